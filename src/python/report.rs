//! The counters behind `DataLoader.report()`: a window of the loader's time (its epoch so
//! far, or its last seconds) read from two readings of its counters, as a dict that
//! `shardflow.report` turns into the report.

use std::collections::VecDeque;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::latency::HistogramSnapshot;
use crate::pipeline::report::ReportCounters;
use crate::pipeline::stats::Stats;
use crate::trace::Trace;

/// Readings kept for `report(seconds=...)`: one a second, ten minutes of them.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
const SAMPLES: usize = 600;

/// The readings a loader takes: at its epoch's start and end, and one a second between.
#[derive(Default)]
pub(super) struct ReportWindow {
    epoch_start: Option<ReportCounters>,
    epoch_end: Option<ReportCounters>,
    samples: VecDeque<ReportCounters>,
}

impl ReportWindow {
    pub(super) fn epoch_started(&mut self, stats: &Stats) {
        let now = stats.report_counters();
        self.epoch_start = Some(now.clone());
        self.epoch_end = None;
        self.keep(now);
    }

    pub(super) fn epoch_ended(&mut self, stats: &Stats) {
        let now = stats.report_counters();
        self.epoch_end = Some(now.clone());
        self.keep(now);
    }

    /// Takes a reading if the last is a second old (called at every batch).
    pub(super) fn tick(&mut self, stats: &Stats) {
        if self
            .samples
            .back()
            .is_none_or(|last| last.at.elapsed() >= SAMPLE_EVERY)
        {
            self.keep(stats.report_counters());
        }
    }

    fn keep(&mut self, reading: ReportCounters) {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(reading);
    }

    /// What happened in the epoch so far (or in the whole of the last one, once it has
    /// ended), or in the last `seconds`; and the window's wall time.
    pub(super) fn window(
        &self,
        stats: &Stats,
        seconds: Option<f64>,
    ) -> Option<(ReportCounters, Duration)> {
        let (earlier, later) = match seconds {
            None => {
                let start = self.epoch_start.as_ref()?;
                let end = self
                    .epoch_end
                    .clone()
                    .unwrap_or_else(|| stats.report_counters());
                (start.clone(), end)
            }
            Some(seconds) => {
                let now = stats.report_counters();
                let from = now
                    .at
                    .checked_sub(Duration::from_secs_f64(seconds.min(1e9)))
                    .unwrap_or(now.at);
                // The latest reading at or before the window's start, else the oldest.
                let earlier = self
                    .samples
                    .iter()
                    .rev()
                    .find(|r| r.at <= from)
                    .or(self.samples.front())?
                    .clone();
                (earlier, now)
            }
        };
        let wall = later.at.saturating_duration_since(earlier.at);
        Some((later.since(&earlier), wall))
    }
}

fn quantiles(h: &HistogramSnapshot, into: &Bound<'_, PyDict>) -> PyResult<()> {
    let seconds = |q| h.quantile_ns(q).map(|ns| ns as f64 / 1e9);
    into.set_item("count", h.count())?;
    into.set_item("seconds", h.sum_ns as f64 / 1e9)?;
    into.set_item("p50_seconds", seconds(0.5))?;
    into.set_item("p99_seconds", seconds(0.99))?;
    Ok(())
}

/// The window's counters as the dict `shardflow.report.Report.from_counters` reads.
pub(super) fn to_dict<'py>(
    py: Python<'py>,
    counters: &ReportCounters,
    wall: Duration,
) -> PyResult<Bound<'py, PyDict>> {
    let s = &counters.stats;
    let d = PyDict::new(py);
    let secs = |ns: u64| ns as f64 / 1e9;
    d.set_item("wall_seconds", wall.as_secs_f64())?;
    d.set_item("rows", s.rows)?;
    d.set_item("batches", s.batches)?;
    d.set_item("wait_seconds", secs(s.wait_ns))?;
    d.set_item("consumer_waits", s.consumer_waits)?;
    d.set_item("units", s.units)?;
    d.set_item("bytes_read", s.bytes_read)?;
    d.set_item("files_opened", s.files_opened)?;
    d.set_item("fetch_wait_seconds", secs(s.fetch_wait_ns))?;
    d.set_item("decode_wait_seconds", secs(s.decode_wait_ns))?;
    d.set_item("assemble_seconds", secs(s.assemble_ns))?;
    d.set_item("pipeline_cpu_seconds", secs(s.pipeline_cpu_ns))?;
    d.set_item("shuffle_cpu_seconds", secs(s.shuffle_cpu_ns))?;
    d.set_item("consumer_cpu_seconds", secs(s.consumer_cpu_ns))?;
    d.set_item("requests", s.requests)?;
    d.set_item("retries", s.retries)?;
    d.set_item("throttled", counters.throttled)?;
    d.set_item("bytes_fetched", s.bytes_fetched)?;
    d.set_item("cache_hits", s.cache_hits)?;
    d.set_item("cache_misses", s.cache_misses)?;
    d.set_item("skipped_records", s.skipped_records)?;
    let decode = PyDict::new(py);
    quantiles(&counters.decode, &decode)?;
    d.set_item("decode", decode)?;
    let ops = PyList::empty(py);
    for op in &counters.ops {
        let o = PyDict::new(py);
        o.set_item("name", &op.name)?;
        o.set_item("on_threads", op.on_threads)?;
        o.set_item("rows_in", op.rows_in)?;
        o.set_item("rows_out", op.rows_out)?;
        quantiles(&op.calls, &o)?;
        ops.append(o)?;
    }
    d.set_item("ops", ops)?;
    let io = PyList::empty(py);
    for (scheme, s) in &counters.io {
        let o = PyDict::new(py);
        o.set_item("scheme", scheme)?;
        quantiles(&s.latency, &o)?;
        o.set_item("retries", s.retries)?;
        o.set_item("throttled", s.throttled)?;
        o.set_item("bytes", s.bytes)?;
        io.append(o)?;
    }
    d.set_item("io", io)?;
    let queues = PyList::empty(py);
    let wall_ns = wall.as_nanos().max(1) as f64;
    for (name, q) in &counters.queues {
        let queue = PyDict::new(py);
        queue.set_item("name", *name)?;
        queue.set_item("capacity", q.capacity)?;
        queue.set_item("mean_depth", q.depth_ns as f64 / wall_ns)?;
        queue.set_item("empty_share", (q.empty_ns as f64 / wall_ns).min(1.0))?;
        queue.set_item("full_share", (q.full_ns as f64 / wall_ns).min(1.0))?;
        queue.set_item("peak_bytes", q.peak_bytes)?;
        queues.append(queue)?;
    }
    d.set_item("queues", queues)?;
    Ok(d)
}

/// A loader's counters, keeping a timeline in `trace` (or, not given, where
/// `SHARDFLOW_TRACE` says: the first loader of the process writes that file, later ones
/// `NAME-2.json`, `NAME-3.json`, ...).
pub(super) fn stats_with_trace(
    trace: Option<std::path::PathBuf>,
) -> PyResult<std::sync::Arc<Stats>> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static FROM_ENV: AtomicU64 = AtomicU64::new(0);
    let path = trace.or_else(|| {
        let path = std::path::PathBuf::from(
            std::env::var_os("SHARDFLOW_TRACE").filter(|v| !v.is_empty())?,
        );
        match FROM_ENV.fetch_add(1, Relaxed) {
            0 => Some(path),
            n => {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                let ext = path
                    .extension()
                    .map(|e| format!(".{}", e.to_string_lossy()))
                    .unwrap_or_default();
                Some(path.with_file_name(format!("{stem}-{}{ext}", n + 1)))
            }
        }
    });
    let stats = std::sync::Arc::new(Stats::default());
    if let Some(path) = path {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
        if folder.is_some_and(|f| !f.is_dir()) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "trace={}: its folder does not exist",
                path.display()
            )));
        }
        let trace = Trace::new(path);
        let _ = stats.trace.set(trace.clone());
        let _ = stats.io.trace.set(trace);
    }
    Ok(stats)
}
