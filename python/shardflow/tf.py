"""TensorFlow adapter. Importing this module imports tensorflow; ``import shardflow``
does not.

:func:`to_tf_dataset` turns a :class:`shardflow.DataLoader` (batches) or a
:class:`shardflow.Dataset` (samples) into a ``tf.data.Dataset`` whose
``output_signature`` comes from the schema: fixed shapes where the data has them, a
``None`` batch dimension, ragged lists as ``tf.RaggedTensor``, text and bytes as
``tf.string``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

import shardflow as sf

__all__ = ["to_tf_dataset"]


def _spec(column: dict[str, Any], batched: bool) -> Any:
    """The tf spec of one column (a dict of specs for a struct)."""
    name, dtype, shape = column["name"], column["dtype"], tuple(column["shape"])
    if dtype == "struct":
        return {child["name"]: _spec(child, batched) for child in column["fields"]}
    if column.get("variable_shape"):
        raise TypeError(
            f"column {name!r} holds images of their own sizes, which a tf.data signature cannot "
            "type; decode them with resize=[H, W] or center_crop= for TensorFlow"
        )
    if dtype == "object":
        raise TypeError(
            f"column {name!r} holds values TensorFlow has no tensor type for; "
            "select other columns (columns=) or convert it with map()"
        )
    tf_dtype = tf.string if dtype in ("string", "bytes") else tf.as_dtype(dtype)
    if None in shape:
        # A list per sample: ragged across the batch.
        if batched:
            return tf.RaggedTensorSpec(shape=(None, *shape), dtype=tf_dtype, ragged_rank=1)
        return tf.TensorSpec(shape=shape, dtype=tf_dtype)
    return tf.TensorSpec(shape=((None,) if batched else ()) + shape, dtype=tf_dtype)


def _convert(value: Any, spec: Any) -> Any:
    """A numpy batch column (or sample value) as what `spec` expects."""
    if isinstance(spec, dict):
        return {k: _convert(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tf.RaggedTensorSpec):
        lengths = [0 if row is None else len(row) for row in value]
        parts = [np.asarray(row) for row in value if row is not None and len(row)]
        flat = np.concatenate(parts) if parts else np.zeros(0, spec.dtype.as_numpy_dtype)
        return tf.RaggedTensor.from_row_lengths(flat.astype(spec.dtype.as_numpy_dtype), lengths)
    if spec.dtype == tf.string:
        return value if isinstance(value, (str, bytes)) else np.asarray(value, dtype=object)
    return value


def to_tf_dataset(source: sf.DataLoader | sf.Dataset) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` reading ``source``: batches for a DataLoader, samples for a
    Dataset. Each pass over it is one epoch of ``source``; its cardinality is set when
    shardflow knows the length."""
    if isinstance(source, sf.DataLoader):
        loader, batched = source, True
    elif isinstance(source, sf.Dataset):
        # A loader of its own, so that each pass (each Keras epoch) is the dataset's next
        # epoch: a new order when it is shuffled.
        loader, batched = sf.DataLoader(source, batch_size=256), False
    else:
        raise TypeError("to_tf_dataset takes a shardflow.DataLoader or shardflow.Dataset")
    signature = {column["name"]: _spec(column, batched) for column in source._column_types()}

    def convert(item: Any) -> dict[str, Any]:
        return {name: _convert(item[name], spec) for name, spec in signature.items()}

    def generate() -> Iterator[dict[str, Any]]:
        for batch in loader:
            if batched:
                yield convert(batch)
            else:
                yield from (convert(batch.row(i)) for i in range(batch.num_rows))

    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    try:
        length = len(source)
    except TypeError:
        return dataset  # the length is not known without reading
    # A known length lets Keras size its epochs and progress bars.
    return dataset.apply(tf.data.experimental.assert_cardinality(length))
