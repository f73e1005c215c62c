"""Is my training input-bound? ``DataLoader.report()`` answers it.

The report covers the loader's epoch so far (the whole of the last epoch once it has
ended) or its last ``seconds``. Its verdict is the share of the consumer's wall time spent
blocked in ``next()``; beside it, each stage's busy time against the threads it has,
the queue of ready batches, and the I/O's latencies. Waiting time is not split across
stages (their intervals overlap, and any split would be made up): the report names the
busiest stage instead.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: From this share of the wall time spent waiting for batches, training is input-bound.
INPUT_BOUND_SHARE = 0.05

__all__ = ["IOScheme", "Queue", "Report", "Stage", "headspace"]


@dataclass
class Stage:
    """One stage of the loader: its busy time summed over its threads, and what it handled.

    ``utilisation`` is ``busy_seconds / (threads * wall_seconds)``: near 1, the stage is
    saturated. ``p50_seconds``/``p99_seconds`` are per item (a request, a decode task, a
    call of an op on a batch) where items are timed one by one.
    """

    name: str
    threads: int
    busy_seconds: float
    utilisation: float
    items: int | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    bytes_in: int | None = None
    p50_seconds: float | None = None
    p99_seconds: float | None = None


@dataclass
class Queue:
    """A queue between two stages: always empty means the stage above it is slow,
    always full the one below it (for the ready-batches queue: the training step)."""

    name: str
    capacity: int
    mean_depth: float
    empty_share: float
    full_share: float
    peak_bytes: int = 0


@dataclass
class IOScheme:
    """Remote requests of one URL scheme (``s3``, ``https``, ``hf``...): their count and
    time in flight, latency percentiles, the retries and throttled answers among them,
    and the bytes they brought."""

    scheme: str
    requests: int
    busy_seconds: float
    p50_seconds: float | None
    p99_seconds: float | None
    retries: int = 0
    throttled: int = 0
    bytes: int = 0


@dataclass
class Report:
    """The answer to "is my training input-bound?" for one loader (or, from
    :meth:`combine`, for several: ranks, workers)."""

    wall_seconds: float
    waiting_seconds: float
    waiting_share: float
    input_bound: bool
    rows: int
    batches: int
    stages: list[Stage]
    queues: list[Queue]
    io: list[IOScheme]
    requests: int
    retries: int
    throttled: int
    bytes_fetched: int
    cache_hits: int
    memory: dict[str, int | None]
    busiest: str | None
    parts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """One line: input-bound or not, and the busiest stage."""
        share = f"{self.waiting_share:.1%}"
        busiest = next((s for s in self.stages if s.name == self.busiest), None)
        where = (f"; the busiest stage is {busiest.name}, at {busiest.utilisation:.0%} of its "
                 f"{busiest.threads} thread{'s' if busiest.threads != 1 else ''}") if busiest else ""
        if self.input_bound:
            return f"input-bound: {share} of the time waiting for batches{where}"
        return f"not input-bound: {share} of the time waiting for batches{where}"

    @classmethod
    def from_counters(cls, c: dict[str, Any]) -> Report:
        """The report of one loader's counters (``DataLoader._report_counters()``)."""
        wall = max(c["wall_seconds"], 1e-9)
        threads = max(int(c["num_threads"]), 1)
        stages: list[Stage] = []

        def stage(name: str, n: int, busy: float, **more: Any) -> None:
            stages.append(Stage(name, n, busy, min(busy / (n * wall), 1.0), **more))

        limit = int(c["max_concurrency"] or 1)
        for io in c["io"]:
            stage(f"I/O ({io['scheme']})", limit, io["seconds"], items=io["count"],
                  bytes_in=io["bytes"], p50_seconds=io["p50_seconds"], p99_seconds=io["p99_seconds"])
        d = c["decode"]
        if d["count"]:
            stage("decode", threads, d["seconds"], items=d["count"], rows_out=None, bytes_in=c["bytes_read"],
                  p50_seconds=d["p50_seconds"], p99_seconds=d["p99_seconds"])
        # Ops run on the pipeline thread, or on the batch threads with re-batching: their
        # time is their own stage's, not counted again in those.
        on_pipeline = on_batch_threads = 0.0
        for op in c["ops"]:
            if not op["count"]:
                continue
            if op["on_threads"]:
                on_batch_threads += op["seconds"]
            else:
                on_pipeline += op["seconds"]
            stage(op["name"], threads if op["on_threads"] else 1, op["seconds"], items=op["count"],
                  rows_in=op["rows_in"], rows_out=op["rows_out"],
                  p50_seconds=op["p50_seconds"], p99_seconds=op["p99_seconds"])
        if c["shuffle_cpu_seconds"] > 0:
            stage("shuffle", 1, c["shuffle_cpu_seconds"])
        if c["assemble_seconds"] > on_batch_threads:
            stage("re-batch", threads, c["assemble_seconds"] - on_batch_threads)
        # The pipeline thread's own work: ordering, re-batching, gathers (the ops it ran
        # are stages of their own).
        stage("pipeline", 1, max(c["pipeline_cpu_seconds"] - on_pipeline, 0.0), rows_out=c["rows"])
        stage("hand-off to Python", 1, c["consumer_cpu_seconds"], items=c["batches"], rows_out=c["rows"])
        queues = [Queue(q["name"], int(q["capacity"]), q["mean_depth"], q["empty_share"], q["full_share"],
                        q["peak_bytes"]) for q in c["queues"]]
        io = [IOScheme(i["scheme"], i["count"], i["seconds"], i["p50_seconds"], i["p99_seconds"], i["retries"],
                       i["throttled"], i["bytes"]) for i in c["io"]]
        busiest = max(stages, key=lambda s: s.utilisation).name if stages else None
        share = min(c["wait_seconds"] / wall, 1.0)
        return cls(
            wall_seconds=c["wall_seconds"], waiting_seconds=c["wait_seconds"], waiting_share=share,
            input_bound=share >= INPUT_BOUND_SHARE, rows=c["rows"], batches=c["batches"], stages=stages,
            queues=queues, io=io, requests=c["requests"], retries=c["retries"], throttled=c["throttled"],
            bytes_fetched=c["bytes_fetched"], cache_hits=c["cache_hits"],
            memory={"memory_limit": c["memory_limit"],
                    "buffered_peak_bytes": sum(q.peak_bytes for q in queues)},
            busiest=busiest,
        )

    @classmethod
    def combine(cls, reports: list[Report], labels: list[str] | None = None) -> Report:
        """One view of several loaders' reports (ranks, or the workers of a rank): busy
        times and counts summed, shares over the summed wall time; ``parts`` lists each
        one's verdict, and the straggler is the part that waited least and delivered
        fewest rows a second (the others wait for it at the next collective)."""
        if not reports:
            raise ValueError("combine needs at least one report")
        labels = labels or [f"part {i}" for i in range(len(reports))]
        wall = sum(r.wall_seconds for r in reports)
        waiting = sum(r.waiting_seconds for r in reports)
        stages: dict[str, Stage] = {}
        for r in reports:
            for s in r.stages:
                into = stages.setdefault(s.name, Stage(s.name, s.threads, 0.0, 0.0, items=0))
                into.busy_seconds += s.busy_seconds
                into.items = (into.items or 0) + (s.items or 0)
        for s in stages.values():
            s.utilisation = min(s.busy_seconds / (s.threads * max(wall, 1e-9)), 1.0)
        rates = [r.rows / max(r.wall_seconds, 1e-9) for r in reports]
        straggler = min(range(len(reports)), key=lambda i: rates[i])
        parts = [{"label": label, "verdict": r.verdict, "rows_per_second": rate, "straggler": i == straggler,
                  "report": r.to_dict()}
                 for i, (label, r, rate) in enumerate(zip(labels, reports, rates))]
        share = min(waiting / max(wall, 1e-9), 1.0)
        ordered = list(stages.values())
        return cls(
            wall_seconds=max(r.wall_seconds for r in reports), waiting_seconds=waiting, waiting_share=share,
            input_bound=share >= INPUT_BOUND_SHARE, rows=sum(r.rows for r in reports),
            batches=sum(r.batches for r in reports), stages=ordered,
            queues=[q for r in reports for q in r.queues], io=[i for r in reports for i in r.io],
            requests=sum(r.requests for r in reports), retries=sum(r.retries for r in reports),
            throttled=sum(r.throttled for r in reports), bytes_fetched=sum(r.bytes_fetched for r in reports),
            cache_hits=sum(r.cache_hits for r in reports),
            memory={"memory_limit": max(r.memory["memory_limit"] or 0 for r in reports),
                    "buffered_peak_bytes": max(r.memory["buffered_peak_bytes"] or 0 for r in reports)},
            busiest=max(ordered, key=lambda s: s.utilisation).name if ordered else None, parts=parts,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The report :meth:`to_dict` gave (from another process, say)."""
        fields = {k: v for k, v in d.items() if k != "verdict"}
        return cls(**{**fields, "stages": [Stage(**s) for s in d["stages"]], "queues": [Queue(**q) for q in d["queues"]],
                      "io": [IOScheme(**i) for i in d["io"]]})

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serialisable), with the verdict."""
        return {**asdict(self), "verdict": self.verdict}

    def __str__(self) -> str:
        def ms(s: float | None) -> str:
            return "" if s is None else f"{s * 1e3:.2f}"

        lines = [self.verdict,
                 f"{self.rows:,} rows in {self.batches:,} batches over {self.wall_seconds:.2f} s "
                 f"({self.rows / max(self.wall_seconds, 1e-9):,.0f} rows/s); waiting {self.waiting_seconds:.2f} s",
                 "",
                 f"{'stage':<32} {'threads':>7} {'busy s':>8} {'util':>6} {'items':>9} {'p50 ms':>9} {'p99 ms':>9}"]
        for s in sorted(self.stages, key=lambda s: -s.utilisation):
            lines.append(f"{s.name[:32]:<32} {s.threads:>7} {s.busy_seconds:>8.2f} {s.utilisation:>6.0%} "
                         f"{'' if s.items is None else f'{s.items:,}':>9} {ms(s.p50_seconds):>9} {ms(s.p99_seconds):>9}")
        lines.append("")
        for q in self.queues:
            lines.append(f"queue of {q.name}: capacity {q.capacity}, mean depth {q.mean_depth:.1f}, "
                         f"empty {q.empty_share:.0%} of the time, full {q.full_share:.0%}, "
                         f"at most {q.peak_bytes / 2**20:,.1f} MiB")
        if self.requests:
            lines += ["", f"I/O: {self.requests:,} requests, {self.bytes_fetched / 1e6:,.1f} MB, "
                          f"{self.retries} retries ({self.throttled} throttled), {self.cache_hits} cache hits"]
            lines += [f"  {i.scheme}: {i.requests:,} requests, p50 {ms(i.p50_seconds)} ms, p99 {ms(i.p99_seconds)} ms, "
                      f"{i.retries} retries ({i.throttled} throttled), {i.bytes / 1e6:,.1f} MB" for i in self.io]
        peak, limit = self.memory.get("buffered_peak_bytes"), self.memory.get("memory_limit")
        if limit:
            lines += ["", f"memory: at most {(peak or 0) / 2**20:,.1f} MiB read ahead and ready at once, "
                          f"of memory_limit {limit / 2**20:,.0f} MiB"]
        for p in self.parts:
            lines.append(f"{p['label']}: {p['verdict']}{' (the straggler)' if p['straggler'] else ''}")
        return "\n".join(lines)


def headspace(loader: Any, seconds: float = 10.0) -> dict[str, Any]:
    """Reads ``loader`` (a fresh one: ``DataLoader.headspace`` makes it) with no step
    between batches for ``seconds``, going on into later epochs if one ends first, and
    says how fast it went: the most the loader can give a training loop."""
    start = time.perf_counter()
    done = False
    while not done:
        for _ in loader:
            if time.perf_counter() - start >= seconds:
                done = True
                break
        else:
            done = time.perf_counter() - start >= seconds
    elapsed = time.perf_counter() - start
    stats = loader.stats()
    return {
        "seconds": elapsed,
        "rows_per_second": stats["rows"] / elapsed,
        "batches_per_second": stats["batches"] / elapsed,
        "report": loader.report(seconds=elapsed),
    }
