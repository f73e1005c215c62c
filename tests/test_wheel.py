"""A wheel of shardflow, from the folder named in SHARDFLOW_WHEEL_DIR: its tags and
metadata, and a fresh virtual environment with no Rust toolchain on PATH that installs
it, imports shardflow without torch or tensorflow, runs the demo and reads a dataset
from S3 (SeaweedFS).

scripts/test.sh builds that wheel from the same release build the other tests use, so
it is tagged for this machine's glibc. scripts/release-check.sh runs this module on the
release wheel of scripts/build-wheel.sh with SHARDFLOW_RELEASE_WHEEL=1, which also
requires its manylinux_2_17 tag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import Seaweed

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = os.environ.get("SHARDFLOW_WHEEL_DIR")
RELEASE = os.environ.get("SHARDFLOW_RELEASE_WHEEL") == "1"
VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]

pytestmark = pytest.mark.skipif(
    not WHEEL_DIR, reason="SHARDFLOW_WHEEL_DIR is unset: scripts/test.sh builds the wheel and sets it"
)


@pytest.fixture(scope="module")
def wheel() -> Path:
    assert WHEEL_DIR
    found = sorted(Path(WHEEL_DIR).glob(f"shardflow-{VERSION}-*.whl"))
    assert len(found) == 1, f"expected one shardflow {VERSION} wheel in {WHEEL_DIR}, found {found}"
    return found[0].resolve()


def without_rust() -> dict[str, str]:
    """The environment with every PATH entry that holds a Rust toolchain left out, and
    nothing that points Python at this checkout."""
    tools = ("cargo", "rustc", "rustup")
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not any(os.path.exists(os.path.join(p, t)) for t in tools)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(path)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the wheel (and its `arrow` extra, which the demo uses) installed;
    pip may take only wheels, so it cannot fall back to building shardflow from source."""
    root = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    env = without_rust()
    env["PATH"] = os.pathsep.join([str(root / "venv" / "bin"), env["PATH"]])
    assert all(shutil.which(tool, path=env["PATH"]) is None for tool in ("cargo", "rustc", "rustup"))
    python = root / "venv" / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--only-binary=:all:", f"{wheel}[arrow]"],
        capture_output=True, text=True, env=env, cwd=root, timeout=600,
    )
    assert install.returncode == 0, install.stderr
    return python, env


def run_in(venv: tuple[Path, dict[str, str]], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    python, env = venv
    out = subprocess.run([str(python), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_wheel_tags_and_metadata(wheel: Path) -> None:
    name, version, python_tag, abi_tag, platform_tag = wheel.stem.split("-")
    assert (name, version, python_tag, abi_tag) == ("shardflow", VERSION, "cp311", "abi3")
    # maturin writes the legacy alias too: manylinux2014_x86_64.manylinux_2_17_x86_64
    platforms = platform_tag.split(".")
    assert all(p.startswith("manylinux") and p.endswith("_x86_64") for p in platforms)
    if RELEASE:
        assert "manylinux_2_17_x86_64" in platforms
    with zipfile.ZipFile(wheel) as archive:
        info = f"shardflow-{VERSION}.dist-info"
        tags = Parser().parsestr(archive.read(f"{info}/WHEEL").decode())
        meta = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        names = archive.namelist()
    assert tags.get_all("Tag") == [f"cp311-abi3-{p}" for p in platforms] and tags["Root-Is-Purelib"] == "false"
    assert meta["Version"] == VERSION and meta["Requires-Python"] == ">=3.11"
    assert any(r.startswith("numpy") for r in meta.get_all("Requires-Dist"))
    # The package's Python files, its type information, and one extension module.
    assert {"shardflow/__init__.py", "shardflow/_native.pyi", "shardflow/py.typed"} <= set(names)
    assert [n for n in names if n.endswith(".so")] == ["shardflow/_native.abi3.so"]


def test_fresh_venv_imports_without_torch_or_tensorflow(
    venv_python: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    code = (
        "import sys, json, shardflow, importlib.util as u; print(json.dumps({'file': shardflow.__file__, "
        "'version': shardflow.__version__, 'loaded': [m for m in ('torch', 'tensorflow', 'pyarrow') if m in sys.modules], "
        "'installed': [m for m in ('torch', 'tensorflow') if u.find_spec(m)]}))"
    )
    seen = json.loads(run_in(venv_python, tmp_path, "-c", code).stdout)
    assert Path(seen["file"]).is_relative_to(venv_python[0].parents[1])  # the venv's copy, not this checkout
    assert seen["version"] == VERSION
    assert seen["loaded"] == [] and seen["installed"] == []


def test_fresh_venv_runs_the_demo(venv_python: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    out = run_in(venv_python, tmp_path, "-m", "shardflow", "demo", "--rows", "20000", "--shards", "3", "--epochs", "1")
    assert "20,000 samples" in out.stdout and "samples/s" in out.stdout


def test_fresh_venv_reads_from_s3(
    venv_python: tuple[Path, dict[str, str]], seaweed: Seaweed, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ids = np.arange(3000, dtype=np.int64)
    for shard in range(3):
        part = ids[shard * 1000 : (shard + 1) * 1000]
        table = pa.table({"id": part, "text": [f"row {i}" for i in part]})
        pq.write_table(table, data / f"part-{shard}.parquet", row_group_size=256, compression="zstd")
    seaweed.upload_tree(data, "wheel-venv")
    code = (
        "import json, sys, shardflow as sf\n"
        "ds = sf.dataset('s3://wheel-venv/part-*.parquet', storage_options=json.loads(sys.argv[1]))\n"
        "ids, texts = [], []\n"
        "for batch in sf.DataLoader(ds, batch_size=500, shuffle=True, seed=3):\n"
        "    ids += batch['id'].tolist(); texts += batch['text'].tolist()\n"
        "print(json.dumps({'len': len(ds), 'ids': ids, 'texts': texts}))\n"
    )
    seen = json.loads(run_in(venv_python, tmp_path, "-c", code, json.dumps(seaweed.storage_options())).stdout)
    assert seen["len"] == 3000
    assert sorted(seen["ids"]) == ids.tolist() and seen["ids"] != ids.tolist()  # every row once, shuffled
    assert seen["texts"] == [f"row {i}" for i in seen["ids"]]
