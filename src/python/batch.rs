//! `shardflow.RecordBatch`: one batch in Arrow form, exportable without copying.

use arrow_array::RecordBatch;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyTuple};

use super::arrow_ffi;
use super::to_python::{batch_to_numpy, batch_to_pydict, batch_to_rows};

/// A batch as Arrow columns (`DataLoader(..., output="arrow")`): exported through the
/// Arrow PyCapsule interface without a copy, or turned into rows with `to_pylist()`.
#[pyclass(frozen, name = "RecordBatch", module = "shardflow")]
pub struct PyRecordBatch {
    pub(crate) batch: RecordBatch,
}

impl PyRecordBatch {
    /// The first `rows` rows as Arrow consumers get them: binary values a shuffle left
    /// as views of its sources copied out into the column's own type.
    fn exported(&self, rows: usize) -> PyResult<RecordBatch> {
        Ok(crate::pipeline::unviewed(&self.batch.slice(0, rows))?)
    }
}

#[pymethods]
impl PyRecordBatch {
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    /// `dict[str, np.ndarray]`; numeric columns share memory with this batch.
    fn to_numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        batch_to_numpy(py, &self.batch)
    }

    /// `dict[str, list]` of Python values.
    fn to_pydict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        batch_to_pydict(py, &self.batch)
    }

    /// One dict per row.
    fn to_pylist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, batch_to_rows(py, &self.batch)?)
    }

    /// A `pyarrow.RecordBatch` sharing this batch's memory (needs pyarrow).
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("pyarrow")?
            .call_method1("record_batch", (slf,))
    }

    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        arrow_ffi::schema_capsule(py, self.exported(0)?.schema().as_ref())
    }

    /// `requested_schema` may be ignored by a producer under the protocol; callers cast.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        arrow_ffi::batch_capsules(py, &self.exported(self.batch.num_rows())?)
    }

    fn __repr__(&self) -> String {
        let schema = match self.exported(0) {
            Ok(empty) => empty.schema(),
            Err(_) => self.batch.schema(),
        };
        let cols: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect();
        format!(
            "shardflow.RecordBatch(num_rows={}, columns=[{}])",
            self.batch.num_rows(),
            cols.join(", ")
        )
    }
}
