"""The `shardflow` console script: inspect, head, bench and convert, their JSON output,
progress bars on a terminal only, and errors without tracebacks."""

from __future__ import annotations

import base64
import errno
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sysconfig
import termios
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf

ROWS = 20_000
FILES = 4


def console_script() -> str | None:
    """The installed `shardflow` script beside this interpreter, or one on PATH."""
    beside = os.path.join(sysconfig.get_path("scripts"), "shardflow")
    return beside if os.path.exists(beside) else shutil.which("shardflow")


SCRIPT = console_script()
CLI = [SCRIPT or "shardflow"]

# tqdm's meter: a carriage return, then on one line "[elapsed..." and the rate's unit
BAR = re.compile(r"\r[^\r\n]*\[\d\d:\d\d[^\r\n]*samples/s")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def run_ok(*args: str) -> str:
    out = run(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def run_on_terminal(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Runs the command with stdout and stderr on a pseudo-terminal; returns its exit
    status and everything it wrote there."""
    master, slave = pty.openpty()
    termios.tcsetwinsize(slave, (24, 100))
    proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no EOF on the terminal after {timeout} s: {b''.join(chunks)!r}"
            if not select.select([master], [], [], remaining)[0]:
                continue
            try:
                data = os.read(master, 65536)
            except OSError as e:
                if e.errno != errno.EIO:  # EIO: the child closed the terminal's last writer
                    raise
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROWS rows in FILES Parquet files: an id, a label, raw bytes and a fixed-size vector."""
    root = tmp_path_factory.mktemp("cli-parquet")
    per_file = ROWS // FILES
    for i in range(FILES):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "label": ids % 10,
                "blob": [b"\x00\xff" + int(j).to_bytes(4, "little") for j in ids],
                "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            }
        )
        pq.write_table(table, root / f"part-{i}.parquet")
    return root


@pytest.fixture(scope="module")
def source(parquet_dir: Path) -> str:
    return str(parquet_dir / "*.parquet")


@pytest.fixture(scope="module")
def plain_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """ROWS rows of numbers and text only, which every format can write (JSON has no
    bytes, WebDataset no unnamed arrays)."""
    root = tmp_path_factory.mktemp("cli-plain")
    per_file = ROWS // FILES
    for i in range(FILES):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "caption": [f"row {j}" for j in ids]}), root / f"part-{i}.parquet")
    return str(root / "*.parquet")


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    """Each row's id, sorted, whichever way the format keeps it (a WebDataset member
    may come back as `id.cls`, or as the id's text in bytes)."""
    name = next(k for k in rows[0] if k == "id" or k.startswith("id."))
    values = [r[name].item() if isinstance(r[name], np.ndarray) else r[name] for r in rows]
    return sorted(int(v) for v in values)


def test_console_script_is_installed() -> None:
    """pyproject's [project.scripts] installs `shardflow` beside the interpreter."""
    assert console_script() is not None, "no `shardflow` script: reinstall the package (pip install -e .)"


def test_bench_through_a_pipe_prints_the_summary_and_no_bar(source: str) -> None:
    out = run("bench", source, "--epochs", "2")
    assert out.returncode == 0, out.stderr
    assert len(re.findall(rf"^epoch \d: {ROWS:,} samples in .* MB/s", out.stdout, re.MULTILINE)) == 2
    assert re.search(r"^median: [\d.]+ s per epoch$", out.stdout, re.MULTILINE)
    assert "\r" not in out.stderr and "samples" not in out.stderr and "it/s" not in out.stderr


def test_bench_on_a_terminal_draws_a_bar(source: str) -> None:
    status, text = run_on_terminal("bench", source, "--epochs", "1")
    assert status == 0, text
    assert BAR.search(text), text
    assert f"epoch 0: {ROWS:,} samples in" in text


def test_bench_json(source: str) -> None:
    result = json.loads(run_ok("bench", source, "--epochs", "2", "--batch-size", "500", "--shuffle", "--json"))
    assert [e["rows"] for e in result["epochs"]] == [ROWS, ROWS]
    for e in result["epochs"]:
        assert e["seconds"] > 0 and e["samples_per_s"] == pytest.approx(ROWS / e["seconds"])
        assert e["mb_per_s"] > 0
    assert result["median_seconds"] in [e["seconds"] for e in result["epochs"]]


def test_bench_json_on_a_terminal_draws_no_bar(source: str) -> None:
    status, text = run_on_terminal("bench", source, "--epochs", "1", "--json")
    assert status == 0, text
    assert not BAR.search(text)
    assert json.loads(text)["epochs"][0]["rows"] == ROWS


def test_inspect_text(parquet_dir: Path, source: str) -> None:
    text = run_ok("inspect", source, "--head", "2")
    for i in range(FILES):
        assert str(parquet_dir / f"part-{i}.parquet") in text
    assert f"{ROWS:,} rows" in text
    assert re.search(r"^  vec +float32\[3\]$", text, re.MULTILINE) and re.search(r"^  blob +bytes$", text, re.MULTILINE)
    assert "[1] {'id': 1," in text and "[2]" not in text


def test_inspect_json(parquet_dir: Path, source: str) -> None:
    result = json.loads(run_ok("inspect", source, "--head", "3", "--json"))
    assert result["format"] == "parquet" and result["rows"] == ROWS
    files = sorted(str(p) for p in parquet_dir.glob("*.parquet"))
    assert [s["url"] for s in result["shards"]] == files
    sizes = [s["bytes"] for s in result["shards"]]
    if None not in sizes:
        assert sizes == [os.path.getsize(f) for f in files] and result["bytes"] == sum(sizes)
    assert result["columns"] == [
        {"name": "id", "type": "int64"},
        {"name": "label", "type": "int64"},
        {"name": "blob", "type": "bytes"},
        {"name": "vec", "type": "float32[3]"},
    ]
    assert [row["id"] for row in result["head"]] == [0, 1, 2]
    assert base64.b64decode(result["head"][2]["blob"]) == b"\x00\xff" + (2).to_bytes(4, "little")


def test_inspect_shards_report_rows_from_parquet_footers(source: str) -> None:
    result = json.loads(run_ok("inspect", source, "--json"))
    assert [s["rows"] for s in result["shards"]] == [ROWS // FILES] * FILES


def test_head_prints_json_lines(source: str) -> None:
    lines = run_ok("head", source, "-n", "5").splitlines()
    assert len(lines) == 5
    expected = list(sf.dataset(source).take(5))
    for line, row in zip(lines, expected, strict=True):
        got = json.loads(line)
        assert got["id"] == row["id"] and got["label"] == row["label"]
        assert base64.b64decode(got["blob"]) == row["blob"]
        assert got["vec"] == row["vec"].tolist()
    assert [json.loads(line)["id"] for line in lines] == [0, 1, 2, 3, 4]


def test_head_stops_quietly_when_the_reader_leaves(source: str) -> None:
    proc = subprocess.Popen([*CLI, "head", source, "-n", str(ROWS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["id"] == 0
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1 and "Traceback" not in stderr


@pytest.mark.parametrize("to", ["jsonl", "webdataset"])
def test_convert_json_and_read_back(tmp_path: Path, plain_source: str, to: str) -> None:
    dest = tmp_path / f"out-{to}"
    manifest = json.loads(
        run_ok("convert", plain_source, str(dest), "--to", to, "--max-rows-per-shard", "6000", "--json")
    )
    assert manifest["format"] == to and manifest["rows"] == ROWS and manifest["seconds"] > 0
    assert len(manifest["shards"]) >= 4 and all(s["rows"] <= 6000 for s in manifest["shards"])
    assert sum(s["rows"] for s in manifest["shards"]) == ROWS
    assert manifest["bytes"] == sum(s["bytes"] for s in manifest["shards"])
    assert ids_of(list(sf.dataset(str(dest)))) == list(range(ROWS))


def test_convert_text_summary(tmp_path: Path, plain_source: str) -> None:
    dest = tmp_path / "out"
    text = run_ok("convert", plain_source, str(dest), "--to", "jsonl")
    assert re.match(rf"wrote \d+ jsonl shards, {ROWS:,} rows, [\d.,]+ MB to {re.escape(str(dest))} in [\d.]+ s$", text)
    again = run("convert", plain_source, str(dest), "--to", "jsonl")
    assert again.returncode != 0 and "error:" in again.stderr and "Traceback" not in again.stderr
    run_ok("convert", plain_source, str(dest), "--to", "jsonl", "--overwrite")
    assert ids_of(list(sf.dataset(str(dest)))) == list(range(ROWS))


def test_convert_refuses_a_column_the_format_cannot_hold(tmp_path: Path, source: str) -> None:
    out = run("convert", source, str(tmp_path / "out"), "--to", "jsonl")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error:") and "blob" in out.stderr


def test_convert_on_a_terminal_draws_a_bar(tmp_path: Path, plain_source: str) -> None:
    status, text = run_on_terminal("convert", plain_source, str(tmp_path / "out"), "--to", "jsonl")
    assert status == 0, text
    assert BAR.search(text), text
    assert f"{ROWS:,} rows" in text


@pytest.mark.parametrize(
    "command",
    [["inspect"], ["inspect", "--json"], ["head"], ["bench"], ["convert", "DEST", "--to", "jsonl"]],
)
def test_missing_path_is_an_error_without_traceback(tmp_path: Path, command: list[str]) -> None:
    name, *rest = command
    rest = [str(tmp_path / "dest") if arg == "DEST" else arg for arg in rest]
    out = run(name, str(tmp_path / "missing.parquet"), *rest)
    assert out.returncode != 0
    assert "error:" in out.stderr and "missing.parquet" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""
