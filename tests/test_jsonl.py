"""JSON Lines read through shardflow equals Python's json module."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shardflow as sf


def records(n: int) -> list[dict]:
    return [
        {
            "id": i,
            "score": i / 3,
            "ok": i % 2 == 0,
            "text": f"line {i} «ünïcode» \"quoted\"\n\ttab",
            "tags": [f"t{j}" for j in range(i % 4)],
            "nested": {"a": i * 10, "b": {"c": [i, i + 1], "d": None}},
            "maybe": None if i % 5 == 0 else i,
            "points": [{"x": float(j), "y": -j} for j in range(i % 3)],
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict], compress: bool = False) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if compress:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("name", ["data.jsonl", "data.ndjson", "data.jsonl.gz", "data.ndjson.gz"])
def test_values_equal_json_loads(tmp_path: Path, name: str) -> None:
    rows = records(3000)
    path = tmp_path / name
    write_jsonl(path, rows, compress=name.endswith(".gz"))
    expected = [json.loads(line) for line in gzip.open(path, "rt") if line.strip()] if name.endswith(".gz") else [
        json.loads(line) for line in path.read_text().splitlines()
    ]
    assert expected == rows
    ds = sf.dataset(str(path))
    assert ds.format == "jsonl"
    assert ds.column_names == list(rows[0])
    assert list(ds) == expected


def test_large_file_is_cut_into_blocks_and_keeps_order(tmp_path: Path) -> None:
    # ~9 MB, several 4 MiB blocks decoded in parallel.
    rows = [{"id": i, "pad": "x" * 200} for i in range(40_000)]
    path = tmp_path / "big.jsonl"
    write_jsonl(path, rows)
    ids = []
    for batch in sf.DataLoader(sf.dataset(str(path)), batch_size=1000, num_threads=4):
        ids.extend(batch["id"].tolist())
    assert ids == list(range(40_000))


def test_blank_lines_and_crlf_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n   \n{"a": 2}\r\n{"a": 3}')
    assert [r["a"] for r in sf.dataset(str(path))] == [1, 2, 3]


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"a": i}) for i in range(10)]
    lines[6] = '{"a": 6,,}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(sf.DecodeError) as info:
        list(sf.dataset(str(path)).skip(0))
    # The first records infer the schema; the bad line is found either there or in decoding.
    assert str(path) in str(info.value)
    assert "line 7" in str(info.value)
    assert info.value.url == str(path)
    assert info.value.position == "line 7"


def test_malformed_line_after_inference_sample(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"a": i}) for i in range(5000)]
    lines[4321] = '{"a": '
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(sf.DecodeError, match="line 4322"):
        list(sf.dataset(str(path)))


def test_skip_counts_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"a": i}) for i in range(5000)]
    for bad in (10, 2500, 4999):
        lines[bad] = "not json"
    path.write_text("\n".join(lines) + "\n")
    loader = sf.DataLoader(sf.dataset(str(path), on_error="skip"), batch_size=512)
    got = [v for b in loader for v in b["a"].tolist()]
    assert got == [i for i in range(5000) if i not in (10, 2500, 4999)]
    assert loader.stats()["skipped_records"] == 3


def test_invalid_utf8_is_a_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"a": "ok"}\n' * 2000 + b'{"a": "\xff\xfe"}\n')
    with pytest.raises(sf.DecodeError, match="line 2001"):
        list(sf.dataset(str(path)))


def test_field_not_in_inferred_schema_is_an_error_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "late.jsonl"
    rows = [{"a": i} for i in range(3000)]
    rows[2500]["extra"] = 1
    write_jsonl(path, rows)
    with pytest.raises(sf.DecodeError, match="line 2501.*schema="):
        list(sf.dataset(str(path)))
    # Choosing the columns, or giving the schema, reads it.
    assert [r["a"] for r in sf.dataset(str(path), columns=["a"])] == list(range(3000))
    ds = sf.dataset(str(path), schema={"a": "int64", "extra": "int64"})
    assert [r["extra"] for r in ds][2499:2502] == [None, 1, None]


def test_schema_from_pyarrow(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_jsonl(path, [{"x": 1, "y": [1.5, 2.0]}, {"x": 2, "y": []}])
    schema = pa.schema([("x", pa.int32()), ("y", pa.list_(pa.float32()))])
    batch = next(iter(sf.DataLoader(sf.dataset(str(path), schema=schema), batch_size=2, output="arrow")))
    table = pa.Table.from_batches([pa.record_batch(batch)])
    assert table.schema == schema
    assert table.to_pylist() == [{"x": 1, "y": [1.5, 2.0]}, {"x": 2, "y": []}]


def test_mixed_int_and_float_widen_and_mixed_scalars_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    write_jsonl(path, [{"n": 1, "v": 1}, {"n": 2.5, "v": "two"}, {"n": 3, "v": True}])
    rows = list(sf.dataset(str(path)))
    assert [r["n"] for r in rows] == [1.0, 2.5, 3.0]
    assert [r["v"] for r in rows] == ["1", "two", "true"]


def test_numeric_columns_are_numpy(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl"
    write_jsonl(path, [{"i": i, "f": i / 2} for i in range(100)])
    batch = next(iter(sf.DataLoader(sf.dataset(str(path)), batch_size=100)))
    assert batch["i"].dtype == np.int64 and batch["f"].dtype == np.float64
    np.testing.assert_array_equal(batch["f"], np.arange(100) / 2)
