//! The Python binding: the only module that uses pyo3. Thin wrappers that convert
//! arguments, call the core with the GIL released, and convert results.

mod arrow_ffi;
mod batch;
mod dataset;
mod errors;
mod fork;
mod from_python;
mod loader;
mod to_python;
mod transform;

use std::time::Duration;

use arrow_array::RecordBatch;
use pyo3::prelude::*;

use crate::pipeline::{BatchReceiver, Received};

/// How often a waiting consumer wakes to let Ctrl-C through.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Waits for the next batch with the GIL released, raising KeyboardInterrupt promptly.
fn next_batch(py: Python<'_>, receiver: &mut BatchReceiver) -> PyResult<Option<RecordBatch>> {
    loop {
        // A batch that is ready is taken with the GIL held: letting go of the GIL and
        // taking it back cost the consumer's thread (the serial path) at every batch.
        let received = match receiver.try_recv()? {
            Some(received) => received,
            None => py.detach(|| receiver.recv_timeout(SIGNAL_CHECK))?,
        };
        match received {
            Received::Batch(batch) => {
                if let Some(rows) = receiver.stats().take_shuffle_bound_report() {
                    let message = format!(
                        "the shuffle buffer holds only {rows} rows: its byte bound (buffer_bytes) is reached first, which weakens the shuffle; raise buffer_bytes if memory allows"
                    );
                    py.import("warnings")?.call_method1(
                        "warn",
                        (message, py.get_type::<pyo3::exceptions::PyUserWarning>()),
                    )?;
                }
                return Ok(Some(batch));
            }
            Received::End => return Ok(None),
            Received::Timeout => py.check_signals()?,
        }
    }
}

/// `text` with the secrets of any URL in it masked, for printing.
#[pyfunction]
fn _redact(text: &str) -> String {
    crate::source::redact(text).into_owned()
}

#[pymodule]
mod _native {
    #[pymodule_export]
    use super::_redact;
    #[pymodule_export]
    use super::arrow_ffi::PySchema;
    #[pymodule_export]
    use super::batch::PyRecordBatch;
    #[pymodule_export]
    use super::dataset::{
        _list_files, _read_file, PyDataset, SampleIterator, concatenate, dataset, from_arrow,
        from_dict, from_list, from_pandas, interleave,
    };
    #[pymodule_export]
    use super::loader::{BatchIterator, PyDataLoader};
    #[pymodule_export]
    use super::to_python::ArrowBufferOwner;

    use pyo3::prelude::*;

    /// `__version__` is the crate's version, compiled in, so the Python package reports
    /// the version of the extension that is really loaded. Fork handlers: see `fork`.
    #[pymodule_init]
    fn init(module: &Bound<'_, PyModule>) -> PyResult<()> {
        super::fork::register(module.py())?;
        module.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
