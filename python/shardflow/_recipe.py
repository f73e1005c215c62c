"""Rebuilding a pickled :class:`shardflow.Dataset` from its recipe."""

from __future__ import annotations

from typing import Any


def rebuild(steps: list[tuple[str, Any]]) -> Any:
    """Replays ``dataset(**kwargs)`` (or ``from_arrow`` / ``from_dict`` / ``from_list`` /
    ``concatenate`` / ``interleave``, whose datasets pickle by their own recipes) and
    then each op call."""
    import shardflow

    (first, kwargs), *ops = steps
    if first not in (
        "dataset",
        "from_arrow",
        "from_dict",
        "from_list",
        "concatenate",
        "interleave",
    ):
        raise ValueError(f"not a shardflow dataset recipe: {first!r}")
    ds = getattr(shardflow, first)(**kwargs)
    for method, args in ops:
        ds = getattr(ds, method)(*args)
    return ds
