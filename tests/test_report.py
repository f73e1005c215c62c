"""`DataLoader.report()`: is training input-bound, and which stage is busiest.

Three runs made to have a known answer: a training step slower than the loader (not
input-bound), a Python map that burns CPU (input-bound, the map busiest), and S3 behind a
proxy that adds 50 ms to every request with two requests in flight (input-bound, I/O
busiest, its p50 at least 50 ms). Then the windows, the headspace, the combined view of
ranks and torch workers, and `shardflow profile`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf

from faultproxy import FaultProxy
from servers import Seaweed


def write_rows(directory: Path, files: int = 4, rows: int = 5_000) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}), directory / f"part-{f}.parquet")
    return str(directory / "part-*.parquet")


def burn(row: dict) -> dict:
    """A per-sample function that costs about 0.1 ms of CPU."""
    until = time.perf_counter() + 1e-4
    while time.perf_counter() < until:
        pass
    return {"y": row["x"] * 2}


def test_a_slow_training_step_is_not_input_bound(tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(write_rows(tmp_path)), batch_size=256)
    for _ in loader:
        time.sleep(0.02)  # the training step
    report = loader.report()
    assert not report.input_bound, str(report)
    assert report.waiting_share < 0.05
    assert report.verdict.startswith("not input-bound")
    assert report.rows == 20_000 and report.batches == 79
    assert report.wall_seconds >= 79 * 0.02
    # The training step is the bottleneck: the ready batches' queue stays full.
    ahead, ready = report.queues
    assert (ahead.name, ready.name) == ("units read ahead", "ready batches")
    assert ready.full_share > 0.5 and ready.empty_share < 0.2, str(report)
    assert 0 < ready.peak_bytes <= report.memory["buffered_peak_bytes"] <= report.memory["memory_limit"]
    decode = next(s for s in report.stages if s.name == "decode")
    assert decode.items >= 4 and decode.p50_seconds is not None and decode.utilisation < 0.5


def test_a_python_map_that_burns_cpu_is_the_busiest_stage(tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(write_rows(tmp_path, files=2, rows=2_000)).map(burn), batch_size=64)
    rows = sum(len(b["y"]) for b in loader)
    assert rows == 4_000
    report = loader.report()
    assert report.input_bound, str(report)
    assert report.waiting_share > 0.5
    busiest = next(s for s in report.stages if s.name == report.busiest)
    assert busiest.name.startswith("map(") and "burn" in busiest.name, str(report)
    assert busiest.threads == 1 and busiest.utilisation > 0.7
    assert busiest.rows_in == busiest.rows_out == 4_000
    # 4,000 calls of 0.1 ms at least, in batches of up to 64 rows per call of the op.
    assert busiest.busy_seconds >= 0.4 and busiest.p50_seconds is not None and busiest.p50_seconds > 1e-3
    assert report.verdict.startswith(f"input-bound: {report.waiting_share:.1%} of the time waiting for batches; "
                                     f"the busiest stage is {busiest.name}")
    ready = next(q for q in report.queues if q.name == "ready batches")
    assert ready.empty_share > 0.5


@pytest.fixture
def slow_bucket(seaweed: Seaweed, tmp_path: Path) -> str:
    s3 = seaweed.client()
    s3.create_bucket(Bucket="report")
    local = write_rows(tmp_path / "local", files=12, rows=100)
    for path in sorted(Path(local).parent.glob("*.parquet")):
        s3.upload_file(str(path), "report", path.name)
    return "s3://report/part-*.parquet"


def test_slow_s3_with_two_requests_in_flight_is_io_bound(slow_bucket: str, seaweed: Seaweed, proxy: FaultProxy,
                                                         tmp_path: Path) -> None:
    options = seaweed.storage_options(proxy.url, max_concurrency=2)
    ds = sf.dataset(slow_bucket, storage_options=options)
    # 50 ms before every answer, and one GET in five answered 503 SlowDown.
    proxy.set_faults(latency=0.05, slow_down=0.2, seed=3)
    loader = sf.DataLoader(ds, batch_size=50, trace=tmp_path / "s3.json")
    assert sum(len(b["id"]) for b in loader) == 1_200
    report = loader.report()
    assert report.input_bound, str(report)
    assert report.busiest == "I/O (s3)", str(report)
    (io,) = report.io
    assert io.scheme == "s3" and io.requests == report.requests >= 12
    assert io.p50_seconds is not None and io.p50_seconds >= 0.05
    assert io.retries == report.retries > 0 and io.throttled == report.throttled
    assert io.bytes == report.bytes_fetched > 0
    stage = next(s for s in report.stages if s.name == "I/O (s3)")
    # Its share of the two request slots: read-ahead of these small files keeps one or two
    # requests in flight.
    assert stage.threads == 2 and stage.utilisation > 0.4
    assert "p50" in str(report) and "I/O: " in str(report)
    # On the timeline, each request is an async span of at least the added 50 ms.
    events = json.loads((tmp_path / "s3.json").read_text())["traceEvents"]
    begins = {e["id"]: e["ts"] for e in events if e["ph"] == "b"}
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "e"}
    assert len(begins) == len(ends) == report.requests
    assert sorted(ends[i] - begins[i] for i in begins)[len(begins) // 2] >= 50_000
    ahead = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "bytes read ahead"]
    assert ahead and max(ahead) > 0 and ahead[-1] == 0
    # The loop waited for its batches: its waits are spans on its thread.
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "wait for a batch"]
    assert waits and sum(e["dur"] for e in waits) / 1e6 <= report.waiting_seconds + 0.01
    spans_nest(events)


def test_windows_and_epochs(tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(write_rows(tmp_path)), batch_size=1_000)
    with pytest.raises(ValueError, match="iterate the loader first"):
        loader.report()
    for epoch in range(2):
        for i, _ in enumerate(loader):
            if epoch == 1 and i == 5:
                # Mid-epoch: the epoch so far.
                assert loader.report().rows == 6_000
            time.sleep(0.01)
    # After the epoch: the whole of it, not the loader's life.
    last = loader.report()
    assert last.rows == 20_000 and last.batches == 20
    # The last seconds span both epochs.
    both = loader.report(seconds=3600)
    assert both.rows == 40_000
    assert json.loads(json.dumps(last.to_dict()))["verdict"] == last.verdict
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="seconds="):
            loader.report(seconds=bad)


def test_headspace_reads_without_a_step_and_leaves_the_loader_alone(tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(write_rows(tmp_path)), batch_size=256, shuffle=True, seed=0)
    first = [b["id"].tolist() for b in loader]
    room = loader.headspace(seconds=0.5)
    assert room["seconds"] >= 0.5 and room["rows_per_second"] > 0 and room["batches_per_second"] > 0
    assert isinstance(room["report"], sf.Report) and room["report"].rows > 0
    # The loader's own position and counters are its own: its next epoch is epoch 1.
    assert loader.stats()["rows"] == 20_000
    again = sf.DataLoader(sf.dataset(write_rows(tmp_path)), batch_size=256, shuffle=True, seed=0)
    list(again)
    assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in again]
    assert sorted(sum(first, [])) == list(range(20_000))
    # A time that is not a number of seconds is refused, not read forever.
    for seconds in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="seconds="):
            loader.headspace(seconds=seconds)


def test_ranks_combine_and_the_straggler_is_named(tmp_path: Path) -> None:
    pattern = write_rows(tmp_path)
    reports = []
    for rank, step in ((0, 0.0), (1, 0.01)):
        loader = sf.DataLoader(sf.dataset(pattern), batch_size=500, rank=rank, world_size=2)
        for _ in loader:
            time.sleep(step)
        reports.append(loader.report())
    combined = sf.Report.combine(reports, labels=["rank 0", "rank 1"])
    assert combined.rows == 20_000
    assert [p["label"] for p in combined.parts if p["straggler"]] == ["rank 1"]
    assert "rank 1: " in str(combined) and "(the straggler)" in str(combined)
    assert combined.stages and combined.busiest in {s.name for s in combined.stages}


TORCH_WORKERS = """
import json, sys, time
import torch
import shardflow as sf
from shardflow.torch import IterableDataset

ds = IterableDataset(sf.dataset(sys.argv[1]), batch_size=250, rank=int(sys.argv[2]), world_size=2)
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
rows = sum(len(b["id"]) for b in loader)
print(json.dumps({"rows": rows, "report": ds.report().to_dict()}))
"""


def test_torch_workers_report_each_and_together(tmp_path: Path) -> None:
    pattern = write_rows(tmp_path)
    for rank in range(2):
        out = subprocess.run([sys.executable, "-c", TORCH_WORKERS, pattern, str(rank)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["rows"] == 10_000
        parts = got["report"]["parts"]
        assert [p["label"] for p in parts] == [f"rank {rank} worker 0", f"rank {rank} worker 1"]
        assert got["report"]["rows"] == 10_000


def test_profile_command_prints_the_report_and_draws_it(tmp_path: Path) -> None:
    pattern = write_rows(tmp_path / "data")
    (tmp_path / "slow_map.py").write_text(
        "import time\n\ndef f(row):\n    until = time.perf_counter() + 1e-4\n"
        "    while time.perf_counter() < until:\n        pass\n    return row\n"
    )
    png = tmp_path / "profile.png"
    run = subprocess.run([sys.executable, "-m", "shardflow", "profile", pattern, "--map", "slow_map:f",
                          "--seconds", "2", "--step-ms", "5", "--plot", str(png), "--json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["headspace_rows_per_second"] > 0
    assert out["report"]["busiest"].startswith("map(")
    assert out["timeline"]["headspace"] and out["timeline"]["consumer"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def spans_nest(events: list[dict]) -> None:
    """Every complete span on a thread lies inside the span open around it, or after it."""
    threads: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            threads.setdefault(e["tid"], []).append(e)
    for tid, spans in threads.items():
        open_ends: list[float] = []
        for s in sorted(spans, key=lambda s: (s["ts"], -s["dur"])):
            while open_ends and s["ts"] >= open_ends[-1]:
                open_ends.pop()
            end = s["ts"] + s["dur"]
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"thread {tid}: {s} overlaps its parent"
            open_ends.append(end)


TRACED = """
import json, sys
import torch
import shardflow as sf
from shardflow.torch import IterableDataset

ds = IterableDataset(sf.dataset(sys.argv[1]).map(lambda row: {"y": row["x"] + 1}), batch_size=250,
                     trace=sys.argv[2])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
rows = sum(len(b["id"]) for b in loader)
print(json.dumps({"rows": rows, "report": ds.report().to_dict()}))
"""


def test_a_two_worker_torch_run_keeps_a_timeline_per_worker(tmp_path: Path) -> None:
    pattern = write_rows(tmp_path / "data", files=8, rows=2_500)
    trace = tmp_path / "trace.json"
    out = subprocess.run([sys.executable, "-c", TRACED, pattern, str(trace)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == 20_000
    for worker, part in enumerate(got["report"]["parts"]):
        events = json.loads((tmp_path / f"trace.rank0-worker{worker}.json").read_text())["traceEvents"]
        spans_nest(events)
        names = {e["name"] for e in events if e["ph"] == "X"}
        # (The worker's loop may never wait for a batch: the S3 test checks those spans.)
        assert "decode" in names and any(n.startswith("map(") for n in names), names
        # The decode spans cover the decode time the worker's report counts.
        decode = next(s for s in part["report"]["stages"] if s["name"] == "decode")
        traced = sum(e["dur"] for e in events if e["ph"] == "X" and e["name"] == "decode") / 1e6
        assert traced >= 0.9 * decode["busy_seconds"] > 0
        # The ready batches' depth, read back from its counter.
        depths = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "ready batches"]
        assert depths and min(depths) >= 0 and max(depths) >= 1
        threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert any(t.startswith("shardflow") for t in threads), threads
    assert not (tmp_path / "trace.json").exists()


def test_a_trace_needs_its_folder_and_is_written_when_the_loader_goes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="folder does not exist"):
        sf.DataLoader(sf.dataset(write_rows(tmp_path)), trace=tmp_path / "missing" / "t.json")
    loader = sf.DataLoader(sf.dataset(write_rows(tmp_path)), batch_size=1_000, trace=tmp_path / "t.json")
    for _ in loader:
        break
    del loader
    # Left part-way, the loader writes what it has when it goes.
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
