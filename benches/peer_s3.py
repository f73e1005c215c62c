"""S3 throughput against a local SeaweedFS, in one run, side by side:

- 2,000 objects of 100 KB, one object = one sample: shardflow (format="raw"), boto3 with
  a thread pool of 64, and the server's ceiling measured by wrk (64 connections);
- one 256 MB object: shardflow (parallel 8 MB ranges), boto3 with a thread pool over
  the same ranges, and a single boto3 GET;
- the same with 25 ms of latency added by the fault proxy in front of the server.

Reports objects/s, MB/s and client CPU seconds per GB (user + system time of this
process: shardflow's threads, or boto3's), and the server's CPU per request (its user +
system time over the run, from /proc): what the requests' shape costs the server, beside
wrk's plain GETs. `python benches/peer_s3.py [--repeats 3]`
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from faultproxy import FaultProxy  # noqa: E402
from servers import Seaweed  # noqa: E402

import pyarrow.compute as pc  # noqa: E402

import shardflow as sf  # noqa: E402

SMALL, SMALL_SIZE = 2000, 100 * 1024
BIG_SIZE, CHUNK = 256 * 1024 * 1024, 8 * 1024 * 1024


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu(pid: int) -> float:
    """User + system seconds the server process has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(run: Callable[[], tuple[int, int]], repeats: int, server_pid: int) -> tuple:
    """Median seconds, objects and bytes of one run, CPU seconds per GB, and the server's
    CPU microseconds per object."""
    times, cpus, served = [], [], []
    objects = size = 0
    for _ in range(repeats):
        c0, s0, t0 = cpu(), server_cpu(server_pid), time.perf_counter()
        objects, size = run()
        times.append(time.perf_counter() - t0)
        cpus.append(cpu() - c0)
        served.append((server_cpu(server_pid) - s0) / objects * 1e6)
    t = statistics.median(times)
    return t, objects, size, statistics.median(cpus) / (size / 1e9), statistics.median(served)


def report(name: str, result: tuple) -> None:
    t, objects, size, cpu_per_gb, server_us = result
    print(f"  {name:44s} {objects / t:10,.0f} objects/s {size / t / 1e6:9.1f} MB/s {cpu_per_gb:7.2f} CPU s/GB"
          f" {server_us:6.0f} server CPU us/request")


def wrk_run(endpoint: str, paths: list[str], server_pid: int | None = None) -> tuple[float, float | None] | None:
    """GETs per second that wrk (2 threads, 64 connections, 8 s) gets from `endpoint`,
    cycling through `paths`, and the server's CPU microseconds per GET (when its pid is
    given); None when wrk is not installed."""
    if not shutil.which("wrk"):
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write("paths = {" + ",".join(f'"/{p}"' for p in paths) + "}\n")
        script.write("i = 0\nrequest = function()\n  i = i % #paths + 1\n  return wrk.format('GET', paths[i])\nend\n")
    s0 = server_cpu(server_pid) if server_pid else 0.0
    out = subprocess.run(
        ["wrk", "-t2", "-c64", "-d8s", "-s", script.name, endpoint], capture_output=True, text=True, check=True
    ).stdout
    served = server_cpu(server_pid) - s0 if server_pid else None
    os.unlink(script.name)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rps, None if served is None else served / requests * 1e6


def wrk_ceiling(endpoint: str, keys: list[str], size: int, latency_note: str, server_pid: int) -> None:
    measured = wrk_run(endpoint, keys, server_pid)
    if measured is None:
        print("  wrk not installed (apt-get install wrk): no server ceiling")
        return
    rps, server_us = measured
    print(f"  {'server ceiling (wrk, 64 connections)' + latency_note:44s} {rps:10,.0f} objects/s {rps * size / 1e6:9.1f} MB/s"
          f" {'':17s}{server_us:6.0f} server CPU us/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        # No auth, so wrk's unsigned GETs are served like the signed ones.
        server = Seaweed(Path(d), auth=False)
        proxy = FaultProxy("127.0.0.1", server.ports["s3"])
        pid = server.process.pid
        try:
            client = server.client()
            client.create_bucket(Bucket="bench")
            payload = os.urandom(SMALL_SIZE)
            keys = [f"small/{i:05d}.bin" for i in range(SMALL)]
            with ThreadPoolExecutor(32) as pool:
                list(pool.map(lambda k: client.put_object(Bucket="bench", Key=k, Body=payload), keys))
            client.put_object(Bucket="bench", Key="big/blob.bin", Body=os.urandom(BIG_SIZE))
            print(f"SeaweedFS {server.s3_url}, cpus={os.cpu_count()}, medians of {args.repeats}")
            for latency in (0.0, 0.025):
                proxy.set_faults(latency=latency)
                endpoint = proxy.url if latency else server.s3_url
                note = f" +{latency * 1000:.0f} ms" if latency else ""
                s3 = server.client(endpoint)
                options = server.storage_options(endpoint, max_concurrency=64)
                small_ds = sf.dataset("s3://bench/small/", format="raw", storage_options=options)
                big_ds = sf.dataset("s3://bench/big/blob.bin", format="raw", storage_options=options)

                def shardflow_small() -> tuple[int, int]:
                    n = sum(b.num_rows for b in sf.DataLoader(small_ds, batch_size=64, output="arrow"))
                    return n, n * SMALL_SIZE

                def boto3_small() -> tuple[int, int]:
                    with ThreadPoolExecutor(64) as pool:
                        sizes = list(pool.map(lambda k: len(s3.get_object(Bucket="bench", Key=k)["Body"].read()), keys))
                    return len(sizes), sum(sizes)

                def shardflow_big() -> tuple[int, int]:
                    (batch,) = list(sf.DataLoader(big_ds, batch_size=1, output="arrow"))
                    # Measured with a kernel: pyarrow's scalar access (column[0]) copies the value.
                    return 1, pc.binary_length(batch.to_pyarrow().column("bytes"))[0].as_py()

                def boto3_big_ranges() -> tuple[int, int]:
                    def part(start: int) -> int:
                        r = f"bytes={start}-{min(start + CHUNK, BIG_SIZE) - 1}"
                        return len(s3.get_object(Bucket="bench", Key="big/blob.bin", Range=r)["Body"].read())

                    with ThreadPoolExecutor(32) as pool:
                        return 1, sum(pool.map(part, range(0, BIG_SIZE, CHUNK)))

                def boto3_big_single() -> tuple[int, int]:
                    return 1, len(s3.get_object(Bucket="bench", Key="big/blob.bin")["Body"].read())

                print(f"{SMALL:,} objects of {SMALL_SIZE // 1024} KB{note}:")
                report("shardflow (raw, 1 object = 1 sample)", measure(shardflow_small, args.repeats, pid))
                report("boto3, thread pool of 64", measure(boto3_small, args.repeats, pid))
                if not latency:
                    wrk_ceiling(server.s3_url, [f"bench/{k}" for k in keys], SMALL_SIZE, note, pid)
                print(f"one {BIG_SIZE >> 20} MB object{note}:")
                report("shardflow (parallel 8 MB ranges)", measure(shardflow_big, args.repeats, pid))
                report("boto3, 32 threads over 8 MB ranges", measure(boto3_big_ranges, args.repeats, pid))
                report("boto3, one GET", measure(boto3_big_single, args.repeats, pid))
        finally:
            proxy.close()
            server.stop()


if __name__ == "__main__":
    main()
