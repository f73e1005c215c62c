"""`Audio` columns as the Hub stores them (Parquet files `datasets` wrote, cells of
`{bytes, path}`), decoded on the pool by symphonia and resampled by rubato, compared
with the reference readers: soundfile (libsndfile) for the samples, soxr for resampling,
`datasets` for the features. The files are made by libsndfile itself (WAV 8/16/24-bit
and float, FLAC, MP3, Ogg Vorbis; mono and stereo; 8-48 kHz)."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile
import soxr

import shardflow as sf

# (container, subtype, rate, channels): every kind the acceptance names.
CLIPS = [
    ("WAV", "PCM_U8", 8000, 1),
    ("WAV", "PCM_16", 16000, 1),
    ("WAV", "PCM_16", 44100, 2),
    ("WAV", "PCM_24", 22050, 2),
    ("WAV", "FLOAT", 48000, 1),
    ("FLAC", "PCM_16", 44100, 1),
    ("FLAC", "PCM_24", 32000, 2),
    ("MP3", "MPEG_LAYER_III", 44100, 2),
    ("MP3", "MPEG_LAYER_III", 16000, 1),
    ("OGG", "VORBIS", 44100, 1),
    ("OGG", "VORBIS", 22050, 2),
]
LOSSY = {"MP3", "OGG"}
EXT = {"WAV": "wav", "FLAC": "flac", "MP3": "mp3", "OGG": "ogg"}


def tones(rate: int, frames: int, channels: int, seed: int) -> np.ndarray:
    """A few tones under 3 kHz (within every rate's band, 8 kHz included) with a little
    noise: `(frames, channels)` in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames) / rate
    out = np.zeros((frames, channels))
    for c in range(channels):
        for f in rng.uniform(100, 3000, size=3):
            out[:, c] += 0.25 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6))
    return np.clip(out + 0.002 * rng.standard_normal(out.shape), -1, 1)


def encode(kind: tuple[str, str, int, int], seconds: float, seed: int) -> bytes:
    container, subtype, rate, channels = kind
    buf = io.BytesIO()
    samples = tones(rate, int(rate * seconds), channels, seed)
    soundfile.write(buf, samples if channels > 1 else samples[:, 0], rate, format=container, subtype=subtype)
    return buf.getvalue()


def reference(data: bytes) -> tuple[np.ndarray, int]:
    """libsndfile's samples as float32 `(frames, channels)`, and the rate."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples, rate


def mono(samples: np.ndarray) -> np.ndarray:
    """`datasets`' `["array"]`: the channels' mean."""
    return samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]


@pytest.fixture(scope="module")
def hub_layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes], object]:
    """A folder laid out as a Hub repo, its one Parquet file written by `datasets` with
    `Audio`, `ClassLabel` and `Value` features; three clips of each kind."""
    import datasets

    root = tmp_path_factory.mktemp("audio_repo")
    clips = [(kind, encode(kind, 0.4 + 0.05 * (i % 3), seed=i)) for i, kind in enumerate(CLIPS * 3)]
    names = sorted({EXT[k[0]] for k in CLIPS})
    rows = {
        "audio": [{"bytes": data, "path": f"clip{i}.{EXT[k[0]]}"} for i, (k, data) in enumerate(clips)],
        "kind": [names.index(EXT[k[0]]) for k, _ in clips],
        "n": list(range(len(clips))),
    }
    features = datasets.Features({"audio": datasets.Audio(), "kind": datasets.ClassLabel(names=names), "n": datasets.Value("int64")})
    # `datasets` needs torchcodec to encode a cell, not to cast stored `{bytes, path}` to `Audio`.
    written = datasets.Dataset.from_dict(rows).cast(features)
    (root / "data").mkdir()
    written.to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    return root, [data for _, data in clips], written


def test_hub_audio_decodes_as_libsndfile_with_datasets_features(hub_layout: tuple[Path, list[bytes], object]) -> None:
    """Through `sf.load_dataset` on the repo's layout: `features` equal `datasets'`
    (the class names included); each cell is `{array, sampling_rate, path}` with the
    channels' mean, equal to libsndfile's samples exactly for PCM WAV and FLAC and
    within 1e-4 for MP3 and Vorbis (lossy decoders round differently)."""
    import datasets

    root, data, written = hub_layout
    ds = sf.load_dataset(str(root), split="train")
    theirs = datasets.load_dataset("parquet", data_files=str(root / "data" / "*.parquet"), split="train")
    assert ds.features.to_dict() == theirs.features.to_dict() == written.features.to_dict()
    assert ds.features["kind"].names == theirs.features["kind"].names
    # pyarrow reads the decoded column as Arrow's canonical variable-shape tensor.
    array_type = pa.schema(ds.schema).field("audio").type.field("array").type
    assert array_type.extension_name == "arrow.variable_shape_tensor" and array_type.storage_type.field("shape").type.list_size == 1
    table = pa.table(sf.DataLoader(ds, batch_size=8, output="arrow"))
    assert table.num_rows == len(data) and table.schema.field("audio").type.field("array").type == array_type
    rows = list(ds)
    assert [r["n"] for r in rows] == list(range(len(data)))
    for row, cell, kind in zip(rows, data, CLIPS * 3):
        want, rate = reference(cell)
        clip = row["audio"]
        assert clip["sampling_rate"] == rate == kind[2]
        assert clip["path"] == f"clip{row['n']}.{EXT[kind[0]]}"
        assert clip["array"].dtype == np.float32 and clip["array"].shape == (len(want),), kind
        if kind[0] in LOSSY:
            np.testing.assert_allclose(clip["array"], mono(want), atol=1e-4, err_msg=str(kind))
        else:
            np.testing.assert_array_equal(clip["array"], mono(want), err_msg=str(kind))


@pytest.mark.parametrize("target", [16000, 44100])
def test_cast_to_a_sampling_rate_resamples_as_soxr_does(hub_layout: tuple[Path, list[bytes], object], target: int) -> None:
    """`cast_column("audio", Audio(sampling_rate=...))`, `datasets`' feature or ours,
    resamples every clip where it is read: `ceil(frames * target / rate)` samples
    within 1e-3 RMS of soxr's (HQ) resampling of libsndfile's samples; the features
    say the new rate, as `datasets`' cast says it."""
    import datasets

    root, data, written = hub_layout
    for feature in (sf.Audio(sampling_rate=target), datasets.Audio(sampling_rate=target)):
        ds = sf.load_dataset(str(root), split="train").cast_column("audio", feature)
        assert ds.features.to_dict() == written.cast_column("audio", datasets.Audio(sampling_rate=target)).features.to_dict()
        for row, cell in zip(ds, data):
            want, rate = reference(cell)
            got = row["audio"]["array"]
            assert row["audio"]["sampling_rate"] == target
            assert len(got) == -(-len(want) * target // rate)
            expected = soxr.resample(mono(want), rate, target, quality="HQ")
            n = min(len(got), len(expected))
            assert abs(len(got) - len(expected)) <= 1
            rms = float(np.sqrt(np.mean((got[:n] - expected[:n]) ** 2)))
            assert rms <= 1e-3, (rate, target, rms)


def test_num_channels_keeps_the_channels(hub_layout: tuple[Path, list[bytes], object]) -> None:
    """`Audio(num_channels=2)`: `(2, samples)`, channel after channel (torchcodec's
    layout), a mono clip in both; `num_channels=1` is the mean, as unset."""
    root, data, _ = hub_layout
    stereo = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(num_channels=2))
    one = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(num_channels=1))
    for row, single, cell, kind in zip(stereo, one, data, CLIPS * 3):
        want, _ = reference(cell)
        both = want if want.shape[1] == 2 else np.repeat(want, 2, axis=1)
        assert row["audio"]["array"].shape == (2, len(want))
        tolerance = 1e-4 if kind[0] in LOSSY else 0
        np.testing.assert_allclose(row["audio"]["array"], both.T, atol=tolerance, rtol=0)
        np.testing.assert_allclose(single["audio"]["array"], mono(want), atol=tolerance, rtol=0)


def test_num_channels_resampled_keeps_each_channel(hub_layout: tuple[Path, list[bytes], object]) -> None:
    """`Audio(sampling_rate=16000, num_channels=2)`: each channel resampled on its own,
    within 1e-3 RMS of soxr's resampling of that channel (the resampler's planes are
    cut to the output's length one after another)."""
    root, data, _ = hub_layout
    ds = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(sampling_rate=16000, num_channels=2))
    for row, cell in zip(ds, data):
        want, rate = reference(cell)
        both = want if want.shape[1] == 2 else np.repeat(want, 2, axis=1)
        got = row["audio"]["array"]
        assert got.shape == (2, -(-len(want) * 16000 // rate))
        for channel in range(2):
            expected = soxr.resample(np.ascontiguousarray(both[:, channel]), rate, 16000, quality="HQ")
            n = min(got.shape[1], len(expected))
            rms = float(np.sqrt(np.mean((got[channel, :n] - expected[:n]) ** 2)))
            assert rms <= 1e-3, (rate, channel, rms)


def test_decode_false_renames_and_casts_after_functions(hub_layout: tuple[Path, list[bytes], object]) -> None:
    """`Audio(decode=False)` gives the stored `{bytes, path}`; a cast follows a rename
    to the files' column; a cast after a `map` (which saw the clips decoded as they
    were) is refused, naming both."""
    root, data, _ = hub_layout
    ds = sf.load_dataset(str(root), split="train")
    stored = ds.cast_column("audio", sf.Audio(decode=False))
    first = next(iter(stored))["audio"]
    assert first == {"bytes": data[0], "path": "clip0.wav"}
    assert stored.features["audio"] == sf.Audio(decode=False)
    renamed = ds.rename_column("audio", "speech").cast_column("speech", sf.Audio(sampling_rate=8000))
    assert next(iter(renamed))["speech"]["sampling_rate"] == 8000
    with pytest.raises(ValueError, match="after map"):
        ds.map(lambda r: r).cast_column("audio", sf.Audio(sampling_rate=8000))


def bad_clips(tmp_path: Path) -> Path:
    """Ten good WAV clips and, among them, garbage called MP3, nothing, a WAV cut in
    its header, and an Ogg Opus file (no pure-Rust decoder yet)."""
    import datasets

    cells = [encode(("WAV", "PCM_16", 16000, 1), 0.1, seed=i) for i in range(10)]
    opus = io.BytesIO()
    soundfile.write(opus, tones(48000, 4800, 1, 0)[:, 0], 48000, format="OGG", subtype="OPUS")
    cells[2] = bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))
    cells[4] = b""
    cells[6] = cells[6][:20]
    cells[8] = opus.getvalue()
    rows = {"audio": [{"bytes": c, "path": f"{i}.wav"} for i, c in enumerate(cells)], "n": list(range(10))}
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(rows, schema=datasets.Features({"audio": datasets.Audio(), "n": datasets.Value("int64")}).arrow_schema), path)
    return path


def test_hostile_clips_raise_or_are_skipped_and_counted(tmp_path: Path) -> None:
    """Clips that do not decode are a `DecodeError` naming the file and the column, or
    under `on_error="skip"` dropped and counted; Opus is refused by name."""
    path = bad_clips(tmp_path)
    with pytest.raises(sf.DecodeError, match=r"bad\.parquet.*column \"audio\""):
        list(sf.dataset(path))
    loader = sf.DataLoader(sf.dataset(path, on_error="skip"), batch_size=4)
    kept = [int(n) for b in loader for n in b["n"]]
    assert kept == [0, 1, 3, 5, 7, 9]
    assert loader.stats()["skipped_records"] == 4
    opus_only = tmp_path / "opus.parquet"
    pq.write_table(pq.read_table(path).slice(8, 1), opus_only)
    with pytest.raises(sf.DecodeError, match="Opus"):
        list(sf.dataset(opus_only))


def test_damaged_clips_never_crash(tmp_path: Path) -> None:
    """Bytes flipped and cut anywhere in WAV, FLAC, MP3 and Vorbis clips: each decodes
    or is its row's `DecodeError`; the interpreter never crashes and nothing hangs."""
    import datasets

    rng = np.random.default_rng(7)
    cells = []
    for kind in [("WAV", "PCM_16", 16000, 2), ("FLAC", "PCM_16", 22050, 1), ("MP3", "MPEG_LAYER_III", 44100, 1), ("OGG", "VORBIS", 16000, 1)]:
        good = encode(kind, 0.2, seed=1)
        for _ in range(40):
            damaged = bytearray(good)
            for at in rng.integers(0, len(good), size=rng.integers(1, 20)):
                damaged[at] = rng.integers(0, 256)
            cells.append(bytes(damaged[: rng.integers(1, len(good) + 1)]))
    schema = datasets.Features({"audio": datasets.Audio(), "n": datasets.Value("int64")}).arrow_schema
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"audio": [{"bytes": c, "path": None} for c in cells], "n": list(range(len(cells)))}, schema=schema), path, row_group_size=1)
    loader = sf.DataLoader(sf.dataset(path, on_error="skip"), batch_size=1)
    kept = [int(n) for b in loader for n in b["n"]]
    assert len(kept) + loader.stats()["skipped_records"] == len(cells)
    for n in range(0, len(cells), 16):
        one = tmp_path / f"one{n}.parquet"
        pq.write_table(pq.read_table(path).slice(n, 1), one)
        try:
            rows = list(sf.dataset(one))
        except sf.DecodeError:
            continue
        assert rows[0]["audio"]["array"].dtype == np.float32


RESUME_CHILD = """
import pickle, sys
import shardflow as sf
root, state_file, out_file = sys.argv[1:4]
ds = sf.load_dataset(root, split="train").cast_column("audio", sf.Audio(sampling_rate=16000))
loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=5)
state = pickle.load(open(state_file, "rb"))
loader.load_state_dict(state)
seen = []
for epoch in range(state["epoch"], 2):
    loader.set_epoch(epoch)
    seen += [(int(n), a) for b in loader for n, a in zip(b["n"], b["audio"]["array"])]
pickle.dump(seen, open(out_file, "wb"))
"""


def test_resampled_audio_across_ranks_workers_epochs_and_a_resume_in_a_new_process(tmp_path: Path, hub_layout: tuple[Path, list[bytes], object]) -> None:
    """The training path: clips resampled to 16 kHz on 2 ranks x 2 forked torch
    workers for 2 epochs (every clip once per epoch, and one more to keep the ranks
    equal; the same samples as one process
    decodes, as lists of tensors); a loader stopped mid-epoch resumed in a new process
    gives the rest of the run."""
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    from shardflow.torch import IterableDataset

    root, data, _ = hub_layout
    ds = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(sampling_rate=16000))
    expected = {int(r["n"]): r["audio"]["array"] for r in ds}
    ranks = [TorchLoader(IterableDataset(ds, batch_size=4, shuffle=True, rank=rank, world_size=2), batch_size=None,
                         num_workers=2, multiprocessing_context="fork") for rank in range(2)]
    orders = []
    for _ in range(2):
        order = []
        for loader in ranks:
            for batch in loader:
                arrays = batch["audio"]["array"]
                assert isinstance(arrays, list) and all(isinstance(a, torch.Tensor) for a in arrays)
                for n, clip in zip(batch["n"].tolist(), arrays):
                    np.testing.assert_array_equal(np.asarray(clip), expected[n])
                    order.append(n)
        # Ranks are kept equal as DistributedSampler keeps them: 33 clips, one repeated.
        assert sorted(set(order)) == list(range(len(data))) and len(order) == 34
        orders.append(order)
    assert orders[0] != orders[1]

    def run(stop: tuple[int, int] | None) -> tuple[list, dict | None]:
        loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=5)
        seen = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for step, b in enumerate(loader):
                seen += [(int(n), a) for n, a in zip(b["n"], b["audio"]["array"])]
                if (epoch, step) == stop:
                    return seen, loader.state_dict()
        return seen, None

    whole, _ = run(None)
    before, state = run((1, 3))
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(state))
    subprocess.run([sys.executable, "-c", RESUME_CHILD, str(root), str(tmp_path / "state.pkl"), str(tmp_path / "after.pkl")], check=True)
    after = pickle.loads((tmp_path / "after.pkl").read_bytes())
    assert [n for n, _ in before + after] == [n for n, _ in whole]
    for (n, a), (m, b) in zip(before + after, whole):
        np.testing.assert_array_equal(a, b)


def test_written_audio_reads_back_in_datasets(tmp_path: Path, hub_layout: tuple[Path, list[bytes], object]) -> None:
    """`write` of decoded clips: `datasets` reads the shards back with the clips'
    samples and the other features (the class names); the decoded column's feature is
    what its type infers, not an `Audio` it no longer holds. Written as stored
    (`Audio(decode=False)`), the cells are the files' bytes."""
    import datasets

    root, data, written = hub_layout
    ds = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(sampling_rate=8000))
    ds.write(str(tmp_path / "decoded"), "parquet")
    back = datasets.load_dataset("parquet", data_files=str(tmp_path / "decoded" / "*.parquet"), split="train")
    assert back.features["kind"] == written.features["kind"]
    assert not isinstance(back.features["audio"], datasets.Audio)
    for ours, theirs in zip(ds, back):
        assert theirs["audio"]["sampling_rate"] == 8000 and theirs["n"] == ours["n"]
    stored = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(decode=False))
    stored.write(str(tmp_path / "stored"), "parquet")
    back = datasets.load_dataset("parquet", data_files=str(tmp_path / "stored" / "*.parquet"), split="train")
    assert back.features["audio"] == datasets.Audio(decode=False)
    assert [r["audio"]["bytes"] for r in back] == data


def test_the_local_hub_and_s3_give_the_clips_local_files_give(hub_layout: tuple[Path, list[bytes], object], seaweed: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same repo served by the local Hub (`sf.load_dataset("org/speech")`) and laid
    out under an S3 prefix: the same features, and every clip resampled to the same
    samples as from the local folder."""
    from hubserver import HubServer
    from servers import S3_KEY, S3_SECRET

    root, _, written = hub_layout

    def clips(ds: Any) -> list[tuple[int, np.ndarray]]:
        ds = ds.cast_column("audio", sf.Audio(sampling_rate=16000))
        assert ds.features.to_dict() == written.cast_column("audio", __import__("datasets").Audio(sampling_rate=16000)).features.to_dict()
        return [(int(r["n"]), r["audio"]["array"]) for r in ds]

    local = clips(sf.load_dataset(str(root), split="train"))
    server = HubServer({"org/speech": {"main": root}}, token="secret")
    try:
        for key, value in {"HF_ENDPOINT": server.url, "HF_TOKEN": "secret", "HF_HOME": str(tmp_path / "hf")}.items():
            monkeypatch.setenv(key, value)
        from_hub = clips(sf.load_dataset("org/speech", split="train"))
    finally:
        server.stop()
    client = seaweed.client()
    client.create_bucket(Bucket="speech")
    for path in root.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "speech", f"repo/{path.relative_to(root).as_posix()}")
    options = {"endpoint_url": seaweed.s3_url, "access_key_id": S3_KEY, "secret_access_key": S3_SECRET, "region": "us-east-1"}
    from_s3 = clips(sf.load_dataset("s3://speech/repo", split="train", storage_options=options))
    for other in (from_hub, from_s3):
        assert [n for n, _ in other] == [n for n, _ in local]
        for (_, a), (_, b) in zip(other, local):
            np.testing.assert_array_equal(a, b)
