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


def both(columns: dict[str, list]) -> tuple[object, sf.Dataset]:
    """The same rows in `datasets` and shardflow."""
    return datasets.Dataset.from_dict(columns), sf.from_list([dict(zip(columns, row)) for row in zip(*columns.values())])


ROWS = {"id": list(range(12)), "text": [f"row {i}" * (1 + i % 3) for i in range(12)], "score": [i * 0.5 for i in range(12)]}


def test_map_merges_the_returned_dict_as_datasets_does() -> None:
    hf, ours = both(ROWS)

    def count(row: dict) -> dict:
        return {"n_chars": len(row["text"]), "id": row["id"] * 10}

    expected = hf.map(count)
    got = ours.map(count)
    assert got.column_names == expected.column_names == ["id", "text", "score", "n_chars"]
    assert got.to_list() == expected.to_list()
    # remove_columns drops input columns; batched maps merge the same way.
    expected = hf.map(lambda b: {"n": [len(t) for t in b["text"]]}, batched=True, remove_columns=["text"])
    got = ours.map(lambda b: {"n": [len(t) for t in b["text"]]}, batched=True, remove_columns=["text"])
    assert got.column_names == expected.column_names
    assert got.to_list() == expected.to_list()
    # A batched map that changes the row count must remove the other columns, in both.
    with pytest.raises(Exception):
        hf.map(lambda b: {"x": [0]}, batched=True)
    with pytest.raises(sf.SchemaError, match="remove the input columns"):
        ours.map(lambda b: {"x": np.zeros(1)}, batched=True).to_list()
    chunked = ours.map(lambda b: {"x": np.arange(2)}, batched=True, batch_size=4, remove_columns=["id", "text", "score"])
    assert chunked.to_dict() == hf.map(lambda b: {"x": [0, 1]}, batched=True, batch_size=4, remove_columns=["id", "text", "score"]).to_dict()


def test_column_names_are_current_after_every_verb() -> None:
    hf, ours = both(ROWS)
    chains = [
        lambda d: d.rename_column("text", "body"),
        lambda d: d.rename_columns({"id": "key", "score": "s"}),
        lambda d: d.remove_columns(["score"]),
        lambda d: d.select_columns(["score", "id"]),
        lambda d: d.map(lambda r: {"extra": 1}),
    ]
    for chain in chains:
        assert chain(ours).column_names == chain(hf).column_names
    assert ours.flat_map(lambda r: [{"t": r["text"]}]).column_names == ["t"]


def test_output_verbs_give_what_datasets_gives() -> None:
    hf, ours = both(ROWS)
    assert ours.to_list() == hf.to_list()
    assert ours.to_dict() == hf.to_dict()
    assert ours.to_pandas().equals(hf.to_pandas())
    assert ours.select(range(3, 7)).to_list() == hf.select(range(3, 7)).to_list()
    assert ours["id"] == list(hf["id"])
    assert list(ours["text"]) == list(hf["text"])
    picked = ours[[1, 5, 7]]
    assert picked == hf[[1, 5, 7]]
    mask = [i % 4 == 0 for i in range(12)]
    assert ours[mask]["id"] == [0, 4, 8]
    assert ours[np.array([2, -1])]["id"] == [2, 11]
    with pytest.raises(IndexError):
        ours[[True, False]]
    with pytest.raises(KeyError):
        ours["nope"]


def test_jsonl_int_then_float_never_truncates(tmp_path) -> None:
    import json

    path = tmp_path / "mixed.jsonl"
    with open(path, "w") as f:
        for i in range(1500):
            f.write(json.dumps({"id": i, "v": i if i < 1200 else i + 0.5}) + "\n")
    theirs = datasets.load_dataset("json", data_files=str(path), split="train")
    assert theirs[1201]["v"] == 1201.5  # datasets reads floats
    ds = sf.dataset(str(path))
    # shardflow inferred int64 from the first 1,000 records: a clear error naming the
    # file, line and column, never 1201.5 read as 1201.
    with pytest.raises(sf.DecodeError, match=r"line 1201.*column \"v\" holds a number that is not an integer"):
        ds.to_list()
    with pytest.raises(sf.DecodeError, match=r"at byte \d+: .*column \"v\""):
        ds[1200]  # read by its byte offset in the file
    import pyarrow as pa

    typed = sf.dataset(str(path), schema=pa.schema([("id", pa.int64()), ("v", pa.float64())]))
    assert typed.to_dict()["v"] == theirs["v"]


def test_cast_of_text_that_is_not_a_number_raises_as_datasets_does() -> None:
    import pyarrow as pa

    hf, ours = both({"t": ["1", "x", "3"]})
    with pytest.raises(Exception):
        hf.cast_column("t", datasets.Value("int64"))
    with pytest.raises(sf.SchemaError, match="column \"t\".*'x'"):
        ours.cast_column("t", pa.int64()).to_list()
    assert ours.cast_column("t", pa.int64(), on_invalid="null").to_dict() == {"t": [1, None, 3]}
    assert both({"t": ["1", "2"]})[1].cast_column("t", pa.int64()).to_dict() == {"t": [1, 2]}


def test_the_same_nested_column_mixes_from_jsonl_parquet_and_memory(tmp_path) -> None:
    # list<struct<role, content>> arrives as List<item> (JSONL), List<element> (Parquet)
    # and LargeList (from_list); concatenate and interleave failed with "neither widens".
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    def chats(start: int, n: int) -> list[dict]:
        return [
            {"id": i, "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}][: 1 + i % 2]}
            for i in range(start, start + n)
        ]

    with open(tmp_path / "a.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in chats(0, 5))
    pq.write_table(pa.Table.from_pylist(chats(5, 4)), tmp_path / "b.parquet")
    parts = [sf.dataset(str(tmp_path / "a.jsonl")), sf.dataset(str(tmp_path / "b.parquet")), sf.from_list(chats(9, 3))]
    theirs = [
        datasets.load_dataset("json", data_files=str(tmp_path / "a.jsonl"), split="train"),
        datasets.load_dataset("parquet", data_files=str(tmp_path / "b.parquet"), split="train"),
        datasets.Dataset.from_list(chats(9, 3)),
    ]
    joined = sf.concatenate(parts)
    assert joined.to_list() == datasets.concatenate_datasets(theirs).to_list() == chats(0, 12)
    mixed = sf.interleave(parts, stopping_strategy="all_exhausted_without_replacement")
    expected = datasets.interleave_datasets([t.to_iterable_dataset() for t in theirs], stopping_strategy="all_exhausted_without_replacement")
    assert mixed.to_list() == list(expected)
    # One canonical type: List<item>.
    assert pa.schema(joined.schema).field("messages").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


# datasets' own sort calls pyarrow in a way pyarrow 25 deprecates.
@pytest.mark.filterwarnings("ignore:Specifying null_placement:FutureWarning")
def test_sort_unique_from_pandas_and_hf_datasets() -> None:
    import pandas as pd

    columns = {"k": [3, 1, 2, 1, None, 3], "name": ["c", "a", "b", "z", "n", "d"], "tags": [[1], [2], [1], [2], [], [1]]}
    hf, ours = both(columns)
    for args in ({"column_names": "k"}, {"column_names": "k", "reverse": True}, {"column_names": ["k", "name"], "reverse": [True, False]}):
        assert ours.sort(**args).to_list() == hf.sort(**args).to_list(), args
    assert ours.sort("k").sort("name").to_list() == hf.sort("k").sort("name").to_list()
    assert ours.unique("k") == hf.unique("k")
    assert ours.unique("name") == hf.unique("name")
    df = pd.DataFrame(columns).iloc[::-1]  # an index that is not 0..n
    assert sf.from_pandas(df).to_list() == datasets.Dataset.from_pandas(df, preserve_index=False).to_list()
    # An HF dataset's own rows, its indices mapping (shuffle, select, filter) applied.
    view = hf.shuffle(seed=1).select(range(4)).filter(lambda r: r["k"] != 2)
    assert sf.from_arrow(view).to_list() == view.to_list()
    # Pickled datasets rebuild from their recipe.
    import pickle

    assert pickle.loads(pickle.dumps(ours.sort("name", reverse=True))).to_list() == hf.sort("name", reverse=True).to_list()
    assert pickle.loads(pickle.dumps(sf.from_pandas(df))).to_list() == sf.from_pandas(df).to_list()


def test_batch_returns_a_dataset_of_batches() -> None:
    hf, ours = both(ROWS)
    for drop in (False, True):
        theirs = list(hf.to_iterable_dataset().batch(batch_size=5, drop_last_batch=drop))
        batched = ours.batch(5, drop_last_batch=drop)
        assert batched.to_list() == theirs
        # Any verb can follow it: here a map over whole batches, then a take.
        sums = batched.map(lambda b: {"total": int(sum(b["id"]))}).take(2)
        assert [r["total"] for r in sums] == [sum(b["id"]) for b in theirs[:2]]


def test_random_access_after_a_filter_as_datasets_has_it(tmp_path) -> None:
    # datasets runs a filter eagerly, so len, [i], select and train_test_split work after
    # it; shardflow runs it once over the rows when they are first addressed.
    import json

    rows = [{"id": i, "text": f"row {i}", "score": i * 0.5} for i in range(40)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []

    def keep(row: dict) -> bool:
        calls.append(row["id"])
        return row["id"] % 3 != 0

    hf = datasets.Dataset.from_list(rows).filter(lambda r: r["id"] % 3 != 0)
    for ours in (sf.from_list(rows).filter(keep), sf.dataset(str(path)).map(lambda r: {"twice": r["id"] * 2}).filter(keep)):
        calls.clear()
        assert len(ours) == len(hf) == 26
        assert len(calls) == 40  # one pass
        assert ours[5]["id"] == hf[5]["id"] and ours[-1]["id"] == hf[-1]["id"]
        assert ours.select(range(3, 9))["id"] == hf.select(range(3, 9))["id"]
        split_ours = ours.train_test_split(test_size=0.25, shuffle=False)
        split_hf = hf.train_test_split(test_size=0.25, shuffle=False)
        assert split_ours["test"]["id"] == split_hf["test"]["id"] and split_ours["train"]["id"] == split_hf["train"]["id"]
        shuffled = ours.shuffle(seed=1)  # a full permutation of the kept rows, as datasets'
        assert sorted(shuffled["id"]) == sorted(hf["id"]) and shuffled["id"] != hf["id"]
        assert len(calls) == 40  # the pass is made once, whatever is made from the filter
        # Ranks divide the kept rows exactly, as for any dataset with known rows.
        parts = [[i for b in sf.DataLoader(ours.select(range(26)), batch_size=4, rank=r, world_size=2) for i in b["id"].tolist()] for r in range(2)]
        assert [len(p) for p in parts] == [13, 13] and sorted(parts[0] + parts[1]) == list(hf["id"])

    # A flat_map, a batched map and an interleave decide the rows as they run: random
    # access reads their rows into memory once, as datasets writes its result.
    hf_rows = datasets.Dataset.from_list(rows)
    fanned = sf.from_list(rows).flat_map(lambda r: [r, {**r, "id": r["id"] + 100}])
    assert len(fanned) == 80 and fanned[1]["id"] == 100 and fanned.select([2, 3])["id"] == [1, 101]
    halved = dict(batched=True, batch_size=7, remove_columns=["id", "text", "score"])
    hf_halved = hf_rows.map(lambda b: {"k": b["id"][::2]}, **halved)
    ours_halved = sf.from_list(rows).map(lambda b: {"k": b["id"][::2]}, **halved)
    assert len(ours_halved) == len(hf_halved) and ours_halved["k"] == hf_halved["k"]
    assert ours_halved.train_test_split(test_size=5, shuffle=False)["test"]["k"] == hf_halved.train_test_split(test_size=5, shuffle=False)["test"]["k"]
    a, b = sf.from_list(rows[:10]), sf.from_list(rows[10:13])
    mixed = sf.interleave([a, b])
    hf_mixed = datasets.interleave_datasets([datasets.Dataset.from_list(rows[:10]).to_iterable_dataset(), datasets.Dataset.from_list(rows[10:13]).to_iterable_dataset()])
    assert len(mixed) == len(list(hf_mixed)) and mixed[3]["id"] == list(hf_mixed)[3]["id"]


def test_map_and_filter_take_datasets_arguments() -> None:
    hf, ours = both(ROWS)

    def scaled(score: float, text: str, factor: int) -> dict:
        return {"scaled": score * factor, "chars": len(text)}

    args = dict(input_columns=["score", "text"], fn_kwargs={"factor": 3})
    assert ours.map(scaled, **args).to_list() == hf.map(scaled, **args).to_list()
    keep = dict(input_columns="id", fn_kwargs={"every": 3})
    assert ours.filter(lambda i, every: i % every == 0, **keep).to_list() == hf.filter(lambda i, every: i % every == 0, **keep).to_list()
    # Batched functions get lists, as datasets gives them (so `+` joins lists, never adds).
    seen = []

    def joined(batch: dict) -> dict:
        seen.append(type(batch["id"]))
        return {"both": [[i] + [s] for i, s in zip(batch["id"], batch["score"])]}

    assert ours.map(joined, batched=True, batch_size=5).to_list() == hf.map(joined, batched=True, batch_size=5).to_list()
    assert set(seen) == {list}
    odd = dict(batched=True, batch_size=4)
    assert ours.filter(lambda b: [i % 2 == 1 for i in b["id"]], **odd).to_list() == hf.filter(lambda b: [i % 2 == 1 for i in b["id"]], **odd).to_list()
    # numpy columns on request.
    got = ours.map(lambda b: {"twice": b["id"] * 2}, batched=True, batch_format="numpy")
    assert got["twice"] == [2 * i for i in ROWS["id"]]
    with pytest.raises(ValueError, match="one per row"):
        ours.filter(lambda b: [True], batched=True).to_list()
    with pytest.raises(ValueError, match="batch_format"):
        ours.map(lambda r: r, batch_format="numpy")


def test_add_column_as_datasets_does() -> None:
    hf, ours = both(ROWS)
    labels = [i % 2 for i in range(12)]
    assert ours.add_column("label", labels).to_list() == hf.add_column("label", labels).to_list()
    assert ours.select([3, 1]).add_column("x", ["a", "b"])["x"] == ["a", "b"]
    with pytest.raises(ValueError, match="3 values for 12 rows"):
        ours.add_column("label", [1, 2, 3])
    with pytest.raises(ValueError, match="already has"):
        ours.add_column("id", labels)


def test_a_declared_schema_casts_and_names_what_does_not_fit() -> None:
    import pyarrow as pa

    ds = sf.from_dict({"x": np.arange(10)})
    narrow = pa.schema([("y", pa.int32())])
    got = ds.map(lambda b: {"y": b["x"] * 2}, batched=True, batch_format="numpy", schema=narrow)
    assert pa.schema(got.schema).field("y").type == pa.int32() and got["y"] == list(range(0, 20, 2))
    too_big = ds.map(lambda b: {"y": b["x"] + 2**40}, batched=True, batch_format="numpy", schema=narrow)
    with pytest.raises(sf.SchemaError, match="'y'|\"y\".*does not fit the Int32 that schema= gives it"):
        too_big.to_list()


# ---------------------------------------------------------------------------------------
# Generated chains of verbs, run through both libraries.

CHAIN_ROWS = {
    "id": list(range(30)),
    "text": [f"row {i}" * (1 + i % 4) for i in range(30)],
    "score": [float((i * 7) % 11) for i in range(30)],
}


def long_text(row: dict) -> bool:
    return len(row["text"]) > 10


def tripled(row: dict) -> dict:
    return {"score": row["score"] * 3, "tag": row["id"] % 5}


def lengths(batch: dict) -> dict:
    return {"n": [len(t) for t in batch["text"]]}


def first_value_odd(row: dict) -> bool:
    return len(repr(next(iter(row.values())))) % 2 == 1


def odd_ids(batch: dict) -> list[bool]:
    return [i % 2 == 1 for i in batch["id"]]


def verb(draw: st.DrawFn, size: int, columns: list[str]) -> tuple[str, tuple, dict]:
    """A verb whose result `datasets` fixes exactly, applicable to `size` rows."""
    kinds = ["filter", "map", "batched_map", "batched_filter", "take", "skip", "sort", "rename"]
    if size:
        kinds += ["select", "shard", "split"] if size >= 2 else ["select", "shard"]
    if "text" in columns and len(columns) > 1:
        kinds.append("remove")
    kind = draw(st.sampled_from(kinds))
    if kind == "filter":
        return "filter", (long_text if "text" in columns else first_value_odd,), {}
    if kind == "map":
        return ("map", (tripled,), {}) if {"score", "id"} <= set(columns) else ("map", (lambda r: {"k": 1},), {})
    if kind == "batched_map":
        return ("map", (lengths,), {"batched": True, "batch_size": draw(st.integers(1, 8))}) if "text" in columns else ("take", (size,), {})
    if kind == "batched_filter":
        return ("filter", (odd_ids,), {"batched": True, "batch_size": draw(st.integers(1, 8))}) if "id" in columns else ("skip", (0,), {})
    if kind == "take":
        return "take", (draw(st.integers(0, size + 2)),), {}
    if kind == "skip":
        # (datasets' Dataset.skip raises IndexError for n == len; shardflow gives no rows.)
        return "skip", (draw(st.integers(0, max(size - 1, 0))),), {}
    if kind == "sort":
        return "sort", (draw(st.sampled_from(columns)),), {"reverse": draw(st.booleans())}
    if kind == "rename":
        name = draw(st.sampled_from(columns))
        return "rename_column", (name, name + "_"), {}
    if kind == "remove":
        return "remove_columns", ("text",), {}
    if kind == "select":
        return "select", (draw(st.lists(st.integers(0, size - 1), max_size=12)),), {}
    if kind == "shard":
        n = draw(st.integers(1, min(4, size)))  # (datasets raises for an empty shard)
        return "shard", (n, draw(st.integers(0, n - 1))), {"contiguous": draw(st.booleans())}
    test = draw(st.integers(1, size - 1))
    return "split", (draw(st.sampled_from(["train", "test"])),), {"test_size": test, "shuffle": False}


def apply(ds: object, name: str, args: tuple, kwargs: dict) -> object:
    if name == "split":
        return ds.train_test_split(**kwargs)[args[0]]  # type: ignore[attr-defined]
    return getattr(ds, name)(*args, **kwargs)


@pytest.mark.filterwarnings("ignore:Specifying null_placement:FutureWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_chains_of_verbs_give_what_datasets_gives(data: st.DataObject) -> None:
    hf, ours = both(CHAIN_ROWS)
    for _ in range(data.draw(st.integers(2, 5), label="verbs")):
        size = len(hf)
        call = data.draw(st.composite(lambda draw: verb(draw, size, list(hf.column_names)))(), label="verb")
        hf, ours = apply(hf, *call), apply(ours, *call)
        assert len(ours) == len(hf), call
        assert ours.column_names == hf.column_names, call
    assert ours.to_list() == hf.to_list()
    # A seeded shuffle at the end: the same rows (datasets' permutation is its own).
    assert sorted(map(repr, ours.shuffle(seed=3).to_list())) == sorted(map(repr, hf.shuffle(seed=3).to_list()))


def test_the_cookbook_patterns_port_line_for_line(tmp_path) -> None:
    # The patterns of README's "Coming from datasets", the same code in both libraries
    # but for the import and the loading call; their results compared.
    import json

    chats = [{"id": i, "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}" * (i % 3 + 1)}]} for i in range(50)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    results: dict[str, dict] = {}
    for lib, ds in (("hf", datasets.load_dataset("json", data_files=str(path), split="train")), ("sf", sf.dataset(str(path)))):
        interleave = datasets.interleave_datasets if lib == "hf" else sf.interleave
        concatenate = datasets.concatenate_datasets if lib == "hf" else sf.concatenate
        from_list = datasets.Dataset.from_list if lib == "hf" else sf.from_list
        out = results[lib] = {}
        shuffled = ds.shuffle(seed=0)
        test, train = shuffled.take(10), shuffled.skip(10)
        out["split sizes"] = (len(test), len(train))
        out["test and train apart"] = not {r["id"] for r in test} & {r["id"] for r in train}
        out["select to_list"] = ds.select(range(5, 10)).to_list()
        long_answers = ds.filter(lambda r: len(r["messages"][1]["content"]) > 4)
        out["filter len"] = len(long_answers)
        out["filter [0]"] = long_answers[0]
        out["filter select"] = long_answers.select([1, 3]).to_list()
        counted = ds.map(lambda r: {"n_turns": len(r["messages"])})
        out["map"] = (counted.column_names, counted[3])
        out["concatenate"] = [r["id"] for r in concatenate([ds.select(range(3)), from_list(chats[:2])])]
        split = ds.train_test_split(test_size=0.2, seed=1)
        out["train_test_split"] = (len(split["train"]), len(split["test"]))
        mixed = [r["id"] for r in interleave([ds.select(range(10)), ds.select(range(10, 20))], probabilities=[0.5, 0.5], seed=1)]
        out["interleave"] = (set(mixed) <= set(range(20)), len(set(mixed)) == len(mixed), min(len([i for i in mixed if i < 10]), len([i for i in mixed if i >= 10])) >= 1)
        streamed = (ds.to_iterable_dataset() if lib == "hf" else ds).batch(batch_size=8, drop_last_batch=True)
        out["batch"] = [b["id"] for b in streamed]
    assert results["sf"] == results["hf"]
    assert results["sf"]["split sizes"] == (10, 40) and results["sf"]["test and train apart"]


def test_json_files_hold_lines_or_an_array_as_datasets_reads_them(tmp_path) -> None:
    import json

    records = [{"id": i, "text": f"t{i}", "score": i if i < 5 else i + 0.5, "tags": [{"k": i}]} for i in range(12)]
    (tmp_path / "array.json").write_text(json.dumps(records, indent=1))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    for name in ("array.json", "lines.json"):
        path = str(tmp_path / name)
        hf = datasets.load_dataset("json", data_files=path, split="train")
        for ours in (sf.dataset(path), sf.dataset(path, format="json")):
            assert ours.to_list() == hf.to_list(), name
            assert len(ours) == 12 and ours[7]["score"] == 7.5
    assert sf.dataset(str(tmp_path / "array.json"), columns=["id"]).column_names == ["id"]
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.json").write_text(json.dumps(records))
    (tmp_path / "mixed" / "b.json").write_text(json.dumps(records[0]) + "\n")
    with pytest.raises(ValueError, match="JSON Lines, but other files a JSON array"):
        sf.dataset(str(tmp_path / "mixed" / "*.json"))
    (tmp_path / "numbers.json").write_text("[1, 2]")
    with pytest.raises(sf.DecodeError, match="numbers.json.*not an object"):
        sf.dataset(str(tmp_path / "numbers.json"))


def test_with_indices_numbers_rows_as_datasets_does(tmp_path) -> None:
    # The index of each row in the dataset the function is called on, in its order.
    hf, ours = both(ROWS)
    tag = lambda row, i: {"at": i, "check": row["id"] * 100 + i}  # noqa: E731
    for chain in (lambda d: d, lambda d: d.select([7, 2, 9, 4]), lambda d: d.filter(lambda r: r["id"] % 3 > 0)):
        assert chain(ours).map(tag, with_indices=True).to_list() == chain(hf).map(tag, with_indices=True).to_list()
    got = ours.select([7, 2, 9, 4]).map(tag, with_indices=True)
    assert got["at"] == [0, 1, 2, 3] and got["check"] == [700, 201, 902, 403]
    assert got[2] == {**ours[9], "at": 2, "check": 902}  # by index too
    assert got.select([3, 0])["at"] == [3, 0]
    batched = ours.map(lambda b, idx: {"at": [i * 10 for i in idx]}, batched=True, batch_size=5, with_indices=True)
    assert batched["at"] == [i * 10 for i in range(12)]
    kept = ours.filter(lambda row, i: i % 4 == 0, with_indices=True)
    assert kept["id"] == hf.filter(lambda row, i: i % 4 == 0, with_indices=True)["id"] == [0, 4, 8]
    scaled = ours.map(lambda score, i, k: {"s": score * k + i}, with_indices=True, input_columns="score", fn_kwargs={"k": 2})
    assert scaled["s"] == hf.map(lambda score, i, k: {"s": score * k + i}, with_indices=True, input_columns="score", fn_kwargs={"k": 2})["s"]
    # Read by ranks, every row keeps its own index.
    parts = [[(int(i), int(a)) for b in sf.DataLoader(got, batch_size=2, rank=r, world_size=2) for i, a in zip(b["id"], b["at"])] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == [(2, 1), (4, 3), (7, 0), (9, 2)]
