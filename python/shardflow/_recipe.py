"""Rebuilding a pickled :class:`shardflow.Dataset` from its recipe."""

from __future__ import annotations

from typing import Any


def rebuild(steps: list[tuple[str, Any]]) -> Any:
    """Replays ``dataset(**kwargs)`` and then each op call."""
    import shardflow

    (first, kwargs), *ops = steps
    assert first == "dataset"
    ds = shardflow.dataset(**kwargs)
    for method, args in ops:
        ds = getattr(ds, method)(*args)
    return ds
