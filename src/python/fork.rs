//! Fork safety for the threads of ours that enter Python.
//!
//! A pipeline thread that calls a user's `map`/`filter` function has no Python thread
//! state of its own, so each call makes one (`PyGILState_Ensure`), and CPython makes it
//! under the runtime's thread-list lock (`HEAD_LOCK`) *before* taking the GIL. A
//! `fork()` by the thread holding the GIL (a PyTorch DataLoader starting its workers)
//! can then copy that lock taken; before 3.11.8 and 3.12.1 (CPython gh-112275) the child
//! takes it again in `PyOS_AfterFork_Child` and hangs for ever, before running any
//! Python. The same holds for pyo3's list of deferred decrefs, locked by any thread that
//! drops a Python object without the GIL and by every call into the extension.
//!
//! So every entry into Python from our threads passes [`attach`], and a handler that
//! `os.register_at_fork` runs before each fork closes the gate and waits, with the GIL
//! released, until no thread of ours is between the gate and the GIL. Atomics, not a
//! lock, keep the gate: nothing of it can be copied taken into the child.
//!
//! The same gate closes for good when the interpreter exits. A thread of ours that wants
//! the GIL back (mid-call, after the interpreter's switch interval) once finalization has
//! begun is ended by CPython with `pthread_exit`, whose forced unwind through our frames
//! aborts the process. So an `atexit` handler closes the gate and waits, the GIL released,
//! until no thread of ours is in Python; the calls after it fail as the interpreter's
//! shutdown, and the pipelines (already cancelled or finished) end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use pyo3::prelude::*;

static FORKING: AtomicBool = AtomicBool::new(false);
/// Threads of ours between the gate and holding the GIL.
static ENTERING: AtomicUsize = AtomicUsize::new(0);
/// Set by the `atexit` handler: no thread of ours enters Python from then on.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Threads of ours past the gate and not yet out of Python (entering it, or in it).
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// How long the exit waits for our threads to leave Python (a function that never
/// returns must not hold the process up for ever).
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// How long a thread waits before looking at the gate again while a fork is under way.
const PAUSE: Duration = Duration::from_micros(200);

/// `f` with the GIL, from any thread (`None` while the interpreter is shutting down).
pub fn attach<T>(f: impl FnOnce(Python<'_>) -> T) -> Option<T> {
    // SAFETY: reads this thread's own slot, which needs no GIL.
    if !unsafe { pyo3::ffi::PyGILState_GetThisThreadState() }.is_null() {
        // A Python thread (perhaps holding the GIL, so it must not wait at the gate):
        // entering makes no thread state.
        return Python::try_attach(f);
    }
    // Counted before the look at the exit flag, so the exit either sees this thread
    // inside or this thread sees the flag.
    INSIDE.fetch_add(1, SeqCst);
    if EXITING.load(SeqCst) {
        INSIDE.fetch_sub(1, SeqCst);
        return None;
    }
    loop {
        while FORKING.load(SeqCst) {
            std::thread::sleep(PAUSE);
        }
        ENTERING.fetch_add(1, SeqCst);
        if !FORKING.load(SeqCst) {
            break;
        }
        // A fork began between the two looks: step back out of its way.
        ENTERING.fetch_sub(1, SeqCst);
    }
    let mut entered = false;
    let out = Python::try_attach(|py| {
        // Holding the GIL: this thread's state exists, so a fork is safe from here on.
        ENTERING.fetch_sub(1, SeqCst);
        entered = true;
        f(py)
    });
    if !entered {
        ENTERING.fetch_sub(1, SeqCst);
    }
    INSIDE.fetch_sub(1, SeqCst);
    out
}

/// `atexit`: closes the gate for good, then waits (the GIL released, so that threads of
/// ours in Python can finish their call) until none is in Python.
#[pyfunction]
fn before_exit(py: Python<'_>) {
    EXITING.store(true, SeqCst);
    py.detach(|| {
        let start = std::time::Instant::now();
        while INSIDE.load(SeqCst) > 0 && start.elapsed() < EXIT_WAIT {
            std::thread::sleep(PAUSE);
        }
    });
}

/// `os.register_at_fork(before=...)`: closes the gate, then waits (the GIL released, so
/// that threads already past it can reach the GIL and clear it) until none is between.
#[pyfunction]
fn before_fork(py: Python<'_>) {
    FORKING.store(true, SeqCst);
    py.detach(|| {
        while ENTERING.load(SeqCst) > 0 {
            std::thread::sleep(PAUSE);
        }
    });
}

/// `os.register_at_fork(after_in_parent=...)`.
#[pyfunction]
fn after_fork_in_parent() {
    FORKING.store(false, SeqCst);
}

/// `os.register_at_fork(after_in_child=...)`: the child has none of the parent's other
/// threads, so none is entering.
#[pyfunction]
fn after_fork_in_child() {
    ENTERING.store(0, SeqCst);
    FORKING.store(false, SeqCst);
}

/// Registers the handlers; called once, when the extension is imported.
pub fn register(py: Python<'_>) -> PyResult<()> {
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("before", wrap_pyfunction!(before_fork, py)?)?;
    kwargs.set_item(
        "after_in_parent",
        wrap_pyfunction!(after_fork_in_parent, py)?,
    )?;
    kwargs.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, py)?)?;
    py.import("os")?
        .getattr("register_at_fork")?
        .call((), Some(&kwargs))?;
    py.import("atexit")?
        .getattr("register")?
        .call1((wrap_pyfunction!(before_exit, py)?,))?;
    Ok(())
}
