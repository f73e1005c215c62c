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

/// `f` over `0..n`, the results in order, on the threads of the rayon pool the caller
/// runs on: the calling thread takes items too, and the pool's idle threads help.
///
/// Not rayon's parallel iterators: a thread waiting in one for the items others took
/// runs whatever pool work it finds meanwhile, and a decode task waiting there took the
/// next unit's whole decode task, so its own unit's batches, which the loader hands out
/// first, waited for that one (a Hub image dataset's first batch at 1.8 s rather than
/// 0.07 s, and its first epoch 30% slower). Here the caller waits only for items already
/// being decoded, doing nothing else. A helper that starts after the items are all taken
/// does nothing, so none is needed: in a forked child with no pool threads, or with every
/// thread busy on a unit of its own, the caller decodes every item itself.
pub(super) fn map_on_pool<T, F>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> T + Sync,
{
    let helpers = rayon::current_num_threads().min(n).saturating_sub(1);
    if helpers == 0 {
        return (0..n).map(f).collect();
    }
    let work: &(dyn Fn(usize) -> T + Sync) = &f;
    // SAFETY: only the lifetime changes. `work` is called only for an item claimed below
    // `n` (`Shared::run`), and this function returns only once every such item is done,
    // so every call happens while `f` lives; a helper starting later claims nothing.
    let work: *const (dyn Fn(usize) -> T + Sync + 'static) = unsafe { std::mem::transmute(work) };
    let shared = Arc::new(Shared {
        next: std::sync::atomic::AtomicUsize::new(0),
        work: SharedWork(work),
        slots: (0..n).map(|_| std::sync::Mutex::new(None)).collect(),
        done: std::sync::Mutex::new(0),
        all_done: std::sync::Condvar::new(),
    });
    for _ in 0..helpers {
        let shared = shared.clone();
        rayon::spawn(move || shared.run());
    }
    shared.run();
    let mut done = shared.done.lock().unwrap_or_else(|p| p.into_inner());
    while *done < n {
        done = shared
            .all_done
            .wait(done)
            .unwrap_or_else(|p| p.into_inner());
    }
    drop(done);
    let mut out = Vec::with_capacity(n);
    for slot in &shared.slots {
        match slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(Ok(value)) => out.push(value),
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => unreachable!("every item is done"),
        }
    }
    out
}

/// The work of one [`map_on_pool`] call, shared by the caller and its helpers.
struct Shared<T> {
    next: std::sync::atomic::AtomicUsize,
    work: SharedWork<T>,
    /// Each item's result, or the panic its call raised.
    slots: Vec<std::sync::Mutex<Option<std::thread::Result<T>>>>,
    done: std::sync::Mutex<usize>,
    all_done: std::sync::Condvar,
}

/// The caller's function, called only while the caller waits (see [`map_on_pool`]).
struct SharedWork<T>(*const (dyn Fn(usize) -> T + Sync));

// SAFETY: the function is `Sync` (called from several threads at once) and is only
// called while the `map_on_pool` that owns it waits; the pointer itself is plain data.
unsafe impl<T> Send for SharedWork<T> {}
unsafe impl<T> Sync for SharedWork<T> {}

impl<T> Shared<T> {
    /// Takes items until none is left.
    fn run(&self) {
        loop {
            let item = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if item >= self.slots.len() {
                return;
            }
            // SAFETY: the item was claimed below `n`: the caller waits for it (see
            // `map_on_pool`), so its function is alive.
            let work = unsafe { &*self.work.0 };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(item)));
            *self.slots[item].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
            let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
            *done += 1;
            if *done == self.slots.len() {
                self.all_done.notify_all();
            }
        }
    }
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
            let group = std::mem::take(pending);
            let decoded = map_on_pool(group.len(), |i| {
                decode_batch(decoder.as_ref(), group[i].clone(), &url, true)
            });
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::Duration;

    use super::map_on_pool;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn results_come_in_order_on_and_off_a_pool() {
        let squares: Vec<usize> = (0..100).map(|i| i * i).collect();
        assert_eq!(map_on_pool(100, |i| i * i), squares);
        assert_eq!(pool(3).install(|| map_on_pool(100, |i| i * i)), squares);
        assert_eq!(
            pool(3).install(|| map_on_pool(0, |i| i)),
            Vec::<usize>::new()
        );
        // Nested, as a group's batches each decode their rows.
        let nested = pool(2).install(|| map_on_pool(8, |i| map_on_pool(8, |j| i * 8 + j)));
        assert_eq!(nested.concat(), (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn a_panic_reaches_the_caller_once_every_item_is_done() {
        let finished = std::sync::atomic::AtomicUsize::new(0);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool(2).install(|| {
                map_on_pool(16, |i| {
                    std::thread::sleep(Duration::from_millis(2));
                    if i == 3 {
                        panic!("item 3");
                    }
                    finished.fetch_add(1, SeqCst);
                })
            })
        }));
        assert!(outcome.is_err());
        assert_eq!(finished.load(SeqCst), 15);
    }

    /// The reason for `map_on_pool`: while the caller waits for an item another thread
    /// took, it does not run other work of the pool (a later unit's whole decode).
    #[test]
    fn the_caller_runs_no_other_pool_work_while_it_waits() {
        let pool = pool(2);
        let (started, release) = (AtomicBool::new(false), AtomicBool::new(false));
        let ran_on = std::sync::Mutex::new(Vec::new());
        pool.install(|| {
            let me = rayon::current_thread_index();
            rayon::scope(|scope| {
                map_on_pool(2, |i| {
                    if i == 0 {
                        // The caller's item: wait until the other thread holds item 1,
                        // then queue more work before the caller waits for it.
                        while !started.load(SeqCst) {
                            std::thread::yield_now();
                        }
                        for _ in 0..4 {
                            scope.spawn(|_| {
                                ran_on.lock().unwrap().push(rayon::current_thread_index());
                                release.store(true, SeqCst);
                            });
                        }
                    } else {
                        started.store(true, SeqCst);
                        // Held until the queued work has run somewhere.
                        let start = std::time::Instant::now();
                        while !release.load(SeqCst) && start.elapsed() < Duration::from_millis(500)
                        {
                            std::thread::yield_now();
                        }
                    }
                });
                // The queued work ran only after the map returned, or on another thread.
                let before = ran_on.lock().unwrap().clone();
                assert!(before.iter().all(|t| *t != me), "{before:?} against {me:?}");
            });
        });
    }
}
