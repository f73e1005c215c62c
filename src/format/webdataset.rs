//! WebDataset tar shards (`.tar`, `.tar.gz`, `.tgz`): members grouped into samples
//! exactly as the `webdataset` library groups them. The key is the path up to the first
//! dot of the basename (directories included), the field the rest of the basename,
//! lower-cased; consecutive members with one key form a sample. The archive is read
//! once, front to back, never extracted and never buffered whole.
//!
//! Fields: `__key__`, `__url__`, `.json` (kept as JSON text, parsed on the way to
//! Python), `.txt`/`.text` (string), `.cls`/`.index` (integer), `.npy` (array), anything
//! else bytes. Samples may lack fields (null).

use std::collections::BTreeSet;
use std::io::Read;
use std::sync::Arc;

use arrow_array::builder::GenericByteBuilder;
use arrow_array::types::{ByteArrayType, LargeBinaryType, LargeUtf8Type};
use arrow_array::{
    ArrayRef, GenericByteArray, Int64Array, RecordBatch, RecordBatchOptions, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::index::{RecordCodec, ShardIndex};
use super::{
    Decoded, EmitTask, Format, OnError, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    compression, task, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta};

const FORMAT: &str = "WebDataset tar";
/// Field metadata marking a text column that holds JSON documents.
pub const JSON_KEY: &str = "shardflow.json";
/// Field metadata marking a binary column that holds `.npy` arrays.
pub const NPY_KEY: &str = "shardflow.npy";
pub const INFER_SAMPLES: usize = 1000;
const BLOCK_BYTES: usize = 4 * 1024 * 1024;
/// The most a member's header may reserve before its bytes are read (larger members
/// grow as they are read).
const MEMBER_RESERVE_MAX: u64 = 64 * 1024 * 1024;

/// How a field's bytes are decoded, by the last part of its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    Json,
    Text,
    Int,
    Npy,
    Bytes,
}

fn decode_for(field: &str) -> Decode {
    match field.rsplit('.').next().unwrap_or(field) {
        "json" => Decode::Json,
        "txt" | "text" => Decode::Text,
        "cls" | "index" => Decode::Int,
        "npy" => Decode::Npy,
        _ => Decode::Bytes,
    }
}

/// Payloads get 64-bit offsets: a block's samples may hold more than 2 GiB.
fn arrow_field(name: &str) -> Field {
    let marker = |key: &str| [(key.to_string(), "1".to_string())];
    match decode_for(name) {
        Decode::Json => Field::new(name, DataType::LargeUtf8, true).with_metadata(marker(JSON_KEY)),
        Decode::Text => Field::new(name, DataType::LargeUtf8, true),
        Decode::Int => Field::new(name, DataType::Int64, true),
        Decode::Npy => Field::new(name, DataType::LargeBinary, true).with_metadata(marker(NPY_KEY)),
        Decode::Bytes => Field::new(name, DataType::LargeBinary, true),
    }
}

/// Splits a member path into (key, field) as `webdataset.tariterators.base_plus_ext`
/// does: `^((?:.*/|)[^.]+)[.]([^/]*)$`.
pub fn key_and_field(path: &str) -> Option<(&str, &str)> {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    let dot = base.find('.')?;
    if dot == 0 {
        return None;
    }
    Some((&path[..base_start + dot], &base[dot + 1..]))
}

/// webdataset skips `__name__` metadata members at the top level.
fn is_meta(path: &str) -> bool {
    !path.contains('/') && path.starts_with("__") && path.ends_with("__")
}

struct Sample {
    key: String,
    /// Every member's field name, with its bytes if the field is kept (else empty).
    fields: Vec<(String, bytes::Bytes)>,
    /// Byte offset of its first member header, for errors.
    offset: u64,
}

/// Reads samples off a tar stream in order.
struct SampleReader {
    url: Arc<str>,
    /// Fields to keep (`None`: all); members of other fields are skipped unread.
    keep: Option<BTreeSet<String>>,
}

impl SampleReader {
    /// Calls `f` with each sample of a tar stream (gzip-compressed or not), in order,
    /// until it returns false.
    fn for_each(
        &self,
        stream: Box<dyn Read + Send>,
        limit: u64,
        f: &mut dyn FnMut(Sample) -> Result<bool>,
    ) -> Result<()> {
        let url = &*self.url;
        let reader = compression::auto_gzip(stream, url, limit)?;
        let mut archive = tar::Archive::new(reader);
        let entries = archive
            .entries()
            .map_err(|e| compression::stream_error(url, Position::Byte(0), e))?;
        self.group(
            entries,
            &mut |entry, offset| {
                // Sized by the header (bounded: a corrupt one may claim anything), not
                // grown by doubling, which copies the member into fresh memory each step.
                let mut data = Vec::new();
                let _ = data.try_reserve_exact(entry.size().min(MEMBER_RESERVE_MAX) as usize);
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| corrupt_tar(url, offset, e))?;
                Ok(data.into())
            },
            f,
        )
    }

    /// `for_each` over an uncompressed tar already in memory (a unit fetched by byte
    /// range): each member is a slice of `data`, and members not kept are seeked past.
    /// Reading them into buffers of their own zeroed and copied every byte: 30% of a
    /// decode thread's time on 8 KB members.
    fn for_each_in(
        &self,
        data: bytes::Bytes,
        f: &mut dyn FnMut(Sample) -> Result<bool>,
    ) -> Result<()> {
        let url = &*self.url;
        let mut archive = tar::Archive::new(std::io::Cursor::new(data.clone()));
        let entries = archive
            .entries_with_seek()
            .map_err(|e| compression::stream_error(url, Position::Byte(0), e))?;
        self.group(
            entries,
            &mut |entry, offset| {
                let start = entry.raw_file_position();
                let end = start
                    .checked_add(entry.size())
                    .filter(|&end| end <= data.len() as u64);
                end.map(|end| data.slice(start as usize..end as usize))
                    .ok_or_else(|| {
                        Error::decode(
                            url,
                            FORMAT,
                            Position::Byte(offset),
                            "a member runs past the end of the archive",
                        )
                    })
            },
            f,
        )
    }

    /// Groups `entries` into samples; `member` gives the bytes of a member whose field
    /// is kept (at the header's `offset`).
    fn group<R: Read>(
        &self,
        entries: tar::Entries<'_, R>,
        member: &mut dyn FnMut(&mut tar::Entry<'_, R>, u64) -> Result<bytes::Bytes>,
        f: &mut dyn FnMut(Sample) -> Result<bool>,
    ) -> Result<()> {
        let url = &*self.url;
        let mut current: Option<Sample> = None;
        let mut last_offset = 0;
        for entry in entries {
            let mut entry = entry.map_err(|e| corrupt_tar(url, last_offset, e))?;
            let offset = entry.raw_header_position();
            last_offset = offset;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = entry.path().map_err(|e| corrupt_tar(url, offset, e))?;
            let path = path.to_string_lossy().into_owned();
            if is_meta(&path) {
                continue;
            }
            let Some((key, field)) = key_and_field(&path) else {
                continue;
            };
            let field = field.to_lowercase();
            if current.as_ref().is_some_and(|s| s.key != key)
                && let Some(done) = current.take()
                && !f(done)?
            {
                return Ok(());
            }
            let sample = current.get_or_insert_with(|| Sample {
                key: key.to_string(),
                fields: Vec::new(),
                offset,
            });
            if sample.fields.iter().any(|(name, _)| *name == field) {
                return Err(Error::decode(
                    url,
                    FORMAT,
                    Position::Byte(offset),
                    format!("sample {:?} has two {field:?} members ({path})", sample.key),
                ));
            }
            let data = if self.keep.as_ref().is_none_or(|keep| keep.contains(&field)) {
                member(&mut entry, offset)?
            } else {
                bytes::Bytes::new()
            };
            sample.fields.push((field, data));
        }
        if let Some(done) = current {
            f(done)?;
        }
        Ok(())
    }
}

/// The tar crate reports malformed archives (bad checksums, short blocks) as
/// `ErrorKind::Other`; those are faults in the data, not I/O failures.
fn corrupt_tar(url: &str, offset: u64, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::Other => Error::decode(url, FORMAT, Position::Byte(offset), e),
        _ => match compression::stream_error(url, Position::Byte(offset), e) {
            Error::Decode { message, .. } => {
                Error::decode(url, FORMAT, Position::Byte(offset), message)
            }
            other => other,
        },
    }
}

pub struct WebDataset;

struct Config {
    schema: SchemaRef,
    strict: bool,
    on_error: OnError,
    limit: u64,
    keep: Option<BTreeSet<String>>,
}

struct PreparedTar {
    config: Arc<Config>,
}

impl Format for WebDataset {
    fn name(&self) -> &'static str {
        "webdataset"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("webdataset");
        let limit = compression::limit_option(&mut opts)?;
        opts.finish()?;
        if options.schema.is_some() || options.features.is_some() {
            return Err(Error::invalid_argument(
                "WebDataset fields are typed by extension: schema= and features= have no use; columns= selects fields",
            ));
        }
        let names: Vec<String> = match &options.columns {
            Some(columns) => columns.clone(),
            None => {
                let mut seen = BTreeSet::new();
                let mut samples = 0;
                for shard in &shards {
                    // Only member names are needed, so no data is kept.
                    let scan = SampleReader {
                        url: shard.url.as_str().into(),
                        keep: Some(BTreeSet::new()),
                    };
                    let stream = io.open(shard)?.open_stream()?;
                    let outcome = scan.for_each(stream, limit, &mut |sample| {
                        seen.extend(sample.fields.into_iter().map(|(name, _)| name));
                        samples += 1;
                        Ok(samples < INFER_SAMPLES)
                    });
                    match outcome {
                        Err(e) if options.on_error == OnError::Raise => return Err(e),
                        _ => {}
                    }
                    if samples >= INFER_SAMPLES {
                        break;
                    }
                }
                let mut names = vec!["__key__".to_string(), "__url__".to_string()];
                names.extend(seen);
                names
            }
        };
        let schema = Arc::new(Schema::new(
            names
                .iter()
                .map(|n| {
                    if n == "__key__" || n == "__url__" {
                        Field::new(n, DataType::Utf8, false)
                    } else {
                        arrow_field(n)
                    }
                })
                .collect::<Vec<_>>(),
        ));
        let keep = options
            .columns
            .as_ref()
            .map(|c| c.iter().cloned().collect());
        let units = whole_files(&shards);
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            PreparedTar {
                config: Arc::new(Config {
                    schema,
                    strict: options.columns.is_none(),
                    on_error: options.on_error,
                    limit,
                    keep,
                }),
            },
        ))
    }
}

impl RecordCodec for Config {
    /// A sample's bytes run from the end of the previous sample's last member to the
    /// end of its own last member, so they hold every header that belongs to it.
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn Read + Send>,
        key: String,
    ) -> Result<ShardIndex> {
        let url = shard.url.as_str();
        let (reader, gzip) = compression::sniff_gzip(stream, url, self.limit)?;
        let mut archive = tar::Archive::new(reader);
        let entries = archive
            .entries()
            .map_err(|e| compression::stream_error(url, Position::Byte(0), e))?;
        let mut offsets = vec![0u64];
        let mut current: Option<String> = None;
        // Where the last member of the current sample ends (512-byte blocks).
        let mut sample_end = 0u64;
        for entry in entries {
            let entry = entry.map_err(|e| corrupt_tar(url, sample_end, e))?;
            let offset = entry.raw_header_position();
            let end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = entry.path().map_err(|e| corrupt_tar(url, offset, e))?;
            let path = path.to_string_lossy();
            if is_meta(&path) {
                continue;
            }
            let Some((key, _)) = key_and_field(&path) else {
                continue;
            };
            if current.as_deref().is_some_and(|k| k != key) {
                offsets.push(sample_end);
            }
            if current.as_deref() != Some(key) {
                current = Some(key.to_string());
            }
            sample_end = end;
        }
        if current.is_some() {
            offsets.push(sample_end);
        } else {
            offsets.clear();
            offsets.push(0);
        }
        Ok(ShardIndex::new(key, offsets, !gzip, Vec::new()))
    }

    fn decode_records(
        &self,
        shard: &ShardMeta,
        _index: &ShardIndex,
        data: bytes::Bytes,
        _first: u64,
    ) -> Result<Decoded> {
        let url: Arc<str> = shard.url.as_str().into();
        let reader = SampleReader {
            url: url.clone(),
            keep: self.keep.clone(),
        };
        let mut samples = Vec::new();
        let mut push = |sample| {
            samples.push(sample);
            Ok(true)
        };
        if compression::is_gzip(data.get(..2).unwrap_or_default()) {
            reader.for_each(Box::new(std::io::Cursor::new(data)), self.limit, &mut push)?;
        } else {
            reader.for_each_in(data, &mut push)?;
        }
        build_batch(self, &url, samples)
    }
}

impl UnitJobs for PreparedTar {
    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        Some(self.config.clone())
    }

    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url: Arc<str> = shard.url.as_str().into();
        let config = self.config.clone();
        UnitJob::Stream(Box::new(move |stream, emit: &mut EmitTask| {
            let reader = SampleReader {
                url: url.clone(),
                keep: config.keep.clone(),
            };
            let mut block: Vec<Sample> = Vec::new();
            let mut block_bytes = 0;
            let mut stopped = false;
            let mut flush = |block: &mut Vec<Sample>| {
                let samples = std::mem::take(block);
                let (config, url) = (config.clone(), url.clone());
                emit(task(move || build_batch(&config, &url, samples)))
            };
            reader.for_each(stream, config.limit, &mut |sample| {
                block_bytes += sample.fields.iter().map(|(_, d)| d.len()).sum::<usize>();
                block.push(sample);
                if block_bytes >= BLOCK_BYTES {
                    block_bytes = 0;
                    stopped = !flush(&mut block);
                }
                Ok(!stopped)
            })?;
            if !stopped && !block.is_empty() {
                flush(&mut block);
            }
            Ok(())
        }))
    }
}

/// Turns samples into a batch, checking each field's bytes decode as its type says.
fn build_batch(config: &Config, url: &str, samples: Vec<Sample>) -> Result<Decoded> {
    let schema = &config.schema;
    let mut skipped = Vec::new();
    let mut good: Vec<Sample> = Vec::with_capacity(samples.len());
    for (i, sample) in samples.into_iter().enumerate() {
        match check_sample(config, &sample) {
            Ok(()) => good.push(sample),
            Err(_) if config.on_error == OnError::Skip => skipped.push(i as u64),
            Err(message) => {
                return Err(Error::decode(
                    url,
                    FORMAT,
                    Position::Byte(sample.offset),
                    format!("sample {:?}: {message}", sample.key),
                ));
            }
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name().as_str();
        let values = || {
            good.iter().map(move |s| {
                s.fields
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, d)| d.as_ref())
            })
        };
        let column: ArrayRef = match name {
            "__key__" => Arc::new(StringArray::from_iter_values(
                good.iter().map(|s| s.key.as_str()),
            )),
            "__url__" => Arc::new(StringArray::from_iter_values(good.iter().map(|_| url))),
            _ => match decode_for(name) {
                Decode::Json | Decode::Text => Arc::new(presized::<LargeUtf8Type, _>(
                    values().map(|v| v.and_then(|b| std::str::from_utf8(b).ok())),
                )),
                Decode::Int => Arc::new(
                    values()
                        .map(|v| v.and_then(parse_int))
                        .collect::<Int64Array>(),
                ),
                Decode::Npy | Decode::Bytes => Arc::new(presized::<LargeBinaryType, _>(values())),
            },
        };
        columns.push(column);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(good.len()));
    let batch = RecordBatch::try_new_with_options(schema.clone(), columns, &options)
        .map_err(|e| Error::Internal(e.to_string()))?;
    Ok(Decoded {
        batches: vec![batch],
        skipped,
    })
}

/// A bytes or text column built in buffers of its final size. `collect` grows them by
/// doubling, copying the values so far into fresh memory (which the kernel faults in) at
/// each step: 6% of a decode thread's time on photos.
fn presized<'a, T, V>(values: impl Iterator<Item = Option<&'a V>> + Clone) -> GenericByteArray<T>
where
    T: ByteArrayType<Native = V>,
    V: AsRef<[u8]> + AsRef<T::Native> + ?Sized + 'a,
{
    let (rows, bytes) = values.clone().fold((0, 0), |(rows, bytes), v| {
        (
            rows + 1,
            bytes + v.map_or(0, |v| AsRef::<[u8]>::as_ref(v).len()),
        )
    });
    let mut builder = GenericByteBuilder::<T>::with_capacity(rows, bytes);
    for v in values {
        builder.append_option(v);
    }
    builder.finish()
}

fn parse_int(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

fn check_sample(config: &Config, sample: &Sample) -> std::result::Result<(), String> {
    for (name, data) in &sample.fields {
        if config.schema.field_with_name(name).is_err() {
            if config.strict {
                return Err(format!(
                    "field {name:?} is not in the fields seen in the first {INFER_SAMPLES} samples; pass columns= to choose fields"
                ));
            }
            continue;
        }
        match decode_for(name) {
            Decode::Text => {
                std::str::from_utf8(data).map_err(|_| format!("{name} is not UTF-8 text"))?;
            }
            Decode::Json => {
                serde_json::from_slice::<serde_json::Value>(data)
                    .map_err(|e| format!("{name}: invalid JSON: {e}"))?;
            }
            Decode::Int => {
                parse_int(data).ok_or_else(|| format!("{name} is not an integer"))?;
            }
            Decode::Npy => {
                super::npy::parse_header(data).map_err(|e| format!("{name}: {e}"))?;
            }
            Decode::Bytes => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_like_webdataset() {
        assert_eq!(key_and_field("a/b/c.d.e"), Some(("a/b/c", "d.e")));
        assert_eq!(key_and_field("dir.x/file.jpg"), Some(("dir.x/file", "jpg")));
        assert_eq!(key_and_field("x.seg.png"), Some(("x", "seg.png")));
        assert_eq!(key_and_field("noext"), None);
        assert_eq!(key_and_field("dir/.hidden"), None);
        assert_eq!(key_and_field("../up.txt"), Some(("../up", "txt")));
        assert!(is_meta("__info__"));
        assert!(!is_meta("d/__info__"));
        assert_eq!(decode_for("seg.json"), Decode::Json);
    }
}
