"""Memory bounded in bytes: the shuffle buffer's `buffer_bytes` and the loader's
`prefetch_bytes` apply whichever bound (rows or bytes) is reached first."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import wait_for

import shardflow as sf

ROW_BYTES = 10_000


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("wide") / "wide.parquet"
    n = 2000
    payload = [bytes([i % 251]) * ROW_BYTES for i in range(n)]
    pq.write_table(pa.table({"id": np.arange(n), "payload": payload}), path, row_group_size=100)
    return str(path)


def test_shuffle_buffer_bytes_bound_the_buffer_and_say_so_once(wide: str) -> None:
    ds = sf.dataset(wide).shuffle(seed=1, buffer_size=10_000, buffer_bytes=1_000_000)
    loader = sf.DataLoader(ds, batch_size=64)
    with pytest.warns(UserWarning, match=r"shuffle buffer holds only \d+ rows") as caught:
        first = [i for b in loader for i in b["id"].tolist()]
    assert len([w for w in caught if "shuffle buffer" in str(w.message)]) == 1
    assert sorted(first) == list(range(2000))
    held = loader.stats()["shuffle_buffer_rows"]
    # About 1 MB of 10 kB rows.
    assert 50 <= held <= 100, held
    # Once per loader, not once per epoch.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(2000))


def test_the_row_bound_still_applies_when_rows_are_small(wide: str) -> None:
    ds = sf.dataset(wide, columns=["id"]).shuffle(seed=1, buffer_size=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = sf.DataLoader(ds, batch_size=64)
        out = [i for b in loader for i in b["id"].tolist()]
    assert sorted(out) == list(range(2000))
    assert loader.stats()["shuffle_buffer_rows"] == 0  # the byte bound never governed


def test_prefetch_bytes_bound_what_is_decoded_ahead(wide: str) -> None:
    # 1 batch = 1 row = 10 kB; 100 rows per row group (a work unit).
    def units_ahead(**limits: int) -> int:
        loader = sf.DataLoader(sf.dataset(wide), batch_size=1, num_threads=1, prefetch=100_000, **limits)
        it = iter(loader)
        next(it)
        # The pipeline runs ahead of a consumer that has stopped, as far as the bounds let it.
        wait_for(lambda: loader.stats()["units"] >= 10, timeout=2.0)
        return loader.stats()["units"]

    assert units_ahead(prefetch_bytes=200_000) <= 5
    assert units_ahead() >= 10  # the default 256 MiB lets it run on


def test_zero_bounds_are_refused(wide: str) -> None:
    with pytest.raises(ValueError, match="buffer_bytes"):
        sf.dataset(wide).shuffle(buffer_bytes=0)
    with pytest.raises(ValueError, match="prefetch_bytes"):
        sf.DataLoader(sf.dataset(wide), prefetch_bytes=0)


def test_the_bound_is_part_of_the_recipe(wide: str, tmp_path: Path) -> None:
    import pickle

    ds = sf.dataset(wide, columns=["id"]).shuffle(seed=3, buffer_bytes=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert list(pickle.loads(pickle.dumps(ds))) == list(ds)
    assert "buffer_bytes=4096" in repr(ds)


# ---- full-permutation shuffle ------------------------------------------------------------

FULL_SHUFFLE = """
import sys
import shardflow as sf
loader = sf.DataLoader(sf.dataset(sys.argv[1]).shuffle(seed=0), batch_size=32, memory_limit=128 << 20)
ids = []
for batch in loader:
    for i, blob in zip(batch["id"].tolist(), batch["blob"]):
        assert int.from_bytes(blob[:8], "little") == i, (i, blob[:8])  # each row's own value
        ids.append(i)
peak_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
# The same permutation as read through the ids alone (small rows: units decoded whole).
expected = [r["id"] for r in sf.dataset(sys.argv[1], columns=["id"]).shuffle(seed=0)]
print(len(ids), len(set(ids)), int(ids == expected), peak_kb << 10)
"""


def test_a_full_shuffle_holds_what_its_gathers_need_not_the_dataset(tmp_path: Path) -> None:
    # Every gather of the permutation decoded each unit it touched whole and held them
    # all: peak RSS grew 2.4-3.7x the data (a 1.5 GB file peaked at 4.7 GB). Gathers now
    # hold a quarter of memory_limit of rows, take a unit's rows and let it go, and
    # decode only the pages that hold them: twice the data peaks where the data did.
    import subprocess
    import sys

    rng = np.random.default_rng(3)

    def peak(rows: int) -> int:
        path = tmp_path / f"rows-{rows}.parquet"
        blobs = [i.to_bytes(8, "little") + rng.bytes((256 << 10) - 8) for i in range(rows)]
        pq.write_table(pa.table({"id": np.arange(rows), "blob": blobs}), path, row_group_size=100, compression="none")
        del blobs
        out = subprocess.run([sys.executable, "-c", FULL_SHUFFLE, str(path)], check=True, capture_output=True, text=True).stdout.split()
        assert int(out[0]) == int(out[1]) == rows  # every row once
        assert out[2] == "1"  # in the permutation's order
        return int(out[3])

    # 300 MiB and 600 MiB of rows: both more than the unit cache holds (256 MiB), which
    # keeps a smaller dataset's units whole for the gathers that come back to them.
    small, large = peak(1200), peak(2400)
    assert large <= 1.25 * small, f"peak RSS {small >> 20} MiB over 300 MiB of rows, {large >> 20} MiB over 600 MiB"
