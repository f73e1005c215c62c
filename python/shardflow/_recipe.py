"""Rebuilding a pickled :class:`shardflow.Dataset` from its recipe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def rebuild(steps: list[tuple[str, Any]], epoch: int = 0, footers: Sequence[tuple[str, int, bytes]] = ()) -> Any:
    """Replays ``dataset(**kwargs)`` (or ``from_arrow`` / ``from_dict`` / ``from_list`` / ``from_pandas`` /
    ``concatenate`` / ``interleave``, whose datasets pickle by their own recipes) and
    then each op call, and sets the dataset's epoch. ``footers``: the Parquet footers the
    pickling process had read of its files (URL, size, bytes), used instead of reading
    them again."""
    import shardflow
    from shardflow import _native

    if footers:
        _native._give_footers(list(footers))

    (first, kwargs), *ops = steps
    if first not in (
        "dataset",
        "from_arrow",
        "from_dict",
        "from_list",
        "from_pandas",
        "concatenate",
        "interleave",
    ):
        raise ValueError(f"not a shardflow dataset recipe: {first!r}")
    ds = getattr(shardflow, first)(**kwargs)
    for method, args in ops:
        ds = getattr(ds, method)(**args) if isinstance(args, dict) else getattr(ds, method)(*args)
    ds.set_epoch(epoch)
    return ds
