//! The process's allocator, and how it keeps freed memory.

/// Decode threads allocate and free batch-sized buffers all the time, and the consumer
/// frees them on another thread. glibc's malloc keeps per-thread arenas whose freed
/// pages fragment, so RSS crept up epoch after epoch (539 MB to 766 MB over 30 epochs
/// of one workload), and every large buffer was a fresh `mmap` and page faults.
/// mimalloc reuses freed memory across threads and keeps RSS flat. (Miri runs Rust code
/// only, and the fuzzer's sanitizers and allocation limits watch the system allocator,
/// so both keep it.)
#[cfg(not(any(miri, fuzzing)))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Has mimalloc keep freed memory for a second before giving it back to the system
/// (its `purge_delay`, 10 ms by default). A loader frees batch-sized buffers on one thread
/// and asks for as many on another a little later; given back at once, each comes back as
/// fresh pages, and on these machines faulting in a fresh page costs more than the copy
/// into it (4 KiB in about 2 µs: 3.3 s for 1.5 GB). Kept, a full-shuffle epoch of 1.5 GB
/// gathers its rows in 175 ms instead of 600 ms. Peak RSS is unchanged: what is kept is
/// reused before more is asked of the system. `MIMALLOC_PURGE_DELAY` in the environment
/// overrides it.
pub fn keep_freed_memory() {
    #[cfg(not(any(miri, fuzzing)))]
    {
        unsafe extern "C" {
            fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
        }
        /// `mi_option_purge_delay` in mimalloc v2's `mimalloc.h` (the crate does not
        /// name it).
        const PURGE_DELAY: std::ffi::c_int = 15;
        // Set in the environment, the user's value (mimalloc read it at start) stands.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: sets one of mimalloc's options, which it reads atomically.
            unsafe { mi_option_set(PURGE_DELAY, 1000) };
        }
    }
}

/// glibc's malloc (which Python's objects above 512 bytes come from) starts by mapping
/// every block of 128 KB or more fresh and giving back the top of its heap as soon as
/// 128 KB of it is free. A batch handed to Python as `bytes` (8 KB images, 256 KB
/// documents) is then paid for again in page faults every time: one batch's objects are
/// freed, the heap shrinks, and the next batch faults its pages back in (4 KB in about
/// 2 µs on these machines, more than the copy into them). glibc raises both thresholds
/// itself once the process frees a large mapped block, up to 32 MB to map and twice that
/// kept; this starts the process at 32 MB to map and keeps up to 128 MB: a batch of 256
/// values of 256 KB is 64 MB and their headers, just over glibc's 64 MB, and was given
/// back and faulted in again batch after batch (a full-shuffle epoch of 1.5 GB of such
/// rows: 300,000 faults, 10% of its time). Any `MALLOC_*_` variable or `GLIBC_TUNABLES` in
/// the environment leaves the user's settings as they are
/// (`MALLOC_TRIM_THRESHOLD_=131072` keeps glibc's defaults). Only the Python module
/// calls it: a Rust program's allocations are mimalloc's.
#[cfg(feature = "python")]
pub fn keep_freed_python_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(any(miri, fuzzing))))]
    {
        const MAP_ABOVE: std::ffi::c_int = 32 << 20;
        // Above a batch of 256 values of 256 KB as `bytes` (64 MB and their headers).
        const KEEP_UP_TO: std::ffi::c_int = 128 << 20;
        let user_set = std::env::vars_os().any(|(name, _)| {
            let name = name.to_string_lossy();
            name == "GLIBC_TUNABLES" || (name.starts_with("MALLOC_") && name.ends_with('_'))
        });
        if !user_set {
            // SAFETY: mallopt sets glibc's malloc parameters under its own lock.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MAP_ABOVE);
                libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_UP_TO);
            }
        }
    }
}
