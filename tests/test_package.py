"""The package surface: imports, the command line."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import shardflow as sf


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_import_pulls_in_no_heavy_dependencies() -> None:
    code = "import sys, shardflow; print(sorted(m for m in ('pyarrow', 'torch', 'tensorflow') if m in sys.modules))"
    assert run("-c", code).stdout.strip() == "[]"


def test_public_names_are_listed() -> None:
    for name in sf.__all__:
        assert hasattr(sf, name), name
    assert sf.DataLoader.__module__ == "shardflow" and sf.Dataset.__name__ == "Dataset"


def test_demo_runs_and_reports_throughput() -> None:
    out = run("-m", "shardflow", "demo", "--rows", "20000", "--shards", "3", "--epochs", "1")
    assert out.returncode == 0, out.stderr
    assert "20,000 samples" in out.stdout and "samples/s" in out.stdout and "MB/s" in out.stdout


def test_inspect_and_bench(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n')
    out = run("-m", "shardflow", "inspect", str(tmp_path / "*.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "columns: ['a', 'b']" in out.stdout and "{'a': 2, 'b': 'y'}" in out.stdout
    out = run("-m", "shardflow", "bench", str(tmp_path / "a.jsonl"), "--epochs", "2")
    assert out.returncode == 0, out.stderr
    assert len(re.findall(r"^epoch \d: 2 samples in", out.stdout, re.MULTILINE)) == 2
    out = run("-m", "shardflow", "inspect", str(tmp_path / "*.parquet"))
    assert out.returncode != 0 and "no files match" in out.stderr


def test_versions_agree() -> None:
    """Cargo.toml holds the version; pyproject.toml takes it from there (maturin copies
    it), the installed metadata carries it, and the extension reports it compiled in."""
    root = Path(__file__).resolve().parents[1]
    cargo = tomllib.loads((root / "Cargo.toml").read_text())["package"]["version"]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert sf.__version__ == sf._native.__version__ == metadata.version("shardflow") == cargo
