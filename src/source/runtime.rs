//! The process's one tokio runtime for I/O, created on first use and rebuilt after
//! `fork()` (PyTorch DataLoader workers fork): a child inherits the parent's memory
//! but none of its threads, so the parent's runtime is unusable there.

use std::sync::Mutex;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

use crate::error::{Error, Result, panic_message};

/// (pid that built it, runtime). Runtimes are leaked on purpose: dropping one in a
/// forked child would wait for worker threads that do not exist in that process.
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

pub fn runtime() -> Result<&'static Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, rt)) = *slot
        && owner == pid
    {
        return Ok(rt);
    }
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 4);
    let rt = Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("shardflow-io")
        // Idle blocking threads (file reads, stream readers) go away soon after an epoch.
        .thread_keep_alive(Duration::from_millis(500))
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Runs `future` to completion on `rt` and waits for it, from any thread: a thread that
/// is already inside a runtime (where `block_on` would panic) hands the wait to a plain
/// thread of its own.
pub fn block_on_outside<F>(rt: &'static Runtime, future: F) -> Result<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(rt.block_on(future));
    }
    std::thread::scope(|scope| {
        scope.spawn(|| rt.block_on(future)).join().map_err(|panic| {
            Error::Internal(format!("I/O setup failed: {}", panic_message(&*panic)))
        })
    })
}
