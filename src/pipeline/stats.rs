//! Counters a loader keeps across its epochs, read by `stats()`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::source::IoCounters;

#[derive(Debug, Default)]
pub struct Stats {
    pub io: Arc<IoCounters>,
    /// Rows and batches handed to the consumer.
    pub rows: AtomicU64,
    pub batches: AtomicU64,
    /// Work units (row groups, files) fully decoded.
    pub units: AtomicU64,
    /// Time the consumer spent blocked waiting for the next batch, and how many times
    /// it found none ready.
    pub wait_ns: AtomicU64,
    pub consumer_waits: AtomicU64,
    /// Whether the consumer is waiting for a batch now (the first of an epoch too).
    pub consumer_waiting: std::sync::atomic::AtomicBool,
    /// The most bytes of units fetched ahead at once (a unit's share of the read-ahead
    /// budget is what it will fetch).
    pub read_ahead_peak_bytes: AtomicU64,
    /// Time the pipeline spent waiting for a unit's bytes, and for a decode task.
    pub fetch_wait_ns: AtomicU64,
    pub decode_wait_ns: AtomicU64,
    /// CPU time spent in decode tasks, summed over threads.
    pub decode_ns: AtomicU64,
    /// CPU time spent joining parts into batches, on threads of their own (summed).
    pub assemble_ns: AtomicU64,
    /// CPU time of the pipeline thread (ordering, rebatching, shuffling, the ops run
    /// there, random-access gathers) and of the consumer inside `next()` (waiting
    /// excluded: it costs no CPU): the serial path, which more decode threads do not
    /// shorten.
    pub pipeline_cpu_ns: AtomicU64,
    pub consumer_cpu_ns: AtomicU64,
    /// CPU time of the shuffle buffers' threads (their draws, and the ordering and ops
    /// before them), beside the pipeline thread: serial too, but not on the same thread.
    pub shuffle_cpu_ns: AtomicU64,
    /// Records skipped under `on_error="skip"`.
    pub skipped_records: AtomicU64,
    /// Whole units or files skipped under `on_error="skip"`.
    pub skipped_units: AtomicU64,
    /// Rows read a second time so that every part gets as many rows (`pad`).
    pub padded_rows: AtomicU64,
    /// Rows the shuffle buffer held when its byte bound stopped it filling (the fewest
    /// seen; 0 while the row bound governs): the buffer size the shuffle really had.
    pub shuffle_buffer_rows: AtomicU64,
    /// Whether the user has been told that the byte bound shrank the buffer.
    pub shuffle_bound_reported: std::sync::atomic::AtomicBool,
    /// How the last stream of rows read by index (a full shuffle, `select`) read them: a
    /// [`ReadPlan`] as its number (0: none yet).
    pub read_plan: std::sync::atomic::AtomicU8,
    /// Bytes of rows written to spill files (see `spill`).
    pub spilled_bytes: AtomicU64,
    /// Things the user should hear of, once each (as Python warnings), not yet told.
    notices: std::sync::Mutex<Vec<String>>,
    /// The wall time of each decode task (a unit, or a part of one), for the report.
    pub decode_times: crate::latency::Histogram,
    /// Each op's time on its batches, registered as the pipeline is built.
    pub(super) ops: std::sync::Mutex<Vec<Arc<super::stage_times::OpTimes>>>,
    /// How full the queue of batches waiting for the consumer was.
    pub queue: super::stage_times::QueueTimes,
    /// How full the read-ahead was: units being fetched before their decode.
    pub read_ahead: super::stage_times::QueueTimes,
    /// The loader's timeline, when it keeps one (`DataLoader(trace=...)`).
    pub trace: std::sync::OnceLock<Arc<crate::trace::Trace>>,
}

/// A consistent-enough copy of the counters for reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Rows delivered.
    pub rows: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Work units (files, row groups) read to their end.
    pub units: u64,
    /// Bytes read from files and objects.
    pub bytes_read: u64,
    /// Files and objects opened.
    pub files_opened: u64,
    /// Nanoseconds the consumer waited for a batch.
    pub wait_ns: u64,
    /// Times the consumer found no batch ready.
    pub consumer_waits: u64,
    /// The most bytes fetched ahead of decoding at once.
    pub read_ahead_peak_bytes: u64,
    /// Nanoseconds the pipeline waited for bytes.
    pub fetch_wait_ns: u64,
    /// Nanoseconds the pipeline waited for a decode to finish.
    pub decode_wait_ns: u64,
    /// Nanoseconds of decoding, summed over threads.
    pub decode_ns: u64,
    /// CPU nanoseconds of joining parts into batches, summed over threads.
    pub assemble_ns: u64,
    /// CPU nanoseconds of the pipeline thread.
    pub pipeline_cpu_ns: u64,
    /// CPU nanoseconds the consumer spent getting batches (converting them included).
    pub consumer_cpu_ns: u64,
    /// CPU nanoseconds of the shuffle buffers' threads.
    pub shuffle_cpu_ns: u64,
    /// Corrupt records skipped (`on_error="skip"`).
    pub skipped_records: u64,
    /// Corrupt files or units skipped whole.
    pub skipped_units: u64,
    /// Rows repeated to give every rank as many rows.
    pub padded_rows: u64,
    /// Remote requests sent, retries included.
    pub requests: u64,
    /// Remote requests retried.
    pub retries: u64,
    /// Bytes received from remote stores.
    pub bytes_fetched: u64,
    /// Ranges served from the disk cache.
    pub cache_hits: u64,
    /// Ranges the disk cache did not hold.
    pub cache_misses: u64,
    /// Rows the shuffle buffer held when its byte bound stopped it (0: never).
    pub shuffle_buffer_rows: u64,
    /// How the last stream of rows read by index read them (None: there was none).
    pub read_plan: Option<ReadPlan>,
    /// Bytes of rows spilled to local disk by the external shuffle.
    pub spilled_bytes: u64,
}

/// How a stream of rows read by index (a full-permutation shuffle, `select`) reads them,
/// chosen per epoch by what the data and the memory budget allow. The rows, and their
/// order, are the same whichever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReadPlan {
    /// Each row read where it lies (uncompressed Parquet values, a record by range, a
    /// page), or taken from units small enough to be decoded for each gather.
    InPlace = 1,
    /// The units decoded once and kept in memory: the data fits the budget.
    InMemory = 2,
    /// Units decoded whole at each visit, each visit taking the rows of the gathers
    /// ahead too (spilling is off or failed).
    ReadAhead = 3,
    /// The external two-pass shuffle: units read once in order, rows spilled to bucket
    /// files on local disk, read back a bucket at a time.
    Spill = 4,
    /// Units decoded whole at each gather that touches them, the cache sparing some
    /// (spilling is off or failed, and the data is not far past the cache).
    Gather = 5,
}

impl ReadPlan {
    /// The name `stats()` gives.
    pub fn name(self) -> &'static str {
        match self {
            ReadPlan::InPlace => "in_place",
            ReadPlan::InMemory => "in_memory",
            ReadPlan::ReadAhead => "read_ahead",
            ReadPlan::Spill => "spill",
            ReadPlan::Gather => "gather",
        }
    }

    fn from_number(n: u8) -> Option<Self> {
        [
            Self::InPlace,
            Self::InMemory,
            Self::ReadAhead,
            Self::Spill,
            Self::Gather,
        ]
        .into_iter()
        .find(|plan| *plan as u8 == n)
    }
}

impl Stats {
    /// Adds the CPU time the calling thread spent since `since` (a [`thread_cpu_ns`]
    /// reading) to `counter`, and returns the new reading.
    pub fn add_thread_cpu(counter: &AtomicU64, since: u64) -> u64 {
        let now = thread_cpu_ns();
        counter.fetch_add(now.saturating_sub(since), Relaxed);
        now
    }

    pub fn add_time(counter: &AtomicU64, elapsed: Duration) {
        counter.fetch_add(elapsed.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// The shuffle buffer's byte bound stopped it at `rows` rows.
    pub fn shuffle_bounded_by_bytes(&self, rows: u64) {
        let rows = rows.max(1);
        let _ = self
            .shuffle_buffer_rows
            .fetch_update(Relaxed, Relaxed, |seen| {
                (seen == 0 || rows < seen).then_some(rows)
            });
    }

    /// The buffer's size in rows the first time it is asked for after the byte bound
    /// shrank it; None before that and ever after.
    pub fn take_shuffle_bound_report(&self) -> Option<u64> {
        let rows = self.shuffle_buffer_rows.load(Relaxed);
        if rows == 0 || self.shuffle_bound_reported.swap(true, Relaxed) {
            return None;
        }
        Some(rows)
    }

    /// Tells the user `message` (as a warning, on the consumer's next batch).
    pub fn notice(&self, message: String) {
        self.notices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message);
    }

    /// What the user has not been told yet.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The loader's timeline, if it keeps one.
    pub fn trace(&self) -> Option<&Arc<crate::trace::Trace>> {
        self.trace.get()
    }

    /// A stream of rows read by index reads them by `plan`.
    pub fn read_by(&self, plan: ReadPlan) {
        self.read_plan.store(plan as u8, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            rows: self.rows.load(Relaxed),
            batches: self.batches.load(Relaxed),
            units: self.units.load(Relaxed),
            bytes_read: self.io.bytes_read.load(Relaxed),
            files_opened: self.io.files_opened.load(Relaxed),
            wait_ns: self.wait_ns.load(Relaxed),
            consumer_waits: self.consumer_waits.load(Relaxed),
            read_ahead_peak_bytes: self.read_ahead_peak_bytes.load(Relaxed),
            fetch_wait_ns: self.fetch_wait_ns.load(Relaxed),
            decode_wait_ns: self.decode_wait_ns.load(Relaxed),
            decode_ns: self.decode_ns.load(Relaxed),
            assemble_ns: self.assemble_ns.load(Relaxed),
            pipeline_cpu_ns: self.pipeline_cpu_ns.load(Relaxed),
            consumer_cpu_ns: self.consumer_cpu_ns.load(Relaxed),
            shuffle_cpu_ns: self.shuffle_cpu_ns.load(Relaxed),
            skipped_records: self.skipped_records.load(Relaxed),
            skipped_units: self.skipped_units.load(Relaxed),
            padded_rows: self.padded_rows.load(Relaxed),
            requests: self.io.requests.load(Relaxed),
            retries: self.io.retries.load(Relaxed),
            bytes_fetched: self.io.bytes_fetched.load(Relaxed),
            cache_hits: self.io.cache_hits.load(Relaxed),
            cache_misses: self.io.cache_misses.load(Relaxed),
            shuffle_buffer_rows: self.shuffle_buffer_rows.load(Relaxed),
            read_plan: ReadPlan::from_number(self.read_plan.load(Relaxed)),
            spilled_bytes: self.spilled_bytes.load(Relaxed),
        }
    }
}

/// A thread's CPU time, added to a counter every few batches rather than at each: a
/// reading of the thread's clock is a system call (about 0.4 µs), and on the serial
/// threads, a few percent of their work per batch. What is not added yet is added when
/// the meter is dropped, so the count is exact once the thread's stream ends (or, for a
/// running stream, behind by at most a few batches).
pub struct CpuMeter<'a> {
    counter: &'a AtomicU64,
    since: u64,
    ticks: u32,
}

impl<'a> CpuMeter<'a> {
    const READ_EVERY: u32 = 8;

    /// Counts the calling thread's CPU from now on into `counter`; the meter must be
    /// dropped on the same thread.
    pub fn start(counter: &'a AtomicU64) -> Self {
        Self {
            counter,
            since: thread_cpu_ns(),
            ticks: 0,
        }
    }

    /// One batch more.
    pub fn tick(&mut self) {
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(Self::READ_EVERY) {
            self.since = Stats::add_thread_cpu(self.counter, self.since);
        }
    }
}

impl Drop for CpuMeter<'_> {
    fn drop(&mut self) {
        Stats::add_thread_cpu(self.counter, self.since);
    }
}

/// What one read of the thread's CPU clock adds to a reading taken around work: the
/// least of a few back-to-back pairs, read once per process.
pub fn clock_read_ns() -> u64 {
    static COST: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *COST.get_or_init(|| {
        (0..16)
            .map(|_| {
                let before = thread_cpu_ns();
                thread_cpu_ns().saturating_sub(before)
            })
            .min()
            .unwrap_or(0)
    })
}

/// CPU time the calling thread has used, in nanoseconds (0 where the clock is missing).
pub fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return 0;
    }
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}
