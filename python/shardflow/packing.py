"""Packed rows (``Dataset.pack``) laid out for frameworks that want fixed shapes.

:func:`fixed_shape` gives a batch of packs the layout of Grain's packing transforms,
which TPU/XLA training loops (JAX, Flax, MaxText) read: every packed column as a
``[batch, seq_length]`` array padded with zeros, with ``<column>_segment_ids`` (1, 2, ...
for the sequences of a row, 0 for padding) and ``<column>_positions`` (each token's place
within its sequence, 0 for padding), both ``int32``. The attention mask is built from the
segment ids (tokens attend only within their segment), so sequences stay apart.

PyTorch users with flash attention want the padding-free layout instead:
:func:`shardflow.torch.padding_free`. Importing this module imports only numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["fixed_shape"]


def fixed_shape(batch: dict[str, Any], seq_length: int, *, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``batch`` (a numpy batch of ``sf.DataLoader``: packed rows, with ``seq_lengths`` when
    the packs keep sequence boundaries) as ``[rows, seq_length]`` arrays in Grain's layout:
    each of ``columns`` (default: every column but ``seq_lengths``) zero-padded, plus its
    ``_segment_ids`` and ``_positions``. A row without ``seq_lengths`` (``"wrapped"``
    packs, or rows never packed) is one sequence. A row longer than ``seq_length`` is an
    error: pack with the same ``seq_length``."""
    if seq_length <= 0:
        raise ValueError(f"seq_length={seq_length}: it must be positive")
    names = list(columns) if columns is not None else [name for name in batch if name != "seq_lengths"]
    if not names:
        raise ValueError("the batch has no columns to lay out (only seq_lengths?)")
    for name in names:
        if name not in batch:
            raise KeyError(f"the batch has no column {name!r}; it has {sorted(batch)}")
    rows = [[np.asarray(row).reshape(-1) for row in batch[name]] for name in names]
    count = len(rows[0])
    segment_ids = np.zeros((count, seq_length), np.int32)
    positions = np.zeros((count, seq_length), np.int32)
    for r in range(count):
        tokens = len(rows[0][r])
        if tokens > seq_length:
            raise ValueError(f"row {r} holds {tokens} tokens, more than seq_length={seq_length}")
        for name, column in zip(names, rows):
            if len(column[r]) != tokens:
                raise ValueError(f"row {r}: {name!r} has {len(column[r])} values and {names[0]!r} {tokens}")
        lengths = np.asarray(batch["seq_lengths"][r], np.int64).reshape(-1) if "seq_lengths" in batch else np.array([tokens])
        lengths = lengths[lengths > 0]
        if int(lengths.sum()) != tokens:
            raise ValueError(f"row {r} holds {tokens} tokens but its seq_lengths add up to {int(lengths.sum())}")
        segment_ids[r, :tokens] = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions[r, :tokens] = np.arange(tokens) - starts
    out: dict[str, np.ndarray] = {}
    for name, column in zip(names, rows):
        dtype = np.result_type(*[values.dtype for values in column]) if column else np.int64
        values = np.zeros((count, seq_length), dtype)
        for r, row in enumerate(column):
            values[r, : len(row)] = row
        out[name] = values
        out[f"{name}_segment_ids"] = segment_ids.copy()
        out[f"{name}_positions"] = positions.copy()
    return out
