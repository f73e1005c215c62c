"""`sf.load_dataset` and `hf://`: repos laid out as the cookbook's are (YAML configs,
sharded split names, split keywords in folders and files, one JSONL file, CSV) give the
splits, configs and rows that `datasets.load_dataset` gives, from a local folder, from an
`s3://` prefix (SeaweedFS) and through a local Hub (tests/hubserver.py) that
`huggingface_hub`'s own clients accept."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf
from hubserver import HubServer

TOKEN = "hf_test_token_7Qx"
# (repo, config name): the cookbook's load_dataset forms.
CASES = [
    ("yaml-configs", None),
    ("yaml-configs", "sft"),
    ("sharded", None),
    ("nested-jsonl", None),
    ("single-jsonl", None),
    ("csv", None),
]


def _rows(n: int, start: int) -> list[dict[str, Any]]:
    return [
        {"id": start + i, "text": f"row {start + i}", "score": (start + i) / 8 + 0.1, "tags": list(range(i % 3))}
        for i in range(n)
    ]


def _parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=16)


def _jsonl(path: Path, rows: list[dict[str, Any]], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def make_repos(root: Path) -> dict[str, Path]:
    repos = {}
    r = repos["yaml-configs"] = root / "yaml-configs"  # nvidia/HelpSteer3-like: two configs
    _parquet(r / "sft/train-00000.parquet", _rows(30, 0))
    _parquet(r / "sft/validation-00000.parquet", _rows(6, 100))
    _parquet(r / "preference/data/train.parquet", _rows(20, 200))
    _parquet(r / "preference/data/test.parquet", _rows(5, 300))
    (r / "README.md").write_text(
        "---\nconfigs:\n- config_name: sft\n  data_files:\n  - split: train\n    path: sft/train-*.parquet\n"
        "  - split: validation\n    path: sft/validation-*.parquet\n- config_name: preference\n"
        "  data_dir: preference\n  default: true\n---\n# A card\n"
    )
    r = repos["sharded"] = root / "sharded"  # openai/gsm8k-like: data/{split}-NNNNN-of-NNNNN
    for i in range(2):
        _parquet(r / f"data/train-{i:05d}-of-00002.parquet", _rows(20, 1000 * i))
    _parquet(r / "data/test-00000-of-00001.parquet", _rows(12, 5000))
    (r / "README.md").write_text("# no YAML here\n")
    r = repos["nested-jsonl"] = root / "nested-jsonl"  # tulu-like mixtures: */train.jsonl.gz
    for j, part in enumerate(["flan", "oasst", "code"]):
        _jsonl(r / part / "train.jsonl.gz", _rows(7 + j, 100 * j), gz=True)
    _jsonl(r / "oasst" / "test.jsonl.gz", _rows(4, 900), gz=True)
    (r / "README.md").write_text("---\nlicense: mit\n---\n")
    r = repos["single-jsonl"] = root / "single-jsonl"
    _jsonl(r / "conversations.jsonl", _rows(9, 0))
    (r / "LICENSE").write_text("MIT\n")
    r = repos["csv"] = root / "csv"
    r.mkdir()
    for split, n in [("train", 11), ("validation", 4)]:
        body = "".join(f"{x['id']},{x['text']},{x['score']}\n" for x in _rows(n, 10 * n))
        (r / f"{split}.csv").write_text("id,text,score\n" + body)
    return repos


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_repos(tmp_path_factory.mktemp("repos"))


def _hf_reference(path: str, name: str | None, env: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """`datasets.load_dataset(path, name, streaming=True)`'s splits and rows, from a
    fresh process (HF_ENDPOINT is read when huggingface_hub is imported). The child leaves
    by `os._exit` once its rows are out: pyarrow's scanner threads, still alive when the
    interpreter tears down, sometimes abort it ("terminate called without an active
    exception", huggingface/datasets#7566; CI saw it once, after the rows were printed)."""
    code = (
        "import datasets, json, os, sys\n"
        f"d = datasets.load_dataset({path!r}, {name!r}, streaming=True)\n"
        "json.dump({k: list(v) for k, v in d.items()}, sys.stdout)\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _ours(found: Any) -> dict[str, list[dict]]:
    return {split: ds.to_list() for split, ds in found.items()}


def _same_rows(ours: dict[str, list[dict]], theirs: dict[str, list[dict]]) -> None:
    assert list(ours) == list(theirs)
    for split in theirs:
        assert len(ours[split]) == len(theirs[split]), split
        for a, b in zip(ours[split], theirs[split]):
            assert a.keys() == b.keys()
            for key in a:
                if isinstance(b[key], float):
                    assert a[key] == pytest.approx(b[key], rel=0, abs=0), (split, key)
                else:
                    assert a[key] == b[key], (split, key)


@pytest.mark.parametrize("repo,name", CASES)
def test_local_repos_give_what_datasets_gives(repos: dict[str, Path], repo: str, name: str | None) -> None:
    theirs = _hf_reference(str(repos[repo]), name)
    found = sf.load_dataset(str(repos[repo]), name)
    assert isinstance(found, sf.DatasetDict)
    _same_rows(_ours(found), theirs)
    assert found.num_rows == {k: len(v) for k, v in theirs.items()}


def test_split_slicing_and_config_errors_as_datasets(repos: dict[str, Path], tmp_path: Path) -> None:
    import datasets

    path = str(repos["sharded"])
    for split in ["train[:10%]", "train[5:15]", "train[-4:]", "test[:50%]+train[:3]", "test"]:
        theirs = datasets.load_dataset(path, split=split, cache_dir=str(tmp_path)).to_list()
        assert sf.load_dataset(path, split=split).to_list() == theirs, split
    with pytest.raises(ValueError, match=r"Unknown split \"validation\". Should be one of \['train', 'test'\]"):
        sf.load_dataset(path, split="validation")
    with pytest.raises(ValueError, match=r"BuilderConfig 'nope' not found. Available: \['sft', 'preference'\]"):
        sf.load_dataset(str(repos["yaml-configs"]), "nope")
    with pytest.raises(sf.NotFoundError, match="not a Hub repo id"):
        sf.load_dataset(str(repos["sharded"] / "missing"))
    # A builder name with data_files, as in HF.
    files = {"train": str(repos["csv"] / "train.csv"), "test": str(repos["csv"] / "validation.csv")}
    theirs = datasets.load_dataset("csv", data_files=files, cache_dir=str(tmp_path))
    ours = sf.load_dataset("csv", data_files=files)
    assert {k: v.to_list() for k, v in ours.items()} == {k: v.to_list() for k, v in theirs.items()}


def test_dataset_dict_verbs_apply_to_every_split(repos: dict[str, Path]) -> None:
    dd = sf.load_dataset(str(repos["sharded"]))
    mapped = dd.filter(lambda r: r["id"] % 2 == 0).select_columns(["id"]).shuffle(seed=3)
    assert list(mapped) == ["train", "test"]
    for split in dd:
        assert sorted(r["id"] for r in mapped[split].to_list()) == [r["id"] for r in dd[split].to_list() if r["id"] % 2 == 0]
    assert mapped.column_names == {"train": ["id"], "test": ["id"]}


def test_a_folder_with_a_readme_reads_its_data_files(repos: dict[str, Path]) -> None:
    """sf.dataset(repo_dir) leaves README.md and LICENSE out; a named README is still read."""
    ds = sf.dataset(str(repos["sharded"]))
    assert len(ds) == 52 and ds.format == "parquet"
    assert len(sf.dataset(str(repos["single-jsonl"]), format="json")) == 9
    with pytest.raises(sf.InvalidArgumentError, match="pass format="):
        sf.dataset([str(repos["sharded"] / "README.md")])
    cli = subprocess.run(
        [sys.executable, "-m", "shardflow", "head", str(repos["sharded"]), "--split", "test", "-n", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert [json.loads(line)["id"] for line in cli.stdout.splitlines()] == [5000, 5001]


def test_s3_prefixes_laid_out_as_repos(repos: dict[str, Path], seaweed: Any) -> None:
    from servers import S3_KEY, S3_SECRET

    client = seaweed.client()
    bucket = "hub-layouts"
    client.create_bucket(Bucket=bucket)
    for name, folder in repos.items():
        for path in folder.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{name}/{path.relative_to(folder).as_posix()}")
    options = {"endpoint_url": seaweed.s3_url, "access_key_id": S3_KEY, "secret_access_key": S3_SECRET, "region": "us-east-1"}
    for repo, name in CASES:
        found = sf.load_dataset(f"s3://{bucket}/{repo}", name, storage_options=options)
        _same_rows(_ours(found), _ours(sf.load_dataset(str(repos[repo]), name)))


# ---------------------------------------------------------------- the local Hub


@pytest.fixture(scope="module")
def hub(repos: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub-extra")
    # 50 files for the request count; a wide file for projection; a converted revision.
    for i in range(50):
        _parquet(root / "many" / f"data/train-{i:05d}-of-00050.parquet", _rows(8, 8 * i))
    # One wide file: the 64 KiB tail read that finds a footer is the only read beyond
    # the projected column's chunks.
    wide = pa.table({"small": pa.array(range(200_000), pa.int64()), "big": pa.array([os.urandom(48).hex() for _ in range(200_000)])})
    (root / "wide").mkdir()
    pq.write_table(wide, root / "wide" / "train.parquet", row_group_size=50_000, compression="none")
    _parquet(root / "converted" / "default/train/0000.parquet", _rows(5, 70))
    server = HubServer(
        {
            **{f"org/{name}": {"main": folder} for name, folder in repos.items()},
            "org/many": {"main": root / "many"},
            "org/wide": {"main": root / "wide"},
            "org/sharded-conv": {"main": repos["sharded"], "refs/convert/parquet": root / "converted"},
        },
        token=TOKEN, page_size=20,
    )
    yield server
    server.stop()


@pytest.fixture
def hub_env(hub: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_huggingface_hub_clients_accept_the_local_hub(hub: HubServer, hub_env: dict[str, str], repos: dict[str, Path]) -> None:
    code = (
        "import huggingface_hub as hh, json, os, sys\n"
        "fs = hh.HfFileSystem()\n"
        "files = sorted(fs.glob('datasets/org/sharded/**/*.parquet'))\n"
        "head = fs.open('datasets/org/sharded/data/test-00000-of-00001.parquet', 'rb').read(4)\n"
        "snap = hh.snapshot_download('org/nested-jsonl', repo_type='dataset')\n"
        "got = sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs_ in os.walk(snap) for f in fs_)\n"
        "json.dump({'files': files, 'head': head.decode(), 'snapshot': got}, sys.stdout)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **hub_env})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    expected = sorted(f"datasets/org/sharded/{p.relative_to(repos['sharded']).as_posix()}" for p in repos["sharded"].rglob("*.parquet"))
    assert seen["files"] == expected and seen["head"] == "PAR1"
    assert seen["snapshot"] == sorted(p.relative_to(repos["nested-jsonl"]).as_posix() for p in repos["nested-jsonl"].rglob("*") if p.is_file())
    assert hub.auth_on_storage == 0


@pytest.mark.parametrize("repo,name", CASES)
def test_hub_repos_give_what_datasets_streaming_gives(hub: HubServer, hub_env: dict[str, str], repo: str, name: str | None) -> None:
    theirs = _hf_reference(f"org/{repo}", name, hub_env)
    _same_rows(_ours(sf.load_dataset(f"org/{repo}", name)), theirs)
    _same_rows(_ours(sf.load_dataset(f"hf://datasets/org/{repo}", name)), theirs)
    assert hub.auth_on_storage == 0  # the token stays on the Hub's host


def test_hub_token_sources_and_errors(hub: HubServer, hub_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(sf.NotFoundError, match="pass token= or set HF_TOKEN"):
        sf.load_dataset("org/sharded")
    assert len(sf.load_dataset("org/sharded", split="test", token=TOKEN)) == 12
    token_file = Path(hub_env["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(TOKEN + "\n")
    assert len(sf.load_dataset("org/sharded", split="test")) == 12
    with pytest.raises(sf.NotFoundError, match="no dataset repo org/absent"):
        sf.load_dataset("org/absent")
    with pytest.raises(sf.NotFoundError, match='repo org/sharded has no revision "v9"'):
        sf.load_dataset("org/sharded", revision="v9")
    with pytest.raises(sf.NotFoundError, match="no files match"):
        sf.dataset("hf://datasets/org/sharded/data/nope-*.parquet")
    converted = sf.load_dataset("hf://datasets/org/sharded-conv@refs/convert/parquet", split="train")
    assert [r["id"] for r in converted.to_list()] == list(range(70, 75))
    assert [r["id"] for r in sf.dataset("hf://datasets/org/sharded-conv@refs%2Fconvert%2Fparquet/default").to_list()] == list(range(70, 75))


def test_hub_parquet_reads_fetch_only_the_projected_columns(hub: HubServer, hub_env: dict[str, str], tmp_path: Path) -> None:
    hub.reset_counts()
    ds = sf.load_dataset("org/wide", split="train", columns=["small"])
    assert sum(len(b["small"]) for b in sf.DataLoader(ds, batch_size=4096)) == 200_000
    meta = pq.ParquetFile(hub.repos["org/wide"]["main"].folder / "train.parquet").metadata
    projected = sum(meta.row_group(g).column(0).total_compressed_size for g in range(meta.num_row_groups))
    fetched = hub.bytes_sent["train.parquet"]
    assert projected <= fetched <= 1.1 * projected, (fetched, projected)


def test_hub_resume_in_a_fresh_process_equal_rank_shares_and_throttling(
    hub: HubServer, hub_env: dict[str, str], tmp_path: Path
) -> None:
    ds = sf.load_dataset("org/sharded", split="train")
    ids = [r["id"] for r in ds.to_list()]
    shares = []
    for rank in range(2):
        loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=5, rank=rank, world_size=2)
        shares.append([int(i) for b in loader for i in b["id"]])
    assert len(shares[0]) == len(shares[1]) == 20 and sorted(shares[0] + shares[1]) == sorted(ids)
    # Mid-epoch state, resumed by a fresh process from the pickled dataset.
    loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=5)
    loader.set_epoch(1)
    batches = iter(loader)
    seen = [int(i) for _ in range(3) for i in next(batches)["id"]]
    state = loader.state_dict()
    rest = [int(i) for b in batches for i in b["id"]]
    (tmp_path / "resume.pkl").write_bytes(pickle.dumps((ds, state)))
    code = (
        "import pickle, sys, json, shardflow as sf\n"
        "ds, state = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=5)\n"
        "loader.load_state_dict(state)\n"
        "print(json.dumps([int(i) for b in loader for i in b['id']]))\n"
    )
    hub.reset_counts()
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "resume.pkl")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == rest and sorted(seen + rest) == sorted(ids)
    assert hub.counts["tree"] == hub.counts["info"] == 0  # the pickled listing was used
    # A 429 with Retry-After is waited out, retried and counted.
    test = sf.load_dataset("org/sharded", split="test")
    assert len(test) == 12  # footers read: the reads below are the loader's own
    hub.throttle = 2
    loader = sf.DataLoader(test, batch_size=5)
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(5000, 5012))
    assert hub.throttle == 0 and loader.stats()["retries"] >= 2


def test_hub_ranks_and_torch_workers_list_the_repo_once_per_process(hub: HubServer, hub_env: dict[str, str]) -> None:
    """2 ranks x 4 spawned torch workers over a 50-file repo: one listing pass per rank
    process (repo info + tree pages); workers rebuild the dataset from its pickled recipe."""
    code = (
        "import sys, torch, shardflow as sf\n"
        "from shardflow.torch import IterableDataset\n"
        "rank = int(sys.argv[1])\n"
        "ds = sf.load_dataset('org/many', split='train')\n"
        "it = IterableDataset(ds, batch_size=8, shuffle=True, seed=1, rank=rank, world_size=2)\n"
        "loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=4, multiprocessing_context='spawn')\n"
        "print(sorted(int(i) for b in loader for i in b['id']))\n"
    )
    hub.reset_counts()
    runs = [subprocess.Popen([sys.executable, "-c", code, str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [r.communicate(timeout=300) for r in runs]
    for run, (out, err) in zip(runs, outs):
        assert run.returncode == 0, err[-3000:]
    got = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    assert len(got[0]) == len(got[1]) == 200 and sorted(got[0] + got[1]) == list(range(400))
    pages = -(-50 // hub.page_size)
    assert hub.counts["info"] == 2 and hub.counts["tree"] == 2 * pages, hub.counts


def test_spawned_workers_read_no_footer_the_parent_read(hub: HubServer, hub_env: dict[str, str]) -> None:
    """A pickled dataset carries the Parquet footers its process read, so 2 spawned torch
    workers rebuilding it make no more requests for the repo's files than 2 forked ones
    (which inherit them): without it, each spawned worker read all 50 footers again."""
    code = (
        "import sys, torch, shardflow as sf\n"
        "from shardflow.torch import IterableDataset\n"
        "ds = sf.load_dataset('org/many', split='train')\n"
        "it = IterableDataset(ds, batch_size=8)\n"
        "assert len(ds) == 400  # the parent reads the footers (as a trainer asking len() does)\n"
        "loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, multiprocessing_context=sys.argv[1])\n"
        "print(sorted(int(i) for b in loader for i in b['id']))\n"
    )
    requests = {}
    for context in ("fork", "spawn"):
        hub.reset_counts()
        run = subprocess.run([sys.executable, "-c", code, context], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.splitlines()[-1]) == list(range(400))
        requests[context] = hub.counts["resolve-get"] + hub.counts["storage-get"]  # the files' reads
    assert 0 < requests["spawn"] <= requests["fork"], requests
