//! A local directory of decoded units (`sf.dataset(..., decoded_cache=...)`): the first
//! read of a unit writes the rows it decoded to an Arrow IPC file there, and every later
//! read of it (another epoch, rank, worker or process) maps that file instead of fetching
//! and decoding the unit again, as `datasets` reads the Arrow copy `load_dataset` made.
//!
//! A file is named by a digest of what the rows depend on: the shard's version (a local
//! file's size and modification time, an object's ETag), the unit, the crate's version
//! and how the dataset reads (columns, features, format options, the schema). A changed
//! shard or reading is a new name, never a stale hit. Files are written to a temporary
//! name and renamed into place, so a process killed mid-write leaves at most a temporary
//! file, which a later start removes; a file that does not read back whole is removed and
//! its unit decoded again. Units whose jobs stream their shard (JSON lines, CSV,
//! TFRecord, tar) are read as before: only units decoded whole (Parquet row groups,
//! Arrow record batches, NPY/NPZ and HDF5 units) are kept.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::Block;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{Schema, SchemaRef};
use sha2::{Digest, Sha256};

use super::arrow_ipc::{block_range, check_block, footer_range, parse_footer};
use super::reader::{PreparedShards, ReadOptions, UnitJobs};
use super::records::{RecordAccess, RecordCodec};
use super::unit::{BatchSink, Decoded, UnitJob, WorkUnit, task};
use crate::error::Result;
use crate::source::cache::{TMP_PREFIX, abandoned_tmp};
use crate::source::{Io, ShardMeta};

/// Where decoded units are kept, and the digest of how the dataset reads them.
pub struct DecodedCache {
    dir: PathBuf,
    reading: String,
}

impl DecodedCache {
    /// The cache in `dir` for a dataset read with `options` into `schema`; temporary
    /// files that killed processes left there are removed.
    pub fn open(dir: PathBuf, format: &str, options: &ReadOptions, schema: &Schema) -> Self {
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let modified = entry.metadata().and_then(|m| m.modified());
                if modified.is_ok_and(|m| abandoned_tmp(&name, m)) {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        // Metadata are ordered maps: every process names a unit alike.
        let fields: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                format!(
                    "{}:{}:{}:{:?}",
                    f.name(),
                    f.data_type(),
                    f.is_nullable(),
                    f.metadata()
                )
            })
            .collect();
        let reading = format!(
            "{}\0{format}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{fields:?}\0{:?}",
            env!("CARGO_PKG_VERSION"),
            options.columns,
            options.features,
            options.format_options,
            options.on_error,
            options.images,
            options.media_features,
            schema.metadata(),
        );
        Self { dir, reading }
    }

    /// The file that holds `unit` of `shard` once decoded; `None` for a shard whose
    /// version cannot be told (an HTTP resource without ETag), which is never kept.
    fn path(&self, unit: &WorkUnit, shard: &ShardMeta) -> Option<PathBuf> {
        let version = super::index::current_key(shard)?;
        let mut digest = Sha256::new();
        for part in [self.reading.as_bytes(), version.as_bytes()] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        digest.update((unit.part as u64).to_le_bytes());
        digest.update(unit.rows.unwrap_or(u64::MAX).to_le_bytes());
        let name: String = digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(self.dir.join(format!("{name}.arrow")))
    }
}

impl PreparedShards {
    /// `plain` read through a cache of decoded units.
    pub fn with_decoded_cache(plain: &Arc<Self>, cache: Arc<DecodedCache>) -> Self {
        Self {
            format: plain.format,
            schema: plain.schema.clone(),
            shards: plain.shards.clone(),
            units: plain.units.clone(),
            skipped_shards: plain.skipped_shards,
            huggingface: plain.huggingface.clone(),
            jobs: Box::new(CachedJobs {
                inner: plain.clone(),
                cache,
            }),
        }
    }
}

/// The jobs of `inner`, through the cache.
struct CachedJobs {
    inner: Arc<PreparedShards>,
    cache: Arc<DecodedCache>,
}

impl UnitJobs for CachedJobs {
    fn kept(&self, unit: &WorkUnit, shard: &ShardMeta) -> bool {
        self.cache.path(unit, shard).is_some_and(|p| p.is_file())
    }

    /// A kept unit's rows as views of its mapped copy (no copy: the pages of those rows
    /// alone are read in); others as the format reads them.
    fn rows_job(
        &self,
        unit: &WorkUnit,
        shard: &ShardMeta,
        rows: &[u64],
        io: &Io,
    ) -> Option<UnitJob> {
        let Some((path, batches)) = self.cache.path(unit, shard).and_then(|path| {
            let batches = load_kept(&path, false)?;
            Some((path, batches))
        }) else {
            return self.inner.rows_job(unit, rows, io);
        };
        let rows = rows.to_vec();
        Some(UnitJob::Ready(task(move || {
            Ok(Decoded {
                batches: row_views(&batches, &rows).map_err(|e| {
                    crate::error::Error::Internal(format!(
                        "rows of the decoded copy {}: {e}",
                        path.display()
                    ))
                })?,
                skipped: Vec::new(),
            })
        })))
    }

    fn reads_rows_alone(&self, unit: &WorkUnit, _shard: &ShardMeta, io: &Io) -> Result<bool> {
        self.inner.reads_rows_alone(unit, io)
    }

    fn row_read_share(&self, unit: &WorkUnit, _shard: &ShardMeta) -> Option<f64> {
        self.inner.row_read_share(unit)
    }

    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        self.inner.record_codec()
    }

    fn record_access(&self) -> Option<RecordAccess> {
        self.inner.record_access()
    }

    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let Some(path) = self.cache.path(unit, shard) else {
            return self.inner.job(unit);
        };
        if let Some(batches) = load_kept(&path, true) {
            return UnitJob::Ready(task(move || {
                Ok(Decoded {
                    batches,
                    skipped: Vec::new(),
                })
            }));
        }
        let schema = self.inner.schema.clone();
        match self.inner.job(unit) {
            UnitJob::Ranges { ranges, decode } => UnitJob::Ranges {
                ranges,
                decode: Box::new(move |fetched, sink: &mut BatchSink| {
                    kept(&path, &schema, sink, |sink| decode(fetched, sink))
                }),
            },
            UnitJob::Ready(decode) => UnitJob::Ready(Box::new(move |sink: &mut BatchSink| {
                kept(&path, &schema, sink, decode)
            })),
            streamed => streamed,
        }
    }
}

/// The rows at `rows` (offsets in the unit, ascending) of the unit's `batches`, in order,
/// as slices of them: each run of consecutive rows one slice.
fn row_views(
    batches: &[RecordBatch],
    rows: &[u64],
) -> std::result::Result<Vec<RecordBatch>, String> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut total = 0u64;
    for batch in batches {
        starts.push(total);
        total += batch.num_rows() as u64;
    }
    // (batch, first row, rows) of each run.
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for &row in rows {
        if row >= total {
            return Err(format!("row {row} of a unit of {total} rows"));
        }
        let batch = starts.partition_point(|&s| s <= row) - 1;
        let at = (row - starts[batch]) as usize;
        match runs.last_mut() {
            Some((b, first, n)) if *b == batch && *first + *n == at => *n += 1,
            _ => runs.push((batch, at, 1)),
        }
    }
    Ok(runs
        .into_iter()
        .map(|(batch, first, n)| batches[batch].slice(first, n))
        .collect())
}

/// Runs `decode`, passing its batches on to `sink`, and writes them all to `path` once
/// it has decoded the whole unit (not where it skipped records: their places would be
/// lost).
fn kept(
    path: &Path,
    schema: &SchemaRef,
    sink: &mut BatchSink,
    decode: impl FnOnce(&mut BatchSink) -> crate::error::Result<Decoded>,
) -> crate::error::Result<Decoded> {
    let mut batches = Vec::new();
    let mut forward = |batch: RecordBatch| {
        batches.push(batch.clone());
        sink(batch);
    };
    let decoded = decode(&mut forward)?;
    if decoded.skipped.is_empty() {
        batches.extend(decoded.batches.iter().cloned());
        store(path, schema, &batches);
    }
    Ok(decoded)
}

/// A file written at most a mebibyte per `write` call. Arrow's IPC writer hands each
/// buffer of a batch to one `write_all`, which a `BufWriter` passes straight on; one call
/// of 16 MiB into the page cache cost several times as much per byte as the same bytes a
/// mebibyte at a time (ext4, Linux 6.18: the kernel's copy took 39% of an epoch that kept
/// 1.5 GB in 16 MiB batches, 5% in 1 MiB calls; the epoch 2.2-3.3 s against 1.3-1.5 s).
struct ChunkedWrites(File);

/// Bytes one `write` call passes on at most.
const WRITE_CALL_BYTES: usize = 1 << 20;

impl Write for ChunkedWrites {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(&buf[..buf.len().min(WRITE_CALL_BYTES)])
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Bytes of values a stored batch joins at most. Decoders hand over batches of a
/// megabyte or less (three rows of 256 KB); each is a message that every later read of
/// the file checks and decodes again, and a full shuffle reads each unit once per gather
/// (22 messages a unit of 64 such rows: a tenth of a shuffled epoch).
const STORED_BATCH_BYTES: u64 = 32 << 20;

/// `batches` cut into runs of consecutive batches, each stored as one batch: up to
/// [`STORED_BATCH_BYTES`] of values (a batch larger alone is a run of its own).
fn stored_batches(batches: &[RecordBatch]) -> Vec<&[RecordBatch]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, batch) in batches.iter().enumerate() {
        let size = crate::batch_bytes::batch_bytes(batch);
        if i > start && bytes + size > STORED_BATCH_BYTES {
            runs.push(&batches[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < batches.len() {
        runs.push(&batches[start..]);
    }
    runs
}

/// Writes `batches` to `path` through a temporary file; a failure (a full disk) leaves
/// nothing behind, and the unit is simply decoded again next time.
fn store(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{}-{}",
        std::process::id(),
        name.to_string_lossy()
    ));
    let written = (|| -> std::result::Result<(), Box<dyn std::error::Error>> {
        fs::create_dir_all(dir)?;
        let schema = batches
            .first()
            .map_or_else(|| schema.clone(), |b| b.schema());
        let file = BufWriter::with_capacity(1 << 20, ChunkedWrites(File::create(&tmp)?));
        let mut writer = FileWriter::try_new(file, &schema)?;
        for group in stored_batches(batches) {
            match group {
                [one] => writer.write(one)?,
                many => writer.write(&arrow_select::concat::concat_batches(&schema, many)?)?,
            }
        }
        writer.finish()?;
        writer.into_inner()?.flush()?;
        fs::rename(&tmp, path)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// The batches kept at `path` (see [`load`]); `None` where there are none, and where the
/// file is damaged (a disk error, a file cut short): it is removed, and the unit decoded
/// again and written anew.
fn load_kept(path: &Path, populate: bool) -> Option<Vec<RecordBatch>> {
    load(path, populate).unwrap_or_else(|_| {
        let _ = fs::remove_file(path);
        None
    })
}

/// The batches kept at `path`, their buffers over the mapped file (its pages read in at
/// once where `populate`: the whole unit is wanted); `None` where there is no such file,
/// an error where it does not read back whole.
fn load(path: &Path, populate: bool) -> std::result::Result<Option<Vec<RecordBatch>>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let buffer = crate::mapped::map_shared(&file, populate)
        .map_err(|e| e.to_string())?
        .filter(|b| b.len() >= 18)
        .ok_or("too short")?;
    std::panic::catch_unwind(|| decode_file(&buffer))
        .unwrap_or_else(|_| Err("the file's messages do not decode".into()))
        .map(Some)
}

/// The record batches of the Arrow IPC file in `buffer`, each checked before decoding.
fn decode_file(buffer: &Buffer) -> std::result::Result<Vec<RecordBatch>, String> {
    let size = buffer.len();
    let bytes = buffer.as_slice();
    let footer = footer_range(&bytes[size - 10..], size as u64)?;
    let footer = parse_footer(
        &bytes[footer.start as usize..footer.end as usize],
        size as u64,
    )?;
    let mut decoder = FileDecoder::new(Arc::new(footer.schema), footer.version);
    let message = |block: &Block| -> std::result::Result<Buffer, String> {
        let range = block_range(block, size as u64)?;
        let (start, end) = (range.start as usize, range.end as usize);
        check_block(block, &bytes[start..end], u64::MAX)?;
        Ok(buffer.slice_with_length(start, end - start))
    };
    for block in &footer.dictionaries {
        decoder
            .read_dictionary(block, &message(block)?)
            .map_err(|e| e.to_string())?;
    }
    let mut batches = Vec::new();
    for block in &footer.batches {
        if let Some(batch) = decoder
            .read_record_batch(block, &message(block)?)
            .map_err(|e| e.to_string())?
        {
            batches.push(batch);
        }
    }
    Ok(batches)
}
