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
