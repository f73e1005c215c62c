"""Ray Data: shardflow datasets as ``ray.data.Dataset``s. Importing this module imports
ray; ``import shardflow`` does not.

    import shardflow.ray
    ds = shardflow.ray.read("s3://bucket/train-*.jsonl", columns=["text"])
    ds = sf.dataset("data/*.parquet").to_ray()         # the same, from a dataset

Each read task takes a group of shardflow's work units (files, row groups, record runs):
a contiguous share of the epoch, as a rank would read it. It reports its rows, bytes and
files up front, decodes in shardflow's Rust threads and hands Ray ``pyarrow.Table``
blocks made from the decoded Arrow batches without copying. Column selections that Ray
pushes down (``ds.select_columns``) reach shardflow's projection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

import shardflow as sf

__all__ = ["ShardflowDatasource", "from_dataset", "read"]

# Rows per block a read task yields.
_BLOCK_ROWS = 8192


class ShardflowDatasource(Datasource):
    """A ``ray.data.Datasource`` over a shardflow dataset (any format, any source)."""

    def __init__(self, dataset: sf.Dataset) -> None:
        super().__init__()
        if not isinstance(dataset, sf.Dataset):
            raise TypeError("ShardflowDatasource reads a shardflow.Dataset")
        self._dataset = dataset
        # The columns Ray asks for (a dict of names), None for all; see apply_projection.
        self._projection_map: dict[str, str] | None = None

    def get_name(self) -> str:
        """The name Ray shows for this read: ``Shardflow(<format>)``."""
        return f"Shardflow({self._dataset.format})"

    def supports_projection_pushdown(self) -> bool:
        """Yes: Ray's ``select_columns`` becomes shardflow's projection."""
        return True

    def _projected(self) -> sf.Dataset:
        columns = self._get_data_columns()
        # No columns at all (Ray counting rows, say) still needs the rows: read them whole.
        return self._dataset if not columns else self._dataset.select_columns(columns)

    def estimate_inmemory_data_size(self) -> int | None:
        """The projected columns' decoded bytes, from shardflow's read plan."""
        plan = self._projected()._read_plan(1)
        return plan[0]["bytes"]

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[ReadTask]:
        """About ``parallelism`` read tasks, each a contiguous group of shardflow's work
        units (files, row groups, record runs) with its rows, bytes and files said
        beforehand."""
        dataset = self._projected()
        plan = dataset._read_plan(max(1, parallelism))
        tasks = []
        for part, info in enumerate(plan):
            metadata = BlockMetadata(
                num_rows=info["rows"], size_bytes=info["bytes"], exec_stats=None, input_files=tuple(info["files"])
            )
            tasks.append(
                ReadTask(
                    lambda part=part, parts=len(plan): _read_part(dataset, part, parts),
                    metadata,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def _read_part(dataset: sf.Dataset, part: int, parts: int) -> Iterator[pa.Table]:
    """Part `part` of `parts` of one epoch, in order, as Arrow tables sharing memory with
    shardflow's decoded batches."""
    loader = sf.DataLoader(dataset, batch_size=_BLOCK_ROWS, rank=part, world_size=parts, pad=False, output="arrow")
    for batch in loader:
        yield pa.Table.from_batches([pa.record_batch(batch)])


def from_dataset(dataset: sf.Dataset, **read_args: Any) -> ray.data.Dataset:
    """``dataset`` as a ``ray.data.Dataset``; ``read_args`` go to
    ``ray.data.read_datasource`` (``override_num_blocks``, ``concurrency``, ...)."""
    return ray.data.read_datasource(ShardflowDatasource(dataset), **read_args)


def read(source: Any, format: str | None = None, *, ray_args: dict[str, Any] | None = None, **dataset_args: Any) -> ray.data.Dataset:
    """``sf.dataset(source, format, **dataset_args)`` as a ``ray.data.Dataset``."""
    return from_dataset(sf.dataset(source, format, **dataset_args), **(ray_args or {}))
