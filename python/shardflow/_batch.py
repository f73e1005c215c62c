"""The batch type `DataLoader(output="numpy")` yields."""

from __future__ import annotations

from typing import Any


class Batch(dict):  # type: ignore[type-arg]
    """``dict[str, numpy.ndarray]`` that also exports the Arrow PyCapsule interface.

    Numeric columns are numpy arrays over the batch's Arrow buffers (no copy);
    ``batch.to_pyarrow()`` and any consumer of ``__arrow_c_array__`` read the same
    memory, but for binary values a shuffle left where they lie in a decoded copy (copied
    out then). (``pyarrow.record_batch(batch)`` sees a dict first and copies.)
    """

    __slots__ = ("_record_batch",)

    @property
    def num_rows(self) -> int:
        return int(self._record_batch.num_rows)

    def row(self, i: int) -> dict[str, Any]:
        """Sample ``i``: each column's value (a struct column's as a dict)."""
        return _row(self, i)

    def to_pyarrow(self) -> Any:
        """A ``pyarrow.RecordBatch`` over the same memory."""
        return self._record_batch.to_pyarrow()

    def __arrow_c_schema__(self) -> Any:
        return self._record_batch.__arrow_c_schema__()

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self._record_batch.__arrow_c_array__(requested_schema)


def _row(columns: dict[str, Any], i: int) -> dict[str, Any]:
    return {name: _row(values, i) if isinstance(values, dict) else values[i] for name, values in columns.items()}
