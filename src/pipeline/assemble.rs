//! Output batches made on threads of their own: re-batching's joins and the shuffle
//! buffer's gathers copy every row of every batch, and on the pipeline thread that copy
//! would bound the loader's rate however many cores decode (a batch of 256 images is
//! 38 MB; a shuffled batch of chat rows, 0.16 ms of nested gathers). The stage decides
//! what goes into each batch, in order, on the pipeline thread; the copies run on a pool
//! with as many threads as the decode pool, several batches at once, and come back in
//! the order they were started, so the stream is the same whatever the timing.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::RecordBatch;

use super::pool::JoinedPool;
use super::stats::{Stats, thread_cpu_ns};
use crate::error::{Error, Result, panic_message};

/// One run's threads for making batches, shared by its stages.
pub struct BatchThreads {
    pub threads: usize,
    /// Started with the first batch to make (many epochs need none). Read without a
    /// lock: the shuffle's thread and the pipeline thread both start copies, and
    /// neither should wait for the other to do so.
    pool: OnceLock<JoinedPool>,
    /// Taken only to start the pool, so that it starts once.
    starting: Mutex<()>,
    stats: Arc<Stats>,
    /// Set when the consumer has gone.
    cancel: Arc<AtomicBool>,
}

impl BatchThreads {
    /// `threads` threads; their CPU time is counted in `stats.assemble_ns`.
    pub fn new(threads: usize, stats: Arc<Stats>, cancel: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(Self {
            threads: threads.max(1),
            pool: OnceLock::new(),
            starting: Mutex::new(()),
            stats,
            cancel,
        })
    }

    fn pool(&self) -> Result<&JoinedPool> {
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let pool = JoinedPool::new(self.threads, "shardflow-batch")?;
        Ok(self.pool.get_or_init(|| pool))
    }

    /// Makes a batch on the threads.
    pub fn start(&self, make: impl FnOnce() -> Result<RecordBatch> + Send + 'static) -> Made {
        let pool = match self.pool() {
            Ok(pool) => pool,
            Err(e) => return Made::Done(Err(e)),
        };
        let (tx, rx) = sync_channel(1);
        let stats = self.stats.clone();
        pool.spawn(move || {
            let start = thread_cpu_ns();
            let span = stats.trace().map(|t| t.span("re-batch", "batch"));
            let made = catch_unwind(AssertUnwindSafe(make)).unwrap_or_else(|panic| {
                Err(Error::Internal(format!(
                    "making a batch failed: {}",
                    panic_message(&*panic)
                )))
            });
            drop(span);
            Stats::add_thread_cpu(&stats.assemble_ns, start);
            let _ = tx.send(made);
        });
        Made::Running(rx)
    }
}

/// A batch, made or being made on [`BatchThreads`].
pub enum Made {
    Done(Result<RecordBatch>),
    Running(Receiver<Result<RecordBatch>>),
}

impl Made {
    /// The batch, once made.
    pub fn wait(self) -> Result<RecordBatch> {
        match self {
            Made::Done(batch) => batch,
            Made::Running(rx) => rx
                .recv()
                .unwrap_or_else(|_| Err(Error::Internal("a batch thread stopped".into()))),
        }
    }
}

/// What a stage gives for its next batch: one ready as it is, or a copy to make.
pub enum Step {
    Ready(RecordBatch),
    Make(Box<dyn FnOnce() -> Result<RecordBatch> + Send>),
}

/// One stage's batches, made on [`BatchThreads`] and handed out in the order they were
/// started.
pub struct InOrder {
    threads: Arc<BatchThreads>,
    queue: VecDeque<Made>,
    /// Whether a batch has gone out yet.
    started: bool,
}

impl InOrder {
    pub fn new(threads: Arc<BatchThreads>) -> Self {
        Self {
            threads,
            queue: VecDeque::new(),
            started: false,
        }
    }

    /// Whether the stage should start another batch: while the oldest is still being
    /// made, up to one per thread, and not once the consumer has gone. A batch that is
    /// ready goes out first: upstream (which runs the user's functions) is not read
    /// further ahead than the copies need. The first batch goes out as soon as it is
    /// made: reading the next one's rows first would add their decoding to the wait
    /// for the first.
    fn wants_more(&mut self) -> bool {
        if let Some(Made::Running(rx)) = self.queue.front()
            && let Ok(made) = rx.try_recv()
        {
            self.queue[0] = Made::Done(made);
        }
        let limit = if self.started {
            self.threads.threads
        } else {
            1
        };
        !matches!(self.queue.front(), Some(Made::Done(_)))
            && self.queue.len() < limit
            && !self.threads.cancel.load(Ordering::Relaxed)
    }

    /// A batch (or the stream's error) that needs no copy.
    fn push_done(&mut self, batch: Result<RecordBatch>) {
        self.queue.push_back(Made::Done(batch));
    }

    /// Makes a batch on the threads.
    fn spawn(&mut self, make: impl FnOnce() -> Result<RecordBatch> + Send + 'static) {
        let made = self.threads.start(make);
        self.queue.push_back(made);
    }

    /// The oldest batch, waiting for it if it is still being made; `None` when none was
    /// started.
    fn pop(&mut self) -> Option<Result<RecordBatch>> {
        self.started = true;
        Some(self.queue.pop_front()?.wait())
    }

    /// Starts the stage's next batches, as `step` gives them (until it ends or fails),
    /// while `wants_more` says so; then hands out the oldest.
    pub fn next(
        &mut self,
        mut step: impl FnMut() -> Option<Result<Step>>,
    ) -> Option<Result<RecordBatch>> {
        while self.wants_more() {
            match step() {
                None => break,
                Some(Ok(Step::Ready(batch))) => self.push_done(Ok(batch)),
                Some(Ok(Step::Make(make))) => self.spawn(make),
                Some(Err(e)) => {
                    self.push_done(Err(e));
                    break;
                }
            }
        }
        self.pop()
    }
}
