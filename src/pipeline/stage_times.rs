//! Counters of how busy each op was and how full the consumer's queue was, kept in the
//! loader's `Stats` for the input-bound report (`report`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::latency::Histogram;

/// The time one op (`map`, `filter`, `tokenize`, `pack`, ...) spent on its batches.
#[derive(Debug, Default)]
pub struct OpTimes {
    /// What the op is (`describe()`), and whether it runs on the batch threads (else on
    /// the pipeline thread, one batch at a time).
    pub name: String,
    pub on_threads: bool,
    pub rows_in: AtomicU64,
    pub rows_out: AtomicU64,
    /// Wall time of each call, on the thread that ran it.
    pub calls: Histogram,
}

impl OpTimes {
    pub fn record(&self, rows_in: usize, rows_out: usize, elapsed: Duration) {
        self.rows_in.fetch_add(rows_in as u64, Relaxed);
        self.rows_out.fetch_add(rows_out as u64, Relaxed);
        self.calls.record(elapsed);
    }
}

/// How full a queue between two stages was, over time: its depth integrated over time,
/// the time it spent empty and at its capacity, and the most bytes it held.
#[derive(Debug, Default)]
pub struct QueueTimes {
    depth_ns: AtomicU64,
    empty_ns: AtomicU64,
    full_ns: AtomicU64,
    capacity: AtomicU64,
    peak_bytes: AtomicU64,
    /// The depth since the last change, and when it changed (under the queue's lock).
    last: Mutex<Option<(usize, Instant)>>,
}

impl QueueTimes {
    /// The queue now holds `depth` items of at most `capacity`, and `bytes`.
    pub fn changed(&self, depth: usize, capacity: usize, bytes: u64) {
        self.peak_bytes.fetch_max(bytes, Relaxed);
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((was, since)) = *last {
            let ns = now.duration_since(since).as_nanos().min(u64::MAX as u128) as u64;
            self.depth_ns
                .fetch_add(ns.saturating_mul(was as u64), Relaxed);
            if was == 0 {
                self.empty_ns.fetch_add(ns, Relaxed);
            } else if was >= self.capacity.load(Relaxed) as usize {
                self.full_ns.fetch_add(ns, Relaxed);
            }
        }
        self.capacity.store(capacity as u64, Relaxed);
        *last = Some((depth, now));
    }

    pub fn snapshot(&self) -> QueueSnapshot {
        // What the depth since the last change has added so far.
        self.changed_to_now();
        QueueSnapshot {
            depth_ns: self.depth_ns.load(Relaxed),
            empty_ns: self.empty_ns.load(Relaxed),
            full_ns: self.full_ns.load(Relaxed),
            capacity: self.capacity.load(Relaxed),
            peak_bytes: self.peak_bytes.load(Relaxed),
        }
    }

    fn changed_to_now(&self) {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((depth, _)) = last {
            self.changed(depth, self.capacity.load(Relaxed) as usize, 0);
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueSnapshot {
    pub depth_ns: u64,
    pub empty_ns: u64,
    pub full_ns: u64,
    pub capacity: u64,
    /// The most bytes held at once in the loader's life so far (a level, not a count).
    pub peak_bytes: u64,
}
