//! The bounded channel between the pipeline thread and the consumer. Memory stays
//! bounded by the prefetch depth in batches (which autotune may raise) and by a budget
//! of bytes, whichever is reached first; dropping the receiver stops the pipeline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;

use super::autotune::Tuning;
use super::pool::join_ended;
use super::stats::{CpuMeter, Stats};
use super::stream::BatchIter;
use crate::batch_bytes::batch_bytes;
use crate::error::{Error, Result};

pub enum Received {
    Batch(RecordBatch),
    /// Nothing arrived within the timeout; the caller may check for Ctrl-C and wait again.
    Timeout,
    End,
}

/// Batches sent and not yet received, and their bytes.
#[derive(Default)]
struct Queued {
    batches: usize,
    bytes: u64,
    /// Whether the producer waits for room. A notify is a system call whether or not a
    /// thread waits (std's condition variable does not count its waiters), and the
    /// consumer gives room back at every batch, on the serial path.
    producer_waits: bool,
}

/// What may wait for the consumer. The producer waits for room, except when nothing is
/// queued (so a batch larger than the whole budget still goes through).
struct Budget {
    queued: Mutex<Queued>,
    freed: Condvar,
    tuning: Arc<Tuning>,
    /// Where the queue's depth over time is counted (`Stats::queue`).
    stats: Arc<Stats>,
}

impl Budget {
    /// Waits until a batch of `bytes` fits (or the pipeline is cancelled), then takes
    /// its room. A producer that found the queue full waits until a quarter of it is
    /// free (see `drained`), then refills it in a run.
    fn take(&self, bytes: u64, cancel: &AtomicBool) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let mut waited = false;
        while (self.full(&queued, bytes) || (waited && !self.drained(&queued)))
            && !cancel.load(Ordering::Relaxed)
        {
            waited = true;
            queued.producer_waits = true;
            queued = self
                .freed
                .wait_timeout(queued, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        queued.producer_waits = false;
        queued.batches += 1;
        queued.bytes += bytes;
        self.changed(&queued);
    }

    /// Whether a batch of `bytes` must wait for room: the queue holds its depth in
    /// batches, or the batch would take it past its bytes (an empty queue takes any
    /// batch, so that one larger than the whole budget still goes through).
    fn full(&self, queued: &Queued, bytes: u64) -> bool {
        queued.batches > 0
            && (queued.batches >= self.tuning.prefetch.get()
                || queued.bytes + bytes > self.tuning.prefetch_bytes)
    }

    /// Whether a waiting producer is woken: a quarter of the queue's depth and of its
    /// bytes is free, or it is empty. Woken for every batch the consumer took, the
    /// producer ran for one batch and waited again, and the scheduler ran it on the
    /// consumer's core, taking turns with it: 784-byte rows in batches of 32 cost the
    /// consumer 4,500-12,000 involuntary context switches an epoch, against 85-970 since.
    /// Half free was as good there, and cost the harness's tar row 3% (the queue's slack);
    /// a depth of 4 or less wakes the producer for any room, as before.
    fn drained(&self, queued: &Queued) -> bool {
        let (depth, bytes) = (self.tuning.prefetch.get(), self.tuning.prefetch_bytes);
        queued.batches == 0
            || (queued.batches <= depth - depth.div_ceil(4)
                && queued.bytes <= bytes - bytes.div_ceil(4))
    }

    /// The queue's depth changed (its lock held): counted for the report, and drawn on
    /// the timeline.
    fn changed(&self, queued: &Queued) {
        self.stats
            .queue
            .changed(queued.batches, self.tuning.prefetch.get(), queued.bytes);
        if let Some(trace) = self.stats.trace() {
            trace.counter("ready batches", queued.batches as f64);
            trace.counter("ready bytes", queued.bytes as f64);
        }
    }

    fn give_back(&self, bytes: u64) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        queued.batches = queued.batches.saturating_sub(1);
        queued.bytes = queued.bytes.saturating_sub(bytes);
        self.changed(&queued);
        if queued.producer_waits && self.drained(&queued) {
            self.freed.notify_all();
        }
    }
}

pub struct BatchReceiver {
    /// In a mutex only so the receiver can be shared (`Sync`) by Python objects; it is
    /// reached through `&mut self`, so the lock is never contended.
    rx: Mutex<Receiver<Result<InQueue>>>,
    cancel: Arc<AtomicBool>,
    stats: Arc<Stats>,
    budget: Arc<Budget>,
    thread: Option<JoinHandle<()>>,
    ended: bool,
    /// The consumer found no batch ready and is waiting for this one (counted once).
    waiting: bool,
    /// Whether a batch has been received: the wait for the first is the start-up, not a
    /// sign that the queue of ready batches is too short, and is not counted as a
    /// consumer wait (the read-ahead and decode depths see it, through
    /// `Stats::consumer_waiting`).
    started: bool,
}

/// Starts the pipeline thread: at most the prefetch depth in batches, and
/// `prefetch_bytes` of them, wait for the consumer.
/// Dropping the receiver sets `cancel`, which the stream `build` makes should watch too.
pub(super) fn spawn(
    tuning: Arc<Tuning>,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    build: impl FnOnce() -> Result<BatchIter> + Send + 'static,
) -> Result<BatchReceiver> {
    // Room for the deepest the depth may grow to; the budget holds the producer back.
    let (tx, rx) = sync_channel(tuning.prefetch.max());
    // The queue is empty from the start: the wait for the first batch counts as empty.
    stats.queue.changed(0, tuning.prefetch.get(), 0);
    let budget = Arc::new(Budget {
        queued: Mutex::default(),
        freed: Condvar::new(),
        tuning,
        stats: stats.clone(),
    });
    let (thread_cancel, thread_budget, thread_stats) =
        (cancel.clone(), budget.clone(), stats.clone());
    let thread = std::thread::Builder::new()
        .name("shardflow-pipeline".into())
        .spawn(move || run(build, tx, thread_cancel, thread_budget, thread_stats))
        .map_err(|e| Error::Internal(format!("cannot start the pipeline thread: {e}")))?;
    Ok(BatchReceiver {
        rx: Mutex::new(rx),
        cancel,
        stats,
        budget,
        thread: Some(thread),
        ended: false,
        waiting: false,
        started: false,
    })
}

/// A batch in the queue, with its bytes (counted once, on the pipeline thread: the
/// consumer's thread is the serial path).
struct InQueue {
    batch: RecordBatch,
    bytes: u64,
}

fn run(
    build: impl FnOnce() -> Result<BatchIter>,
    tx: SyncSender<Result<InQueue>>,
    cancel: Arc<AtomicBool>,
    budget: Arc<Budget>,
    stats: Arc<Stats>,
) {
    let mut cpu = CpuMeter::start(&stats.pipeline_cpu_ns);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let stream = match build() {
            Ok(stream) => stream,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        for item in stream {
            let item = item.map(|batch| InQueue {
                bytes: batch_bytes(&batch),
                batch,
            });
            // Counted before the wait for room in the queue, which costs no CPU.
            cpu.tick();
            if let Ok(queued) = &item {
                budget.take(queued.bytes, &cancel);
            }
            let failed = item.is_err();
            if cancel.load(Ordering::Relaxed) || tx.send(item).is_err() || failed {
                return;
            }
        }
    }));
    if let Err(panic) = outcome {
        let _ = tx.send(Err(Error::Internal(format!(
            "pipeline panicked: {}",
            crate::error::panic_message(&*panic)
        ))));
    }
}

impl BatchReceiver {
    /// Waits up to `timeout` for the next batch, counting the wait in the stats.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Received> {
        Ok(self.receive(Some(timeout))?.unwrap_or(Received::Timeout))
    }

    /// The next batch (or the end) if it is there, without waiting; `None` if not yet.
    /// The consumer asks first with the GIL held, and lets go of the GIL only to wait.
    pub fn try_recv(&mut self) -> Result<Option<Received>> {
        self.receive(None)
    }

    /// The next batch, waiting up to `wait` for it (not at all with `None`).
    fn receive(&mut self, wait: Option<Duration>) -> Result<Option<Received>> {
        if self.ended {
            return Ok(Some(Received::End));
        }
        let start = Instant::now();
        let rx = self.rx.get_mut().unwrap_or_else(|p| p.into_inner());
        let got = match rx.try_recv() {
            Ok(item) => Ok(item),
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {
                let Some(timeout) = wait else {
                    return Ok(None);
                };
                if self.started && !std::mem::replace(&mut self.waiting, true) {
                    self.stats.consumer_waits.fetch_add(1, Ordering::Relaxed);
                    self.budget.tuning.consumer_waited();
                }
                self.stats.consumer_waiting.store(true, Ordering::Relaxed);
                let got = rx.recv_timeout(timeout);
                self.stats.consumer_waiting.store(false, Ordering::Relaxed);
                got
            }
        };
        Stats::add_time(&self.stats.wait_ns, start.elapsed());
        match got {
            Ok(Ok(InQueue { batch, bytes })) => {
                self.waiting = false;
                self.started = true;
                self.budget.give_back(bytes);
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .rows
                    .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                Ok(Some(Received::Batch(batch)))
            }
            Ok(Err(e)) => {
                self.ended = true;
                Err(e)
            }
            Err(RecvTimeoutError::Timeout) => Ok(Some(Received::Timeout)),
            Err(RecvTimeoutError::Disconnected) => {
                self.ended = true;
                join_ended(&mut self.thread);
                Ok(Some(Received::End))
            }
        }
    }

    /// The counters of the loader this pipeline belongs to.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Blocks until the next batch (no interruption; for Rust callers and benches).
    pub fn recv(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match self.recv_timeout(Duration::from_secs(3600))? {
                Received::Batch(batch) => return Ok(Some(batch)),
                Received::End => return Ok(None),
                Received::Timeout => {}
            }
        }
    }

    /// Stops the pipeline and waits for its thread to exit.
    pub fn close(mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        let Self { rx, thread, .. } = &mut self;
        // Drop our end so a pipeline thread waiting to send fails at once, then wait for it.
        drop(std::mem::replace(rx, Mutex::new(sync_channel(1).1)));
        join_ended(thread);
    }
}

impl Iterator for BatchReceiver {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.recv().transpose()
    }
}

impl Drop for BatchReceiver {
    fn drop(&mut self) {
        // The pipeline thread notices at its next send (which fails once `rx` is gone)
        // or its next check of the flag; it is not joined here so that dropping never
        // blocks a caller that may hold the GIL the pipeline needs.
        self.cancel.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn budget_of(depth: usize, bytes: u64) -> Arc<Budget> {
        Arc::new(Budget {
            queued: Mutex::default(),
            freed: Condvar::new(),
            tuning: Arc::new(Tuning::new(Some(1), Some(depth), Some(bytes), None).unwrap()),
            stats: Arc::new(Stats::default()),
        })
    }

    /// Takes batches of `bytes` on a thread of its own until cancelled, counting them.
    fn producer(
        budget: &Arc<Budget>,
        bytes: u64,
        cancel: &Arc<AtomicBool>,
    ) -> (Arc<AtomicUsize>, JoinHandle<()>) {
        let taken = Arc::new(AtomicUsize::new(0));
        let (budget, cancel, count) = (budget.clone(), cancel.clone(), taken.clone());
        let thread = std::thread::spawn(move || {
            while !cancel.load(Ordering::Relaxed) {
                budget.take(bytes, &cancel);
                count.fetch_add(1, Ordering::Relaxed);
            }
        });
        (taken, thread)
    }

    /// Waits (up to 10 s) until `taken` reaches `n`, then a while longer, and gives the
    /// count then: more than `n` would mean the producer did not wait.
    fn settles_at(taken: &AtomicUsize, n: usize) -> usize {
        let start = Instant::now();
        while taken.load(Ordering::Relaxed) < n && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Past the producer's 100 ms timeout: a wrong check would have let it go on.
        std::thread::sleep(Duration::from_millis(250));
        taken.load(Ordering::Relaxed)
    }

    #[test]
    fn a_producer_that_found_the_queue_full_waits_until_a_quarter_is_free() {
        let budget = budget_of(8, u64::MAX);
        let cancel = Arc::new(AtomicBool::new(false));
        let (taken, thread) = producer(&budget, 1, &cancel);
        assert_eq!(settles_at(&taken, 8), 8);
        budget.give_back(1);
        // Seven left: room for one, but not taken batch by batch.
        assert_eq!(settles_at(&taken, 8), 8);
        budget.give_back(1);
        // Six left (a quarter free): refilled in one run.
        assert_eq!(settles_at(&taken, 10), 10);
        cancel.store(true, Ordering::Relaxed);
        budget.give_back(1);
        thread.join().unwrap();
    }

    #[test]
    fn a_quarter_of_the_bytes_too_and_an_empty_queue_takes_any_batch() {
        // Batches of 10 bytes in a budget of 100 (and a depth of 64): ten fit.
        let budget = budget_of(64, 100);
        let cancel = Arc::new(AtomicBool::new(false));
        let (taken, thread) = producer(&budget, 10, &cancel);
        assert_eq!(settles_at(&taken, 10), 10);
        budget.give_back(10);
        budget.give_back(10);
        // 80 bytes left: room for two, but not a quarter free.
        assert_eq!(settles_at(&taken, 10), 10);
        budget.give_back(10);
        // 70 bytes left: refilled to 100.
        assert_eq!(settles_at(&taken, 13), 13);
        cancel.store(true, Ordering::Relaxed);
        budget.give_back(10);
        thread.join().unwrap();

        // A batch larger than the whole budget goes into an empty queue.
        let big = budget_of(64, 100);
        let never = AtomicBool::new(false);
        big.take(500, &never);
        assert_eq!(big.queued.lock().unwrap().bytes, 500);
    }
}
