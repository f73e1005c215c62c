"""HF features: `ds.features` as `datasets` describes the columns, read from the
`huggingface` metadata that `datasets` writes, carried through the verbs as `datasets`
carries them, and compared with `datasets` itself (its Features' JSON and repr)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Callable

import datasets
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf

HF = datasets.Features(
    {
        "label": datasets.ClassLabel(names=["neg", "pos", "mixed"]),
        "text": datasets.Value("string"),
        "score": datasets.Value("float32"),
        "tags": datasets.Sequence(datasets.Value("int32")),
        "image": datasets.Image(),
        "audio": datasets.Audio(sampling_rate=16_000),
        "meta": {"source": datasets.Value("string"), "ids": datasets.List(datasets.Value("int64"))},
        "pair": datasets.List(datasets.Value("float64"), length=2),
        "per_token": datasets.Sequence({"start": datasets.Value("int8")}),
        "big": datasets.LargeList(datasets.Value("int16")),
    }
)
#: With a feature shardflow keeps as read (`datasets` cannot make rows of it from a dict).
HF_JSON = datasets.Features({**HF, "translation": datasets.Translation(languages=["en", "fr"])})

ROWS = 24


def columns() -> dict[str, list[Any]]:
    return {
        "label": [i % 3 for i in range(ROWS)],
        "text": [f"row {i}" for i in range(ROWS)],
        "score": [i / 4 for i in range(ROWS)],
        "tags": [list(range(i % 4)) for i in range(ROWS)],
        "image": [None] * ROWS,
        "audio": [None] * ROWS,
        "meta": [{"source": f"s{i % 2}", "ids": [i]} for i in range(ROWS)],
        "pair": [[float(i), float(-i)] for i in range(ROWS)],
        "per_token": [{"start": [i % 5]} for i in range(ROWS)],
        "big": [[i] for i in range(ROWS)],
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[datasets.Dataset, str, str]:
    """The rows as `datasets` holds them, and as it writes them: Parquet
    (`to_parquet`) and its own Arrow file (`save_to_disk`)."""
    directory = tmp_path_factory.mktemp("features")
    reference = datasets.Dataset.from_dict(columns(), features=HF)
    parquet = str(directory / "train.parquet")
    reference.to_parquet(parquet)
    reference.save_to_disk(str(directory / "saved"))
    (arrow,) = sorted((directory / "saved").glob("*.arrow"))
    return reference, parquet, str(arrow)


def test_features_json_repr_and_arrow_are_datasets_own() -> None:
    ours = sf.Features.from_dict(HF_JSON.to_dict())
    assert ours.to_dict() == HF_JSON.to_dict()
    assert repr(ours) == repr(dict(HF_JSON))
    # What `datasets` stores and reads back, and what it infers from bare Arrow types.
    assert sf.Features.from_arrow_schema(HF.arrow_schema).to_dict() == HF.to_dict()
    assert sf.Features.from_arrow_schema(HF.arrow_schema).arrow_schema.remove_metadata() == HF.arrow_schema.remove_metadata()
    bare = pa.schema(
        [
            ("a", pa.int32()), ("b", pa.list_(pa.float32())), ("c", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("d", pa.large_string()), ("e", pa.timestamp("ms", tz="UTC")), ("f", pa.dictionary(pa.int32(), pa.string())),
            ("g", pa.list_(pa.int8(), 4)), ("h", pa.large_list(pa.int16())), ("i", pa.float64()), ("j", pa.date32()),
            ("k", pa.decimal128(10, 2)), ("l", pa.float16()), ("m", pa.bool_()),
        ]
    )
    assert sf.Features.from_arrow_schema(bare).to_dict() == datasets.Features.from_arrow_schema(bare).to_dict()
    # `Sequence` reads as `List`, as `datasets` 4+ reads it, and the old JSON too.
    assert sf.Sequence(sf.Value("int32")) == sf.List(sf.Value("int32"))
    assert sf.Sequence({"x": sf.Value("int8")}) == {"x": sf.List(sf.Value("int8"))}
    old = {"tags": {"feature": {"dtype": "int32", "id": None, "_type": "Value"}, "length": -1, "id": None, "_type": "Sequence"}}
    assert sf.Features.from_dict(old).to_dict() == datasets.Features.from_dict(old).to_dict()


def test_class_labels_name_as_datasets_names() -> None:
    ours, theirs = sf.ClassLabel(names=["neg", "pos"]), datasets.ClassLabel(names=["neg", "pos"])
    for call in ("int2str(1)", "int2str([0, 1])", "str2int('pos')", "str2int(['pos', 'neg'])", "str2int('1')", "num_classes", "names"):
        assert eval(f"ours.{call}") == eval(f"theirs.{call}"), call
    for call in ("int2str(2)", "str2int('maybe')", "str2int('7')"):
        with pytest.raises(ValueError):
            eval(f"theirs.{call}")
        with pytest.raises(ValueError):
            eval(f"ours.{call}")
    assert sf.ClassLabel(num_classes=3).names == datasets.ClassLabel(num_classes=3).names


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_files_datasets_wrote_read_with_their_features(written: tuple[datasets.Dataset, str, str], kind: str) -> None:
    reference, parquet, arrow = written
    ds = sf.dataset(parquet if kind == "parquet" else arrow)
    assert ds.features.to_dict() == reference.features.to_dict()
    label = ds.features["label"]
    assert isinstance(label, sf.ClassLabel) and label.int2str(2) == "mixed"
    # The Arrow schema stays as it is (the images as stored, not decoded).
    stored = sf.dataset(parquet if kind == "parquet" else arrow, format_options={"decode_images": {}})
    assert pa.schema(stored.schema).field("label").type == pa.int64()
    assert pa.schema(stored.schema).field("image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    assert stored.features.to_dict() == reference.features.to_dict()
    # Projected, the columns read keep theirs.
    assert sf.dataset(parquet, columns=["text", "label"]).features.to_dict() == reference.select_columns(["text", "label"]).features.to_dict()


def test_files_without_features_infer_them_as_datasets_does(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    table = pa.table({"x": [1, 2], "y": [["a"], []], "z": [{"p": 1.5}, {"p": 2.0}]})
    pq.write_table(table, tmp_path / "plain.parquet")
    ours = sf.dataset(str(tmp_path / "plain.parquet")).features
    assert ours.to_dict() == datasets.Dataset(table).features.to_dict()


def add_n(row: dict[str, Any]) -> dict[str, Any]:
    return {"n": 1}


def score_as_text(row: dict[str, Any]) -> dict[str, Any]:
    # Text that is not a number: `datasets` would cast "0.25" back to the column's
    # float32, where shardflow's map keeps the type the function returns.
    return {"score": f"score {row['score']}"}


def every_row(row: dict[str, Any]) -> bool:
    return True


#: Verbs with `datasets`' meaning, applied alike to both sides (module-level functions,
#: so that the datasets pickle).
VERBS: dict[str, Callable[[Any], Any]] = {
    "rename label": lambda d: d.rename_column("label", "sentiment") if "label" in d.column_names else d,
    "rename text": lambda d: d.rename_columns({"text": "body"}) if "text" in d.column_names else d,
    "select": lambda d: d.select_columns([c for c in ("score", "label", "tags", "sentiment") if c in d.column_names]),
    "remove image": lambda d: d.remove_columns(["image"]) if "image" in d.column_names else d,
    "map adds": lambda d: d.map(add_n),
    "map replaces score": lambda d: d.map(score_as_text) if "score" in d.column_names else d,
    "filter": lambda d: d.filter(every_row),
    "shuffle": lambda d: d.shuffle(seed=1),
    "take": lambda d: d.take(20) if hasattr(d, "take") else d.select(range(20)),
    "cast label": lambda d: d.cast_column("label", datasets.ClassLabel(names=["a", "b", "c"])) if "label" in d.column_names else d,
    "cast score": lambda d: d.cast_column("score", datasets.Value("float64")) if "score" in d.column_names else d,
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=st.lists(st.sampled_from(sorted(VERBS)), max_size=4))
def test_features_follow_the_verbs_as_in_datasets(written: tuple[datasets.Dataset, str, str], chain: list[str]) -> None:
    """A chain of verbs gives the features `datasets` gives after the same chain: renamed,
    selected, removed and cast features carried, columns a map made or changed
    inferred, the others kept; and the dataset pickles with them."""
    reference, parquet, _ = written
    keep = ["label", "text", "score", "tags", "image", "meta"]
    theirs, ours = reference.select_columns(keep), sf.dataset(parquet).select_columns(keep)
    for k, verb in enumerate(chain):
        if verb == "cast score" and "map replaces score" in chain[:k]:
            continue  # text that is not a number does not cast to float64
        theirs, ours = VERBS[verb](theirs), VERBS[verb](ours)
    assert ours.features.to_dict() == theirs.features.to_dict(), chain
    assert pickle.loads(pickle.dumps(ours)).features.to_dict() == theirs.features.to_dict()


def test_cast_takes_features_and_concatenate_keeps_them(written: tuple[datasets.Dataset, str, str]) -> None:
    reference, parquet, arrow = written
    wanted = datasets.Features({"label": datasets.ClassLabel(names=["x", "y", "z"]), "score": datasets.Value("float64")})
    ours = sf.dataset(parquet).select_columns(["label", "score"]).cast(wanted)
    theirs = reference.select_columns(["label", "score"]).cast(wanted)
    assert ours.features.to_dict() == theirs.features.to_dict()
    assert [r["score"] for r in ours] == [r["score"] for r in theirs]
    # shardflow's own features cast as `datasets`' do.
    own = sf.dataset(parquet).select_columns(["label"]).cast_column("label", sf.ClassLabel(names=["x", "y", "z"]))
    assert own.features.to_dict() == {"label": {"names": ["x", "y", "z"], "_type": "ClassLabel"}}
    both = sf.concatenate([sf.dataset(parquet), sf.dataset(arrow)])
    assert both.features.to_dict() == datasets.concatenate_datasets([reference, reference]).features.to_dict()


def test_written_shards_keep_the_features_for_datasets(written: tuple[datasets.Dataset, str, str], tmp_path: Path) -> None:
    """`write` stores the features in the Parquet shards' `huggingface` metadata:
    `datasets` reads shardflow's shards with them, and so does shardflow."""
    reference, parquet, _ = written
    ds = sf.dataset(parquet).select_columns(["label", "text", "tags", "meta"]).rename_column("label", "sentiment")
    ds = ds.cast_column("sentiment", sf.ClassLabel(names=["bad", "good", "both"]))
    ds.write(str(tmp_path / "out"), format="parquet", max_rows_per_shard=10)
    shards = sorted(str(p) for p in (tmp_path / "out").glob("*.parquet"))
    theirs = datasets.load_dataset("parquet", data_files=shards, split="train", cache_dir=str(tmp_path / "hf"))
    assert theirs.features.to_dict() == ds.features.to_dict()
    assert theirs.features["sentiment"].names == ["bad", "good", "both"]
    assert sf.dataset(shards).features.to_dict() == ds.features.to_dict()
    assert [r["sentiment"] for r in theirs] == [r["label"] for r in reference]


CARD = """---
configs:
- config_name: default
  data_files: data/train.*
- config_name: other
  data_files: data/train.*
dataset_info:
- config_name: default
  features:
  - name: text
    dtype: string
  - name: label
    dtype:
      class_label:
        names:
          '0': neg
          '1': pos
          '2': mixed
  - name: tags
    sequence: string
  - name: spans
    list:
    - name: start
      dtype: int64
  - name: meta
    struct:
    - name: source
      dtype: string
  - name: score
    dtype: float64
  splits:
  - name: train
    num_examples: 4
- config_name: other
  features:
  - name: text
    dtype: large_string
---
# A card whose files carry no features of their own
"""


def test_a_repo_card_gives_the_features_its_files_lack(tmp_path: Path) -> None:
    """A repo of JSON Lines (no `huggingface` metadata) whose README's `dataset_info`
    names the features: `ds.features` is what `datasets` reads from the card (class
    names included) and the rows are cast to it; files that carry features keep theirs."""
    import json

    rows = [{"text": f"t{i}", "label": i % 3, "tags": ["a"] * i, "spans": [{"start": i}], "meta": {"source": "x"}, "score": i / 2} for i in range(4)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "README.md").write_text(CARD)
    ours = sf.load_dataset(str(tmp_path), split="train")
    theirs = datasets.load_dataset(str(tmp_path), split="train")
    assert ours.features.to_dict() == theirs.features.to_dict()
    assert ours.features["label"].int2str(2) == "mixed"
    assert [r["label"] for r in ours] == [r["label"] for r in theirs]
    # Infos of several configs that the card does not declare are passed over, by both.
    (tmp_path / "README.md").write_text(CARD.replace("configs:\n- config_name: default\n  data_files: data/train.*\n- config_name: other\n  data_files: data/train.*\n", ""))
    ours = sf.load_dataset(str(tmp_path), split="train")
    theirs = datasets.load_dataset(str(tmp_path), split="train", download_mode="force_redownload")
    assert ours.features.to_dict() == theirs.features.to_dict()
    assert ours.features["label"] == sf.Value("int64")
    # Files with features of their own keep them, whatever the card says.
    written = datasets.Dataset.from_dict({"text": ["a"], "label": [1]}, features=datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["x", "y"])}))
    (tmp_path / "data" / "train.jsonl").unlink()
    written.to_parquet(str(tmp_path / "data" / "train.parquet"))
    assert sf.load_dataset(str(tmp_path), split="train").features["label"].names == ["x", "y"]
