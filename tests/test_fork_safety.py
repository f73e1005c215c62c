"""fork() while shardflow's threads call into Python: the child must not hang.

A pipeline thread that runs a user's map function has no Python thread state, so each
call makes one, under CPython's thread-list lock and before taking the GIL. A fork at
that moment (a PyTorch DataLoader starting its workers) copied the lock taken, and on
CPython before 3.11.8 / 3.12.1 (gh-112275) the child hung for ever inside os.fork(),
before running any Python: the torch workers that never answered in
tests/test_training_loops.py. shardflow now holds such threads back while a fork is
under way (src/python/fork.rs). scripts/stress-fork.sh runs the torch form of this for
longer, under load.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import shardflow as sf

FORKS = 800


def plus_one(row: dict) -> dict:
    return {"id": row["id"] + 1}


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forks_while_pipeline_threads_call_python_never_hang() -> None:
    stop = threading.Event()
    ds = sf.from_dict({"id": np.arange(4000)}).map(plus_one)

    def read_until_stopped() -> None:
        while not stop.is_set():
            for _ in sf.DataLoader(ds, batch_size=1, num_threads=2):
                if stop.is_set():
                    break

    readers = [threading.Thread(target=read_until_stopped, daemon=True) for _ in range(4)]
    for reader in readers:
        reader.start()
    hung = 0
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            deadline = time.monotonic() + 20
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.0005)
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=30)
    assert hung == 0, f"{hung} of {FORKS} forked children hung"


EXIT_MID_CALL = """
import sys, time
import numpy as np
import shardflow as sf

def burn(row):
    until = time.perf_counter() + 2e-4
    while time.perf_counter() < until:
        pass
    return row

# Shards of 500 rows: a pipeline maps one (0.1 s) while the next batch is asked for.
sf.from_dict({"x": np.arange(20_000)}).write(sys.argv[1], max_rows_per_shard=500)
loaders = [sf.DataLoader(sf.dataset(sys.argv[1]).map(burn), batch_size=256) for _ in range(3)]
for loader in loaders:
    for batch in loader:
        break
# The pipeline threads are mid-call in `burn` as the interpreter exits.
print("exiting", flush=True)
"""


def test_exiting_while_pipeline_threads_are_in_python_is_clean(tmp_path) -> None:  # noqa: ANN001
    """A thread of ours that wants the GIL back after finalization has begun would be
    ended by CPython with pthread_exit, which aborts the process: the exit waits for them
    to leave Python, and lets none enter again."""
    import subprocess
    import sys

    # Without the exit's wait, one run in six aborted here (SIGABRT, nothing on stderr).
    for i in range(8):
        run = subprocess.run([sys.executable, "-c", EXIT_MID_CALL, str(tmp_path / str(i))],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout == "exiting\n", (run.returncode, run.stderr[-2000:])
