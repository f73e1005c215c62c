//! Parallel work, ordered output. Work units are fetched on the I/O runtime (several
//! units open at once: the read-ahead) and their decode tasks run on a rayon pool of
//! `num_threads`; how far ahead both go is tuned while it runs (see `autotune`);
//! results are handed out strictly in unit order, then task order within a unit, so the
//! batch sequence never depends on thread timing.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use arrow_array::RecordBatch;
use tokio::sync::mpsc;

use super::autotune::Tuning;
use super::stats::Stats;
use crate::error::{Error, Position, Result, panic_message};
use crate::format::{BatchSink, DecodeTask, Decoded, OnError, PreparedShards, UnitJob};
use crate::source::ranges::RangeSet;
use crate::source::{self, Io, ShardMeta, Source};

/// What a unit's fetcher sends, in order.
enum Feed {
    Task(DecodeTask),
    Failed(Error),
    /// Sent last; a feed that closes without it lost its fetcher to a panic.
    Done,
}

/// What a decode task sends: its batches as it makes them (see `BatchSink`), then its end.
enum Decoding {
    Batch(RecordBatch),
    End(Result<Decoded>),
}

/// A decode queued or running, or a marker kept in order with them; `slice` indexes
/// the decoder's slices.
enum Pending {
    Task {
        slice: usize,
        rx: std_mpsc::Receiver<Decoding>,
        /// Batches received and not handed out yet: under `on_error="skip"` a task's
        /// batches wait for its end, so that a unit that fails half-way is skipped whole.
        held: Vec<RecordBatch>,
    },
    Failed {
        slice: usize,
        error: Error,
    },
    /// A unit's last task; `slice` when its row count is to be checked (it was read to
    /// its end, not skipped).
    UnitDone {
        slice: Option<usize>,
    },
}

/// A unit to read this epoch, possibly only part of its rows (the rows of a unit that
/// straddles two ranks' ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitSlice {
    pub unit: usize,
    pub skip: u64,
    /// Rows to keep after `skip`; `None` keeps the rest.
    pub take: Option<u64>,
    /// The position (see `rows`) of the first row kept, when rows are tracked.
    pub position: Option<u64>,
}

/// A slice being read: its rows seen so far, to clip its batches and number its rows.
struct SliceState {
    slice: UnitSlice,
    seen: u64,
    /// Rows handed out so far.
    kept: u64,
}

impl SliceState {
    fn clip(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let start = self.seen;
        let end = start + batch.num_rows() as u64;
        self.seen = end;
        let lo = self.slice.skip.max(start);
        let hi = self
            .slice
            .take
            .map_or(end, |t| (self.slice.skip + t).min(end));
        if hi <= lo {
            return Ok(None);
        }
        let batch = if lo == start && hi == end {
            batch
        } else {
            batch.slice((lo - start) as usize, (hi - lo) as usize)
        };
        let batch = match self.slice.position {
            Some(first) => super::rows::attach_run(batch, first + self.kept)?,
            None => batch,
        };
        self.kept += hi - lo;
        Ok(Some(batch))
    }
}

struct OpenUnit {
    slice: usize,
    rx: mpsc::Receiver<Feed>,
    /// Bytes the unit will fetch (its share of the in-flight budget).
    bytes: u64,
    /// The unit's fetch on the I/O runtime, if it is async: aborted when the unit is
    /// dropped, so that a decoder that goes away takes its requests in flight with it.
    fetch: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for OpenUnit {
    fn drop(&mut self) {
        if let Some(fetch) = &self.fetch {
            fetch.abort();
        }
    }
}

/// How often a decoder waiting for a fetch checks whether its run was cancelled.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// A wait for bytes or for a decode shorter than this is not worth a deeper queue.
const SHORT_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// What a streamed unit is charged: its read-ahead, roughly.
const STREAM_UNIT_BYTES: u64 = 32 * 1024 * 1024;

/// Small LRU of open sources so a file's row groups share one handle, without keeping
/// every file of a large dataset open at once.
struct SourceCache {
    io: Io,
    entries: VecDeque<(usize, Arc<dyn Source>)>,
}

const OPEN_SOURCES: usize = 64;

impl SourceCache {
    fn get(&mut self, shard: usize, meta: &ShardMeta) -> Result<Arc<dyn Source>> {
        if let Some(entry) = self
            .entries
            .iter()
            .position(|(s, _)| *s == shard)
            .and_then(|pos| self.entries.remove(pos))
        {
            let source = entry.1.clone();
            self.entries.push_front(entry);
            return Ok(source);
        }
        let source = self.io.open(meta)?;
        self.entries.push_front((shard, source.clone()));
        self.entries.truncate(OPEN_SOURCES);
        Ok(source)
    }
}

pub struct UnitDecoder {
    prepared: Arc<PreparedShards>,
    /// What to read, in epoch order; `order` holds the slices not yet opened.
    slices: Vec<SliceState>,
    order: VecDeque<usize>,
    open: VecDeque<OpenUnit>,
    pending: VecDeque<Pending>,
    ready: VecDeque<RecordBatch>,
    sources: SourceCache,
    pool: rayon::ThreadPool,
    runtime: &'static tokio::runtime::Runtime,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    /// The run's flag: set when the consumer is gone.
    stopped: Arc<AtomicBool>,
    on_error: OnError,
    tuning: Arc<Tuning>,
    /// Bytes the open units will fetch, bounded by the tuning's read-ahead bytes.
    open_bytes: u64,
    finished: bool,
}

impl UnitDecoder {
    pub fn new(
        prepared: Arc<PreparedShards>,
        slices: Vec<UnitSlice>,
        tuning: Arc<Tuning>,
        on_error: OnError,
        io: Io,
        stats: Arc<Stats>,
        stopped: Arc<AtomicBool>,
    ) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(tuning.threads.max(1))
            .thread_name(|i| format!("shardflow-decode-{i}"))
            .build()
            .map_err(|e| Error::Internal(format!("cannot start decode threads: {e}")))?;
        Ok(Self {
            prepared,
            order: (0..slices.len()).collect(),
            slices: slices
                .into_iter()
                .map(|slice| SliceState {
                    slice,
                    seen: 0,
                    kept: 0,
                })
                .collect(),
            open: VecDeque::new(),
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            sources: SourceCache {
                io,
                entries: VecDeque::new(),
            },
            pool,
            runtime: source::runtime()?,
            stats,
            // Our own flag: this decoder may be dropped (e.g. after `take(n)`) while the
            // rest of the pipeline goes on.
            cancel: Arc::new(AtomicBool::new(false)),
            stopped,
            on_error,
            tuning,
            open_bytes: 0,
            finished: false,
        })
    }

    /// Starts fetching the next units until the read-ahead is reached, in units or in
    /// the bytes they will fetch.
    fn open_units(&mut self) -> Result<()> {
        loop {
            let full = self.open.len() >= self.tuning.read_ahead_units()
                || self.open_bytes >= self.tuning.read_ahead_bytes;
            if full && !self.open.is_empty() {
                return Ok(());
            }
            let Some(slice) = self.order.pop_front() else {
                return Ok(());
            };
            let (tx, rx) = mpsc::channel(2);
            let (bytes, fetch) = self.start_fetch(self.slices[slice].slice.unit, tx)?;
            self.open_bytes += bytes;
            self.stats
                .read_ahead_peak_bytes
                .fetch_max(self.open_bytes, Ordering::Relaxed);
            self.open.push_back(OpenUnit {
                slice,
                rx,
                bytes,
                fetch,
            });
        }
    }

    /// Closes the front unit, releasing its share of the byte budget.
    fn close_front(&mut self) {
        if let Some(unit) = self.open.pop_front() {
            self.open_bytes -= unit.bytes;
        }
    }

    /// Starts fetching a unit; returns the bytes it will fetch, and the fetch's task
    /// when it can be aborted.
    fn start_fetch(
        &mut self,
        unit_idx: usize,
        tx: mpsc::Sender<Feed>,
    ) -> Result<(u64, Option<tokio::task::JoinHandle<()>>)> {
        let unit = &self.prepared.units[unit_idx];
        let shard = &self.prepared.shards[unit.shard];
        let job = match self.prepared.job(unit) {
            UnitJob::Ready(task) => {
                queue_whole_unit(&tx, task);
                return Ok((0, None));
            }
            job => job,
        };
        let source = self.sources.get(unit.shard, shard)?;
        if source.is_remote() {
            self.tuning.reading_remote();
        }
        let known_size = shard.size;
        Ok(match job {
            UnitJob::Ready(_) => (0, None),
            UnitJob::Ranges { ranges, decode } if !source.is_remote() => {
                // Local reads are done by the decode task itself: for small files the
                // hand-offs through the I/O runtime cost more than the reads.
                let task = move |sink: &mut BatchSink| {
                    decode(
                        source::read_ranges_blocking(&*source, known_size, ranges)?,
                        sink,
                    )
                };
                queue_whole_unit(&tx, Box::new(task));
                (0, None)
            }
            UnitJob::Ranges { ranges, decode } => {
                let bytes = ranges.iter().map(|r| r.end - r.start).sum();
                let fetch = self.runtime.spawn(async move {
                    let fetched = fetch_ranges(source, known_size, ranges).await;
                    let feed = match fetched {
                        Ok(set) => {
                            Feed::Task(Box::new(move |sink: &mut BatchSink| decode(set, sink)))
                        }
                        Err(e) => Feed::Failed(e),
                    };
                    if tx.send(feed).await.is_ok() {
                        let _ = tx.send(Feed::Done).await;
                    }
                });
                (bytes, Some(fetch))
            }
            UnitJob::Stream(job) => {
                let cancel = self.cancel.clone();
                self.runtime.spawn_blocking(move || {
                    let run = || -> Result<()> {
                        let reader = source.open_stream()?;
                        job(reader, &mut |task| {
                            !cancel.load(Ordering::Relaxed)
                                && tx.blocking_send(Feed::Task(task)).is_ok()
                        })
                    };
                    let last = match catch_unwind(AssertUnwindSafe(run)) {
                        Ok(Ok(())) => Feed::Done,
                        Ok(Err(e)) => Feed::Failed(e),
                        Err(panic) => Feed::Failed(Error::Internal(format!(
                            "{}: reader panicked: {}",
                            source.url(),
                            panic_message(&*panic)
                        ))),
                    };
                    let _ = tx.blocking_send(last);
                });
                // A blocking reader cannot be aborted; it stops at its next task.
                (STREAM_UNIT_BYTES, None)
            }
        })
    }

    /// Counts a wait of the pipeline (since `start`) in `counter`; one that held up a
    /// waiting consumer deepens the queue it waited on (`deepen`).
    fn pipeline_waited(&self, start: Instant, counter: &AtomicU64, deepen: fn(&Tuning)) {
        let waited = start.elapsed();
        Stats::add_time(counter, waited);
        if waited > SHORT_WAIT && self.stats.consumer_waiting.load(Ordering::Relaxed) {
            deepen(&self.tuning);
        }
    }

    /// Moves decode tasks of the front units onto the pool, in order, until the decode
    /// depth is queued. Blocks for the next task only when nothing is pending.
    fn schedule(&mut self) -> Result<()> {
        self.open_units()?;
        while self.pending.len() < self.tuning.decode_tasks.get() {
            let Some(front) = self.open.front_mut() else {
                return Ok(());
            };
            let slice = front.slice;
            let feed = if self.pending.is_empty() {
                let start = Instant::now();
                let feed = recv_unless_stopped(self.runtime, &mut front.rx, &self.stopped);
                self.pipeline_waited(start, &self.stats.fetch_wait_ns, Tuning::fetch_was_short);
                match feed {
                    Some(feed) => feed,
                    None => return Ok(()),
                }
            } else {
                match front.rx.try_recv() {
                    Ok(feed) => Some(feed),
                    Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            match feed {
                Some(Feed::Task(task)) => self.spawn_decode(slice, task),
                Some(Feed::Failed(error)) => {
                    self.close_front();
                    self.pending.push_back(Pending::Failed { slice, error });
                    self.open_units()?;
                }
                Some(Feed::Done) => {
                    self.close_front();
                    self.pending
                        .push_back(Pending::UnitDone { slice: Some(slice) });
                    self.open_units()?;
                }
                None => {
                    self.close_front();
                    let url = self.slice_url(slice).to_string();
                    self.pending.push_back(Pending::Failed {
                        slice,
                        error: Error::Internal(format!(
                            "{url}: the reader stopped without finishing"
                        )),
                    });
                    self.open_units()?;
                }
            }
        }
        Ok(())
    }

    fn spawn_decode(&mut self, slice: usize, task: DecodeTask) {
        // Unbounded, so that a task never waits for the consumer while it holds a decode
        // thread that an earlier unit's task needs; it holds what `Decoded` held before.
        let (tx, rx) = std_mpsc::channel();
        let (stats, cancel) = (self.stats.clone(), self.cancel.clone());
        let url = self.slice_url(slice).to_string();
        let format = self.prepared.format;
        self.pool.spawn(move || {
            if cancel.load(Ordering::Relaxed) {
                return;
            }
            let start = Instant::now();
            // Decoders (ours and the parquet crate's) can trip assertions on corrupt
            // bytes; that is a fault in this unit's data, reported against its file.
            let mut sink = |batch| {
                let _ = tx.send(Decoding::Batch(batch));
            };
            let result =
                catch_unwind(AssertUnwindSafe(|| task(&mut sink))).unwrap_or_else(|panic| {
                    Err(Error::decode(
                        url,
                        format,
                        Position::Unknown,
                        format!("the decoder failed: {}", panic_message(&*panic)),
                    ))
                });
            Stats::add_time(&stats.decode_ns, start.elapsed());
            let _ = tx.send(Decoding::End(result));
        });
        self.pending.push_back(Pending::Task {
            slice,
            rx,
            held: Vec::new(),
        });
    }

    fn slice_url(&self, slice: usize) -> &str {
        let unit = self.slices[slice].slice.unit;
        &self.prepared.shards[self.prepared.units[unit].shard].url
    }

    /// Handles a unit-level failure: skipped and counted, or returned.
    fn unit_failed(&mut self, error: Error) -> Option<Error> {
        if self.on_error == OnError::Skip && error.is_data_error() {
            self.stats.skipped_units.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(error)
    }

    fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            if let Some(batch) = self.ready.pop_front() {
                return Some(Ok(batch));
            }
            if self.cancel.load(Ordering::Relaxed) || self.stopped.load(Ordering::Relaxed) {
                return None;
            }
            if let Err(e) = self.schedule() {
                return Some(Err(e));
            }
            match self.pending.pop_front()? {
                Pending::UnitDone { slice } => {
                    self.stats.units.fetch_add(1, Ordering::Relaxed);
                    if let Some(error) = slice.and_then(|s| self.rows_differ(s)) {
                        return Some(Err(error));
                    }
                }
                Pending::Failed { error, .. } => {
                    if let Some(error) = self.unit_failed(error) {
                        return Some(Err(error));
                    }
                }
                Pending::Task {
                    slice,
                    rx,
                    mut held,
                } => match self.decoded(&rx) {
                    Ok(Decoding::Batch(batch)) => {
                        if self.on_error == OnError::Skip {
                            held.push(batch);
                        } else if let Err(e) = self.release(slice, batch) {
                            return Some(Err(e));
                        }
                        self.pending.push_front(Pending::Task { slice, rx, held });
                    }
                    Ok(Decoding::End(Ok(decoded))) => {
                        self.stats
                            .skipped_records
                            .fetch_add(decoded.skipped, Ordering::Relaxed);
                        for batch in held.into_iter().chain(decoded.batches) {
                            if let Err(e) = self.release(slice, batch) {
                                return Some(Err(e));
                            }
                        }
                    }
                    Ok(Decoding::End(Err(error))) => {
                        if let Some(error) = self.unit_failed(error) {
                            return Some(Err(error));
                        }
                        self.discard_slice(slice);
                    }
                    Err(_) => {
                        return Some(Err(Error::Internal(format!(
                            "{}: a decode task vanished",
                            self.slice_url(slice)
                        ))));
                    }
                },
            }
        }
    }

    /// The next message of a decode task, counting the time spent waiting for it.
    fn decoded(
        &mut self,
        rx: &std_mpsc::Receiver<Decoding>,
    ) -> Result<Decoding, std_mpsc::RecvError> {
        if let Ok(message) = rx.try_recv() {
            return Ok(message);
        }
        let start = Instant::now();
        let message = rx.recv();
        self.pipeline_waited(start, &self.stats.decode_wait_ns, Tuning::decode_was_short);
        message
    }

    /// A unit whose rows were known beforehand (from the file's metadata or a manifest)
    /// must decode to that many: ranks' shares and `len()` were planned with them. Under
    /// `on_error="skip"` skipped records make it fewer, and are counted instead.
    fn rows_differ(&self, slice: usize) -> Option<Error> {
        let state = &self.slices[slice];
        let expected = self.prepared.units[state.slice.unit].rows?;
        (self.on_error == OnError::Raise && state.seen != expected).then(|| {
            Error::decode(
                self.slice_url(slice),
                self.prepared.format,
                Position::Unknown,
                format!(
                    "{} rows where its metadata or manifest promised {expected}",
                    state.seen
                ),
            )
        })
    }

    /// Clips a decoded batch to its slice's rows and queues what is left for the consumer.
    fn release(&mut self, slice: usize, batch: RecordBatch) -> Result<()> {
        let batch = self.slices[slice].clip(batch)?;
        self.ready.extend(batch);
        Ok(())
    }

    /// After a skipped decode failure, drops the rest of that unit: a unit is skipped
    /// from its first bad task on, and counted once.
    fn discard_slice(&mut self, slice: usize) {
        self.pending.retain(|p| match p {
            Pending::Task { slice: s, .. } | Pending::Failed { slice: s, .. } => *s != slice,
            Pending::UnitDone { .. } => true,
        });
        if let Some(open) = self
            .open
            .iter()
            .position(|o| o.slice == slice)
            .and_then(|pos| self.open.remove(pos))
        {
            self.open_bytes -= open.bytes;
            self.pending.push_back(Pending::UnitDone { slice: None });
        }
    }
}

impl Iterator for UnitDecoder {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let item = self.next_batch();
        if !matches!(item, Some(Ok(_))) {
            self.finished = true;
        }
        item
    }
}

impl Drop for UnitDecoder {
    fn drop(&mut self) {
        // Queued decode tasks see this and return at once; fetchers stop when their
        // channels close with `self.open`.
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// The next feed of a unit, waiting on the I/O runtime; `None` once `stopped` is set
/// (checked every [`CANCEL_POLL`]), so that a consumer that left is not kept waiting on
/// a slow request.
fn recv_unless_stopped(
    runtime: &tokio::runtime::Runtime,
    rx: &mut mpsc::Receiver<Feed>,
    stopped: &AtomicBool,
) -> Option<Option<Feed>> {
    loop {
        // The timer is made inside `block_on`: it needs the runtime's context.
        let feed = runtime.block_on(async { tokio::time::timeout(CANCEL_POLL, rx.recv()).await });
        if let Ok(feed) = feed {
            return Some(feed);
        }
        if stopped.load(Ordering::Relaxed) {
            return None;
        }
    }
}

/// Feeds a unit that is one task with nothing to fetch first. The unit's channel holds
/// two: the task and the end of the unit.
fn queue_whole_unit(tx: &mpsc::Sender<Feed>, task: DecodeTask) {
    let _ = tx.try_send(Feed::Task(task));
    let _ = tx.try_send(Feed::Done);
}

/// Aborts the tasks when dropped: the range reads of a unit whose fetch was aborted.
struct AbortOnDrop<T>(Vec<tokio::task::JoinHandle<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

async fn fetch_ranges(
    source: Arc<dyn Source>,
    known_size: Option<u64>,
    ranges: Vec<std::ops::Range<u64>>,
) -> Result<RangeSet> {
    let size = match known_size {
        Some(size) => size,
        None => source.size().await?,
    };
    let mut reads = AbortOnDrop(
        ranges
            .iter()
            .map(|range| {
                let (source, range) = (source.clone(), range.clone());
                tokio::spawn(async move { source.read_range(range).await })
            })
            .collect(),
    );
    let mut set = RangeSet::new(size);
    for (range, read) in ranges.iter().zip(reads.0.iter_mut()) {
        let bytes = read
            .await
            .map_err(|e| Error::Internal(format!("{}: read task failed: {e}", source.url())))??;
        set.insert(range.start, bytes);
    }
    Ok(set)
}
