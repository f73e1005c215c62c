//! Entry points for fuzzing: arbitrary bytes in, records or an error out, through the
//! same code a user's read takes. The cargo-fuzz targets in `fuzz/` call [`run`], and
//! so does `tests/fuzz_corpus.rs`, which replays every saved input on stable Rust, so a
//! finding stays fixed without a nightly toolchain.
//!
//! [`run`] panics when an invariant breaks; the fuzzer reports that as a crash. The
//! invariants: no panic anywhere (cargo-fuzz makes even a caught panic abort); every
//! error names the file it concerns and is not an internal error; and a shard read as a
//! stream gives the same rows as the same shard read through its record index.
//!
//! Targets that take a whole shard write it to one scratch file per process (on tmpfs
//! where there is one), so the local source, the header readers, the decode tasks and
//! the record index all see it as they see a user's file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;

use crate::error::Error;
use crate::format::example::{encode_len_field as len_field, encode_varint as varint};
use crate::format::npy::file_bytes;
use crate::format::{OnError, ReadOptions};
use crate::options::{OptionValue, Options};
use crate::pipeline::{Dataset, RunOptions, Stats, Tuning};
use crate::source::{Storage, StorageOptions};

/// Every target's name: `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`.
pub const TARGETS: &[&str] = &[
    "parquet",
    "arrow",
    "jsonl",
    "csv",
    "tfrecord",
    "npy",
    "npz",
    "webdataset",
    "example",
    "record_index",
    "pattern",
    "options",
    "tfrecord_framed",
    "npy_header",
    "tar_members",
    "media",
];

/// Whether a panic is one shardflow expects and turns into a `DecodeError` naming the
/// file: the parquet crate asserts on some corrupt pages and metadata instead of
/// returning an error, and symphonia's containers and zune-jpeg's bit reader overflow
/// arithmetic on some lying headers and streams (a panic only where overflow checks are
/// on, as in the fuzz build); every call into them is inside `catch_unwind`. Only these are let through; any other
/// panic is a finding.
pub fn tolerated_panic(info: &std::panic::PanicHookInfo<'_>) -> bool {
    info.location().is_some_and(|l| {
        let file = l.file();
        file.contains("registry")
            && ["/parquet-", "/symphonia-", "/zune-jpeg-"]
                .iter()
                .any(|krate| file.contains(krate))
    })
}

/// Lets [`tolerated_panic`]s unwind to the `catch_unwind` that reports them, and hands
/// every other panic to the hook that was there (the fuzzer's, which aborts).
fn tolerate_parquet_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !tolerated_panic(info) {
                previous(info);
            }
        }));
    });
}

/// Runs one target on one input. Panics (a fuzzer crash) when an invariant breaks.
pub fn run(target: &str, data: &[u8]) {
    tolerate_parquet_panics();
    let (flags, body) = data.split_first().map_or((0, data), |(f, b)| (*f, b));
    match target {
        "parquet" => read_shard("parquet", "parquet", flags, body),
        "arrow" => read_shard("arrow", "arrow", flags, body),
        "jsonl" => read_shard("jsonl", "jsonl", flags, body),
        "csv" => read_shard("csv", "csv", flags, body),
        "tfrecord" => read_shard("tfrecord", "tfrecord", flags, body),
        "npy" => read_shard("npy", "npy", flags, body),
        "npz" => read_shard("npz", "npz", flags, body),
        "webdataset" => read_shard("webdataset", "tar", flags, body),
        "example" => examples(flags, body),
        "record_index" => record_index(data),
        "pattern" => pattern(data),
        "options" => options(data),
        "tfrecord_framed" => read_shard("tfrecord", "tfrecord", flags, &framed_tfrecord(body)),
        "npy_header" => read_shard("npy", "npy", flags, &npy_with_header(body)),
        "tar_members" => read_shard("webdataset", "tar", flags, &tar_members(body)),
        "media" => media_cell(flags, body),
        other => panic!("unknown fuzz target {other:?}; the targets are {TARGETS:?}"),
    }
}

/// A folder of this process's own for scratch files.
fn scratch() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("shardflow-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cannot make the fuzz scratch folder");
        dir
    })
}

/// Writes `bytes` as the scratch shard `name`. Each write gets a new modification time
/// (a counter, not the clock, whose ticks are coarser than one input's run), so an index
/// kept for the previous input is never taken for this one.
fn write_shard(name: &str, bytes: &[u8]) -> String {
    static VERSION: AtomicU64 = AtomicU64::new(1);
    let path = scratch().join(name);
    let mut file = std::fs::File::create(&path).expect("cannot write the fuzz shard");
    file.write_all(bytes).expect("cannot write the fuzz shard");
    let version = VERSION.fetch_add(1, Ordering::Relaxed);
    file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(version))
        .expect("cannot set the fuzz shard's time");
    path.to_string_lossy().into_owned()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// An error from reading the shard at `path` must name it, and must not be a bug.
fn check_error(error: &Error, path: &str) {
    match error {
        Error::Internal(message) => panic!("internal error on fuzz input: {message}"),
        Error::Callback(e) => panic!("a callback error with no callback: {e}"),
        Error::InvalidArgument(message) => {
            assert!(
                message.contains(path),
                "bad data reported as a bad argument, without naming the file: {message}"
            )
        }
        other => assert_eq!(
            other.url(),
            Some(path),
            "the error does not name the file: {other}"
        ),
    }
}

/// One cell of a Hub `Image` or `Audio` column decoded as the pool decodes it: it
/// decodes, or it is its row's error (or, skipping, its row dropped), naming the file;
/// never a panic.
///
/// `flags`: bit 0 skips instead of raising; bit 1 reads the cell as audio, else as an
/// image; bits 2-3 choose the feature's options (a mode, a rate, a channel count).
fn media_cell(flags: u8, body: &[u8]) {
    use arrow_schema::{DataType, Field, Schema};

    use crate::format::cells::{CellDecoder, decode_batch};

    const URL: &str = "fuzz/cell.parquet";
    let on_error = if flags & 1 == 1 {
        OnError::Skip
    } else {
        OnError::Raise
    };
    let audio = flags & 2 == 2;
    let feature = match ((flags >> 2) & 3, audio) {
        (1, true) => serde_json::json!({"_type": "Audio", "sampling_rate": 16000}),
        (2, true) => {
            serde_json::json!({"_type": "Audio", "sampling_rate": 8000, "num_channels": 2})
        }
        (_, true) => serde_json::json!({"_type": "Audio"}),
        (1, false) => serde_json::json!({"_type": "Image", "mode": "L"}),
        (2, false) => serde_json::json!({"_type": "Image", "mode": "RGBA"}),
        (_, false) => serde_json::json!({"_type": "Image"}),
    };
    let features = serde_json::json!({"info": {"features": {"cell": feature}}}).to_string();
    let schema = Arc::new(Schema::new(vec![Field::new(
        "cell",
        DataType::LargeBinary,
        true,
    )]));
    let decoder: Arc<dyn CellDecoder> = if audio {
        let spec = crate::format::audio::AudioSpec::from_features(&features, &schema)
            .expect("an Audio feature");
        Arc::new(spec.bind(&schema, on_error).expect("a binary column"))
    } else {
        let spec = crate::format::image_spec::ImageSpec::from_features(&features, &schema)
            .expect("an Image feature");
        Arc::new(
            spec.bind("parquet", &schema, on_error)
                .expect("a binary column"),
        )
    };
    let cells = arrow_array::LargeBinaryArray::from(vec![Some(body)]);
    let batch = RecordBatch::try_new(schema, vec![Arc::new(cells)]).expect("one column");
    match decode_batch(decoder.as_ref(), batch, URL, true) {
        Ok((out, skipped)) => {
            assert_eq!(out.num_rows() + skipped.len(), 1, "the cell's row is lost")
        }
        Err(e) => check_error(&e, URL),
    }
}

/// Reads the shard as a stream, then through its record index (or its units, for
/// formats with random access), and checks that both give the same rows.
///
/// `flags`: bit 0 skips bad records instead of raising; bits 1-2 choose a variant
/// (gzip-wrapped by the harness, a raw `.gz` name, or the format's `rows` mode).
fn read_shard(format: &str, extension: &str, flags: u8, body: &[u8]) {
    let on_error = if flags & 1 == 1 {
        OnError::Skip
    } else {
        OnError::Raise
    };
    let variant = (flags >> 1) & 3;
    let mut format_options = Options::default();
    let gz_capable = matches!(format, "jsonl" | "csv" | "tfrecord" | "webdataset");
    let (name, bytes) = match variant {
        1 if gz_capable => (format!("shard.{extension}.gz"), gzip(body)),
        2 if gz_capable => (format!("shard.{extension}.gz"), body.to_vec()),
        1 | 2 if matches!(format, "npy" | "npz") => {
            format_options
                .0
                .insert("mode".into(), OptionValue::Str("rows".into()));
            (format!("shard.{extension}"), body.to_vec())
        }
        _ => (format!("shard.{extension}"), body.to_vec()),
    };
    // The bound on decompressed bytes, small, so that bombs are cheap to find.
    if format != "parquet" {
        format_options
            .0
            .insert("max_decompressed_bytes".into(), OptionValue::Int(64 << 20));
    }
    let path = write_shard(&name, &bytes);
    let options = ReadOptions {
        format_options,
        on_error,
        ..ReadOptions::default()
    };
    let open = || {
        Dataset::open(
            std::slice::from_ref(&path),
            Some(format),
            options.clone(),
            Storage::local_only(),
        )
        .expect("the scratch shard exists and the options are valid")
    };
    let streamed = stream_rows(&open(), &path);
    let indexed = indexed_rows(&open(), &path);
    if let (Some(streamed), Some(indexed)) = (streamed, indexed)
        && on_error == OnError::Raise
    {
        assert_eq!(
            streamed, indexed,
            "the stream and the record index disagree on the rows of {path}"
        );
    }
}

/// Every row of one epoch read as a stream, as one batch; `None` after a (checked) error.
fn stream_rows(ds: &Dataset, path: &str) -> Option<RecordBatch> {
    let run = RunOptions {
        tuning: Arc::new(Tuning::fixed(1, 1)),
        batch_rows: Some(7),
        ..RunOptions::default()
    };
    let schema = ds.schema().map_err(|e| check_error(&e, path)).ok()?;
    let stream = ds
        .stream(&run, Arc::new(Stats::default()))
        .map_err(|e| check_error(&e, path))
        .ok()?;
    let mut batches = Vec::new();
    for batch in stream {
        match batch {
            Ok(batch) => batches.push(batch),
            Err(e) => {
                check_error(&e, path);
                return None;
            }
        }
    }
    Some(arrow_select::concat::concat_batches(&schema, &batches).expect("batches of one schema"))
}

/// Rows read by index at most: a header may declare far more rows than are worth
/// comparing (they are still checked against the file).
const COMPARED_ROWS: u64 = 100_000;

/// Every row read by index, last to first; `None` after a (checked) error, or when
/// there are too many to compare (then only the first and last are read).
fn indexed_rows(ds: &Dataset, path: &str) -> Option<RecordBatch> {
    let rows = ds.len().map_err(|e| check_error(&e, path)).ok()??; // None: no random access (Arrow IPC streams)
    let access = ds
        .random_access(0)
        .map_err(|e| check_error(&e, path))
        .ok()?;
    assert_eq!(access.len(), rows);
    if rows > COMPARED_ROWS {
        if let Err(e) = access.rows(&[0, rows - 1]) {
            check_error(&e, path);
        }
        return None;
    }
    let last_first: Vec<u64> = (0..rows).rev().collect();
    let batch = access
        .rows(&last_first)
        .map_err(|e| check_error(&e, path))
        .ok()?;
    let first_last: Vec<u32> = (0..rows as u32).rev().collect();
    Some(
        arrow_select::take::take_record_batch(&batch, &arrow_array::UInt32Array::from(first_last))
            .expect("in range"),
    )
}

/// `tf.train.Example` records, one per length-prefixed piece: schema inference, then
/// decoding with the inferred spec (strict) and with fixed-length specs (lenient).
fn examples(flags: u8, body: &[u8]) {
    use crate::format::example::{ExampleDecoder, FeatureSpec, Missing, Shape, SpecInference};
    let records = pieces(body);
    let mut inference = SpecInference::default();
    for record in &records {
        let _ = inference.add(record);
    }
    let inferred = inference.specs();
    let fixed: Vec<FeatureSpec> = inferred
        .iter()
        .map(|spec| FeatureSpec {
            shape: Shape::Fixed(vec![usize::from(flags % 4)]),
            missing: if flags & 4 == 0 {
                Missing::Error
            } else {
                Missing::Empty
            },
            ..spec.clone()
        })
        .collect();
    for (specs, strict) in [(&inferred, true), (&fixed, false)] {
        let mut decoder = ExampleDecoder::new(specs, strict);
        let mut added = 0;
        for record in &records {
            added += usize::from(decoder.add(record).is_ok());
        }
        if let Ok(batch) = decoder.finish() {
            assert_eq!(batch.num_rows(), added, "rows lost or invented");
        }
    }
}

/// Splits fuzz bytes into pieces, each led by a one-byte length.
fn pieces(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let len = usize::from(len).min(rest.len());
        out.push(&rest[..len]);
        data = &rest[len..];
    }
    out
}

/// A persisted record index (a file others may have written, or a crash cut short):
/// refused, or read back exactly as it would be written again.
fn record_index(data: &[u8]) {
    use crate::format::index::ShardIndex;
    if let Some(index) = ShardIndex::decode(data) {
        assert_eq!(
            index.encode(),
            data,
            "an index that does not write back as read"
        );
        assert!(
            index.offsets.is_empty()
                || index.rows.checked_add(1) == Some(index.offsets.len() as u64)
        );
    }
}

/// Brace expansion, and listing a folder with the expanded globs.
fn pattern(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(expanded) = crate::source::pattern::expand_braces(&text) else {
        return;
    };
    // Globs are matched in a folder of a few files. Only names without separators, so
    // that no pattern walks out of it.
    let dir = scratch().join("listing");
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).expect("scratch folder");
        for name in ["a.jsonl", "b.jsonl", "c-001.tar", "[x].csv"] {
            std::fs::write(dir.join(name), b"").expect("scratch file");
        }
    }
    let specs: Vec<String> = expanded
        .iter()
        .take(64)
        .filter(|s| !s.contains('/') && !s.is_empty())
        .map(|s| format!("{}/{s}", dir.display()))
        .collect();
    if specs.is_empty() {
        return;
    }
    let _ = crate::source::resolve(&specs, &Storage::local_only());
}

/// Option dicts as users write them, for storage and for every format.
fn options(data: &[u8]) {
    const KEYS: &[&str] = &[
        "mode",
        "compression",
        "verify_crc",
        "raw",
        "label",
        "missing_columns",
        "max_decompressed_bytes",
        "endpoint_url",
        "region",
        "anonymous",
        "addressing_style",
        "max_concurrency",
        "max_attempts",
        "retry_base_seconds",
        "retry_max_seconds",
        "timeout_seconds",
        "chunk_size",
        "cache_size",
        "bogus",
    ];
    let mut options = Options::default();
    for piece in pieces(data) {
        let Some((&choice, rest)) = piece.split_first() else {
            continue;
        };
        let key = KEYS[usize::from(choice) % KEYS.len()].to_string();
        let number = rest
            .get(..8)
            .map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap_or_default()));
        let value = match choice / 32 {
            0 => OptionValue::Bool(number & 1 == 1),
            1 => OptionValue::Int(number),
            2 => OptionValue::Float(f64::from_bits(number as u64)),
            _ => OptionValue::Str(String::from_utf8_lossy(rest).into_owned()),
        };
        options.0.insert(key, value);
    }
    if let Err(e) = StorageOptions::parse(&options) {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    for (format, extension, bytes) in sample_shards() {
        let path = write_shard(&format!("options.{extension}"), &bytes);
        let read = ReadOptions {
            format_options: options.clone(),
            ..ReadOptions::default()
        };
        let ds = Dataset::open(
            std::slice::from_ref(&path),
            Some(format),
            read,
            Storage::local_only(),
        )
        .expect("the scratch shard exists");
        if let Err(e) = ds.prepared() {
            assert!(
                matches!(e, Error::InvalidArgument(_)) || e.url() == Some(path.as_str()),
                "{format}: {e}"
            );
        }
    }
}

/// One small valid shard of each stream and header format, for the options target.
fn sample_shards() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut tfrecord = Vec::new();
    let feature: (&[u8], u8, &[u8]) = (b"x", 2, &[1, 2]);
    frame_record(&mut tfrecord, &example_bytes(&[feature]), false);
    vec![
        ("jsonl", "jsonl", b"{\"a\": 1}\n{\"a\": 2}\n".to_vec()),
        ("csv", "csv", b"a,b\n1,x\n2,y\n".to_vec()),
        ("tfrecord", "tfrecord", tfrecord),
        ("npy", "npy", file_bytes("<i4", false, "(2,)", &[0; 8])),
    ]
}

// ---- structure-aware inputs: valid framing around fuzzed contents -----------------

/// A cursor over fuzz bytes that reads zeros once they run out.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A serialized `tf.train.Example` with these features: (name, kind, raw values), kind
/// 0 bytes (each value one byte string), 1 floats, 2 int64s.
fn example_bytes(features: &[(&[u8], u8, &[u8])]) -> Vec<u8> {
    let mut map = Vec::new();
    for (name, kind, values) in features {
        let list = match kind % 3 {
            0 => {
                let mut list = Vec::new();
                for chunk in values.chunks(3) {
                    len_field(1, chunk, &mut list);
                }
                list
            }
            1 => {
                let packed: Vec<u8> = values
                    .iter()
                    .flat_map(|v| (f32::from(*v) / 3.0).to_le_bytes())
                    .collect();
                let mut list = Vec::new();
                len_field(1, &packed, &mut list);
                list
            }
            _ => {
                let mut packed = Vec::new();
                for v in *values {
                    varint(u64::from(*v).wrapping_mul(0x0101_0101_0101), &mut packed);
                }
                let mut list = Vec::new();
                len_field(1, &packed, &mut list);
                list
            }
        };
        let mut feature = Vec::new();
        len_field(u64::from(kind % 3) + 1, &list, &mut feature);
        let mut entry = Vec::new();
        len_field(1, name, &mut entry);
        len_field(2, &feature, &mut entry);
        len_field(1, &entry, &mut map);
    }
    let mut features_msg = Vec::new();
    len_field(1, &map, &mut features_msg);
    features_msg
}

/// Appends one TFRecord frame; `damage` breaks its data checksum.
fn frame_record(out: &mut Vec<u8>, data: &[u8], damage: bool) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&crate::format::tfrecord::masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    let crc = crate::format::tfrecord::masked_crc(data) ^ u32::from(damage);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// TFRecord frames with valid checksums around Examples (or raw bytes) built from the
/// input, sometimes damaged or cut short, so that the fuzzer gets past the framing.
fn framed_tfrecord(data: &[u8]) -> Vec<u8> {
    const NAMES: [&[u8]; 4] = [b"image", b"label", b"text", b"x"];
    let mut input = Cursor(data);
    let mut out = Vec::new();
    while !input.is_empty() {
        let shape = input.byte();
        let record = if shape & 0x80 == 0 {
            let count = usize::from(shape % 4);
            let mut features = Vec::new();
            for _ in 0..count {
                let pick = input.byte();
                let len = usize::from(input.byte() % 16);
                features.push((NAMES[usize::from(pick % 4)], pick >> 2, input.take(len)));
            }
            example_bytes(&features)
        } else {
            let len = usize::from(input.byte());
            input.take(len).to_vec()
        };
        frame_record(&mut out, &record, shape & 0x40 != 0 && shape & 0x20 != 0);
    }
    // A cut at an input-chosen point, now and then: a truncated upload.
    if data.len() > 2 && data[data.len() - 1] == 0xff {
        let keep = out.len() * usize::from(data[data.len() - 2]) / 256;
        out.truncate(keep);
    }
    out
}

/// An `.npy` file with a well-formed header of input-chosen dtype, order and shape
/// (sizes small and huge), over input bytes as its data.
fn npy_with_header(data: &[u8]) -> Vec<u8> {
    const DESCRS: [&str; 16] = [
        "|b1", "|i1", "<i2", ">i4", "<i8", "|u1", ">u2", "<u4", "<f2", ">f4", "<f8", "<c8", ">c16",
        "|S3", "<U2", ">U1",
    ];
    const DIMS: [u64; 8] = [0, 1, 2, 3, 7, 1 << 20, 1 << 31, 1 << 60];
    let mut input = Cursor(data);
    let pick = input.byte();
    let descr = DESCRS[usize::from(pick % 16)];
    let fortran = pick & 0x10 != 0;
    let ndim = usize::from(input.byte() % 5);
    let dims: Vec<String> = (0..ndim)
        .map(|_| {
            let b = input.byte();
            if b & 0x80 == 0 {
                (b % 6).to_string()
            } else {
                DIMS[usize::from(b % 8)].to_string()
            }
        })
        .collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    file_bytes(descr, fortran, &shape, input.0)
}

/// A tar archive of input-chosen members (keys, extensions, folders, long names,
/// contents) written by the `tar` crate, sometimes with one byte changed or cut short.
fn tar_members(data: &[u8]) -> Vec<u8> {
    const KEYS: [&str; 6] = ["a", "b", "dir/a", "x.y", "__key__", "long"];
    const EXTENSIONS: [&str; 8] = ["json", "txt", "cls", "npy", "jpg", "a.b", "", "__key__"];
    let mut input = Cursor(data);
    let mut builder = tar::Builder::new(Vec::new());
    let mut members = 0;
    while !input.is_empty() && members < 64 {
        members += 1;
        let pick = input.byte();
        let mut key = KEYS[usize::from(pick % 6)].to_string();
        if key == "long" {
            key = "k".repeat(120 + usize::from(input.byte()));
        }
        let extension = EXTENSIONS[usize::from(pick >> 5)];
        let name = if extension.is_empty() {
            key
        } else {
            format!("{key}.{extension}")
        };
        let len = usize::from(input.byte());
        let body = input.take(len);
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(if pick & 0x08 != 0 && pick & 0x10 != 0 {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        if builder.append_data(&mut header, &name, body).is_err() {
            continue;
        }
    }
    let mut out = builder.into_inner().unwrap_or_default();
    let mut tail = Cursor(input.0);
    let (what, at, value) = (tail.byte(), tail.byte(), tail.byte());
    let at = out.len() * usize::from(at) / 256;
    match what % 4 {
        1 if at < out.len() => out[at] = value,
        2 => out.truncate(at),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_runs_on_empty_and_small_inputs() {
        for target in TARGETS {
            for input in [&b""[..], b"\x00", b"\x01{}\n", b"\xff\xff\xff\xff"] {
                run(target, input);
            }
        }
    }

    #[test]
    fn structured_inputs_are_valid_files() {
        // Framed examples with good checksums read back as rows.
        let records = framed_tfrecord(&[0x01, 0x00, 0x03, 1, 2, 3, 0x01, 0x01, 0x02, 4, 5]);
        let path = write_shard("valid.tfrecord", &records);
        let ds = Dataset::open(
            std::slice::from_ref(&path),
            None,
            ReadOptions::default(),
            Storage::local_only(),
        )
        .unwrap();
        assert_eq!(ds.len().unwrap(), Some(2));
        let npy = npy_with_header(&[0x0a, 0x01, 0x02, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
        assert!(crate::format::npy::parse_header(&npy).is_ok());
        let tar = tar_members(&[0x00, 2, b'{', b'}', 0x40, 1, b'7']);
        assert_eq!(tar.len() % 512, 0);
    }
}
