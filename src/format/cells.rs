//! Cells decoded on the decode threads: a column of encoded media (image or audio
//! bytes, or `datasets`' `{bytes, path}` structs) becomes a column of decoded values as
//! each batch leaves the format, before the pipeline sees it. One [`CellDecoder`] per
//! kind of media (`image`, `audio`); this file holds what they share: the bytes of a
//! cell, a decoder's panic caught as that cell's error, and `on_error="skip"` dropping
//! the rows whose cells do not decode, counted in the places the format counts its own.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::{BooleanBuffer, NullBuffer};
use arrow_schema::{DataType, SchemaRef};
use rayon::prelude::*;

use super::reader::PreparedShards;
use super::{BatchSink, DecodeTask, Decoded, OnError, UnitJob, UnitJobs, WorkUnit};
use crate::error::{Error, Position, Result};
use crate::source::ShardMeta;

/// Each row's outcome of decoding one column: `Err` names what went wrong with its cell.
pub(super) type Outcomes = Vec<std::result::Result<(), String>>;

/// Decodes some columns of each batch (see the module docs).
pub trait CellDecoder: std::fmt::Debug + Send + Sync {
    /// What a cell holds, for errors: `"image"`, `"audio"`.
    fn media(&self) -> &'static str;
    /// The schema with the decoded columns in place of the encoded ones.
    fn schema(&self) -> &SchemaRef;
    fn on_error(&self) -> OnError;
    /// The columns decoded, by their place in the schema.
    fn columns(&self) -> Vec<usize>;
    /// The `column` at schema place `index` decoded (a row whose cell does not decode
    /// holds an empty value), and each row's outcome.
    /// An `Err` is the whole column's (a cell that is only a path): the batch's error.
    fn decode_column(
        &self,
        index: usize,
        column: &ArrayRef,
    ) -> std::result::Result<(ArrayRef, Outcomes), String>;
}

/// Whether a column of this type holds encoded media: a binary column, or a struct with
/// a binary `bytes` field (an `Image` or `Audio` column as `datasets` stores it:
/// `{bytes, path}`).
pub(super) fn media_bytes_type(data_type: &DataType) -> bool {
    let binary = |t: &DataType| {
        matches!(
            t,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        )
    };
    match data_type {
        DataType::Struct(fields) => fields
            .iter()
            .any(|f| f.name() == "bytes" && binary(f.data_type())),
        other => binary(other),
    }
}

/// The encoded bytes of a column [`media_bytes_type`] accepts, as one large-binary
/// array: a struct's `bytes`, null where the struct is. A cell given by its `path` alone
/// (no bytes) is an error: it would otherwise read as no media.
pub(super) fn cell_bytes(
    column: &ArrayRef,
    media: &str,
) -> std::result::Result<arrow_array::LargeBinaryArray, String> {
    let bytes = match column.as_struct_opt() {
        Some(cells) => {
            let Some(bytes) = cells.column_by_name("bytes") else {
                return Err(format!("a {media} struct with no bytes field"));
            };
            if let Some(paths) = cells.column_by_name("path") {
                let by_path = (0..cells.len())
                    .find(|&row| cells.is_valid(row) && bytes.is_null(row) && paths.is_valid(row));
                if let Some(row) = by_path {
                    let path =
                        arrow_cast::display::array_value_to_string(paths, row).unwrap_or_default();
                    return Err(format!(
                        "row {row}'s {media} is only a path ({path:?}), with no bytes: shardflow decodes the bytes stored in the data"
                    ));
                }
            }
            let nulls = NullBuffer::union(cells.nulls(), bytes.nulls());
            let data = bytes
                .to_data()
                .into_builder()
                .nulls(nulls)
                .build()
                .map_err(|e| e.to_string())?;
            arrow_array::make_array(data)
        }
        None => column.clone(),
    };
    let bytes = arrow_cast::cast(&bytes, &DataType::LargeBinary).map_err(|e| e.to_string())?;
    Ok(bytes.as_binary::<i64>().clone())
}

/// `decode`, with a panic in a decoder (a bug there) reported as this cell's error.
pub(super) fn guarded<T>(
    decode: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode))
        .unwrap_or_else(|panic| Err(crate::error::panic_message(&*panic)))
}

/// The nulls of a media column's input: a missing cell is a missing decoded value.
pub(super) fn nulls_of(input: &arrow_array::LargeBinaryArray) -> Option<NullBuffer> {
    input
        .nulls()
        .cloned()
        .map(|n| NullBuffer::new(n.inner().clone()))
}

/// Decodes the columns of `batch` (read from `url`) that `decoder` decodes; returns the
/// batch and the rows dropped (under `on_error="skip"`, when `may_skip`), by their place
/// in `batch`.
pub fn decode_batch(
    decoder: &dyn CellDecoder,
    batch: RecordBatch,
    url: &str,
    may_skip: bool,
) -> Result<(RecordBatch, Vec<u64>)> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    let mut bad_rows = vec![false; rows];
    let mut first_error: Option<String> = None;
    for index in decoder.columns() {
        let (decoded, outcomes) = decoder
            .decode_column(index, batch.column(index))
            .map_err(|e| Error::decode(url, decoder.media(), Position::Unknown, e))?;
        columns[index] = decoded;
        for (row, outcome) in outcomes.into_iter().enumerate() {
            if let Err(e) = outcome {
                bad_rows[row] = true;
                first_error.get_or_insert_with(|| {
                    format!(
                        "row {row} of the batch, column {:?}: {e}",
                        batch.schema().field(index).name()
                    )
                });
            }
        }
    }
    let media = decoder.media();
    let out = RecordBatch::try_new(decoder.schema().clone(), columns)
        .map_err(|e| Error::Internal(format!("decoded {media}: {e}")))?;
    let Some(message) = first_error else {
        return Ok((out, Vec::new()));
    };
    if decoder.on_error() == OnError::Raise || !may_skip {
        return Err(Error::decode(url, media, Position::Unknown, message));
    }
    let keep = BooleanArray::new(BooleanBuffer::from_iter(bad_rows.iter().map(|b| !b)), None);
    let skipped = (0..rows as u64).filter(|&r| bad_rows[r as usize]).collect();
    let kept = arrow_select::filter::filter_record_batch(&out, &keep)
        .map_err(|e| Error::Internal(format!("dropping undecodable {media}: {e}")))?;
    Ok((kept, skipped))
}

/// Encoded bytes a group of batches decoded together holds, at least (see `wrap_task`).
const GROUP_BYTES: usize = 4 << 20;

/// `task` with its batches' cells decoded. Batches are decoded a group at a time, each
/// group's cells in parallel on the pool: a format gives wide rows (a clip or a photo of
/// a megabyte) in batches of one or two, and one task's batches come one after another.
fn wrap_task(decoder: &Arc<dyn CellDecoder>, url: String, task: DecodeTask) -> DecodeTask {
    let decoder = decoder.clone();
    Box::new(move |sink: &mut BatchSink| {
        // Rows dropped here, by their place among the rows the task decoded.
        let mut dropped = Vec::new();
        let mut decoded_rows = 0u64;
        let mut failed = None;
        let mut pending: Vec<RecordBatch> = Vec::new();
        let group_rows = 4 * rayon::current_num_threads();
        let mut decode_pending = |pending: &mut Vec<RecordBatch>, sink: &mut BatchSink| {
            if failed.is_some() || pending.is_empty() {
                pending.clear();
                return;
            }
            // Each batch of the group on its own pool thread (and each batch's cells on
            // as many as it has rows), then handed on in order.
            let decoded: Vec<Result<(RecordBatch, Vec<u64>)>> = std::mem::take(pending)
                .into_par_iter()
                .map(|batch| decode_batch(decoder.as_ref(), batch, &url, true))
                .collect();
            for outcome in decoded {
                match outcome {
                    Ok((batch, bad)) => {
                        let rows = (batch.num_rows() + bad.len()) as u64;
                        dropped.extend(bad.into_iter().map(|r| decoded_rows + r));
                        decoded_rows += rows;
                        sink(batch);
                    }
                    Err(e) => {
                        failed = Some(e);
                        return;
                    }
                }
            }
        };
        // A group holds a few cells per pool thread and some megabytes of them: enough
        // that a thread left with the group's last cell, and the format's reading of the
        // next batches meanwhile, are a small part of the group's time.
        let (mut rows, mut bytes) = (0usize, 0usize);
        let mut grouping = |batch: RecordBatch, sink: &mut BatchSink| {
            rows += batch.num_rows();
            bytes += batch.get_array_memory_size();
            pending.push(batch);
            if rows >= group_rows && (bytes >= GROUP_BYTES || rows >= 16 * group_rows) {
                decode_pending(&mut pending, sink);
                (rows, bytes) = (0, 0);
            }
        };
        let rest = task(&mut |batch| grouping(batch, sink))?;
        for batch in rest.batches {
            grouping(batch, sink);
        }
        decode_pending(&mut pending, sink);
        if let Some(e) = failed {
            return Err(e);
        }
        // A decoded row's place among the task's records steps over the records the
        // task itself skipped before it.
        let mut skipped = rest.skipped;
        let mut before = skipped.clone();
        before.sort_unstable();
        for row in dropped {
            let mut place = row;
            for &s in &before {
                if s <= place {
                    place += 1;
                } else {
                    break;
                }
            }
            skipped.push(place);
        }
        skipped.sort_unstable();
        Ok(Decoded {
            batches: Vec::new(),
            skipped,
        })
    })
}

/// A prepared dataset's jobs with their batches' cells decoded on the decode threads.
/// It wraps the format's prepared shards, or their indexed form: the record index is
/// built from the format's own records (`record_codec`), and cells are decoded once, on
/// the way out.
struct CellJobs {
    inner: Arc<PreparedShards>,
    decoder: Arc<dyn CellDecoder>,
}

impl UnitJobs for CellJobs {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url = shard.url.clone();
        match self.inner.job(unit) {
            UnitJob::Ready(task) => UnitJob::Ready(wrap_task(&self.decoder, url, task)),
            UnitJob::Ranges { ranges, decode } => {
                let decoder = self.decoder.clone();
                UnitJob::Ranges {
                    ranges,
                    decode: Box::new(move |fetched, sink| {
                        let task: DecodeTask =
                            Box::new(move |sink: &mut BatchSink| decode(fetched, sink));
                        wrap_task(&decoder, url, task)(sink)
                    }),
                }
            }
            UnitJob::Stream(job) => {
                let decoder = self.decoder.clone();
                UnitJob::Stream(Box::new(move |reader, emit| {
                    job(reader, &mut |task| {
                        emit(wrap_task(&decoder, url.clone(), task))
                    })
                }))
            }
        }
    }

    fn record_codec(&self) -> Option<Arc<dyn super::index::RecordCodec>> {
        self.inner.record_codec()
    }

    fn record_access(&self) -> Option<super::index::RecordAccess> {
        let mut access = self.inner.record_access()?;
        access.codec = Arc::new(CellCodec {
            inner: access.codec,
            decoder: self.decoder.clone(),
        });
        Some(access)
    }
}

/// Random access's record decoder with cells decoded. Rows were counted by the index,
/// so a cell that does not decode is an error here even under `on_error="skip"`.
struct CellCodec {
    inner: Arc<dyn super::index::RecordCodec>,
    decoder: Arc<dyn CellDecoder>,
}

impl super::index::RecordCodec for CellCodec {
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn std::io::Read + Send>,
        key: String,
    ) -> Result<super::index::ShardIndex> {
        self.inner.scan(shard, stream, key)
    }

    fn decode_records(
        &self,
        shard: &ShardMeta,
        index: &super::index::ShardIndex,
        data: bytes::Bytes,
        first: u64,
    ) -> Result<Decoded> {
        let decoded = self.inner.decode_records(shard, index, data, first)?;
        let batches = decoded
            .batches
            .into_iter()
            .map(|b| decode_batch(self.decoder.as_ref(), b, &shard.url, false).map(|(b, _)| b))
            .collect::<Result<_>>()?;
        Ok(Decoded {
            batches,
            skipped: decoded.skipped,
        })
    }
}

impl PreparedShards {
    /// `plain` with the columns `decoder` decodes decoded on the decode threads.
    pub fn with_cells(plain: &Arc<Self>, decoder: Arc<dyn CellDecoder>) -> Self {
        Self {
            format: plain.format,
            schema: decoder.schema().clone(),
            shards: plain.shards.clone(),
            units: plain.units.clone(),
            skipped_shards: plain.skipped_shards,
            huggingface: plain.huggingface.clone(),
            jobs: Box::new(CellJobs {
                inner: plain.clone(),
                decoder,
            }),
        }
    }
}
