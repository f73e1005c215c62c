//! shardflow: a data loader for machine learning. It streams training data from local
//! disk, S3 and HTTP(S) (Parquet, Arrow IPC, JSON Lines, CSV, TFRecord with
//! `tf.train.Example`, NPY/NPZ, WebDataset tar, raw files) as Arrow record batches,
//! decoded on a thread pool, shuffled, sharded across ranks and batched, with every row
//! exactly once per epoch and the same order for the same seed. It also writes datasets
//! back out as shards with a manifest.
//!
//! ```no_run
//! use shardflow::Dataset;
//!
//! # fn main() -> shardflow::Result<()> {
//! let ds = Dataset::builder("s3://bucket/train/")
//!     .storage_option("endpoint_url", "http://127.0.0.1:8333")
//!     .columns(["image", "label"])
//!     .open()?;
//! let loader = ds.loader(256).shuffle(0).drop_last(true).rank(0, 8)?;
//! for epoch in 0..10 {
//!     for batch in loader.epoch(epoch)? {
//!         let batch = batch?; // arrow_array::RecordBatch
//!         assert_eq!(batch.num_rows(), 256);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`Dataset`], [`Loader`] and [`Writer`] are the API; `examples/read_batches.rs` runs
//! it. Data flows top to bottom through the modules behind it: `source` (where bytes
//! come from) -> `format` (bytes to Arrow record batches) -> `pipeline` (order, shape,
//! parallelism) -> `write` (batches to shards) and `python` (the only module that uses
//! pyo3). Those modules are public for the crate's own benches, tests and fuzzer, and
//! hidden from the documentation: they may change without notice.
#![warn(missing_docs)]

mod api;
#[doc(hidden)]
pub mod batch_bytes;
#[doc(hidden)]
pub mod buffers;
pub mod error;
#[doc(hidden)]
pub mod format;
#[doc(hidden)]
pub mod fuzz;
#[doc(hidden)]
pub mod options;
#[doc(hidden)]
pub mod pipeline;
#[doc(hidden)]
pub mod source;

pub mod text;
#[doc(hidden)]
pub mod write;

#[cfg(feature = "python")]
mod python;

pub use api::{Batches, Dataset, Loader, OpenOptions, Writer};
pub use arrow_array::RecordBatch;
pub use arrow_schema::SchemaRef;
pub use error::{Error, Position, Result};
pub use options::OptionValue;
pub use pipeline::StatsSnapshot;
pub use source::manifest::{Manifest, ManifestShard};

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
/// reused before more is asked of the system.
pub fn keep_freed_memory() {
    #[cfg(not(any(miri, fuzzing)))]
    {
        unsafe extern "C" {
            fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
        }
        /// `mi_option_purge_delay` in mimalloc v2's `mimalloc.h` (the crate does not
        /// name it).
        const PURGE_DELAY: std::ffi::c_int = 15;
        // SAFETY: sets one of mimalloc's options, which it reads atomically.
        unsafe { mi_option_set(PURGE_DELAY, 1000) };
    }
}
