"""shardflow: a data loader for machine learning.

A Rust core reads, decodes, shuffles and batches data off the GIL; this package is
the Python face of it::

    import shardflow as sf

    ds = sf.dataset("data/train-*.parquet")
    loader = sf.DataLoader(ds, batch_size=256, shuffle=True, seed=0)
    for batch in loader:          # dict[str, numpy.ndarray]
        ...
"""

# Batches are numpy arrays: numpy is imported with the package, so that its import (and
# the start of its BLAS threads, which spin for a while) is not paid by the first batch.
import numpy as _numpy  # noqa: F401

from shardflow._batch import Batch
from shardflow._native import (
    __version__,
    BatchIterator,
    DataLoader,
    Dataset,
    RecordBatch,
    SampleIterator,
    Schema,
    Tokenizer,
    concatenate,
    dataset,
    from_arrow,
    from_dict,
    from_list,
    from_pandas,
    interleave,
)
from shardflow._load import DatasetDict, load_dataset
from shardflow.report import Report
from shardflow.features import Audio, ClassLabel, Features, FixedLen, Image, LargeList, List, Sequence, Value, VarLen
from shardflow.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    DecodeError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ReadError,
    SchemaError,
    ShardflowError,
    TemplateError,
    WriteError,
)


__all__ = [
    "AccessDeniedError",
    "AlreadyExistsError",
    "Audio",
    "Batch",
    "BatchIterator",
    "ClassLabel",
    "DataLoader",
    "Dataset",
    "DatasetDict",
    "DecodeError",
    "Features",
    "FixedLen",
    "Image",
    "InternalError",
    "InvalidArgumentError",
    "LargeList",
    "List",
    "NotFoundError",
    "ReadError",
    "RecordBatch",
    "Report",
    "SampleIterator",
    "Schema",
    "SchemaError",
    "Sequence",
    "ShardflowError",
    "TemplateError",
    "Tokenizer",
    "Value",
    "VarLen",
    "WriteError",
    "__version__",
    "concatenate",
    "dataset",
    "from_arrow",
    "from_dict",
    "from_list",
    "from_pandas",
    "interleave",
    "load_dataset",
]
