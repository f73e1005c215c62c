//! shardflow: a data loader for machine learning. Data flows top to bottom:
//! `source` (where bytes come from) -> `format` (bytes to Arrow record batches) ->
//! `pipeline` (order, shape, parallelism) -> `python` (the only module that uses pyo3).

pub mod error;
pub mod format;
pub mod fuzz;
pub mod options;
pub mod pipeline;
pub mod source;
pub mod write;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};

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
pub use pipeline::{Dataset, RunOptions, Stats};
