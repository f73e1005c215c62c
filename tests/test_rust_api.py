"""The Rust API's example (`examples/read_batches.rs`) runs: it writes a dataset, then
reads it back from a local glob and from S3 (SeaweedFS)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servers import S3_KEY, S3_SECRET

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/shardflow/target"))


@pytest.fixture(scope="module")
def example() -> Path:
    # The project builds from source with cargo, so it is there wherever the tests run.
    cargo = shutil.which("cargo") or "cargo"
    # A no-op after scripts/test.sh's `cargo test --examples`; a build otherwise.
    subprocess.run(
        [cargo, "build", "--release", "--locked", "--example", "read_batches"],
        cwd=ROOT, check=True, env={**os.environ, "CARGO_TARGET_DIR": str(TARGET)}, timeout=1200,
    )
    return TARGET / "release" / "examples" / "read_batches"


def test_read_batches_example_local_and_s3(example: Path, tmp_path: Path, seaweed) -> None:  # noqa: ANN001
    seaweed.client().create_bucket(Bucket="rust-example")
    env = {
        **os.environ,
        "SHARDFLOW_EXAMPLE_S3": "s3://rust-example/ids",
        "AWS_ENDPOINT_URL": seaweed.s3_url,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_REGION": "us-east-1",
    }
    out = subprocess.run([example, tmp_path], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    total = sum(range(10_000))
    assert lines[0].startswith(f"local glob: 10000 rows in 10 shards, sum of ids {total}, ")
    assert lines[1] == "wrote 4 shards to s3://rust-example/ids"
    assert lines[2].startswith(f"s3: 10000 rows in 4 shards, sum of ids {total}, ")
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["_shardflow.json", "part-00000.parquet"]
