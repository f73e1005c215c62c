"""A user's function as ``map`` and ``filter`` call it when given ``input_columns`` or
``fn_kwargs`` (the names and meanings of Hugging Face ``datasets``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Call:
    """Calls ``function`` with the columns ``input_columns`` names as its positional
    arguments (in that order) instead of the whole row or batch, and with ``fn_kwargs``
    as keyword arguments. Module-level, so that it pickles with the function."""

    def __init__(self, function: Callable[..., Any], input_columns: list[str] | None, fn_kwargs: dict[str, Any] | None):
        self.function = function
        self.input_columns = input_columns
        self.fn_kwargs = dict(fn_kwargs or {})

    def __call__(self, row: dict[str, Any], *index: Any) -> Any:
        # `index`: the row's index (or the batch's indices) with `with_indices=True`.
        if self.input_columns is None:
            return self.function(row, *index, **self.fn_kwargs)
        return self.function(*(row[name] for name in self.input_columns), *index, **self.fn_kwargs)
