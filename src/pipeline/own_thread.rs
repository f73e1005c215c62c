//! A stage of the stream on a thread of its own, beside the pipeline thread.
//!
//! Every batch passes the pipeline thread, so its CPU per batch bounds the loader's rate
//! however many cores decode. A shuffle buffer's draws (a random pick and its
//! bookkeeping per row) cost a shuffled stream's pipeline thread as much as the rest of
//! its work together (ordering the decoded batches, re-batching, handing over). On a
//! thread of their own, the draws and what comes before them work beside the pipeline
//! thread: two serial threads of about half the work each rather than one of all of it.
//! The stage's thread starts each output's copy on the batch threads and hands over the
//! copy being made, not the batch: it goes on drawing while the copies run, and the
//! pipeline thread, which would wait for the stage anyway, waits for the copy. The
//! order of the stream is the same: one thread still runs the stage, in order, and its
//! outputs come out in the order they were started.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;

use super::assemble::{BatchThreads, Made, Step};
use super::pool::join_ended;
use super::stats::{CpuMeter, Stats};
use crate::error::{Error, Result, panic_message};

/// The batches of a stage that runs on a thread of its own.
pub struct OwnThread {
    rx: Receiver<Made>,
    /// Joined once the stage has ended (see `next`).
    thread: Option<JoinHandle<()>>,
}

impl OwnThread {
    /// Runs `steps` (the stage's next output, until `None` or an error) on a thread named
    /// `name`, whose CPU time is counted in `cpu` (a counter of `stats`); the copies the
    /// steps ask for run on `threads`, as many at once as they have threads. The thread
    /// stops at the stage's end or first error, when `cancel` is set, or at its next
    /// output once this is dropped. It is joined once its end is seen (see `next`), not
    /// when this is dropped: a stage waiting for a user's function waits for the GIL,
    /// which whoever drops this may hold.
    pub fn spawn(
        name: &str,
        mut steps: impl FnMut() -> Option<Result<Step>> + Send + 'static,
        threads: Arc<BatchThreads>,
        stats: Arc<Stats>,
        cpu: fn(&Stats) -> &AtomicU64,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        let (tx, rx) = sync_channel(threads.threads.max(1));
        let run = move || {
            let mut meter = CpuMeter::start(cpu(&stats));
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                while let Some(step) = steps() {
                    let made = match step {
                        Ok(Step::Ready(batch)) => Made::Done(Ok(batch)),
                        Ok(Step::Make(make)) => threads.start(make),
                        Err(e) => Made::Done(Err(e)),
                    };
                    // Counted before the wait for room in the channel, which costs no CPU.
                    meter.tick();
                    let failed = matches!(made, Made::Done(Err(_)));
                    if cancel.load(Ordering::Relaxed) || tx.send(made).is_err() || failed {
                        return;
                    }
                }
            }));
            // The stage's buffers (and what it read from) go before its end is seen.
            drop(steps);
            drop(meter);
            if let Err(panic) = outcome {
                let _ = tx.send(Made::Done(Err(Error::Internal(format!(
                    "a pipeline stage panicked: {}",
                    panic_message(&*panic)
                )))));
            }
        };
        match std::thread::Builder::new().name(name.into()).spawn(run) {
            Ok(thread) => Self {
                rx,
                thread: Some(thread),
            },
            Err(e) => {
                // The closure, with its sender, is gone: this channel holds the error,
                // then ends.
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Made::Done(Err(Error::Internal(format!(
                    "cannot start the thread {name}: {e}"
                )))));
                Self { rx, thread: None }
            }
        }
    }
}

impl Iterator for OwnThread {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.rx.recv() {
            Ok(made) => Some(made.wait()),
            Err(_) => {
                join_ended(&mut self.thread);
                None
            }
        }
    }
}
