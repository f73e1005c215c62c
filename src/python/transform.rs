//! User functions (`filter`, `map`, `flat_map`) run by the pipeline thread, which takes
//! the GIL for each batch.

use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use arrow_select::filter::filter_record_batch;
use pyo3::prelude::*;

use super::errors::callback_error;
use super::fork;
use super::from_python::{columns_to_batch, rows_to_batch};
use super::to_python::{batch_to_numpy, batch_to_rows};
use crate::error::{Error, Result};
use crate::pipeline::BatchTransform;

pub enum Kind {
    /// Keep the samples for which `fn(sample)` is true.
    Filter,
    /// Keep the rows for which `fn(batch)`, given `batch_rows` rows at a time (see
    /// `Columns`), gives true.
    FilterBatched { batch_rows: usize, columns: Columns },
    /// `fn(sample) -> dict`, merged into the sample (as `datasets` does).
    Map,
    /// `fn(batch) -> dict of columns` on `batch_rows` rows at a time, merged into the
    /// batch.
    MapBatched { batch_rows: usize, columns: Columns },
    /// `fn(sample) -> iterable of samples`.
    FlatMap,
}

/// What a batched function gets: a dict of columns, each a list (as `datasets` gives
/// it) or a numpy array (`batch_format="numpy"`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Columns {
    Lists,
    Numpy,
}

pub struct PyTransform {
    /// Dropped with the GIL (see `Drop`).
    func: ManuallyDrop<Py<PyAny>>,
    pub kind: Kind,
    /// e.g. `map(train.normalize)`: names the function in errors and fingerprints.
    pub name: String,
    /// The schema of every batch the function returns: given (`schema=`), or that of
    /// the first one. Later batches are cast to it where no value can change.
    pub schema: OnceLock<SchemaRef>,
    /// Whether the user gave the schema: then every batch is cast to it, and a value
    /// that does not fit is an error naming it.
    declared: bool,
    /// A map's input columns left out of its output (`remove_columns=`).
    remove_columns: Vec<String>,
    /// The function takes each row's index after the row (`with_indices=True`).
    with_indices: bool,
}

impl PyTransform {
    pub fn new(func: &Bound<'_, PyAny>, kind: Kind, schema: Option<SchemaRef>) -> Self {
        let verb = match kind {
            Kind::Filter => "filter",
            Kind::FilterBatched { .. } => "filter(batched)",
            Kind::Map => "map",
            Kind::MapBatched { .. } => "map(batched)",
            Kind::FlatMap => "flat_map",
        };
        let qualname = |attr: &str| func.getattr(attr).and_then(|v| v.extract::<String>()).ok();
        let function = match (qualname("__module__"), qualname("__qualname__")) {
            (Some(module), Some(name)) => format!("{module}.{name}"),
            (None, Some(name)) => name,
            _ => func
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into()),
        };
        let fixed = OnceLock::new();
        let declared = schema.is_some();
        if let Some(schema) = schema {
            let _ = fixed.set(schema);
        }
        Self {
            func: ManuallyDrop::new(func.clone().unbind()),
            kind,
            name: format!("{verb}({function})"),
            schema: fixed,
            declared,
            remove_columns: Vec::new(),
            with_indices: false,
        }
    }

    /// A function that takes each row's index too (the row's, or the batch's list).
    pub fn indexed(mut self, with_indices: bool) -> Self {
        self.with_indices = with_indices;
        self
    }

    /// `batch` without its index column, and the indices (see `wants_indices`).
    fn split_indices<'py>(
        &self,
        py: Python<'py>,
        batch: RecordBatch,
    ) -> PyResult<(RecordBatch, Option<Vec<u64>>)> {
        if !self.with_indices {
            return Ok((batch, None));
        }
        let mut batch = batch;
        let at = batch
            .schema()
            .index_of(crate::pipeline::rows::INDEX_COLUMN)
            .map_err(|_| {
                pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "{}: rows came without their indices",
                    self.name
                ))
            })?;
        let column = batch.remove_column(at);
        let indices = column
            .as_any()
            .downcast_ref::<arrow_array::UInt64Array>()
            .map(|a| a.values().to_vec())
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("row indices of another type")
            })?;
        let _ = py;
        Ok((batch, Some(indices)))
    }

    /// The same transform calling `call` (the user's function wrapped to take its
    /// `fn_kwargs` or `input_columns`) in place of the function it is named after.
    pub fn calling(mut self, call: &Bound<'_, PyAny>) -> Self {
        // SAFETY: the old function is not used again (dropped here, with the GIL).
        drop(unsafe { ManuallyDrop::take(&mut self.func) });
        self.func = ManuallyDrop::new(call.clone().unbind());
        self
    }

    /// A map that leaves `columns` of its input out of its output.
    pub fn removing(mut self, columns: Vec<String>) -> Self {
        if !columns.is_empty() {
            self.name = format!("{}, remove_columns={columns:?}", self.name);
        }
        self.remove_columns = columns;
        self
    }

    /// A map's output: the input's columns, less `remove_columns`, with those the
    /// function returned put in their place, and its new columns after them (as
    /// `datasets` updates each example with the function's dict).
    fn merge(&self, input: &RecordBatch, out: RecordBatch) -> Result<RecordBatch> {
        let input_schema = input.schema();
        let out_schema = out.schema();
        if let Some(missing) = self
            .remove_columns
            .iter()
            .find(|c| input_schema.index_of(c).is_err())
        {
            return Err(Error::Schema {
                url: self.name.clone(),
                message: format!(
                    "remove_columns names {missing:?}, which is not a column; the columns are {:?}",
                    crate::format::field_names(&input_schema)
                ),
            });
        }
        let kept: Vec<usize> = (0..input.num_columns())
            .filter(|&i| {
                let name = input_schema.field(i).name();
                !self.remove_columns.contains(name) && out_schema.index_of(name).is_err()
            })
            .collect();
        if !kept.is_empty() && input.num_rows() != out.num_rows() {
            return Err(Error::Schema {
                url: self.name.clone(),
                message: format!(
                    "the function returned {} rows for {}; a batched map that changes the number of rows must remove the input columns it does not return (remove_columns=[...]), as in datasets",
                    out.num_rows(),
                    input.num_rows()
                ),
            });
        }
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        for (i, field) in input_schema.fields().iter().enumerate() {
            if self.remove_columns.contains(field.name()) {
                continue;
            }
            match out_schema.index_of(field.name()) {
                Ok(j) => {
                    fields.push(out_schema.field(j).clone());
                    columns.push(out.column(j).clone());
                }
                Err(_) if kept.contains(&i) => {
                    fields.push(field.as_ref().clone());
                    columns.push(input.column(i).clone());
                }
                Err(_) => {}
            }
        }
        for (j, field) in out_schema.fields().iter().enumerate() {
            let replaced = input_schema.index_of(field.name()).is_ok()
                && !self.remove_columns.contains(field.name());
            if !replaced {
                fields.push(field.as_ref().clone());
                columns.push(out.column(j).clone());
            }
        }
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(out.num_rows()));
        RecordBatch::try_new_with_options(
            std::sync::Arc::new(arrow_schema::Schema::new(fields)),
            columns,
            &options,
        )
        .map_err(|e| Error::Schema {
            url: self.name.clone(),
            message: e.to_string(),
        })
    }

    /// `batch` with this transform's one schema: the first batch sets it; later batches
    /// are cast to it where that loses nothing, else it is a schema error naming the
    /// column and both types.
    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if batch.num_rows() == 0 && self.schema.get().is_none() {
            // Dropped downstream; an empty batch's inferred types say nothing.
            return Ok(batch);
        }
        let schema = self.schema.get_or_init(|| batch.schema());
        if batch.num_rows() == 0 {
            // A batch the function returned nothing for has no keys to check.
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        if batch.schema().fields() == schema.fields() {
            return Ok(batch);
        }
        let mismatch = |message: String| Error::Schema {
            url: self.name.clone(),
            message,
        };
        let got = batch.schema();
        let names = |s: &SchemaRef| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        if names(&got) != names(schema) {
            return Err(mismatch(format!(
                "a batch has columns {:?}, but the dataset's are {:?}; every sample must return the same keys",
                names(&got),
                names(schema)
            )));
        }
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            let from = column.data_type();
            if from == field.data_type() {
                columns.push(column.clone());
                continue;
            }
            if !self.declared && !widens(from, field.data_type()) {
                return Err(mismatch(format!(
                    "column {:?} is {from} in a later batch but {} in the first; give schema= to choose the type",
                    field.name(),
                    field.data_type()
                )));
            }
            let options = arrow_cast::CastOptions {
                safe: false,
                ..Default::default()
            };
            columns.push(
                arrow_cast::cast_with_options(column, field.data_type(), &options).map_err(
                    |e| {
                        mismatch(format!(
                            "column {:?} does not fit the {} that schema= gives it: {e}",
                            field.name(),
                            field.data_type()
                        ))
                    },
                )?,
            );
        }
        RecordBatch::try_new(schema.clone(), columns).map_err(|e| mismatch(e.to_string()))
    }
}

/// Whether every value of type `from` has an equal value of type `to` (integers into
/// wider integers or floats, narrower floats into wider, nulls into anything; lists and
/// structs of such).
fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType as T;
    let int_width = |t: &T| match t {
        T::Int8 => Some((8, true)),
        T::Int16 => Some((16, true)),
        T::Int32 => Some((32, true)),
        T::Int64 => Some((64, true)),
        T::UInt8 => Some((8, false)),
        T::UInt16 => Some((16, false)),
        T::UInt32 => Some((32, false)),
        T::UInt64 => Some((64, false)),
        _ => None,
    };
    let float_width = |t: &T| match t {
        T::Float16 => Some(16),
        T::Float32 => Some(32),
        T::Float64 => Some(64),
        _ => None,
    };
    if from == to || from == &T::Null {
        return true;
    }
    match (from, to) {
        (T::Utf8, T::LargeUtf8) | (T::Binary, T::LargeBinary) => true,
        (T::List(a) | T::LargeList(a), T::List(b) | T::LargeList(b)) => {
            widens(a.data_type(), b.data_type())
        }
        (T::FixedSizeList(a, n), T::FixedSizeList(b, m)) => {
            n == m && widens(a.data_type(), b.data_type())
        }
        (T::Struct(a), T::Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.name() == y.name() && widens(x.data_type(), y.data_type()))
        }
        _ => match (
            int_width(from),
            int_width(to),
            float_width(from),
            float_width(to),
        ) {
            (Some((w1, s1)), Some((w2, s2)), _, _) => {
                (s1 == s2 && w2 >= w1) || (!s1 && s2 && w2 > w1)
            }
            (Some(_), None, _, Some(_)) => true,
            (None, None, Some(w1), Some(w2)) => w2 >= w1,
            _ => false,
        },
    }
}

/// A batch as the dict of columns a batched function gets.
fn columns_of<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
    columns: Columns,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    match columns {
        Columns::Numpy => batch_to_numpy(py, batch),
        Columns::Lists => {
            let dict = pyo3::types::PyDict::new(py);
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                let values = super::to_python::column_to_py(py, column.as_ref())?;
                dict.set_item(field.name(), pyo3::types::PyList::new(py, values)?)?;
            }
            Ok(dict)
        }
    }
}

fn with_gil<T>(f: impl FnOnce(Python<'_>) -> PyResult<T>) -> Result<T> {
    fork::attach(|py| f(py).map_err(callback_error)).unwrap_or_else(|| {
        Err(Error::Internal(
            "the Python interpreter is shutting down".into(),
        ))
    })
}

impl Drop for PyTransform {
    fn drop(&mut self) {
        // The last reference often goes on a pipeline thread. Dropped there without the
        // GIL, the function would go on pyo3's list of deferred decrefs, under a lock
        // that a fork could copy taken (see `fork`).
        // SAFETY: `func` is not used again.
        let func = unsafe { ManuallyDrop::take(&mut self.func) };
        let _ = fork::attach(move |_py| drop(func));
    }
}

impl PyTransform {
    /// The filter's verdict on each row of `batch`.
    fn mask(&self, py: Python<'_>, batch: &RecordBatch) -> PyResult<BooleanArray> {
        let func = self.func.bind(py);
        let (batch, indices) = self.split_indices(py, batch.clone())?;
        let batch = &batch;
        let keep = match self.kind {
            Kind::FilterBatched { columns, .. } => {
                let input = columns_of(py, batch, columns)?;
                let verdicts = match &indices {
                    Some(indices) => func.call1((input, indices.clone()))?,
                    None => func.call1((input,))?,
                };
                let keep = verdicts
                    .try_iter()?
                    .map(|v| v?.is_truthy())
                    .collect::<PyResult<Vec<bool>>>()?;
                if keep.len() != batch.num_rows() {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "{}: the function gave {} verdicts for {} rows; a batched filter gives one per row",
                        self.name,
                        keep.len(),
                        batch.num_rows()
                    )));
                }
                keep
            }
            _ => batch_to_rows(py, batch)?
                .into_iter()
                .enumerate()
                .map(|(i, row)| {
                    match &indices {
                        Some(indices) => func.call1((row, indices[i])),
                        None => func.call1((row,)),
                    }?
                    .is_truthy()
                })
                .collect::<PyResult<Vec<bool>>>()?,
        };
        Ok(BooleanArray::from(keep))
    }
}

impl BatchTransform for PyTransform {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        with_gil(|py| {
            let func = self.func.bind(py);
            if matches!(self.kind, Kind::Filter | Kind::FilterBatched { .. }) {
                let keep = self.mask(py, &batch)?;
                let (batch, _) = self.split_indices(py, batch)?;
                let kept = filter_record_batch(&batch, &keep)
                    .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
                return Ok((kept, batch));
            }
            let (batch, indices) = self.split_indices(py, batch)?;
            let out = match self.kind {
                Kind::Filter | Kind::FilterBatched { .. } => unreachable!("filtered above"),
                Kind::Map => {
                    let results = batch_to_rows(py, &batch)?
                        .into_iter()
                        .enumerate()
                        .map(|(i, row)| match &indices {
                            Some(indices) => func.call1((row, indices[i])),
                            None => func.call1((row,)),
                        })
                        .collect::<PyResult<Vec<_>>>()?;
                    rows_to_batch(py, &results)?
                }
                Kind::MapBatched { columns, .. } => {
                    let columns = columns_of(py, &batch, columns)?;
                    let out = match &indices {
                        Some(indices) => func.call1((columns, indices.clone()))?,
                        None => func.call1((columns,))?,
                    };
                    columns_to_batch(py, &out)?
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
            Ok((out, batch))
        })
        .and_then(|(out, input)| match self.kind {
            Kind::Filter | Kind::FilterBatched { .. } => Ok(vec![out]),
            Kind::FlatMap => Ok(vec![self.conform(out)?]),
            Kind::Map | Kind::MapBatched { .. } => {
                Ok(vec![self.merge(&input, self.conform(out)?)?])
            }
        })
    }

    fn filters(&self) -> bool {
        matches!(self.kind, Kind::Filter | Kind::FilterBatched { .. })
    }

    fn wants_indices(&self) -> bool {
        self.with_indices
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        // A filter keeps the rows' columns as they are.
        self.filters().then(|| input.clone())
    }

    fn keep(&self, batch: &RecordBatch) -> Option<Result<BooleanArray>> {
        self.filters().then(|| with_gil(|py| self.mask(py, batch)))
    }

    fn preserves_rows(&self) -> bool {
        matches!(self.kind, Kind::Map)
    }

    fn batch_rows(&self) -> Option<usize> {
        match self.kind {
            Kind::MapBatched { batch_rows, .. } | Kind::FilterBatched { batch_rows, .. } => {
                Some(batch_rows)
            }
            _ => None,
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn runs_python(&self) -> bool {
        true
    }
}
