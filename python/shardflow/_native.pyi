"""Type stubs for the Rust extension (checked with `python -m mypy.stubtest shardflow._native`)."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from typing import Any, final

import numpy as np
from shardflow.features import Features
from shardflow.report import Report

__all__ = [
    "BatchIterator",
    "DataLoader",
    "Dataset",
    "RecordBatch",
    "SampleIterator",
    "Schema",
    "Tokenizer",
    "_ArrowBuffer",
    "__version__",
    "_give_footers",
    "_list_files",
    "_read_file",
    "_redact",
    "concatenate",
    "dataset",
    "from_arrow",
    "from_dict",
    "from_list",
    "from_pandas",
    "interleave",
]

_Source = str | PathLike[str] | list[str | PathLike[str]] | tuple[str | PathLike[str], ...]

__version__: str

def _redact(text: str) -> str: ...
def _give_footers(footers: list[tuple[str, int, bytes]]) -> None: ...

def dataset(
    source: _Source,
    format: str | None = None,
    *,
    columns: list[str] | None = None,
    schema: Any = None,
    features: dict[str, Any] | None = None,
    format_options: dict[str, bool | int | float | str] | None = None,
    storage_options: dict[str, bool | int | float | str] | None = None,
    on_error: str = "raise",
    decoded_cache: str | PathLike[str] | bool | None = None,
    _listing: list[tuple[str, int | None, str | None]] | None = None,
) -> Dataset: ...
def _list_files(
    source: _Source, storage_options: dict[str, bool | int | float | str] | None = None
) -> list[tuple[str, int | None, str | None]]: ...
def _read_file(
    url: str, size: int | None = None, storage_options: dict[str, bool | int | float | str] | None = None
) -> bytes: ...
def from_arrow(data: Any) -> Dataset: ...
def from_dict(columns: dict[str, Any]) -> Dataset: ...
def from_list(rows: list[dict[str, Any]]) -> Dataset: ...
def from_pandas(df: Any) -> Dataset: ...
def concatenate(datasets: Sequence[Dataset]) -> Dataset: ...
def interleave(
    datasets: Sequence[Dataset],
    probabilities: Sequence[float] | None = None,
    seed: int | None = None,
    stopping_strategy: str = "first_exhausted",
) -> Dataset: ...
@final
class Schema:
    def __arrow_c_schema__(self, requested_schema: object | None = None) -> object: ...
    @property
    def names(self) -> list[str]: ...
    def __eq__(self, value: object, /) -> bool: ...
@final
class Dataset:
    def shuffle(
        self, seed: int | None = None, buffer_size: int | None = None, buffer_bytes: int | None = None
    ) -> Dataset: ...
    def take(self, n: int) -> Dataset: ...
    def skip(self, n: int) -> Dataset: ...
    def filter(
        self,
        function: Callable[..., Any],
        batched: bool = False,
        batch_size: int | None = None,
        *,
        with_indices: bool = False,
        input_columns: str | list[str] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        batch_format: str = "python",
    ) -> Dataset: ...
    def map(
        self,
        function: Callable[..., Mapping[str, Any]],
        batched: bool = False,
        batch_size: int | None = None,
        schema: Any = None,
        remove_columns: str | list[str] | None = None,
        *,
        with_indices: bool = False,
        input_columns: str | list[str] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        batch_format: str = "python",
    ) -> Dataset: ...
    def add_column(self, name: str, column: Any) -> Dataset: ...
    def flat_map(
        self, func: Callable[[dict[str, Any]], Iterable[Mapping[str, Any]]], schema: Any = None
    ) -> Dataset: ...
    def select(self, indices: Any) -> Dataset: ...
    def shard(self, num_shards: int, index: int, contiguous: bool = True) -> Dataset: ...
    def weighted_sample(
        self,
        weights: str | Sequence[float] | Any = None,
        num_samples: int | None = None,
        *,
        source_weights: Sequence[float] | None = None,
        replacement: bool = True,
        seed: int | None = None,
    ) -> Dataset: ...
    def set_epoch(self, epoch: int) -> None: ...
    @property
    def epoch(self) -> int: ...
    def _read_plan(self, parallelism: int) -> list[dict[str, Any]]: ...
    def _runs_python(self) -> bool: ...
    def to_ray(self, **read_args: Any) -> Any: ...
    def train_test_split(
        self,
        test_size: int | float | None = None,
        train_size: int | float | None = None,
        *,
        seed: int | None = None,
        shuffle: bool = True,
    ) -> dict[str, Dataset]: ...
    def batch(self, batch_size: int, drop_last_batch: bool = False) -> Dataset: ...
    def tokenize(
        self,
        tokenizer: Tokenizer,
        column: str = "text",
        max_length: int | None = None,
        truncation: bool = False,
        add_special_tokens: bool = True,
        on_error: str = "raise",
    ) -> Dataset: ...
    def apply_chat_template(
        self,
        tokenizer: Tokenizer,
        column: str = "messages",
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str | None = None,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        max_length: int | None = None,
        truncation: bool = False,
        return_assistant_tokens_mask: bool | None = None,
        labels: bool = False,
        remove_columns: str | Sequence[str] | None = None,
        now: Any = None,
        on_error: str = "raise",
        **template_kwargs: Any,
    ) -> Dataset: ...
    def pack(
        self,
        seq_length: int,
        strategy: str = "bfd",
        columns: str | Sequence[str] | None = None,
        buffer_rows: int = 1000,
        on_too_long: str = "truncate",
    ) -> Dataset: ...
    def select_columns(self, names: str | Sequence[str]) -> Dataset: ...
    def remove_columns(self, names: str | Sequence[str]) -> Dataset: ...
    def rename_columns(self, column_mapping: dict[str, str]) -> Dataset: ...
    def rename_column(self, original_column_name: str, new_column_name: str) -> Dataset: ...
    def cast(self, schema: Any, *, on_invalid: str = "raise") -> Dataset: ...
    def cast_column(self, column: str, dtype: Any, *, on_invalid: str = "raise") -> Dataset: ...
    @property
    def features(self) -> Features: ...
    @property
    def _stored_features(self) -> str | None: ...
    @property
    def schema(self) -> Schema: ...
    def index(self) -> int: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> SampleIterator: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]: ...
    def to_arrow(self) -> Any: ...
    def to_list(self) -> list[dict[str, Any]]: ...
    def to_dict(self) -> dict[str, list[Any]]: ...
    def to_pandas(self) -> Any: ...
    def sort(
        self, column_names: str | Sequence[str], reverse: bool | Sequence[bool] | None = None, null_placement: str = "at_end"
    ) -> Dataset: ...
    def unique(self, column: str) -> list[Any]: ...
    @property
    def shards(self) -> list[str]: ...
    @property
    def format(self) -> str: ...
    @property
    def column_names(self) -> list[str]: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...
    def __reduce__(self) -> tuple[Any, tuple[list[tuple[str, Any]], int, list[tuple[str, int, bytes]]]]: ...
    def _column_types(self) -> list[dict[str, Any]]: ...
    def write(
        self,
        dest: str | PathLike[str],
        format: str = "parquet",
        *,
        max_rows_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        compression: str | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        num_threads: int | None = None,
        memory_limit: int | None = None,
        progress: Callable[[int, int], object] | None = None,
    ) -> dict[str, Any]: ...
    def _shard_table(self) -> list[dict[str, Any]]: ...

@final
class Tokenizer:
    @staticmethod
    def from_texts(
        tokenizer_json: str, tokenizer_config: str | None = None, chat_template: str | None = None
    ) -> Tokenizer: ...
    @staticmethod
    def from_file(
        path: str | PathLike[str],
        chat_template: str | None = None,
        tokenizer_config: str | PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> Tokenizer: ...
    @staticmethod
    def from_pretrained(
        path: str | PathLike[str], revision: str | None = None, storage_options: dict[str, Any] | None = None
    ) -> Tokenizer: ...
    def encode(
        self, text: str, add_special_tokens: bool = True, truncation: bool = False, max_length: int | None = None
    ) -> list[int]: ...
    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str | None = None,
        tokenize: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        return_dict: bool = True,
        return_assistant_tokens_mask: bool = False,
        now: Any = None,
        **kwargs: Any,
    ) -> Any: ...
    @property
    def special_tokens_map(self) -> dict[str, str]: ...
    @property
    def chat_template(self) -> str | None: ...
    def __reduce__(self) -> tuple[Any, tuple[str | None, str | None, str | None]]: ...

@final
class SampleIterator:
    def __iter__(self) -> SampleIterator: ...
    def __next__(self) -> dict[str, Any]: ...

@final
class DataLoader:
    def __new__(
        cls,
        dataset: Dataset,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        pad: bool | None = None,
        num_threads: int | None = None,
        prefetch: int | None = None,
        prefetch_bytes: int | None = None,
        memory_limit: int | None = None,
        spill_dir: str | PathLike[str] | None = None,
        spill_bytes: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
        output: str = "numpy",
        pin_memory: bool = False,
        trace: str | PathLike[str] | None = None,
    ) -> DataLoader: ...
    def __iter__(self) -> BatchIterator: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    @property
    def epoch(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None: ...
    def _ended_state_dict(self) -> dict[str, Any] | None: ...
    def _batch_positions(self) -> list[int] | None: ...
    def stats(self) -> dict[str, int | float | str | None]: ...
    def report(self, seconds: float | None = None) -> Report: ...
    def headspace(self, seconds: float = 10.0) -> dict[str, Any]: ...
    def _report_counters(self, seconds: float | None = None) -> dict[str, Any] | None: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...
    def _column_types(self) -> list[dict[str, Any]]: ...

@final
class BatchIterator:
    def __iter__(self) -> BatchIterator: ...
    def __next__(self) -> Any: ...

@final
class RecordBatch:
    @property
    def num_rows(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def to_numpy(self) -> dict[str, np.ndarray[Any, Any]]: ...
    def to_pydict(self) -> dict[str, list[Any]]: ...
    def to_pylist(self) -> list[dict[str, Any]]: ...
    def to_pyarrow(self) -> Any: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...

@final
class _ArrowBuffer:
    @property
    def address(self) -> int: ...
