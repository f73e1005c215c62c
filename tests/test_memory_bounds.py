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

    def peaks(rows: int) -> list[int]:
        path = tmp_path / f"rows-{rows}.parquet"
        blobs = [i.to_bytes(8, "little") + rng.bytes((256 << 10) - 8) for i in range(rows)]
        pq.write_table(pa.table({"id": np.arange(rows), "blob": blobs}), path, row_group_size=100, compression="none")
        del blobs
        out = []
        for _ in range(3):
            got = subprocess.run([sys.executable, "-c", FULL_SHUFFLE, str(path)], check=True, capture_output=True, text=True).stdout.split()
            assert int(got[0]) == int(got[1]) == rows  # every row once
            assert got[2] == "1"  # in the permutation's order
            out.append(int(got[3]))
        return out

    # 300 MiB and 600 MiB of rows: both more than the unit cache holds (half of
    # memory_limit), which keeps a smaller dataset's units whole for the gathers that come
    # back to them.
    small, large = peaks(1200), peaks(2400)
    report = f"peak RSS {[p >> 20 for p in small]} MiB over 300 MiB of rows, {[p >> 20 for p in large]} MiB over 600 MiB"
    # What one epoch needs: the lowest peak of its runs. A run's peak also depends on how
    # far the loader got ahead of this consumer when it peaked, which its memory_limit
    # (128 MiB) bounds and timing decides: the same build peaked at 206 or 256 MiB over
    # 600 MiB of rows from one run to the next, and at 197 or 230 MiB over 300 MiB.
    assert min(large) <= 1.25 * min(small), report
    assert max(large) <= max(small) + (128 << 20), report


def write_blobs(directory: Path, files: int, rows: int, blob: int, seed: int,
                **options: object) -> tuple[str, dict[int, bytes]]:
    """`files` Parquet files of `rows` rows: an id, and `blob` random bytes that begin with
    it; `options` go to `pq.write_table`. Returns the pattern and each id's blob."""
    rng = np.random.default_rng(seed)
    blobs: dict[int, bytes] = {}
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        column = [int(i).to_bytes(8, "little") + rng.bytes(blob - 8) for i in ids]
        blobs.update(zip(ids.tolist(), column))
        pq.write_table(pa.table({"id": ids, "blob": column}), directory / f"part-{f}.parquet", **options)
    return str(directory / "part-*.parquet"), blobs


def write_paged(directory: Path, files: int = 4, rows: int = 2000, blob: int = 4096,
                page_index: bool = True) -> tuple[str, dict[int, bytes]]:
    """Parquet as HF `datasets` writes it: an offset index, plain (not dictionary) pages
    of a few rows each; or, without `page_index`, the same pages with neither an offset
    index nor statistics in their headers."""
    return write_blobs(directory, files, rows, blob, 11, row_group_size=1000, compression="none",
                       use_dictionary=False, write_page_index=page_index, write_statistics=page_index,
                       data_page_size=16 << 10, write_batch_size=4)


@pytest.mark.parametrize("page_index", [True, False])
def test_a_gather_reads_only_the_pages_that_hold_its_rows(tmp_path: Path, page_index: bool) -> None:
    # 32 MB of rows in pages of 4; 40 scattered rows ask for 40 pages (about 0.6 MB),
    # where whole row groups would be read before. Without an offset index the page
    # headers before the last wanted row are read too (about 0.9 MB); both counted in
    # the loader's stats (they were not).
    source, blobs = write_paged(tmp_path, page_index=page_index)
    total = sum(p.stat().st_size for p in tmp_path.glob("*.parquet"))
    wanted = sorted(np.random.default_rng(2).choice(len(blobs), 40, replace=False).tolist())
    loader = sf.DataLoader(sf.dataset(source).select(wanted), batch_size=16, memory_limit=8 << 20)
    got = [(int(i), bytes(b)) for batch in loader for i, b in zip(batch["id"], batch["blob"])]
    assert [i for i, _ in got] == wanted
    assert all(b == blobs[i] for i, b in got)
    # The 40 pages and the footers (64 KiB read per file), counted in the loader's stats.
    read = loader.stats()["bytes_read"]
    assert 40 * 4096 <= read < total / (20 if page_index else 10), (read, total)


def write_dictionary(directory: Path, files: int = 4, rows: int = 500, blob: int = 16 << 10,
                     **options: object) -> tuple[str, dict[int, bytes]]:
    """Parquet as pyarrow writes it by default (here uncompressed): each row group's
    column in one dictionary page, no page index, so reading any row of a row group
    decodes all of it (unless its values are read where they are)."""
    return write_blobs(directory, files, rows, blob, 13, row_group_size=50, compression="none", **options)


@pytest.mark.parametrize("layout", ["paged", "dictionary", "wide-dictionary"])
@pytest.mark.parametrize(("world_size", "num_workers"), [(1, 1), (2, 2)])
def test_page_reads_give_the_rows_and_order_of_whole_units(tmp_path: Path, world_size: int, num_workers: int,
                                                          layout: str) -> None:
    # A full shuffle under a memory_limit the data outgrows reads pages (or, where the
    # layout has none to read, whole units, reading ahead); under one it fits, whole units
    # from the cache. Same rows, same order, on every rank and worker, every epoch, and
    # after a resume.
    if layout == "paged":
        source, blobs = write_paged(tmp_path)
    elif layout == "dictionary":
        source, blobs = write_dictionary(tmp_path)
    else:  # dictionary pages past 1 MiB: values read where they are, not decoded whole
        source, blobs = write_dictionary(tmp_path, files=2, rows=150, blob=64 << 10, write_batch_size=8,
                                         data_page_size=64, dictionary_pagesize_limit=64 << 20)
    ds = sf.dataset(source).shuffle(seed=5)

    def loader(rank: int, worker: int, memory_limit: int, epoch: int) -> sf.DataLoader:
        out = sf.DataLoader(ds, batch_size=50, memory_limit=memory_limit, rank=rank, world_size=world_size,
                            worker=worker, num_workers=num_workers)
        out.set_epoch(epoch)
        return out

    def ids(batches: object) -> list[int]:
        out = []
        for batch in batches:
            for i, b in zip(batch["id"].tolist(), batch["blob"]):
                assert bytes(b) == blobs[i]
                out.append(i)
        return out

    orders = []
    for epoch in (0, 1):
        seen: list[int] = []
        for rank in range(world_size):
            for worker in range(num_workers):
                paged = ids(loader(rank, worker, 8 << 20, epoch))
                assert paged == ids(loader(rank, worker, 1 << 30, epoch))
                seen += paged
        assert sorted(seen) == sorted(blobs)
        orders.append(seen)
    assert orders[0] != orders[1]
    # A resume part-way through an epoch, in a loader of its own.
    first = loader(world_size - 1, num_workers - 1, 8 << 20, 1)
    it = iter(first)
    head = ids([next(it), next(it)])
    state = first.state_dict()
    again = loader(world_size - 1, num_workers - 1, 8 << 20, 1)
    again.load_state_dict(state)
    whole = ids(loader(world_size - 1, num_workers - 1, 1 << 30, 1))
    assert head + ids(again) == whole


def test_dictionary_values_are_read_where_they_are(tmp_path: Path) -> None:
    # pyarrow's default layout puts every value of a row group's column in one dictionary
    # page. Stored uncompressed and past 1 MiB, a gather reads each wanted value where it
    # is (the data pages give each row's value): scattered rows cost their own bytes.
    # Compressed, or where the dictionary filled and plain pages follow, the arrow reader
    # decodes the chunk as before. Nulls, strings, large binary, V1 and V2 data pages,
    # several data pages per chunk; every value against pyarrow's.
    rng = np.random.default_rng(5)
    rows, per_group = 240, 40
    ids = np.arange(rows)
    blob = [None if i % 7 == 3 else int(i).to_bytes(8, "little") + rng.bytes(48 << 10) for i in ids]
    text = [None if i % 5 == 1 else f"{i:06d}" + "é" * (24 << 10) for i in ids]
    table = pa.table({"id": ids, "blob": pa.array(blob, pa.large_binary()), "text": text})
    # A data page of indices per 8 rows, and a dictionary that never fills.
    several_index_pages = {"write_batch_size": 8, "data_page_size": 64, "dictionary_pagesize_limit": 64 << 20}
    layouts = {
        "v1": {"compression": "none", **several_index_pages},
        "v2": {"compression": "none", "data_page_version": "2.0", **several_index_pages},
        "snappy": {"compression": "snappy"},
        "fell-back": {"compression": "none", "write_batch_size": 4, "dictionary_pagesize_limit": 256 << 10},
    }
    wanted = sorted(rng.choice(rows, 30, replace=False).tolist())
    read = {}
    for name, options in layouts.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=per_group, **options)
        expected = pq.read_table(path).take(wanted).to_pylist()
        loader = sf.DataLoader(sf.dataset(str(path)).select(wanted), batch_size=8, memory_limit=4 << 20)
        got = [row for batch in loader for row in pa.Table.from_pydict(
            {k: list(v) if not isinstance(v, np.ndarray) else v.tolist() for k, v in batch.items()}).to_pylist()]
        assert [r["id"] for r in got] == wanted, name
        for g, e in zip(got, expected):
            assert (g["blob"] is None) == (e["blob"] is None) and (g["blob"] is None or bytes(g["blob"]) == e["blob"]), (name, e["id"])
            assert g["text"] == e["text"], (name, e["id"])
        read[name] = loader.stats()["bytes_read"]
    # The wanted rows' values, plus the page headers, lengths and indices found once per
    # row group, against whole dictionary pages (about 2.6 MB per row group).
    values = sum(len(blob[i] or b"") + len((text[i] or "").encode()) for i in wanted)
    assert read["v1"] < 2 * values and read["v2"] < 2 * values, (read, values)
    assert read["snappy"] > 3 * values and read["fell-back"] > 3 * values, (read, values)


def test_a_full_shuffle_reads_ahead_where_each_visit_decodes_a_whole_unit(tmp_path: Path) -> None:
    # Each row group's rows in one dictionary page: any row read decodes the row group.
    # Gathers of 128 rows (a quarter of 8 MiB) alone visit every row group once per
    # gather: 15.8x the data read. A visit that also takes the rows the next 256 want
    # (twice the quarter of memory_limit that holds them) comes back about 2,000 / 256
    # + 1 times: 8.2x measured.
    source, blobs = write_dictionary(tmp_path)
    total = sum(p.stat().st_size for p in tmp_path.glob("*.parquet"))
    # spill_bytes=0: not the external shuffle (tests/test_spill.py), which reads it once.
    loader = sf.DataLoader(sf.dataset(source).shuffle(seed=2), batch_size=64, memory_limit=8 << 20, spill_bytes=0)
    got = [(int(i), bytes(b)) for batch in loader for i, b in zip(batch["id"], batch["blob"])]
    expected = [r["id"] for r in sf.dataset(source, columns=["id"]).shuffle(seed=2)]
    assert [i for i, _ in got] == expected
    assert all(b == blobs[i] for i, b in got)
    read = loader.stats()["bytes_read"]
    assert read < 11 * total, f"read {read / total:.1f}x the data"
    assert loader.stats()["read_plan"] == "read_ahead"


def test_a_byte_bounded_buffer_still_mixes_across_its_outputs(tmp_path: Path) -> None:
    # buffer_size asks for 10,000 rows, buffer_bytes holds about 100: each output used to
    # take a sixteenth of 10,000 rows (all the buffer held), so rows moved at most a
    # buffer's length. Outputs now take a sixteenth of what the buffer holds, and a row
    # may stay through many of them, as in a buffer of that size bounded by rows.
    path = tmp_path / "one-group.parquet"
    n = 3000
    pq.write_table(pa.table({"id": np.arange(n), "payload": [bytes(1000)] * n}), path, row_group_size=n)
    ds = sf.dataset(str(path)).shuffle(seed=4, buffer_size=10_000, buffer_bytes=100_000)
    with pytest.warns(UserWarning, match="shuffle buffer holds only"):
        order = np.array([i for b in sf.DataLoader(ds, batch_size=50) for i in b["id"].tolist()])
    assert sorted(order.tolist()) == list(range(n))
    later = np.argsort(order) - np.arange(n)  # how many places after its own each row came
    # A row enters about 100 places before its own; emptying the buffer at every output,
    # none came more than that after it. Held through outputs of 6 rows of 100, one in
    # eight stays 200 places (measured: 12%).
    assert np.mean(later > 100) > 0.05, np.percentile(later, [50, 90, 99])
