"""Specs for reading ``tf.train.Example`` records, in the spirit of
``tf.io.parse_example``. ``tf.io.FixedLenFeature`` and ``tf.io.VarLenFeature`` objects
are accepted as they are, so a TensorFlow spec can be reused unchanged::

    sf.dataset("train.tfrecord", features={
        "image": sf.FixedLen((28, 28), "float32"),
        "label": sf.FixedLen((), "int64", default=0),
        "tags": sf.VarLen("bytes"),
    })

dtypes are those an Example can hold: ``"float32"``, ``"int64"`` and ``"bytes"``
(``"string"`` is the same, as in TensorFlow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FixedLen:
    """Exactly ``prod(shape)`` values per record, as an array of ``shape`` (a scalar
    for ``()``). A record without the feature gets ``default`` (one value fills the
    shape), or is an error when there is no default."""

    shape: tuple[int, ...]
    dtype: str
    default: Any = None


@dataclass(frozen=True)
class VarLen:
    """Any number of values per record, as a list (empty when the feature is missing)."""

    dtype: str


__all__ = ["FixedLen", "VarLen"]
