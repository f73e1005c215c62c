"""Differential tests against Hugging Face `datasets` (the reference for every verb whose
name is theirs): the same calls on the same data in both libraries, compared row by
row where `datasets` is deterministic, and by size and row set where it draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf

datasets = pytest.importorskip("datasets")

STRATEGIES = ["first_exhausted", "all_exhausted", "all_exhausted_without_replacement"]


def parts_of(lengths: list[int]) -> tuple[list[object], list[sf.Dataset]]:
    """Datasets of `lengths` rows with ids unique across them, in both libraries."""
    ids = [list(range(1000 * i, 1000 * i + n)) for i, n in enumerate(lengths)]
    hf = [datasets.Dataset.from_dict({"id": column}).to_iterable_dataset() for column in ids]
    ours = [sf.from_dict({"id": np.array(column, dtype=np.int64)}) for column in ids]
    return hf, ours


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4), strategy=st.sampled_from(STRATEGIES))
def test_round_robin_interleave_is_datasets_sequence(lengths: list[int], strategy: str) -> None:
    # `datasets`' IterableDataset interleave: the row that runs out the first dataset
    # (first_exhausted) or completes the last one's pass (all_exhausted) ends the mix.
    hf, ours = parts_of(lengths)
    expected = [row["id"] for row in datasets.interleave_datasets(hf, stopping_strategy=strategy)]
    mixed = sf.interleave(ours, stopping_strategy=strategy)
    assert [row["id"] for row in mixed] == expected
    assert len(mixed) == len(expected)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(20, 200), min_size=2, max_size=3),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 2**16),
)
def test_weighted_interleave_stops_and_draws_as_datasets_does(lengths: list[int], strategy: str, seed: int) -> None:
    # Seeded draws differ from numpy's, so compare what the rules fix: which rows can
    # come, where the mixing stops, and the proportions.
    weights = np.arange(1, len(lengths) + 1, dtype=np.float64)
    probabilities = (weights / weights.sum()).tolist()
    hf, ours = parts_of(lengths)
    theirs = [r["id"] for r in datasets.interleave_datasets(hf, probabilities=probabilities, seed=seed, stopping_strategy=strategy)]
    mixed = [r["id"] for r in sf.interleave(ours, probabilities=probabilities, seed=seed, stopping_strategy=strategy)]
    for rows in (theirs, mixed):
        by_part = [[i for i in rows if i // 1000 == p] for p in range(len(lengths))]
        if strategy == "all_exhausted_without_replacement":
            assert sorted(rows) == sorted(i for p, n in enumerate(lengths) for i in range(1000 * p, 1000 * p + n))
        elif strategy == "all_exhausted":
            # Every dataset runs out at least once; the last row drawn completes a pass.
            assert all(len(part) >= n for part, n in zip(by_part, lengths))
            last = rows[-1]
            assert last % 1000 == lengths[last // 1000] - 1
        else:
            # first_exhausted ends on the row that runs out a dataset.
            last = rows[-1]
            assert last % 1000 == lengths[last // 1000] - 1
            assert len(by_part[last // 1000]) == lengths[last // 1000]
            assert all(len(part) <= n for part, n in zip(by_part, lengths))
