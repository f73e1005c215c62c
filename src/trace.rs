//! A timeline of a loader's work, written as Chrome Trace Event JSON (what PyTorch's
//! profiler writes, and Perfetto and `chrome://tracing` open): a span per unit of work on
//! the thread that did it (decode, each op, re-batching, the consumer's waits), each
//! remote request as an async span, and counters (the ready batches and their bytes).
//!
//! Spans are closed by a guard, so spans on one thread nest. Nothing is recorded unless
//! the loader was given a trace: the hooks are an `Option` test each.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Events kept at most (about 100 MB of JSON): past it, events are counted, not kept.
const MAX_EVENTS: usize = 1_000_000;

enum Event {
    /// A complete span on a thread.
    Span {
        tid: u64,
        name: String,
        cat: &'static str,
        start_ns: u64,
        dur_ns: u64,
    },
    /// An async span (a request in flight, which shares its thread with others).
    Async {
        id: u64,
        name: String,
        cat: &'static str,
        start_ns: u64,
        end_ns: u64,
    },
    Counter {
        name: &'static str,
        at_ns: u64,
        value: f64,
    },
}

struct Recorded {
    events: Vec<Event>,
    dropped: u64,
    /// Names of the threads that recorded (their `std::thread` names).
    threads: BTreeMap<u64, String>,
}

/// One loader's timeline, written to `path`.
pub struct Trace {
    path: PathBuf,
    start: Instant,
    recorded: Mutex<Recorded>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trace({})", self.path.display())
    }
}

fn thread_id() -> u64 {
    // SAFETY: gettid has no preconditions.
    (unsafe { libc::gettid() }) as u64
}

impl Trace {
    pub fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            path,
            start: Instant::now(),
            recorded: Mutex::new(Recorded {
                events: Vec::new(),
                dropped: 0,
                threads: BTreeMap::new(),
            }),
            next_id: AtomicU64::new(0),
        })
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_nanos() as u64
    }

    fn push(&self, event: Event, tid: Option<u64>) {
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if recorded.events.len() >= MAX_EVENTS {
            recorded.dropped += 1;
            return;
        }
        if let Some(tid) = tid {
            recorded.threads.entry(tid).or_insert_with(|| {
                std::thread::current()
                    .name()
                    .unwrap_or("python")
                    .to_string()
            });
        }
        recorded.events.push(event);
    }

    /// A span of `name` on this thread, from now until the guard is dropped.
    pub fn span(self: &Arc<Self>, name: impl Into<String>, cat: &'static str) -> Span {
        Span {
            trace: self.clone(),
            name: Some(name.into()),
            cat,
            start: Instant::now(),
        }
    }

    /// A request that was in flight from `start` to now.
    pub fn request(&self, name: String, start: Instant) {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (start_ns, end_ns) = (self.ns(start), self.ns(Instant::now()));
        self.push(
            Event::Async {
                id,
                name,
                cat: "io",
                start_ns,
                end_ns,
            },
            None,
        );
    }

    pub fn counter(&self, name: &'static str, value: f64) {
        let at_ns = self.ns(Instant::now());
        self.push(Event::Counter { name, at_ns, value }, None);
    }

    /// Writes every event so far to the trace's file (replacing what an earlier write
    /// left), through a temporary file renamed into place.
    pub fn write(&self) -> std::io::Result<()> {
        let pid = std::process::id();
        let us = |ns: u64| ns as f64 / 1e3;
        let mut out = Vec::new();
        {
            let recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
            out.reserve(recorded.events.len() * 120);
            out.extend_from_slice(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
            let mut first = true;
            let mut event = |value: serde_json::Value, out: &mut Vec<u8>| {
                if !std::mem::take(&mut first) {
                    out.extend_from_slice(b",\n");
                }
                let _ = serde_json::to_writer(&mut *out, &value);
            };
            event(
                serde_json::json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "shardflow"}}),
                &mut out,
            );
            for (tid, name) in &recorded.threads {
                event(
                    serde_json::json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}),
                    &mut out,
                );
            }
            for e in &recorded.events {
                let value = match e {
                    Event::Span {
                        tid,
                        name,
                        cat,
                        start_ns,
                        dur_ns,
                    } => {
                        serde_json::json!({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                                            "ts": us(*start_ns), "dur": us(*dur_ns)})
                    }
                    Event::Async {
                        id,
                        name,
                        cat,
                        start_ns,
                        end_ns,
                    } => {
                        event(
                            serde_json::json!({"ph": "b", "name": name, "cat": cat, "pid": pid, "id": id, "ts": us(*start_ns)}),
                            &mut out,
                        );
                        serde_json::json!({"ph": "e", "name": name, "cat": cat, "pid": pid, "id": id, "ts": us(*end_ns)})
                    }
                    Event::Counter { name, at_ns, value } => {
                        serde_json::json!({"ph": "C", "name": name, "pid": pid, "ts": us(*at_ns), "args": {"value": value}})
                    }
                };
                event(value, &mut out);
            }
            out.extend_from_slice(
                format!(
                    "\n],\"otherData\":{{\"dropped_events\":{}}}}}\n",
                    recorded.dropped
                )
                .as_bytes(),
            );
        }
        let temporary = self.path.with_extension(format!("tmp{pid}"));
        std::fs::File::create(&temporary)?.write_all(&out)?;
        std::fs::rename(&temporary, &self.path)
    }
}

/// A span being recorded; it ends when dropped.
pub struct Span {
    trace: Arc<Trace>,
    name: Option<String>,
    cat: &'static str,
    start: Instant,
}

impl Drop for Span {
    fn drop(&mut self) {
        let end = Instant::now();
        let tid = thread_id();
        let (start_ns, end_ns) = (self.trace.ns(self.start), self.trace.ns(end));
        self.trace.push(
            Event::Span {
                tid,
                name: self.name.take().unwrap_or_default(),
                cat: self.cat,
                start_ns,
                dur_ns: end_ns - start_ns,
            },
            Some(tid),
        );
    }
}
