//! A rayon pool whose threads are joined when it is dropped.
//!
//! Dropping a rayon pool only tells its threads to exit; they give back what they hold
//! (their allocator heaps too) some time later. An epoch's pools go at its end, before
//! the pipeline thread passes the end on (see `BatchReceiver`), so joining them here
//! means an epoch's memory is given back by the time its end is seen: without it, RSS
//! read just after an epoch varied by 20 MB, by whether the threads had exited yet.

use std::ops::Deref;
use std::thread::JoinHandle;

use crate::error::{Error, Result};

pub struct JoinedPool {
    // Fields drop in order: the pool (which tells its threads to exit), then the joins.
    pool: rayon::ThreadPool,
    // Read by nothing: it is here to be dropped (joined) after the pool.
    _joins: Joins,
}

/// The pool's threads, joined on drop.
struct Joins(Vec<JoinHandle<()>>);

impl JoinedPool {
    /// `threads` threads (at least one) named `name-0`, `name-1`, ...
    pub fn new(threads: usize, name: &str) -> Result<Self> {
        let mut handles = Vec::new();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .spawn_handler(|thread| {
                let handle = std::thread::Builder::new()
                    .name(format!("{name}-{}", thread.index()))
                    .spawn(|| thread.run())?;
                handles.push(handle);
                Ok(())
            })
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the {name} threads: {e}")))?;
        Ok(Self {
            pool,
            _joins: Joins(handles),
        })
    }
}

impl Deref for JoinedPool {
    type Target = rayon::ThreadPool;

    fn deref(&self) -> &rayon::ThreadPool {
        &self.pool
    }
}

impl Drop for Joins {
    fn drop(&mut self) {
        // A thread cannot join itself: dropped on one of its own threads (by a task that
        // held the last reference), the pool's threads exit on their own.
        let me = std::thread::current().id();
        if self.0.iter().any(|thread| thread.thread().id() == me) {
            return;
        }
        for thread in self.0.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Joins a stage's thread once its end has been seen: it has dropped its sender, its last
/// act, so joining costs nothing, and what it held (its allocator heap too) is given back
/// and its counters are final before the end is passed on. Without it, RSS read just after
/// an epoch varied by 20 MB.
pub fn join_ended(thread: &mut Option<JoinHandle<()>>) {
    if let Some(thread) = thread.take() {
        let _ = thread.join();
    }
}
