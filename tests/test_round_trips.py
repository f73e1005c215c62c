"""What shardflow writes it reads back (issue 31's findings, each a test): JSON Lines
with late-set nulls and the column order kept, a written directory's read options
merged with the user's, WebDataset keys refused where readers would merge samples, and
a command line that prints strict JSON for every writer's output."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tarfile
import warnings
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


# ---- write, then read back: every format, generated tables ------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# (Arrow type, values) of each kind of column.
KINDS: dict[str, tuple[pa.DataType, st.SearchStrategy]] = {
    "int": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": (pa.float64(), st.floats()),
    "finite": (pa.float64(), st.floats(allow_nan=False, allow_infinity=False)),
    "float32": (pa.float32(), st.floats(width=32)),
    "text": (pa.string(), st.text(max_size=6)),
    "bytes": (pa.binary(), st.binary(max_size=6)),
    "bool": (pa.bool_(), st.booleans()),
    "ints": (pa.list_(pa.int64()), st.lists(st.integers(-(2**40), 2**40), max_size=4)),
    "record": (
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        st.fixed_dictionaries({"a": st.integers(-5, 5), "b": st.text(max_size=3)}),
    ),
}
# What each writer holds: its kinds, and whether a value may be null. Column names follow
# WebDataset's conventions there (the extension types the member).
FORMATS: dict[str, tuple[dict[str, str], bool]] = {
    "parquet": ({k: k for k in KINDS}, True),
    "jsonl": ({k: k for k in ("int", "finite", "text", "bool", "ints", "record")}, True),
    "npz": ({k: k for k in ("int", "float", "float32", "bool")}, False),
    "webdataset": ({"txt": "text", "bin": "bytes", "cls": "int"}, True),
    "tfrecord": ({"label": "int", "weight": "float32", "name": "bytes", "ids": "ints"}, False),
}


@st.composite
def tables_for(draw: st.DrawFn, fmt: str) -> pa.Table:
    kinds, nullable = FORMATS[fmt]
    n = draw(st.integers(1, 25))
    names = draw(st.lists(st.sampled_from(sorted(kinds)), min_size=1, max_size=len(kinds), unique=True))
    columns = {}
    for name in names:
        data_type, values = KINDS[kinds[name]]
        value = st.one_of(st.none(), values) if nullable else values
        columns[name] = pa.array(draw(st.lists(value, min_size=n, max_size=n)), data_type)
    return pa.table(columns)


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _plain(value: Any) -> Any:
    """A value read back as Python compares with `to_pylist()`'s."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


@settings(max_examples=int(os.environ.get("SHARDFLOW_ROUND_TRIP_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_what_each_writer_writes_reads_back_equal(tmp_path_factory: pytest.TempPathFactory, fmt: str, data: st.DataObject) -> None:
    source = data.draw(tables_for(fmt))
    rows_per_shard = data.draw(st.integers(1, 30))
    dest = tmp_path_factory.mktemp(fmt)
    expected = source.to_pylist()
    if fmt == "webdataset" and any(all(v is None for v in row.values()) for row in expected):
        # A sample is its files: a row with none would vanish, so it is refused.
        with pytest.raises(sf.InvalidArgumentError, match="has no value to write"):
            sf.from_arrow(source).write(dest, fmt, max_rows_per_shard=rows_per_shard, overwrite=True)
        return
    sf.from_arrow(source).write(dest, fmt, max_rows_per_shard=rows_per_shard, overwrite=True)
    back = sf.dataset(dest)
    got = [{k: _plain(v) for k, v in row.items()} for row in back]
    if fmt == "webdataset":
        got = [{k: v for k, v in row.items() if k not in ("__key__", "__url__")} for row in got]
    assert len(got) == len(expected)
    for i, (ours, theirs) in enumerate(zip(got, expected)):
        assert list(ours) == list(theirs), (i, ours, theirs)
        assert _same(ours, theirs), (i, ours, theirs)
    # The format's reference reader reads the same values.
    files = sorted(p for p in dest.iterdir() if not p.name.startswith("_"))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        assert _same(pa.concat_tables([pq.read_table(f) for f in files]).to_pylist(), expected)
    elif fmt == "jsonl":
        read = pa.concat_tables([pajson.read_json(f) for f in files], promote_options="default")
        theirs = read.to_pylist()
        assert all(_same({k: r.get(k) for k in source.column_names}, e) for r, e in zip(theirs, expected) if "record" not in e)
    elif fmt == "npz":
        for name in source.column_names:
            parts = []
            for f in files:
                with np.load(f) as z:
                    parts.append(z[name])
            assert _same(np.concatenate(parts).tolist(), source[name].to_pylist()), name
    elif fmt == "webdataset":
        import webdataset as wds

        with warnings.catch_warnings():
            # webdataset leaves its last shard's file to the garbage collector.
            warnings.simplefilter("ignore", ResourceWarning)
            samples = list(wds.WebDataset([str(f) for f in files], shardshuffle=False))
            gc.collect()
        assert len(samples) == len(expected)
        for sample, row in zip(samples, expected):
            for name, value in row.items():
                member = sample.get(name)
                if value is None:
                    assert member is None
                elif name == "bin":
                    assert member == value
                else:
                    assert member.decode() == str(value)
