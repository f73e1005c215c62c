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

from dataclasses import dataclass, field
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




# ---- Hugging Face `datasets` features ------------------------------------------------
#
# The feature types `datasets` describes columns with (`Value`, `ClassLabel`, `List`,
# `LargeList`, `Image`, `Audio`), with its meaning: the same names, arguments, reprs and
# `to_dict()` JSON (what `datasets` writes in a Parquet or Arrow file's `huggingface`
# metadata key), and `Sequence` read as `List`, as `datasets` 4+ reads it. A feature of
# another kind (`Array2D`, `Translation`, ...) is kept as read (`Feature`), so that it
# travels unchanged.


def _arrow_dtype_name(pa_type: Any) -> str:
    """The `Value` dtype `datasets` names an Arrow type by."""
    import pyarrow as pa

    names = {pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64", pa.date32(): "date32", pa.date64(): "date64"}
    return names.get(pa_type, str(pa_type))


def _arrow_type_of_dtype(dtype: str) -> Any:
    import pyarrow as pa

    special = {"float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(), "bool": pa.bool_(),
               "date32": pa.date32(), "date64": pa.date64(), "null": pa.null()}
    if dtype in special:
        return special[dtype]
    if hasattr(pa, dtype) and callable(getattr(pa, dtype)):
        try:
            return getattr(pa, dtype)()
        except TypeError:
            pass
    try:
        return pa.type_for_alias(dtype)
    except (ValueError, KeyError):
        pass
    import re

    parsed = re.fullmatch(r"(timestamp|time32|time64|duration)\[(\w+)(?:, tz=(.+))?\]|decimal(128|256)\((\d+), (\d+)\)", dtype)
    if parsed is None:
        raise ValueError(f"Value: unknown dtype {dtype!r}")
    kind, unit, tz, bits, precision, scale = parsed.groups()
    if bits:
        return (pa.decimal128 if bits == "128" else pa.decimal256)(int(precision), int(scale))
    return pa.timestamp(unit, tz=tz) if kind == "timestamp" else getattr(pa, kind)(unit)


@dataclass(frozen=True)
class Value:
    """A scalar column of one Arrow type, named as `datasets` names it (``"int64"``,
    ``"float32"``, ``"string"``, ``"timestamp[ms]"``, ...)."""

    dtype: str

    def __post_init__(self) -> None:
        # `datasets` takes the Arrow aliases too, and names them its own way.
        object.__setattr__(self, "dtype", {"float": "float32", "double": "float64", "halffloat": "float16"}.get(self.dtype, self.dtype))
        _arrow_type_of_dtype(self.dtype)

    @property
    def pa_type(self) -> Any:
        return _arrow_type_of_dtype(self.dtype)

    def __repr__(self) -> str:
        return f"Value({self.dtype!r})"


class ClassLabel:
    """Integer labels with names: ``names``, or ``num_classes`` (named ``"0"``,
    ``"1"``, ...), or ``names_file`` (one name per line). Stored as int64."""

    def __init__(self, num_classes: int | None = None, names: list[str] | None = None, names_file: str | None = None) -> None:
        if names_file is not None:
            with open(names_file, encoding="utf-8") as f:
                names = [line.strip() for line in f.read().splitlines() if line.strip()]
        if names is None:
            if num_classes is None:
                raise ValueError("ClassLabel needs names, num_classes or names_file")
            names = [str(i) for i in range(num_classes)]
        elif num_classes is not None and num_classes != len(names):
            raise ValueError(f"ClassLabel: num_classes={num_classes} but {len(names)} names")
        if len(set(names)) != len(names):
            raise ValueError(f"ClassLabel: the names are not unique: {names}")
        self.names: list[str] = list(names)
        self.num_classes: int = len(self.names)
        self._index = {name: i for i, name in enumerate(self.names)}

    @property
    def pa_type(self) -> Any:
        import pyarrow as pa

        return pa.int64()

    def str2int(self, values: Any) -> Any:
        """The label of a name (or of each of a list of names)."""
        if isinstance(values, (list, tuple)):
            return [self.str2int(v) for v in values]
        if values in self._index:
            return self._index[values]
        # As `datasets`: a number written as a string is that label, if it is one.
        try:
            label = int(str(values).strip())
        except ValueError:
            raise ValueError(f"Invalid string class label {values}") from None
        if not 0 <= label < self.num_classes:
            raise ValueError(f"Invalid string class label {values}")
        return label

    def int2str(self, values: Any) -> Any:
        """The name of a label (or of each of a list of labels)."""
        if isinstance(values, (list, tuple)):
            return [self.int2str(v) for v in values]
        if not 0 <= int(values) < self.num_classes:
            raise ValueError(f"Invalid integer class label {values}")
        return self.names[int(values)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassLabel) and other.names == self.names

    def __hash__(self) -> int:
        return hash(tuple(self.names))

    def __repr__(self) -> str:
        return f"ClassLabel(names={self.names!r})"


@dataclass(frozen=True)
class List:
    """A list of ``feature`` per row: any number (``length=-1``), or exactly
    ``length`` (an Arrow fixed-size list)."""

    feature: Any
    length: int = -1

    @property
    def pa_type(self) -> Any:
        import pyarrow as pa

        inner = _arrow_type(self.feature)
        return pa.list_(inner) if self.length == -1 else pa.list_(inner, self.length)

    def __repr__(self) -> str:
        return f"List({self.feature!r})" if self.length == -1 else f"List({self.feature!r}, length={self.length})"


@dataclass(frozen=True)
class LargeList:
    """A list of ``feature`` per row with 64-bit offsets."""

    feature: Any

    @property
    def pa_type(self) -> Any:
        import pyarrow as pa

        return pa.large_list(_arrow_type(self.feature))

    def __repr__(self) -> str:
        return f"LargeList({self.feature!r})"


def Sequence(feature: Any, length: int = -1) -> Any:  # noqa: N802 (datasets' name)
    """`datasets`' ``Sequence``, as `datasets` 4+ reads it: a ``List``; of a dict of
    features, a dict of lists."""
    if isinstance(feature, dict):
        return {name: List(f, length) for name, f in feature.items()}
    return List(feature, length)


def _media_type() -> Any:
    import pyarrow as pa

    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclass(frozen=True)
class Image:
    """An image stored as `datasets` stores it: ``{bytes, path}``. ``mode`` converts
    it (``"RGB"``, ``"L"``, ...) where it is decoded; ``decode=False`` leaves it as
    stored."""

    mode: str | None = None
    decode: bool = True

    pa_type = property(lambda self: _media_type())


@dataclass(frozen=True)
class Audio:
    """An audio file stored as `datasets` stores it: ``{bytes, path}``, decoded at
    ``sampling_rate`` (the file's own where None)."""

    sampling_rate: int | None = None
    decode: bool = True
    num_channels: int | None = None
    stream_index: int | None = None

    pa_type = property(lambda self: _media_type())


@dataclass(frozen=True)
class Feature:
    """A feature of a kind shardflow does not read (``Array2D``, ``Translation``,
    ...): its ``to_dict()`` JSON as `datasets` wrote it, kept unchanged, and the Arrow
    type of the column it was read with (None where it was not read from data)."""

    spec: Any
    arrow: Any = field(default=None, compare=False)

    @property
    def pa_type(self) -> Any:
        if self.arrow is None:
            raise ValueError(f"the Arrow type of a {self.spec['_type']} feature is known only from data that has it")
        return self.arrow

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.spec.items() if k != "_type")
        return f"{self.spec['_type']}({fields})"


#: shardflow's own feature types.
_OURS = (Value, ClassLabel, List, LargeList, Image, Audio, Feature)


def _arrow_type(feature: Any) -> Any:
    import pyarrow as pa

    if isinstance(feature, dict):
        return pa.struct([(name, _arrow_type(f)) for name, f in feature.items()])
    if isinstance(feature, list):
        return pa.list_(_arrow_type(feature[0]))
    return feature.pa_type


#: The defaults `to_dict()` leaves out, as `datasets` does.
_DEFAULTS: dict[type, dict[str, Any]] = {
    Image: {"mode": None, "decode": True},
    Audio: {"sampling_rate": None, "decode": True, "num_channels": None, "stream_index": None},
}


def _to_dict(feature: Any) -> Any:
    if isinstance(feature, dict):
        return {name: _to_dict(f) for name, f in feature.items()}
    if isinstance(feature, list):
        return [_to_dict(feature[0])]
    if isinstance(feature, Value):
        return {"dtype": feature.dtype, "_type": "Value"}
    if isinstance(feature, ClassLabel):
        return {"names": list(feature.names), "_type": "ClassLabel"}
    if isinstance(feature, List):
        out = {"feature": _to_dict(feature.feature)}
        if feature.length != -1:
            out["length"] = feature.length
        return {**out, "_type": "List"}
    if isinstance(feature, LargeList):
        return {"feature": _to_dict(feature.feature), "_type": "LargeList"}
    if isinstance(feature, (Image, Audio)):
        defaults = _DEFAULTS[type(feature)]
        out = {k: getattr(feature, k) for k, v in defaults.items() if getattr(feature, k) != v}
        return {**out, "_type": type(feature).__name__}
    if isinstance(feature, Feature):
        return dict(feature.spec)
    return _to_dict(from_hf(feature))


def _from_dict(spec: Any) -> Any:
    if isinstance(spec, list):
        return List(_from_dict(spec[0]))
    if not isinstance(spec, dict):
        raise ValueError(f"not a feature: {spec!r}")
    kind = spec.get("_type")
    if kind is None:
        return {name: _from_dict(s) for name, s in spec.items()}
    args = {k: v for k, v in spec.items() if k not in ("_type", "id")}
    if kind == "Value":
        return Value(args["dtype"])
    if kind == "ClassLabel":
        return ClassLabel(names=args.get("names"), num_classes=args.get("num_classes") if args.get("names") is None else None)
    if kind in ("List", "Sequence"):
        inner = _from_dict(args["feature"])
        length = args.get("length", -1)
        return Sequence(inner, length) if kind == "Sequence" else List(inner, length)
    if kind == "LargeList":
        return LargeList(_from_dict(args["feature"]))
    if kind in ("Image", "Audio"):
        cls = Image if kind == "Image" else Audio
        return cls(**{k: v for k, v in args.items() if k in _DEFAULTS[cls]})
    return Feature(dict(spec))


def from_hf(feature: Any) -> Any:
    """A `datasets` feature (or a dict of them) as shardflow's, by its JSON."""
    if isinstance(feature, dict):  # `datasets.Features` too
        return {name: from_hf(f) for name, f in feature.items()}
    if isinstance(feature, list):  # `datasets`' old spelling of a list
        return List(from_hf(feature[0]))
    if isinstance(feature, _OURS):
        return feature
    from dataclasses import asdict, is_dataclass

    name = type(feature).__name__
    if name == "ClassLabel":
        return ClassLabel(names=list(feature.names))
    if is_dataclass(feature):
        fields = {k: v for k, v in asdict(feature).items() if not k.startswith("_") and k != "id"}
        if "feature" in fields:
            fields["feature"] = _to_dict(from_hf(getattr(feature, "feature")))
        return _from_dict({**fields, "_type": name})
    raise TypeError(f"not a feature: {feature!r}")


def _infer(pa_type: Any) -> Any:
    """The feature `datasets` infers for an Arrow type (``Features.from_arrow_schema``)."""
    import pyarrow as pa

    if pa.types.is_struct(pa_type):
        return {pa_type.field(i).name: _infer(pa_type.field(i).type) for i in range(pa_type.num_fields)}
    if pa.types.is_fixed_size_list(pa_type):
        return List(_infer(pa_type.value_type), pa_type.list_size)
    if pa.types.is_large_list(pa_type):
        return LargeList(_infer(pa_type.value_type))
    if pa.types.is_list(pa_type) or pa.types.is_list_view(pa_type):
        return List(_infer(pa_type.value_type))
    if pa.types.is_dictionary(pa_type):
        return _infer(pa_type.value_type)
    return Value(_arrow_dtype_name(pa_type))


class Features(dict):  # type: ignore[type-arg]
    """Column name -> feature, as `datasets.Features`: ``from_dict``/``to_dict`` in its
    JSON, ``from_arrow_schema`` as it infers, ``arrow_schema`` as it stores."""

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Features:
        return cls({name: _from_dict(s) for name, s in spec.items()})

    def to_dict(self) -> dict[str, Any]:
        """The features as `datasets` serialises them (``Features.to_dict()``)."""
        return {name: _to_dict(f) for name, f in self.items()}

    @classmethod
    def from_arrow_schema(cls, schema: Any) -> Features:
        """Features from an Arrow schema: those its ``huggingface`` metadata names
        where the column's type is theirs, else inferred from the type."""
        import json

        import pyarrow as pa

        schema = pa.schema(schema)
        stored: dict[str, Any] = {}
        raw = (schema.metadata or {}).get(b"huggingface")
        if raw:
            stored = cls.from_dict(json.loads(raw).get("info", {}).get("features") or {})
        return cls({field.name: _fitting(stored.get(field.name), field.type) for field in schema})

    @property
    def arrow_schema(self) -> Any:
        import json

        import pyarrow as pa

        metadata = {"huggingface": json.dumps({"info": {"features": self.to_dict()}})}
        return pa.schema([(name, _arrow_type(f)) for name, f in self.items()], metadata=metadata)

    @property
    def type(self) -> Any:
        import pyarrow as pa

        return pa.struct([(name, _arrow_type(f)) for name, f in self.items()])

    def copy(self) -> Features:
        """A shallow copy, still a ``Features``."""
        return Features(self)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{name!r}: {f!r}" for name, f in self.items()) + "}"


def _decoded_image(pa_type: Any) -> bool:
    """Whether a column of ``pa_type`` holds decoded images: uint8 tensors, of one
    shape (a fixed-size list) or each of its own (``{data, shape}``)."""
    import pyarrow as pa

    if pa_type is None:
        return False
    if pa.types.is_fixed_size_list(pa_type):
        return pa_type.value_type == pa.uint8()
    return pa.types.is_struct(pa_type) and {pa_type.field(i).name for i in range(pa_type.num_fields)} == {"data", "shape"}


def _decoded_audio(pa_type: Any) -> bool:
    """Whether a column of ``pa_type`` holds decoded audio: ``{array, sampling_rate, path}``."""
    import pyarrow as pa

    return pa_type is not None and pa.types.is_struct(pa_type) and [pa_type.field(i).name for i in range(pa_type.num_fields)] == ["array", "sampling_rate", "path"]


def _fitting(feature: Any, pa_type: Any) -> Any:
    """``feature`` where it describes a column of ``pa_type`` (a feature shardflow
    does not read is trusted), else the one inferred from the type."""
    if feature is None:
        return _infer(pa_type)
    if isinstance(feature, Image) and _decoded_image(pa_type):
        return feature  # decoded on the pool: the pixels of the `Image` it was
    if isinstance(feature, Audio) and _decoded_audio(pa_type):
        return feature
    if isinstance(feature, Feature):
        return Feature(feature.spec, pa_type)
    if _arrow_type(feature).equals(pa_type):
        return feature
    import pyarrow as pa

    if isinstance(feature, dict) and pa.types.is_struct(pa_type):
        return {pa_type.field(i).name: _fitting(feature.get(pa_type.field(i).name), pa_type.field(i).type) for i in range(pa_type.num_fields)}
    return _infer(pa_type)



def _is_feature(obj: Any) -> bool:
    """Whether ``obj`` is a feature (shardflow's or `datasets`'), not an Arrow type."""
    return isinstance(obj, _OURS) or type(obj).__module__.startswith("datasets.")


def _cast_schema(spec: Any, column: str | None = None) -> Any:
    """What ``cast`` (``column=None``) or ``cast_column(column, ...)`` casts to, as an
    Arrow schema: given features (shardflow's or `datasets`'), their Arrow types, with
    the features in its ``huggingface`` metadata (so that ``ds.features`` follows the
    cast); given Arrow types, those."""
    import pyarrow as pa

    if column is not None:
        if not _is_feature(spec):
            return pa.schema([pa.field(column, spec)])
        spec = {column: spec}
    if isinstance(spec, dict) and all(_is_feature(f) or isinstance(f, (dict, list)) for f in spec.values()):
        return Features({name: from_hf(f) for name, f in spec.items()}).arrow_schema
    return spec


#: Verbs that run the user's code on rows: a cast that changes how a media column
#: decodes (where it is read) cannot come after them, as they saw it decoded as it was.
_FUNCTION_VERBS = frozenset({"map", "filter", "flat_map", "batch"})


def _cast_plan(schema: Any, recipe: list[tuple[str, Any]]) -> tuple[Any, str | None]:
    """Splits what ``cast`` casts to (``schema``, from ``_cast_schema``) in two: the
    Arrow schema of the columns an Arrow cast converts, and the JSON of the `Image` /
    `Audio` features given (``{column: feature}``, columns named as the files name
    them): those set how the columns decode as they are read, as `datasets` decodes a
    cell by its feature when it is accessed."""
    import json

    import pyarrow as pa

    schema = pa.schema(schema)
    stored = (schema.metadata or {}).get(b"huggingface")
    features = json.loads(stored).get("info", {}).get("features", {}) if stored else {}
    media = {name: f for name, f in features.items() if name in schema.names and isinstance(f, dict) and f.get("_type") in ("Image", "Audio")}
    if not media:
        return schema, None
    ran = [verb for verb, _ in recipe[1:] if verb in _FUNCTION_VERBS]
    if ran:
        raise ValueError(f"cast to {', '.join(f['_type'] for f in media.values())} after {ran[0]}: it sets how {sorted(media)} decode where they are read, and {ran[0]} saw them decoded as they were; cast before {ran[0]}")
    if recipe[0][0] in ("concatenate", "interleave"):
        raise ValueError(f"cast to {', '.join(f['_type'] for f in media.values())} after {recipe[0][0]}: cast each dataset before combining them")
    # The files' name for each column, undoing the renames since.
    source = {name: name for name in media}
    for verb, args in reversed(recipe[1:]):
        if verb == "rename_columns":
            back = {new: old for old, new in dict(args[0]).items()}
            source = {name: back.get(was, was) for name, was in source.items()}
    rest = pa.schema([f for f in schema if f.name not in media], metadata=schema.metadata)
    return rest, json.dumps({source[name]: f for name, f in media.items()})


def _renamed(features: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    return {mapping.get(name, name): f for name, f in features.items()}


def _features_of(recipe: list[tuple[str, Any]], stored: str | None, schema: Any) -> Features:
    """``ds.features``: the features the dataset's files were written with
    (``stored``: their ``huggingface`` metadata), carried through its verbs as
    `datasets` carries them (renamed, selected, removed, cast), then matched against
    ``schema``, its columns now: a column whose type is its feature's keeps it, any
    other (made or changed by a function) has the feature its Arrow type infers."""
    import json

    import pyarrow as pa

    (origin, kwargs), *verbs = recipe
    tracked: dict[str, Any] = {}
    if origin in ("concatenate", "interleave"):
        parts = kwargs.get("datasets") if isinstance(kwargs, dict) else None
        if parts:
            tracked = dict(parts[0].features)
    elif stored:
        tracked = Features.from_dict(json.loads(stored).get("info", {}).get("features") or {})
    for verb, args in verbs:
        if verb == "rename_columns":
            tracked = _renamed(tracked, dict(args[0]))
        elif verb == "remove_columns":
            tracked = {name: f for name, f in tracked.items() if name not in set(args[0])}
        elif verb == "select_columns":
            tracked = {name: tracked[name] for name in args[0] if name in tracked}
        elif verb == "cast":
            tracked.update(Features.from_arrow_schema(pa.schema(args["schema"])))
    schema = pa.schema(schema)
    return Features({field.name: _fitting(tracked.get(field.name), field.type) for field in schema})



def _stored_json(features: Features, schema: Any) -> str:
    """The ``huggingface`` metadata value `datasets` writes for ``features`` of columns
    of ``schema``: the columns as written (decoded images are tensors and decoded audio
    `{array, sampling_rate, path}` now: theirs is what their type infers, which
    `datasets` reads back the same)."""
    import json

    import pyarrow as pa

    types = {field.name: field.type for field in pa.schema(schema)}
    written = {
        name: f
        for name, f in features.items()
        if not (isinstance(f, Image) and _decoded_image(types.get(name))) and not (isinstance(f, Audio) and _decoded_audio(types.get(name)))
    }
    return json.dumps({"info": {"features": Features(written).to_dict()}})


__all__ = ["Audio", "ClassLabel", "Feature", "Features", "FixedLen", "Image", "LargeList", "List", "Sequence", "Value", "VarLen", "from_hf"]
