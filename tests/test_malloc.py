"""`import shardflow` has glibc's malloc keep the memory of freed batches: `bytes` handed to
Python and dropped batch after batch are not faulted in afresh each time. A user's
`MALLOC_*_` setting stands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Batches of 256 values, each dropped before the next is made; the page faults the batches
# after the first cost. Dropped first, a batch leaves the top of glibc's heap free, so
# plain glibc gives it back every time (33,000-48,500 faults, whatever the environment).
# Dropped after the next was made, whether the heap shrinks depends on where start-up left
# small blocks, which the environment moves: 24,232 faults here, 518 with `env -i`, and
# 517 on CI.
CHILD = """
import json, resource, sys
if sys.argv[1] == "import":
    import shardflow
size, batches = int(sys.argv[2]), int(sys.argv[3])
batch = [b"x" * size for _ in range(256)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(batches):
    batch = None
    batch = [bytes([i % 256]) * size for _ in range(256)]
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


# glibc's own starting thresholds, held: left to itself glibc raises them the first time
# the process frees a mapped block above them, and the baseline would then depend on what
# the child's start-up happened to allocate. Setting them (as a user's MALLOC_*_ does)
# holds them.
GLIBC_STARTS_AT = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def faults(shardflow: bool, size: int = 8192, batches: int = 100, **env: str) -> int:
    # -E: the child ignores PYTHON* variables (PYTHONMALLOC=malloc puts Python's small
    # objects in glibc's heap too).
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-E", "-c", CHILD, "import" if shardflow else "plain", str(size),
                          str(batches)], env={**clean, **env}, check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return json.loads(out)


def transparent_huge_pages() -> str:
    """The kernel's setting, said when a baseline is off: with huge pages always on, a
    heap's pages are faulted in 2 MB at a time."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_batches_are_not_faulted_in_again() -> None:
    plain = faults(False, **GLIBC_STARTS_AT)
    # 100 batches of 2 MB, each faulted back in without (the heap shrinks when the batch
    # at its top goes): thousands of faults.
    said = sorted(k for k in os.environ if k.startswith(("PYTHON", "LD_")))
    assert plain > 10_000, (plain, transparent_huge_pages(), said)
    assert faults(True) < plain / 10
    # The user's setting (here glibc's own default) is left as it is.
    assert faults(True, MALLOC_TRIM_THRESHOLD_="131072") > plain / 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_batches_of_large_values_are_not_faulted_in_again() -> None:
    # 256 values of 256 KB: a batch of 64 MB and their headers, just over the 64 MB of
    # freed heap glibc keeps at most on its own. Given back, a batch faults its pages in
    # again (16,000 faults a batch; 130,000-196,000 for these 12 here).
    size, batches = 256 << 10, 12
    plain = faults(False, size, batches)
    assert plain > batches * 5_000, plain
    # Kept: none once the first batch has grown the heap, whatever the count.
    assert faults(True, size, batches) < plain / 5
