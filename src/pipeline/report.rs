//! What the input-bound report is made of: the time each stage spent busy, per item and
//! in total, how full the consumer's queue was, and the I/O's latencies, read as a
//! whole at one moment so that two readings give what happened between them.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::stage_times::{OpTimes, QueueSnapshot};
use super::stats::{Stats, StatsSnapshot};
use crate::latency::HistogramSnapshot;
use crate::source::SchemeSnapshot;

/// One op's counters at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSnapshot {
    pub name: String,
    pub on_threads: bool,
    pub rows_in: u64,
    pub rows_out: u64,
    pub calls: HistogramSnapshot,
}

/// Everything the report reads, at one moment.
#[derive(Debug, Clone)]
pub struct ReportCounters {
    pub at: Instant,
    pub stats: StatsSnapshot,
    pub decode: HistogramSnapshot,
    pub ops: Vec<OpSnapshot>,
    /// The queues between stages: the units read ahead, the batches ready.
    pub queues: Vec<(&'static str, QueueSnapshot)>,
    pub io: Vec<(String, SchemeSnapshot)>,
    pub throttled: u64,
}

impl Stats {
    /// The counters of the op `name` (shared by every epoch's run of it).
    pub fn op_times(&self, name: String, on_threads: bool) -> Arc<OpTimes> {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(op) = ops
            .iter()
            .find(|op| op.name == name && op.on_threads == on_threads)
        {
            return op.clone();
        }
        let op = Arc::new(OpTimes {
            name,
            on_threads,
            ..Default::default()
        });
        ops.push(op.clone());
        op
    }

    pub fn report_counters(&self) -> ReportCounters {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ReportCounters {
            at: Instant::now(),
            stats: self.snapshot(),
            decode: self.decode_times.snapshot(),
            ops: ops
                .iter()
                .map(|op| OpSnapshot {
                    name: op.name.clone(),
                    on_threads: op.on_threads,
                    rows_in: op.rows_in.load(Relaxed),
                    rows_out: op.rows_out.load(Relaxed),
                    calls: op.calls.snapshot(),
                })
                .collect(),
            queues: vec![
                ("units read ahead", self.read_ahead.snapshot()),
                ("ready batches", self.queue.snapshot()),
            ],
            io: self.io.schemes(),
            throttled: self.io.throttled.load(Relaxed),
        }
    }
}

impl ReportCounters {
    /// What happened between `earlier` and this reading (of the same loader's counters).
    pub fn since(&self, earlier: &ReportCounters) -> ReportCounters {
        let (a, b) = (&self.stats, &earlier.stats);
        let stats = StatsSnapshot {
            rows: a.rows.saturating_sub(b.rows),
            batches: a.batches.saturating_sub(b.batches),
            units: a.units.saturating_sub(b.units),
            bytes_read: a.bytes_read.saturating_sub(b.bytes_read),
            files_opened: a.files_opened.saturating_sub(b.files_opened),
            wait_ns: a.wait_ns.saturating_sub(b.wait_ns),
            consumer_waits: a.consumer_waits.saturating_sub(b.consumer_waits),
            fetch_wait_ns: a.fetch_wait_ns.saturating_sub(b.fetch_wait_ns),
            decode_wait_ns: a.decode_wait_ns.saturating_sub(b.decode_wait_ns),
            decode_ns: a.decode_ns.saturating_sub(b.decode_ns),
            assemble_ns: a.assemble_ns.saturating_sub(b.assemble_ns),
            pipeline_cpu_ns: a.pipeline_cpu_ns.saturating_sub(b.pipeline_cpu_ns),
            consumer_cpu_ns: a.consumer_cpu_ns.saturating_sub(b.consumer_cpu_ns),
            shuffle_cpu_ns: a.shuffle_cpu_ns.saturating_sub(b.shuffle_cpu_ns),
            skipped_records: a.skipped_records.saturating_sub(b.skipped_records),
            skipped_units: a.skipped_units.saturating_sub(b.skipped_units),
            padded_rows: a.padded_rows.saturating_sub(b.padded_rows),
            requests: a.requests.saturating_sub(b.requests),
            retries: a.retries.saturating_sub(b.retries),
            bytes_fetched: a.bytes_fetched.saturating_sub(b.bytes_fetched),
            cache_hits: a.cache_hits.saturating_sub(b.cache_hits),
            cache_misses: a.cache_misses.saturating_sub(b.cache_misses),
            spilled_bytes: a.spilled_bytes.saturating_sub(b.spilled_bytes),
            // Levels, not counts: as they are now.
            ..*a
        };
        let before_op = |op: &OpSnapshot| {
            earlier
                .ops
                .iter()
                .find(|e| e.name == op.name && e.on_threads == op.on_threads)
        };
        let before_io = |scheme: &str| {
            earlier
                .io
                .iter()
                .find(|(s, _)| s == scheme)
                .map(|(_, io)| io)
        };
        ReportCounters {
            at: self.at,
            stats,
            decode: self.decode.since(&earlier.decode),
            ops: self
                .ops
                .iter()
                .map(|op| match before_op(op) {
                    Some(e) => OpSnapshot {
                        rows_in: op.rows_in.saturating_sub(e.rows_in),
                        rows_out: op.rows_out.saturating_sub(e.rows_out),
                        calls: op.calls.since(&e.calls),
                        ..op.clone()
                    },
                    None => op.clone(),
                })
                .collect(),
            queues: self
                .queues
                .iter()
                .map(|(name, q)| {
                    let e = earlier
                        .queues
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or(QueueSnapshot::default(), |(_, e)| *e);
                    (
                        *name,
                        QueueSnapshot {
                            depth_ns: q.depth_ns.saturating_sub(e.depth_ns),
                            empty_ns: q.empty_ns.saturating_sub(e.empty_ns),
                            full_ns: q.full_ns.saturating_sub(e.full_ns),
                            ..*q
                        },
                    )
                })
                .collect(),
            io: self
                .io
                .iter()
                .map(|(s, h)| {
                    (
                        s.clone(),
                        before_io(s).map_or_else(|| h.clone(), |e| h.since(e)),
                    )
                })
                .collect(),
            throttled: self.throttled.saturating_sub(earlier.throttled),
        }
    }
}
