//! What reading a shard is cut into: work units, the decode job for each (whole bytes,
//! byte ranges or a stream), the decode tasks a job emits, and what a task decoded; and
//! the helpers every format uses to make them (projection, per-shard preparation).

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta};

/// What to do with data that cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    #[default]
    Raise,
    /// Skip the bad record (or, where records cannot be told apart, the bad unit or
    /// file) and count it in the stats.
    Skip,
}

impl OnError {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "raise" => Ok(OnError::Raise),
            "skip" => Ok(OnError::Skip),
            other => Err(Error::invalid_argument(format!(
                "on_error must be \"raise\" or \"skip\", not {other:?}"
            ))),
        }
    }
}

/// Resolves `columns=` against the names a shard offers: their indices, in the order
/// asked. Every format's projection goes through here, so all of them refuse an empty
/// list, a name given twice and a name the data lacks, in the same words.
pub fn column_indices(available: &[&str], columns: &[String], url: &str) -> Result<Vec<usize>> {
    if columns.is_empty() {
        return Err(Error::invalid_argument(
            "columns= must name at least one column",
        ));
    }
    let mut indices = Vec::with_capacity(columns.len());
    for name in columns {
        let Some(index) = available.iter().position(|a| a == name) else {
            return Err(Error::Schema {
                url: url.to_string(),
                message: format!("no column {name:?}; the columns are {available:?}"),
            });
        };
        if indices.contains(&index) {
            return Err(Error::invalid_argument(format!(
                "column {name:?} is listed twice in columns="
            )));
        }
        indices.push(index);
    }
    Ok(indices)
}

/// The names of a schema's fields, for [`column_indices`].
pub fn field_names(schema: &arrow_schema::Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}

/// One work unit per file, for formats read front to back; its rows are known where a
/// manifest gives them.
pub fn whole_files(shards: &[ShardMeta]) -> Vec<WorkUnit> {
    shards
        .iter()
        .enumerate()
        .map(|(shard, meta)| WorkUnit {
            shard,
            part: 0,
            rows: meta.rows,
        })
        .collect()
}

/// Shards whose headers are read at once while preparing.
const HEADER_CONCURRENCY: usize = 32;

/// Runs `read(source, size)` for every shard on the I/O runtime, many at once, and
/// returns each shard's outcome in order. A panic inside `read` (a parser choking on
/// corrupt bytes) becomes that shard's decode error.
pub fn per_shard<T, F>(
    shards: &[ShardMeta],
    io: &Io,
    format: &'static str,
    read: F,
) -> Result<Vec<Result<T>>>
where
    T: Send + 'static,
    F: Fn(Arc<dyn crate::source::Source>, u64) -> crate::source::BoxFuture<'static, Result<T>>
        + Send
        + Sync
        + 'static,
{
    let rt = crate::source::runtime()?;
    let read = Arc::new(read);
    let limit = Arc::new(tokio::sync::Semaphore::new(HEADER_CONCURRENCY));
    let tasks: Vec<_> = shards
        .iter()
        .map(|shard| {
            let (shard, io, limit, read) = (shard.clone(), io.clone(), limit.clone(), read.clone());
            rt.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let source = io.open(&shard)?;
                let size = match shard.size {
                    Some(size) => size,
                    None => source.size().await?,
                };
                read(source, size).await
            })
        })
        .collect();
    rt.block_on(async {
        let mut out = Vec::with_capacity(tasks.len());
        for (shard, task) in shards.iter().zip(tasks) {
            out.push(task.await.unwrap_or_else(|e| {
                Err(crate::error::Error::decode(
                    &shard.url,
                    format,
                    crate::error::Position::Unknown,
                    format!("the header parser failed: {e}"),
                ))
            }));
        }
        Ok(out)
    })
}

/// A unit that reads its whole file, then decodes it: one range read when the size is
/// known (for remote objects, many such reads go on at once), else a stream.
pub fn whole_file_job(
    shard: &ShardMeta,
    decode: impl FnOnce(bytes::Bytes) -> Result<Decoded> + Send + 'static,
) -> UnitJob {
    if let Some(size) = shard.size {
        return UnitJob::Ranges {
            ranges: std::iter::once(0..size).collect(),
            decode: Box::new(move |fetched: RangeSet, _: &mut BatchSink| {
                decode(fetched.get(0, size).unwrap_or_default())
            }),
        };
    }
    let url = shard.url.clone();
    UnitJob::Stream(Box::new(move |mut reader, emit: &mut EmitTask| {
        let mut data = Vec::new();
        reader
            .read_to_end(&mut data)
            .map_err(|e| crate::error::Error::io(url, crate::error::Position::Unknown, e))?;
        let data = bytes::Bytes::from(data);
        emit(task(move || decode(data)));
        Ok(())
    }))
}

/// A part of one shard that is fetched and decoded on its own: the unit of parallel
/// work and of shuffled shard order (a Parquet row group, a whole JSONL file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkUnit {
    /// Index into [`super::PreparedShards::shards`].
    pub shard: usize,
    /// Format-specific part number (row group index for Parquet, 0 for whole files).
    pub part: usize,
    /// Rows in the unit, where the format's metadata says so.
    pub rows: Option<u64>,
}

/// The output of one decode task: what it did not already hand to its [`BatchSink`].
#[derive(Debug, Default)]
pub struct Decoded {
    pub batches: Vec<RecordBatch>,
    /// Records dropped under `OnError::Skip`, by their place among the task's records
    /// (ascending): the rows after one keep their own places, so that a part's share of
    /// a unit, counted in records, still ends where it should.
    pub skipped: Vec<u64>,
}

/// Takes batches from a decode task while it runs. A task that makes many batches (a
/// Parquet row group) hands each over as it is made, so that the unit's first rows reach
/// the consumer without waiting for its last; they come before the task's [`Decoded`].
pub type BatchSink<'a> = dyn FnMut(RecordBatch) + 'a;

/// CPU work that turns fetched bytes into batches; runs on the decode thread pool.
pub type DecodeTask = Box<dyn FnOnce(&mut BatchSink) -> Result<Decoded> + Send>;

/// A decode task that returns all of its batches at its end.
pub fn task(decode: impl FnOnce() -> Result<Decoded> + Send + 'static) -> DecodeTask {
    Box::new(move |_: &mut BatchSink| decode())
}

/// Decodes the fetched ranges of one unit (see [`BatchSink`]).
pub type DecodeRanges = Box<dyn FnOnce(RangeSet, &mut BatchSink) -> Result<Decoded> + Send>;

/// Emits a decode task; returns false once the consumer has gone away.
pub type EmitTask<'a> = dyn FnMut(DecodeTask) -> bool + 'a;

/// Reads a shard's stream to its end, emitting decode tasks as it goes.
pub type StreamJob = Box<dyn FnOnce(Box<dyn Read + Send>, &mut EmitTask) -> Result<()> + Send>;

/// How the pipeline should fetch one unit's bytes.
pub enum UnitJob {
    /// Random access: fetch these byte ranges (concurrently), then decode them.
    Ranges {
        ranges: Vec<Range<u64>>,
        decode: DecodeRanges,
    },
    /// Sequential: read the shard front to back on a blocking thread, cutting it into
    /// decode tasks as it goes (so a large file is decoded in parallel, in bounded memory).
    Stream(StreamJob),
    /// Nothing to fetch (records already in memory): just this task.
    Ready(DecodeTask),
}
