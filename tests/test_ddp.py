"""Real multi-process DDP: 3 processes joined by torch.distributed (gloo, CPU), each with 2
DataLoader workers, call `all_reduce` every step over JSONL and TFRecord shards of
deliberately uneven sizes. Every process finishes the epoch (no rank waits on another
that ran out), every row comes once (the padding aside, which `DistributedSampler` also
adds), and an epoch killed mid-way on 3 processes finishes on 2, every row once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_for
from test_random_access import write_shards

SIZES = [1, 97, 40, 253, 31, 7]  # 429 rows
TOTAL = sum(SIZES)
WORKERS = 2
BATCH = 16
DDP_WORKER = Path(__file__).with_name("ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(world: int, spec: dict, worker: Path = DDP_WORKER, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """`world` ranks of `worker`, each a process of its own, joined as torchrun joins them
    (one process: no distributed run); their output goes to OUT/rank-N.log."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, **(env or {}))
        if world > 1:
            rank_env.update(
                RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
            )
        with open(Path(spec["out"]) / f"rank-{rank}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, str(worker), json.dumps(spec)], env=rank_env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def finish(procs: list[subprocess.Popen], out: Path, timeout: float = 240) -> None:
    """Waits for every rank (killing all at the deadline) before judging any, so a failing
    rank never leaves its peer running past the test."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            pytest.fail("a rank did not finish (waiting on another in a collective?)")
    for rank, p in enumerate(procs):
        assert p.returncode == 0, (out / f"rank-{rank}.log").read_text()[-5000:]


def keys(out: Path, world: int) -> list[list[int]]:
    return [json.loads((out / f"keys-{r}.json").read_text()) for r in range(world)]


def padded_total(rows: int, parts: int) -> int:
    """Rows that `parts` equal, padded shares of `rows` hold."""
    return parts * -(-rows // parts)


@pytest.fixture(params=["jsonl", "tfrecord"])
def shards(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str]]:
    return request.param, write_shards(tmp_path / "data", request.param, SIZES)


def test_three_ranks_finish_the_epoch_with_every_row(shards: tuple[str, list[str]], tmp_path: Path) -> None:
    fmt, paths = shards
    finish(launch(3, {"fmt": fmt, "paths": paths, "batch_size": BATCH, "out": str(tmp_path)}), tmp_path)
    steps = [json.loads((tmp_path / f"steps-{r}.json").read_text()) for r in range(3)]
    assert len(set(steps)) == 1
    got = [k for rank in keys(tmp_path, 3) for k in rank]
    assert set(got) == set(range(TOTAL))
    assert len(got) == padded_total(TOTAL, 3)  # ranks are padded, never a rank's workers


def test_killed_on_three_ranks_resumes_on_two(shards: tuple[str, list[str]], tmp_path: Path) -> None:
    fmt, paths = shards
    first = tmp_path / "first"
    first.mkdir()
    spec = {"fmt": fmt, "paths": paths, "batch_size": BATCH, "out": str(first), "stop_at": 3}
    procs = launch(3, spec)
    try:
        assert wait_for(lambda: all((first / f"ready-{r}").exists() for r in range(3)), timeout=240), "no checkpoint"
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    before = [k for rank in keys(first, 3) for k in rank]
    assert len(before) == len(set(before)) == 3 * 3 * BATCH
    states = [s for r in range(3) for s in json.loads((first / f"state-{r}.json").read_text())]
    assert len(states) == 3 * WORKERS
    (tmp_path / "states.json").write_text(json.dumps(states))
    second = tmp_path / "second"
    second.mkdir()
    finish(launch(2, {**spec, "out": str(second), "stop_at": None, "resume": str(tmp_path / "states.json")}), second)
    after = [k for rank in keys(second, 2) for k in rank]
    rest = TOTAL - len(before)
    assert set(after) == set(range(TOTAL)) - set(before)
    assert len(after) == padded_total(rest, 2)
