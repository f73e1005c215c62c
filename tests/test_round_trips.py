"""What shardflow writes it reads back (issue 31's findings, each a test): JSON Lines
with late-set nulls and the column order kept, a written directory's read options
merged with the user's, WebDataset keys refused where readers would merge samples, and
a command line that prints strict JSON for every writer's output."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pytest

import shardflow as sf


def test_jsonl_with_a_column_null_in_its_first_lines_reads_back(tmp_path: Path) -> None:
    """arrow-json left null fields out of each line; the column was null in the first
    1,200 rows, so inference (first 1,000 records) never saw it, and reading the
    directory back failed at line 1201. The columns also came back reordered."""
    n = 1500
    notes = [None] * 1200 + [f"note {i}" for i in range(1200, n)]
    source = pa.table({"z": list(range(n)), "note": notes, "a": [float(i) / 4 for i in range(n)]})
    sf.from_arrow(source).write(tmp_path / "out", "jsonl", max_rows_per_shard=700)
    back = sf.dataset(tmp_path / "out")
    assert back.column_names == ["z", "note", "a"]
    assert back.to_list() == source.to_pylist()
    # Every line names every field, so pyarrow's reader (the reference) reads it too.
    shards = sorted((tmp_path / "out").glob("*.jsonl"))
    theirs = pa.concat_tables([pajson.read_json(s) for s in shards], promote_options="default")
    assert theirs.select(["z", "note", "a"]).to_pylist() == source.to_pylist()
    assert all(json.loads(line).keys() == {"z", "note", "a"} for line in shards[0].read_text().splitlines())


def test_a_written_npz_directory_keeps_its_meaning_with_other_options(tmp_path: Path) -> None:
    """The user's format_options used to replace the manifest's {"mode": "rows"}: len
    went from 10 rows to 3 files."""
    ds = sf.from_dict({"x": np.arange(10, dtype=np.int64), "y": np.arange(20, dtype=np.float32).reshape(10, 2)})
    ds.write(tmp_path / "npz", "npz", max_rows_per_shard=4)
    plain = sf.dataset(tmp_path / "npz")
    with_options = sf.dataset(tmp_path / "npz", format_options={"max_decompressed_bytes": 1 << 30})
    assert len(plain) == len(with_options) == 10
    assert with_options[7]["x"] == 7 and list(with_options[7]["y"]) == [14.0, 15.0]
    assert sf.dataset(tmp_path / "npz", format_options={"mode": "rows"})[3]["x"] == 3
    with pytest.raises(sf.InvalidArgumentError, match=r"is \"sample\", but these shards were written to be read with mode = \"rows\""):
        sf.dataset(tmp_path / "npz", format_options={"mode": "sample"})


def test_webdataset_writer_refuses_a_key_on_consecutive_rows(tmp_path: Path) -> None:
    ds = sf.from_dict({"__key__": ["a", "b", "b", "c"], "txt": ["1", "2", "3", "4"]})
    with pytest.raises(sf.InvalidArgumentError, match=r'__key__ "b" is on two consecutive rows'):
        ds.write(tmp_path / "wds", "webdataset")
    # Repeated, but not on consecutive rows: each is its own sample, as webdataset reads it.
    sf.from_dict({"__key__": ["a", "b", "a"], "txt": ["1", "2", "3"]}).write(tmp_path / "ok", "webdataset")
    with tarfile.open(next((tmp_path / "ok").glob("*.tar"))) as tar:
        assert tar.getnames() == ["a.txt", "b.txt", "a.txt"]
    assert [r["txt"] for r in sf.dataset(tmp_path / "ok").to_list()] == ["1", "2", "3"]


def _strict(line: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


# What each writer takes: numbers with NaN and inf where the format holds them (JSON
# cannot), arrays, text and bytes.
WRITERS = {
    "parquet": {"f": [1.5, float("nan"), float("inf"), -float("inf")], "t": ["a", "b", "c", "d"], "b": [b"\x00", b"x", b"", b"yz"]},
    "jsonl": {"f": [1.5, 2.0, -3.0, 0.0], "t": ["a", "b", "c", "d"]},
    "npz": {"f": np.array([1.5, np.nan, np.inf, 0.0]), "m": np.arange(8, dtype=np.float32).reshape(4, 2)},
    "tfrecord": {"f": np.array([1.5, np.nan, np.inf, 0.0], dtype=np.float32), "t": [b"a", b"b", b"c", b"d"]},
    "webdataset": {"__key__": ["k0", "k1", "k2", "k3"], "cls": [0, 1, 2, 3], "txt": ["a", "b", "c", "d"]},
}


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_head_and_inspect_print_strict_json_for_every_writer(tmp_path: Path, fmt: str) -> None:
    sf.from_dict(WRITERS[fmt]).write(tmp_path / fmt, fmt)
    cli = [sys.executable, "-m", "shardflow"]
    head = subprocess.run([*cli, "head", str(tmp_path / fmt), "-n", "4"], capture_output=True, text=True, timeout=120)
    assert head.returncode == 0, head.stderr
    rows = [_strict(line) for line in head.stdout.splitlines()]
    assert len(rows) == 4
    if "f" in WRITERS[fmt] and fmt != "jsonl":
        assert [r["f"] for r in rows][1:3] == [None, None]  # NaN and inf print as null
    inspect = subprocess.run([*cli, "inspect", "--json", str(tmp_path / fmt)], capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    summary = _strict(inspect.stdout)
    assert summary["rows"] == 4 and len(summary["head"]) == 3
