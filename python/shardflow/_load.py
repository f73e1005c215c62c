"""``load_dataset``: a dataset where it lives — a Hugging Face Hub repo, a folder or
``s3://``/``gs://``/``az://`` prefix laid out as one, or data files of a named format — resolved into
configs and splits by the rules of Hugging Face ``datasets`` (``datasets/load.py`` and
``datasets/data_files.py``):

- the README.md YAML ``configs:`` block (``config_name``, ``data_files`` as a string, a
  list or split mappings, ``data_dir``, ``default``);
- else the split patterns: ``data/{split}-NNNNN-of-NNNNN.*``, then split keywords in
  folder names, then in file names, then everything as ``train``;
- the builder by the most common extension, and only its files read.

A Hub repo is listed once (its revision pinned to a commit) and every split's dataset
carries that listing, so pickled copies in worker processes list nothing.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, Callable

# HF's builder name -> (our format, the extensions HF gives the builder). Builders
# HF has and we do not (text, xml, audio and image folders, ...) are refused by name.
_BUILDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "parquet": ("parquet", (".parquet", ".geoparquet", ".gpq")),
    "json": ("json", (".json", ".jsonl", ".ndjson")),
    "csv": ("csv", (".csv", ".tsv")),
    "arrow": ("arrow", (".arrow",)),
    "webdataset": ("webdataset", (".tar",)),
    "hdf5": ("hdf5", (".hdf5", ".h5")),
}
# `datasets`' folder builders: the column each file becomes, and the files' extensions
# (theirs: those PIL and libsndfile/FFmpeg open; a file of one shardflow does not
# decode is its row's DecodeError, never a file passed over).
_FOLDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "imagefolder": ("image", (
        ".blp", ".bmp", ".dib", ".bufr", ".cur", ".pcx", ".dcx", ".dds", ".ps", ".eps", ".fit", ".fits", ".fli",
        ".flc", ".ftc", ".ftu", ".gbr", ".gif", ".grib", ".png", ".apng", ".jp2", ".j2k", ".jpc", ".jpf", ".jpx",
        ".j2c", ".icns", ".ico", ".im", ".iim", ".tif", ".tiff", ".jfif", ".jpe", ".jpg", ".jpeg", ".mpg", ".mpeg",
        ".msp", ".pcd", ".pxr", ".pbm", ".pgm", ".ppm", ".pnm", ".psd", ".bw", ".rgb", ".rgba", ".sgi", ".ras",
        ".tga", ".icb", ".vda", ".vst", ".webp", ".wmf", ".emf", ".xbm", ".xpm")),
    "audiofolder": ("audio", (
        ".aiff", ".au", ".avr", ".caf", ".flac", ".htk", ".svx", ".mat4", ".mat5", ".mpc2k", ".ogg", ".paf", ".pvf",
        ".raw", ".rf64", ".sd2", ".sds", ".ircam", ".voc", ".w64", ".wav", ".nist", ".wavex", ".wve", ".xi", ".mp3",
        ".opus", ".3gp", ".3g2", ".avi", ".asf", ".flv", ".mp4", ".mov", ".m4v", ".mkv", ".webm", ".f4v",
        ".wmv", ".wma", ".ogm", ".mxf", ".nut", ".m4a")),
}
_METADATA_FILES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
# Every extension HF knows, with its builder (what `infer_module_for_data_files` counts).
_EXTENSION_TO_BUILDER = {ext: name for name, (_, exts) in _BUILDERS.items() for ext in exts} | {
    ".txt": "text", ".xml": "xml", ".conll": "conll", ".conllu": "conll", ".eval": "eval",
    ".lance": "lance", ".vortex": "vortex", ".toml": "harbor", ".md": "harbor",
} | {ext: name for name, (_, exts) in _FOLDERS.items() for ext in exts}
# On a draw, HF prefers these, in this order, then the extension's name.
_FAVOURITES = (".parquet", ".lance", ".vortex", ".arrow", ".jsonl", ".json", ".csv")

_SPLIT_KEYWORDS = {
    "train": ["train", "training"],
    "validation": ["validation", "valid", "dev", "val"],
    "test": ["test", "testing", "eval", "evaluation"],
}
_SEP = "-._ 0-9"
_SHARDED = "data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"
_IN_DIR_NAME = {
    split: [p.format(keyword=k, sep=_SEP) for k in keywords for p in (
        "**/{keyword}/**", "**/{keyword}[{sep}]*/**", "**/*[{sep}]{keyword}/**",
        "**/*[{sep}]{keyword}[{sep}]*/**")]
    for split, keywords in _SPLIT_KEYWORDS.items()
}
_IN_FILE_NAME = {
    split: [p.format(keyword=k, sep=_SEP) for k in keywords for p in (
        "**/{keyword}[{sep}]*", "**/*[{sep}]{keyword}[{sep}]*")]
    for split, keywords in _SPLIT_KEYWORDS.items()
}
_DEFAULT_PATTERNS = [_IN_DIR_NAME, _IN_FILE_NAME, {"train": ["**"]}]
# Never data, wherever they match (HF's FILES_TO_IGNORE).
_FILES_TO_IGNORE = {
    "README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip",
    "dataset_dict.json",
}
_SHARD_NAME = re.compile(r"^data/([^/]+)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*$")
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_SPLIT_NAME = re.compile(r"^\w+(?:\.\w+)*$")


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """fsspec's glob (HF's resolver): ``*`` and ``?`` stay within a folder, ``**/`` is
    any number of folders (none too), a trailing ``**`` anything, ``[...]`` a class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 1)) > i + 1:
            body = pattern[i + 1:end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _hidden_parts(path: str, starts: str) -> int:
    return sum(1 for part in path.split("/") if part.startswith(starts) and set(part) != {"."})


def _match(pattern: str, files: list[str]) -> list[str]:
    """The files (relative paths, sorted) that `pattern` selects, as HF resolves it: hidden
    files and `__special__` folders only where the pattern names them too."""
    regex = _glob_regex(pattern.lstrip("/"))
    base = os.path.basename(pattern)
    return [
        f for f in files
        if regex.match(f)
        and (os.path.basename(f) not in _FILES_TO_IGNORE or os.path.basename(f) == base)
        and _hidden_parts(f, ".") == _hidden_parts(pattern, ".")
        and _hidden_parts(os.path.dirname(f), "__") == _hidden_parts(os.path.dirname(pattern), "__")
    ]


def _default_patterns(files: list[str]) -> dict[str, list[str]]:
    """HF's `get_data_patterns`: the first layout the files follow."""
    shard_splits = {m.group(1) for f in files if (m := _SHARD_NAME.match(f))}
    if shard_splits:
        bad = [s for s in shard_splits if not _SPLIT_NAME.match(s)]
        if bad:
            raise ValueError(f"Split name should match '{_SPLIT_NAME.pattern}' but got '{bad}'.")
        ordered = [s for s in _SPLIT_KEYWORDS if s in shard_splits] + sorted(shard_splits - set(_SPLIT_KEYWORDS))
        return {s: [_SHARDED.format(split=s)] for s in ordered}
    for patterns in _DEFAULT_PATTERNS:
        found = {s: p for s, p in patterns.items() if any(_match(one, files) for one in p)}
        if found:
            return found
    raise _not_found("no data files")


def _sanitize(data_files: Any) -> dict[str, list[str]]:
    """`data_files` as HF takes it: a pattern, a list of them (train), a dict of split
    to pattern(s), or a list of {"split", "path"} mappings."""
    if isinstance(data_files, dict):
        return {str(k): v if isinstance(v, list) else [v] for k, v in data_files.items()}
    if isinstance(data_files, str):
        return {"train": [data_files]}
    data_files = list(data_files)
    if any(isinstance(p, dict) for p in data_files):
        if not all(isinstance(p, dict) and set(p) == {"split", "path"} for p in data_files):
            raise ValueError(
                "Invalid format for data_files entry. Each item must be a dictionary with the "
                f"structure {{'split': <split_name>, 'path': <path_or_list_of_paths>}}.\nReceived: {data_files}"
            )
        return {str(p["split"]): p["path"] if isinstance(p["path"], list) else [p["path"]] for p in data_files}
    return {"train": data_files}


def _extensions(name: str) -> list[str]:
    return ["." + suffix.lower() for suffix in os.path.basename(name).split(".")[1:]]


def _builder(files: list[str]) -> str:
    """HF's `infer_module_for_data_files_list`: the most common known extension."""
    counts = Counter(ext for f in files for ext in _extensions(f))
    for ext, _ in sorted(
        counts.items(),
        key=lambda item: (item[1], *(item[0] == f for f in _FAVOURITES), item[0]),
        reverse=True,
    ):
        if ext in _EXTENSION_TO_BUILDER:
            return _EXTENSION_TO_BUILDER[ext]
    raise _not_found("no (supported) data files")


def _not_found(what: str) -> Exception:
    from shardflow.errors import NotFoundError

    return NotFoundError(what)


class _Repo:
    """A repo's files: relative paths, each with what reads it."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None) -> None:
        from shardflow import _native

        self.storage_options = storage_options
        # (url, size, version) by relative path.
        self.files: dict[str, tuple[str, int | None, str | None]] = {}
        if "://" not in root or root.startswith("file://"):
            local = root.removeprefix("file://")
            for folder, dirs, names in os.walk(local):
                dirs.sort()
                for name in sorted(names):
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, local).replace(os.sep, "/")
                    self.files[rel] = (path, None, None)
            self.remote = False
        else:
            for url, size, version in _native._list_files(root, storage_options):
                self.files[_relative(root, url)] = (url, size, version)
            self.remote = True
        self.root = root

    def read_text(self, rel: str) -> str:
        from shardflow import _native

        url, size, _ = self.files[rel]
        return bytes(_native._read_file(url, size, self.storage_options)).decode("utf-8")


def _relative(root: str, url: str) -> str:
    """A listed URL's path in its repo (`hf://datasets/org/name@commit/path`: the listing
    names the commit, not the branch listed) or below its prefix."""
    if url.startswith("hf://"):
        return url.split("/", 5)[5]
    return url[len(root):].lstrip("/")


def _repo_root(path: str, revision: str | None) -> tuple[str, str]:
    """The root to list for `path`, and the folder below it that `path` names."""
    if path.startswith("hf://"):
        rest = path[len("hf://"):]
        if not rest.startswith("datasets/"):
            raise ValueError(f"{path}: only dataset repos can be read (hf://datasets/org/name)")
        parts = rest.split("/", 3)
        if len(parts) < 3:
            raise ValueError(f"{path}: expected hf://datasets/org/name[@revision][/path]")
        repo, sub = f"{parts[1]}/{parts[2]}", parts[3] if len(parts) > 3 else ""
        if "@" in repo:
            repo, at = repo.split("@", 1)
            if at == "refs" and sub.split("/")[0] in ("convert", "pr"):
                head = sub.split("/", 2)
                at, sub = "/".join(["refs", *head[:2]]), head[2] if len(head) > 2 else ""
            revision = revision or at
        return _hub_root(repo, revision), sub.strip("/")
    if "://" in path and not path.startswith("file://"):  # an object store's prefix
        return path.rstrip("/") + "/", ""
    return path, ""


def _hub_root(repo: str, revision: str | None) -> str:
    from urllib.parse import quote

    return f"hf://datasets/{repo}@{quote(revision or 'main', safe='')}"


def _is_repo_id(path: str) -> bool:
    return bool(_REPO_ID.match(path)) and not os.path.exists(path)


def _card(repo: _Repo) -> dict[str, Any]:
    """The README.md YAML block (empty without a card or the block)."""
    if "README.md" not in repo.files:
        return {}
    text = repo.read_text("README.md")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    import yaml

    card = yaml.safe_load(text[3:end]) or {}
    return card if isinstance(card, dict) else {}


def _card_configs(card: dict[str, Any], root: str) -> list[dict[str, Any]]:
    """The card's `configs:` list."""
    configs = card.get("configs") or []
    if not isinstance(configs, list) or not all(isinstance(c, dict) and "config_name" in c for c in configs):
        raise ValueError(f"{root}: README.md's configs must be a list of mappings with config_name")
    return configs


def _card_features(card: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    """The `dataset_info.features` of the card for config `name` (one mapping, or a list
    of them by `config_name`), in `datasets`' JSON form (`Features._from_yaml_list`)."""
    info = card.get("dataset_info")
    if isinstance(info, list) and len(info) > 1 and not card.get("configs"):
        return None  # as `datasets`: infos of several configs, none of them declared
    if isinstance(info, list):
        wanted = name or "default"
        info = next((i for i in info if isinstance(i, dict) and i.get("config_name", "default") == wanted), None)
    if not isinstance(info, dict) or not isinstance(info.get("features"), list):
        return None
    return _from_yaml(info["features"])


def _from_yaml(obj: Any) -> Any:
    """`datasets`' `Features._from_yaml_list`: the card's list of `{name, dtype | class_label
    | list | sequence | struct ...}` as the features' JSON."""
    import copy

    from shardflow.features import _arrow_type_of_dtype

    def camel(name: str) -> str:
        return "".join(part[:1].upper() + part[1:] for part in name.split("_"))

    def unsimplify(feature: dict[str, Any]) -> dict[str, Any]:
        for list_type in ("large_list", "list", "sequence"):
            if isinstance(feature.get(list_type), str):
                feature[list_type] = {"dtype": feature[list_type]}
        label = feature.get("class_label")
        if isinstance(label, dict) and isinstance(label.get("names"), dict):
            ids = sorted(label["names"], key=int)
            if ids and [int(i) for i in ids] != list(range(int(ids[-1]) + 1)):
                raise ValueError(f"ClassLabel expected a value for all label ids [0:{int(ids[-1]) + 1}] but some ids are missing.")
            label["names"] = [label["names"][i] for i in ids]
        return feature

    def inner(obj: Any) -> Any:
        if isinstance(obj, list):
            names = [feature.pop("name") for feature in obj]
            return {name: inner(feature) for name, feature in zip(names, obj)}
        if not isinstance(obj, dict):
            raise TypeError(f"Expected a dict but got a {type(obj)}: {obj}")
        if not obj:
            return {}
        kind = next(iter(obj))
        if kind in ("large_list", "list", "sequence"):
            if kind == "sequence" and isinstance(obj[kind], list):
                feature = inner(unsimplify(obj).pop(kind))
                return {name: {"feature": sub, **obj, "_type": "List"} for name, sub in feature.items()}
            feature = inner(unsimplify(obj).pop(kind))
            return {"feature": feature, **obj, "_type": "LargeList" if kind == "large_list" else "List"}
        if kind == "struct":
            return inner(obj["struct"])
        if kind == "dtype":
            if isinstance(obj["dtype"], str):
                try:
                    _arrow_type_of_dtype(obj["dtype"])
                    return {**obj, "_type": "Value"}
                except ValueError:
                    return {"_type": camel(obj["dtype"])}
            return inner(obj["dtype"])
        return {"_type": camel(kind), **unsimplify(obj)[kind]}

    return inner(copy.deepcopy(obj))


def _default_config(configs: list[dict[str, Any]]) -> str | None:
    """HF's `MetadataConfigs.get_default_config_name`."""
    default = None
    for config in configs:
        if len(configs) == 1 or config["config_name"] == "default" or config.get("default"):
            if default is not None:
                raise ValueError(f"Dataset has several default configs: '{default}' and '{config['config_name']}'.")
            default = config["config_name"]
    return default


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _below(repo: _Repo, base: str) -> dict[str, str]:
    """The repo's files in the folder `base` (all of them for ""): path there -> path in the repo."""
    return {f[len(base) + 1:] if base else f: f for f in repo.files if not base or f.startswith(base + "/")}


def _split_files(repo: _Repo, base: str, patterns: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each split's files (relative paths), pattern by pattern in the order given."""
    below = _below(repo, base)
    relative = sorted(below)
    splits: dict[str, list[str]] = {}
    for split, split_patterns in patterns.items():
        files: list[str] = []
        for pattern in split_patterns:
            matched = _match(pattern, relative)
            # A glob that matches nothing is passed over; a file named must be there.
            if not matched and not any(c in pattern for c in "*?["):
                raise _not_found(f"Unable to find '{_join(repo.root, base, pattern)}'")
            files += [below[m] for m in matched]
        splits[split] = files
    return splits


def _split_datasets(
    repo: _Repo, splits: dict[str, list[str]], dataset_args: dict[str, Any],
) -> dict[str, Any]:
    """A dataset per split, of the builder's files only."""
    import shardflow

    builder = _builder([f for files in splits.values() for f in files])
    if builder in _FOLDERS:
        return _folder_splits(builder, repo, splits, dataset_args)
    if builder not in _BUILDERS:
        raise shardflow.InvalidArgumentError(
            f"{repo.root}: its data files are for the {builder!r} builder of `datasets`, which shardflow does not read"
        )
    fmt, extensions = _BUILDERS[builder]
    out = {}
    for split, files in splits.items():
        kept = [f for f in files if any(ext in extensions for ext in _extensions(f))]
        if any(".tsv" in _extensions(f) for f in kept):
            raise shardflow.InvalidArgumentError(f"{repo.root}: tab-separated (.tsv) files are not read yet")
        if not kept:
            raise _not_found(f"{repo.root}: split {split!r} has no {builder} files")
        entries = [repo.files[f] for f in kept]
        listing = entries if repo.remote else None
        out[split] = shardflow.dataset(
            [e[0] for e in entries], format=fmt, storage_options=repo.storage_options,
            _listing=listing, **dataset_args,
        )
    return out


def _with_card_features(ds: Any, card: dict[str, Any]) -> Any:
    """`ds` with the card's features where its files carry none of their own (as
    `datasets` reads a repo: the files' `huggingface` metadata first): cast to them, the
    columns it has."""
    from shardflow.features import Features

    if ds._stored_features is not None:
        return ds
    columns = set(ds.schema.names)
    features = Features.from_dict({name: spec for name, spec in card.items() if name in columns})
    return ds.cast(features) if features else ds


def _folder_splits(builder: str, repo: _Repo, splits: dict[str, list[str]], dataset_args: dict[str, Any]) -> dict[str, Any]:
    """`datasets`' `imagefolder` / `audiofolder`: a row per image or audio file, its
    column an `Image` / `Audio` decoded on the pool; a `label` `ClassLabel` of the
    sorted folder names where there is more than one and every file sits at one depth
    (`drop_labels=False` forces it, `True` drops it). Metadata files (`metadata.csv`,
    `.jsonl`, `.parquet`) are not joined yet: refused unless `drop_metadata=True`."""
    import shardflow
    from shardflow.features import Audio, ClassLabel, Image

    column, extensions = _FOLDERS[builder]
    drop_labels = dataset_args.pop("drop_labels", None)
    drop_metadata = dataset_args.pop("drop_metadata", None)
    media = {s: [f for f in files if os.path.splitext(f)[1].lower() in extensions] for s, files in splits.items()}
    metadata = sorted(f for files in splits.values() for f in files if f.rsplit("/", 1)[-1] in _METADATA_FILES)
    if metadata and not drop_metadata:
        raise shardflow.InvalidArgumentError(
            f"{repo.root}: {metadata[0]}: shardflow does not join a folder's metadata files yet; "
            "drop_metadata=True reads the files without it"
        )
    every = [f for files in media.values() for f in files]
    # A file's label is its folder's name; its depth, the folders above it.
    paths = [repo.files[f][0].replace(os.sep, "/") for f in every]
    names = sorted({p.rsplit("/", 2)[-2] if p.count("/") else "" for p in paths})
    depths = {p.count("/") for p in paths}
    add_labels = (len(names) > 1 and len(depths) == 1) if drop_labels is None else not drop_labels
    feature = Image() if column == "image" else Audio()
    out = {}
    for split, files in media.items():
        if not files:
            raise _not_found(f"{repo.root}: split {split!r} has no {builder} files ({column} files)")
        entries = [repo.files[f] for f in files]
        options = {"label": True, "label_names": names} if add_labels else {}
        ds = shardflow.dataset(
            [e[0] for e in entries], format="raw", format_options=options, storage_options=repo.storage_options,
            _listing=entries if repo.remote else None, **dataset_args,
        )
        features = {column: feature}
        if add_labels:
            ds = ds.select_columns(["bytes", "label_id"]).rename_columns({"bytes": column, "label_id": "label"})
            features["label"] = ClassLabel(names=names)
        else:
            ds = ds.select_columns(["bytes"]).rename_columns({"bytes": column})
        out[split] = ds.cast(features)
    return out


_SLICE = re.compile(r"^\s*([\w.-]+)\s*(?:\[\s*(-?\d+%?)?\s*:\s*(-?\d+%?)?\s*\])?\s*$")


def _bound(text: str | None, rows: int, default: int) -> int:
    if text is None:
        return default
    if text.endswith("%"):
        value = int(round(int(text[:-1]) * rows / 100.0))
    else:
        value = int(text)
    if value < 0:
        value += rows
    return max(0, min(rows, value))


def _select_split(splits: dict[str, Any], split: str) -> Any:
    """HF's split syntax: `train`, `train[:10%]`, `train[100:200]`, `train+test`."""
    import shardflow

    parts = []
    for one in split.split("+"):
        found = _SLICE.match(one)
        if not found:
            raise ValueError(f"Unrecognized split format: {one!r}")
        name, start, stop = found.groups()
        if name not in splits:
            raise ValueError(f'Unknown split "{name}". Should be one of {list(splits)}.')
        ds = splits[name]
        if start is not None or stop is not None or "[" in one:
            rows = len(ds)
            ds = ds.select(range(_bound(start, rows, 0), max(_bound(start, rows, 0), _bound(stop, rows, rows))))
        parts.append(ds)
    return parts[0] if len(parts) == 1 else shardflow.concatenate(parts)


def load_dataset(
    path: str,
    name: str | None = None,
    *,
    split: str | None = None,
    data_files: Any = None,
    data_dir: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    storage_options: dict[str, Any] | None = None,
    streaming: bool = True,
    **dataset_args: Any,
) -> Any:
    """Opens a dataset as ``datasets.load_dataset`` finds it: a Hub repo id
    (``"org/name"``) or ``hf://datasets/org/name[@revision][/path]``; a local folder or an
    object store's prefix (``s3://``, ``gs://``, ``az://``) laid out as a repo; or a builder name (``"json"``, ``"parquet"``,
    ``"csv"``, ``"arrow"``, ``"webdataset"``, ``"hdf5"``) with ``data_files``.

    ``name`` picks a config of the README's ``configs:``; ``split`` one split, with HF's
    slicing (``"train[:10%]"``, ``"train[100:200]"``, ``"train+test"``): a
    :class:`~shardflow.Dataset`. Without ``split``, a :class:`DatasetDict` of them all.
    ``token`` is the Hub token (else ``HF_TOKEN`` or the token file); ``HF_ENDPOINT``
    chooses the Hub. ``streaming`` is accepted for ported code: every shardflow dataset
    streams. Other keywords go to :func:`shardflow.dataset` (``columns=``,
    ``on_error=``, ...).
    """
    del streaming  # every shardflow dataset streams, and reads by index too
    if token is not None:
        storage_options = {**(storage_options or {}), "hf_token": token}
    if path in _FOLDERS:
        if data_dir is None and data_files is None:
            raise ValueError(f"load_dataset({path!r}) needs data_dir= or data_files=")
        root, sub = _repo_root(data_dir or ".", revision)
        repo = _Repo(root, storage_options)
        base = sub if data_dir else ""
        patterns = _sanitize(data_files) if data_files is not None else _default_patterns(sorted(_below(repo, base)))
        splits = _folder_splits(path, repo, _split_files(repo, base, patterns), dataset_args)
    elif path in _BUILDERS or path in _EXTENSION_TO_BUILDER.values():
        if data_files is None:
            raise ValueError(f"load_dataset({path!r}) needs data_files=")
        splits = _builder_splits(path, data_files, data_dir, storage_options, dataset_args)
    else:
        if _is_repo_id(path):
            root, sub = _hub_root(path, revision), ""
        else:
            if "://" not in path and not os.path.isdir(path):
                raise _not_found(f"{path}: no such folder, and not a Hub repo id (org/name)")
            root, sub = _repo_root(path, revision)
        repo = _Repo(root, storage_options)
        card = _card(repo)
        configs = _card_configs(card, repo.root)
        config: dict[str, Any] = {}
        if configs:
            names = [c["config_name"] for c in configs]
            name = name if name is not None else _default_config(configs)
            if name is None:
                raise ValueError(
                    f"Config name is missing.\nPlease pick one among the available configs: {names}\n"
                    f"Example of usage:\n\t`load_dataset('{path}', '{names[0]}')`"
                )
            if name not in names:
                raise ValueError(f"BuilderConfig '{name}' not found. Available: {names}")
            config = configs[names.index(name)]
        elif name not in (None, "default"):
            raise ValueError(f"BuilderConfig '{name}' not found. Available: ['default']")
        base = _join(sub, data_dir or config.get("data_dir") or "")
        if data_files is not None:
            patterns = _sanitize(data_files)
        elif config.get("data_files") is not None:
            patterns = _sanitize(config["data_files"])
        else:
            patterns = _default_patterns(sorted(_below(repo, base)))
        splits = _split_datasets(repo, _split_files(repo, base, patterns), dataset_args)
        features = _card_features(card, name)
        if features:
            splits = {s: _with_card_features(ds, features) for s, ds in splits.items()}
    if split is not None:
        return _select_split(splits, split)
    return DatasetDict(splits)


def _builder_splits(
    builder: str, data_files: Any, data_dir: str | None, storage_options: Any, dataset_args: dict[str, Any],
) -> dict[str, Any]:
    """`load_dataset("json", data_files=...)`: each split's patterns listed as
    `dataset()` lists them, relative to `data_dir` (else the working directory)."""
    import shardflow

    if builder not in _BUILDERS:
        raise shardflow.InvalidArgumentError(f"the {builder!r} builder of `datasets` is not read by shardflow")
    fmt = _BUILDERS[builder][0]
    out = {}
    for split, patterns in _sanitize(data_files).items():
        sources = [p if "://" in p or os.path.isabs(p) or not data_dir else os.path.join(data_dir, p) for p in patterns]
        out[split] = shardflow.dataset(sources, format=fmt, storage_options=storage_options, **dataset_args)
    return out


def _per_split(verb: str) -> Callable[..., "DatasetDict"]:
    def apply(self: "DatasetDict", *args: Any, **kwargs: Any) -> "DatasetDict":
        return DatasetDict({split: getattr(ds, verb)(*args, **kwargs) for split, ds in self.items()})

    apply.__name__ = verb
    apply.__doc__ = f"``Dataset.{verb}`` applied to every split."
    return apply


class DatasetDict(dict):  # type: ignore[type-arg]
    """Splits by name, as ``datasets.DatasetDict``: ``dd["train"]``, ``dd.keys()``, and
    the verbs applied to every split, each giving a new ``DatasetDict``."""

    map = _per_split("map")
    filter = _per_split("filter")
    flat_map = _per_split("flat_map")
    select_columns = _per_split("select_columns")
    remove_columns = _per_split("remove_columns")
    rename_column = _per_split("rename_column")
    rename_columns = _per_split("rename_columns")
    cast = _per_split("cast")
    cast_column = _per_split("cast_column")
    sort = _per_split("sort")

    def shuffle(self, seeds: dict[str, int] | int | None = None, *, seed: int | None = None, **kwargs: Any) -> "DatasetDict":
        """Shuffles every split: ``seed`` for all, or ``seeds`` by split (HF's arguments)."""
        if seed is not None and seeds is not None:
            raise ValueError("Please specify seed or seeds, but not both")
        by_split = seeds if isinstance(seeds, dict) else {s: seed if seeds is None else seeds for s in self}
        return DatasetDict({s: ds.shuffle(seed=by_split.get(s), **kwargs) for s, ds in self.items()})

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that every split's ``ds[i]`` and ``iter(ds)`` read."""
        for ds in self.values():
            ds.set_epoch(epoch)

    @property
    def column_names(self) -> dict[str, list[str]]:
        return {split: ds.column_names for split, ds in self.items()}

    @property
    def num_rows(self) -> dict[str, int]:
        return {split: len(ds) for split, ds in self.items()}

    def __repr__(self) -> str:
        inner = ",\n".join(f"    {split}: {ds!r}" for split, ds in self.items())
        return f"DatasetDict({{\n{inner}\n}})"
