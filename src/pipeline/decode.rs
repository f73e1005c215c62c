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
use super::pool::JoinedPool;
use super::stats::Stats;
use crate::error::{Error, Position, Result, panic_message};
use crate::format::{BatchSink, DecodeTask, Decoded, OnError, PreparedShards, UnitJob};
use crate::source::ranges::RangeSet;
use crate::source::{self, Io, ShardMeta, Source};

/// What a unit's fetcher sends, in order.
enum Feed {
    Task(DecodeTask),
    /// The unit's one task (its rows are all decoded by it), then `Done`.
    Whole(DecodeTask),
    Failed(Error),
    /// Sent last; a feed that closes without it lost its fetcher to a panic.
    Done,
}

/// What a decode task sends: its batches as it makes them (see `BatchSink`), then its end,
/// with its slice's state when the task cut its own batches (see `Cutter`).
enum Decoding {
    Batch(RecordBatch),
    End(Result<Decoded>, Option<SliceState>),
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
        /// The task clips, numbers and cuts its batches itself (see `Cutter`).
        cut: bool,
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
#[derive(Debug, Clone, Copy)]
struct SliceState {
    slice: UnitSlice,
    seen: u64,
    /// Rows handed out so far.
    kept: u64,
    /// Rows of the decoder's stream before this slice's, when every earlier slice's rows
    /// are known: where the slice stands against the batch grid (see `Cutter`).
    after: Option<u64>,
}

impl SliceState {
    /// A task's decoded rows (`batches`, in order) clipped to the slice, where the task
    /// skipped the records at `skipped` (places among its records, ascending): a slice
    /// counts records, not the rows that came of them, so the rows after a skipped
    /// record keep their places (and positions), and the part whose share it was is the
    /// one short of a row. Also gives the skipped records within the slice, to count.
    fn clip_skipping(
        &mut self,
        batches: Vec<RecordBatch>,
        skipped: &[u64],
    ) -> Result<(Vec<RecordBatch>, u64)> {
        let decoded: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        let start = self.seen;
        let records = decoded + skipped.len() as u64;
        self.seen += records;
        // The slice's records within this task, as places in it.
        let end = self.slice.take.map_or(u64::MAX, |t| self.slice.skip + t);
        let lo = self.slice.skip.clamp(start, start + records) - start;
        let hi = end.clamp(start, start + records) - start;
        let hi = hi.max(lo);
        let below = |place: u64| skipped.partition_point(|&s| s < place) as u64;
        // Decoded rows [a, b) are the slice's.
        let (a, b) = (lo - below(lo), hi - below(hi));
        let mut places = Vec::with_capacity((b - a) as usize);
        let mut k = 0;
        for row in a..b {
            while k < skipped.len() && skipped[k] <= row + k as u64 {
                k += 1;
            }
            places.push(start + row + k as u64);
        }
        let mut out = Vec::new();
        let mut at = 0u64;
        for batch in batches {
            let n = batch.num_rows() as u64;
            let (from, to) = (a.max(at), b.min(at + n));
            if from < to {
                let piece = batch.slice((from - at) as usize, (to - from) as usize);
                out.push(match self.slice.position {
                    Some(first) => {
                        let positions = places[(from - a) as usize..(to - a) as usize]
                            .iter()
                            .map(|&place| first + place - self.slice.skip)
                            .collect();
                        super::rows::attach(piece, positions)?
                    }
                    None => piece,
                });
            }
            at += n;
        }
        self.kept += b - a;
        Ok((out, below(hi) - below(lo)))
    }

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

/// Cuts a slice's batches at the loader's batch boundaries, on the decode thread that
/// made them, after clipping them to the slice and numbering their rows as the pipeline
/// thread would. Re-batching then hands each whole batch on as it is, where it sliced
/// one out of every decoded batch on the pipeline thread (the serial path): a column
/// list and an array per column allocated there, per batch, for the consumer's thread to
/// free. Only a unit's single task knows where its first row stands; a unit decoded in
/// several tasks is cut by re-batching as before.
struct Cutter {
    state: SliceState,
    /// Rows of the stream before the slice's.
    after: u64,
    batch_rows: u64,
}

impl Cutter {
    fn cut(&mut self, batch: RecordBatch, out: &mut impl FnMut(RecordBatch)) -> Result<()> {
        let Some(batch) = self.state.clip(batch)? else {
            return Ok(());
        };
        let rows = batch.num_rows() as u64;
        let first = self.after + self.state.kept - rows;
        let mut at = 0;
        while at < rows {
            let len = (self.batch_rows - (first + at) % self.batch_rows).min(rows - at);
            if len == rows {
                out(batch);
                return Ok(());
            }
            out(batch.slice(at as usize, len as usize));
            at += len;
        }
        Ok(())
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
    pool: JoinedPool,
    runtime: &'static tokio::runtime::Runtime,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    /// The run's flag: set when the consumer is gone.
    stopped: Arc<AtomicBool>,
    on_error: OnError,
    tuning: Arc<Tuning>,
    /// Bytes the open units will fetch, bounded by the tuning's read-ahead bytes.
    open_bytes: u64,
    /// The rows of the loader's batches, when this decoder's batches go straight to its
    /// re-batching: decode tasks cut their batches at its boundaries (see `Cutter`).
    batch_rows: Option<usize>,
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
        let pool = JoinedPool::new(tuning.threads, "shardflow-decode")?;
        let slices: Vec<SliceState> = slices
            .into_iter()
            .scan(Some(0), |after, slice| {
                let state = SliceState {
                    slice,
                    seen: 0,
                    kept: 0,
                    after: *after,
                };
                let rows = prepared.units[slice.unit].rows;
                *after = after
                    .zip(slice.take.or(rows.map(|r| r.saturating_sub(slice.skip))))
                    .map(|(a, r)| a + r);
                Some(state)
            })
            .collect();
        Ok(Self {
            prepared,
            order: (0..slices.len()).collect(),
            slices,
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
            batch_rows: None,
            finished: false,
        })
    }

    /// Has decode tasks cut their batches at the boundaries of batches of `batch_rows`,
    /// when the decoder's batches go straight to a re-batching to that size.
    pub fn cutting_at(mut self, batch_rows: Option<usize>) -> Self {
        self.batch_rows = batch_rows;
        self
    }

    /// The units read ahead changed: counted for the report, and drawn on the timeline
    /// if one is kept.
    fn trace_read_ahead(&self) {
        self.stats.read_ahead.changed(
            self.open.len(),
            self.tuning.read_ahead_units(),
            self.open_bytes,
        );
        if let Some(trace) = self.stats.trace() {
            trace.counter("bytes read ahead", self.open_bytes as f64);
        }
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
            self.trace_read_ahead();
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
            self.trace_read_ahead();
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
                            Feed::Whole(Box::new(move |sink: &mut BatchSink| decode(set, sink)))
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
                Some(Feed::Task(task)) => self.spawn_decode(slice, task, false),
                Some(Feed::Whole(task)) => self.spawn_decode(slice, task, true),
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

    /// Runs `task`, a task of `slice`; `whole` when it is the unit's only task.
    fn spawn_decode(&mut self, slice: usize, task: DecodeTask, whole: bool) {
        // Unbounded, so that a task never waits for the consumer while it holds a decode
        // thread that an earlier unit's task needs; it holds what `Decoded` held before.
        let (tx, rx) = std_mpsc::channel();
        let (stats, cancel) = (self.stats.clone(), self.cancel.clone());
        let url = self.slice_url(slice).to_string();
        let format = self.prepared.format;
        let state = self.slices[slice];
        // (A task that may skip records is clipped once it ends: see `clip_skipping`.)
        let mut cutter = match (whole, self.batch_rows, state.after) {
            (true, Some(batch_rows), Some(after)) if self.on_error != OnError::Skip => {
                Some(Cutter {
                    state,
                    after,
                    batch_rows: batch_rows as u64,
                })
            }
            _ => None,
        };
        let cut = cutter.is_some();
        self.pool.spawn(move || {
            if cancel.load(Ordering::Relaxed) {
                return;
            }
            // The span opens before the clock starts and closes after it stops, so the
            // timeline's decode spans cover the decode time counted (and that time does
            // not count the timeline's own bookkeeping).
            let span = stats.trace().map(|t| t.span("decode", "decode"));
            let start = Instant::now();
            let mut send = |batch| {
                let _ = tx.send(Decoding::Batch(batch));
            };
            let mut cut_failed = None;
            let mut sink = |batch| match &mut cutter {
                None => send(batch),
                Some(cutter) if cut_failed.is_none() => {
                    cut_failed = cutter.cut(batch, &mut send).err();
                }
                Some(_) => {}
            };
            // Decoders (ours and the parquet crate's) can trip assertions on corrupt
            // bytes; that is a fault in this unit's data, reported against its file.
            let result =
                catch_unwind(AssertUnwindSafe(|| task(&mut sink))).unwrap_or_else(|panic| {
                    Err(Error::decode(
                        url,
                        format,
                        Position::Unknown,
                        format!("the decoder failed: {}", panic_message(&*panic)),
                    ))
                });
            let result = match cut_failed {
                Some(error) => Err(error),
                None => result.and_then(|mut decoded| {
                    if let Some(cutter) = &mut cutter {
                        let mut pieces = Vec::with_capacity(decoded.batches.len());
                        for batch in std::mem::take(&mut decoded.batches) {
                            cutter.cut(batch, &mut |piece| pieces.push(piece))?;
                        }
                        decoded.batches = pieces;
                    }
                    Ok(decoded)
                }),
            };
            let elapsed = start.elapsed();
            drop(span);
            Stats::add_time(&stats.decode_ns, elapsed);
            stats.decode_times.record(elapsed);
            let _ = tx.send(Decoding::End(result, cutter.map(|c| c.state)));
        });
        self.pending.push_back(Pending::Task {
            slice,
            rx,
            held: Vec::new(),
            cut,
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
                    cut,
                } => match self.decoded(&rx) {
                    Ok(Decoding::Batch(batch)) => {
                        if self.on_error == OnError::Skip {
                            held.push(batch);
                        } else if let Err(e) = self.release(slice, batch, cut) {
                            return Some(Err(e));
                        }
                        self.pending.push_front(Pending::Task {
                            slice,
                            rx,
                            held,
                            cut,
                        });
                    }
                    Ok(Decoding::End(Ok(decoded), state)) => {
                        if let Some(state) = state {
                            self.slices[slice] = state;
                        }
                        let batches = held.into_iter().chain(decoded.batches);
                        if decoded.skipped.is_empty() {
                            for batch in batches {
                                if let Err(e) = self.release(slice, batch, cut) {
                                    return Some(Err(e));
                                }
                            }
                        } else {
                            match self.slices[slice]
                                .clip_skipping(batches.collect(), &decoded.skipped)
                            {
                                Ok((kept, skipped)) => {
                                    self.stats
                                        .skipped_records
                                        .fetch_add(skipped, Ordering::Relaxed);
                                    self.ready.extend(kept);
                                }
                                Err(e) => return Some(Err(e)),
                            }
                        }
                    }
                    Ok(Decoding::End(Err(error), _)) => {
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

    /// Clips a decoded batch to its slice's rows and queues what is left for the consumer
    /// (a task that `cut` its batches clipped them itself).
    fn release(&mut self, slice: usize, batch: RecordBatch, cut: bool) -> Result<()> {
        if cut {
            self.ready.push_back(batch);
            return Ok(());
        }
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
            self.trace_read_ahead();
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
    let _ = tx.try_send(Feed::Whole(task));
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt64Type};
    use arrow_array::{ArrayRef, Int64Array};

    fn ids(rows: std::ops::Range<i64>) -> RecordBatch {
        let column = Arc::new(Int64Array::from_iter_values(rows)) as ArrayRef;
        RecordBatch::try_from_iter([("id", column)]).unwrap()
    }

    #[test]
    fn cut_batches_end_at_the_batch_boundaries_with_the_slices_rows_and_positions() {
        // Rows 5..95 of a unit of 100, numbered from 1000, after 37 rows of the stream,
        // for batches of 16; decoded as batches of 40, 40 and 20 rows.
        let slice = UnitSlice {
            unit: 0,
            skip: 5,
            take: Some(90),
            position: Some(1000),
        };
        let state = SliceState {
            slice,
            seen: 0,
            kept: 0,
            after: Some(37),
        };
        let mut cutter = Cutter {
            state,
            after: 37,
            batch_rows: 16,
        };
        let mut pieces = Vec::new();
        for rows in [0..40, 40..80, 80..100] {
            cutter.cut(ids(rows), &mut |p| pieces.push(p)).unwrap();
        }
        // Stream rows 37..127: cut at 48, 64, 80, 96 and 112, and where the decoded
        // batches end (72, 112).
        let sizes: Vec<usize> = pieces.iter().map(|p| p.num_rows()).collect();
        assert_eq!(sizes, [11, 16, 8, 8, 16, 16, 15]);
        let kept: Vec<i64> = pieces
            .iter()
            .flat_map(|p| p.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(kept, (5..95).collect::<Vec<_>>());
        let positions: Vec<u64> = pieces
            .iter()
            .flat_map(|p| p.column(1).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(positions, (1000..1090).collect::<Vec<_>>());
        assert_eq!((cutter.state.seen, cutter.state.kept), (100, 90));
    }
}
