//! User functions (`filter`, `map`, `flat_map`) run by the pipeline thread, which takes
//! the GIL for each batch.

use arrow_array::{BooleanArray, RecordBatch};
use arrow_select::filter::filter_record_batch;
use pyo3::prelude::*;

use super::errors::callback_error;
use super::from_python::{columns_to_batch, rows_to_batch};
use super::to_python::{batch_to_numpy, batch_to_rows};
use crate::error::{Error, Result};
use crate::pipeline::BatchTransform;

pub enum Kind {
    /// Keep the samples for which `fn(sample)` is true.
    Filter,
    /// `fn(sample) -> sample`.
    Map,
    /// `fn(batch: dict[str, np.ndarray]) -> dict of columns` on `batch_rows` rows at a time.
    MapBatched { batch_rows: usize },
    /// `fn(sample) -> iterable of samples`.
    FlatMap,
}

pub struct PyTransform {
    pub func: Py<PyAny>,
    pub kind: Kind,
}

fn with_gil<T>(f: impl FnOnce(Python<'_>) -> PyResult<T>) -> Result<T> {
    Python::try_attach(|py| f(py).map_err(callback_error)).unwrap_or_else(|| {
        Err(Error::Internal(
            "the Python interpreter is shutting down".into(),
        ))
    })
}

impl BatchTransform for PyTransform {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        with_gil(|py| {
            let func = self.func.bind(py);
            let out = match self.kind {
                Kind::Filter => {
                    let keep = batch_to_rows(py, &batch)?
                        .into_iter()
                        .map(|row| func.call1((row,))?.is_truthy())
                        .collect::<PyResult<Vec<bool>>>()?;
                    filter_record_batch(&batch, &BooleanArray::from(keep))
                        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?
                }
                Kind::Map => {
                    let results = batch_to_rows(py, &batch)?
                        .into_iter()
                        .map(|row| func.call1((row,)))
                        .collect::<PyResult<Vec<_>>>()?;
                    rows_to_batch(py, &results)?
                }
                Kind::MapBatched { .. } => {
                    columns_to_batch(py, &func.call1((batch_to_numpy(py, &batch)?,))?)?
                }
                Kind::FlatMap => {
                    let mut results = Vec::new();
                    for row in batch_to_rows(py, &batch)? {
                        for item in func.call1((row,))?.try_iter()? {
                            results.push(item?);
                        }
                    }
                    rows_to_batch(py, &results)?
                }
            };
            Ok(vec![out])
        })
    }

    fn preserves_rows(&self) -> bool {
        matches!(self.kind, Kind::Map)
    }

    fn batch_rows(&self) -> Option<usize> {
        match self.kind {
            Kind::MapBatched { batch_rows } => Some(batch_rows),
            _ => None,
        }
    }
}
