//! shardflow: a data loader for machine learning. Data flows top to bottom:
//! `source` (where bytes come from) -> `format` (bytes to Arrow record batches) ->
//! `pipeline` (order, shape, parallelism) -> `python` (the only module that uses pyo3).

pub mod error;
pub mod format;
pub mod options;
pub mod pipeline;
pub mod source;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
pub use pipeline::{Dataset, RunOptions, Stats};
