//! The Python binding: the only module that uses pyo3. Thin wrappers that convert
//! arguments, call the core with the GIL released, and convert results:
//! - `open` makes datasets and `dataset` holds `shardflow.Dataset`'s verbs; `loader` is
//!   `DataLoader`; `batch` a batch; `args` converts their arguments;
//! - `to_python` / `from_python` / `arrow_ffi` convert data (numpy, Python objects,
//!   the Arrow PyCapsule interface); `transform` runs Python functions as ops;
//! - `wait` (the consumer's wait), `errors` (exceptions), `fork` (fork handlers).

mod args;
mod arrow_ffi;
mod batch;
mod chat_verbs;
mod column_types;
mod dataset;
mod errors;
mod feature_verbs;
mod fork;
mod from_python;
mod loader;
mod open;
mod report;
mod to_python;
mod tokenizer;
mod transform;
mod wait;

use pyo3::prelude::*;

/// `text` with the secrets of any URL in it masked, for printing.
#[pyfunction]
fn _redact(text: &str) -> String {
    crate::source::redact(text).into_owned()
}

/// Parquet footers carried by an unpickled dataset (see `Dataset.__reduce__`), used in
/// place of reading them again.
#[pyfunction]
fn _give_footers(footers: Vec<(String, u64, Vec<u8>)>) {
    crate::format::parquet_footers::give(
        footers
            .into_iter()
            .map(|(url, size, tail)| (url, size, bytes::Bytes::from(tail)))
            .collect(),
    );
}

#[pymodule]
mod _native {
    #[pymodule_export]
    use super::_give_footers;
    #[pymodule_export]
    use super::_redact;
    #[pymodule_export]
    use super::arrow_ffi::PySchema;
    #[pymodule_export]
    use super::batch::PyRecordBatch;
    #[pymodule_export]
    use super::dataset::{PyDataset, SampleIterator};
    #[pymodule_export]
    use super::loader::{BatchIterator, PyDataLoader};
    #[pymodule_export]
    use super::open::{
        _list_files, _read_file, concatenate, dataset, from_arrow, from_dict, from_list,
        from_pandas, interleave,
    };
    #[pymodule_export]
    use super::to_python::ArrowBufferOwner;
    #[pymodule_export]
    use super::tokenizer::PyTokenizer;

    use pyo3::prelude::*;

    /// `__version__` is the crate's version, compiled in, so the Python package reports
    /// the version of the extension that is really loaded. Fork handlers: see `fork`.
    #[pymodule_init]
    fn init(module: &Bound<'_, PyModule>) -> PyResult<()> {
        super::fork::register(module.py())?;
        crate::allocator::keep_freed_memory();
        crate::allocator::keep_freed_python_memory();
        module.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
