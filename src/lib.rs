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

mod allocator;
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
pub mod latency;
#[doc(hidden)]
pub mod mapped;
#[doc(hidden)]
pub mod options;
#[doc(hidden)]
pub mod pipeline;
#[doc(hidden)]
pub mod source;

pub mod text;
#[doc(hidden)]
pub mod trace;
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
