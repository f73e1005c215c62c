//! `shardflow.dataset(...)` and `shardflow.Dataset`.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use arrow_array::RecordBatch;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyCapsule, PyDict, PyList, PyString};

use super::arrow_ffi::{schema_from_py, stream_capsule};
use super::next_batch;
use super::to_python::batch_to_rows;
use super::transform::{Kind, PyTransform};
use crate::format::example::{FeatureSpec, Kind as ExampleKind, Missing, Shape, Values};
use crate::format::options::{FormatOptions, OptionValue};
use crate::format::{OnError, ReadOptions};
use crate::pipeline::{self, BatchReceiver, Dataset, Op, RunOptions, Stats};

/// Rows per call of a batched `map` when the user gives no `batch_size` (as in
/// Hugging Face `datasets`).
const DEFAULT_MAP_BATCH: usize = 1000;

#[pyclass(frozen, name = "Dataset", module = "shardflow")]
pub struct PyDataset {
    pub(crate) inner: Dataset,
}

/// Paths given as str, os.PathLike or a list of them.
fn source_list(source: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let fspath = |item: &Bound<'_, PyAny>| -> PyResult<String> {
        let os = item.py().import("os")?;
        os.call_method1("fspath", (item,))?
            .extract::<String>()
            .map_err(|_| PyTypeError::new_err("source paths must be str or os.PathLike"))
    };
    if source.is_instance_of::<PyString>() || source.hasattr("__fspath__")? {
        return Ok(vec![fspath(source)?]);
    }
    if source.is_instance_of::<PyList>() || source.is_instance_of::<pyo3::types::PyTuple>() {
        return source.try_iter()?.map(|item| fspath(&item?)).collect();
    }
    Err(PyTypeError::new_err(
        "source must be a path, URL, pattern, or a list of them",
    ))
}

/// A fresh seed for a shuffle the user gave no seed: fixed for the object's lifetime.
pub fn random_seed() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

fn non_negative(name: &str, n: i64) -> PyResult<u64> {
    u64::try_from(n).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {n}")))
}

fn check_callable(func: &Bound<'_, PyAny>) -> PyResult<()> {
    if func.is_callable() {
        Ok(())
    } else {
        Err(PyTypeError::new_err("expected a callable"))
    }
}

/// Opens a dataset from paths, `file://` URLs, globs (`data/*.parquet`), brace ranges
/// (`shard-{000..099}.parquet`) or a list of these.
#[pyfunction]
#[pyo3(signature = (source, format=None, *, columns=None, schema=None, features=None, format_options=None, on_error="raise"))]
#[allow(clippy::too_many_arguments)]
pub fn dataset(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    format: Option<String>,
    columns: Option<Vec<String>>,
    schema: Option<&Bound<'_, PyAny>>,
    features: Option<&Bound<'_, PyDict>>,
    format_options: Option<&Bound<'_, PyDict>>,
    on_error: &str,
) -> PyResult<PyDataset> {
    let specs = source_list(source)?;
    let options = ReadOptions {
        columns,
        schema: schema.map(schema_from_py).transpose()?,
        features: features.map(feature_specs).transpose()?,
        format_options: format_options
            .map(parse_format_options)
            .transpose()?
            .unwrap_or_default(),
        on_error: OnError::parse(on_error)?,
    };
    let inner = py.detach(|| Dataset::open(&specs, format.as_deref(), options))?;
    Ok(PyDataset { inner })
}

fn parse_format_options(options: &Bound<'_, PyDict>) -> PyResult<FormatOptions> {
    let mut map = std::collections::BTreeMap::new();
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        // bool first: Python's bool is an int.
        let value = if value.is_instance_of::<PyBool>() {
            OptionValue::Bool(value.extract()?)
        } else if let Ok(i) = value.extract::<i64>() {
            OptionValue::Int(i)
        } else if let Ok(s) = value.extract::<String>() {
            OptionValue::Str(s)
        } else {
            return Err(PyTypeError::new_err(format!(
                "format_options[{key:?}] must be a bool, int or str"
            )));
        };
        map.insert(key, value);
    }
    Ok(FormatOptions(map))
}

fn example_kind(dtype: &Bound<'_, PyAny>) -> PyResult<ExampleKind> {
    // A string, or a tf.DType (whose .name is the string).
    let name: String = match dtype.extract() {
        Ok(name) => name,
        Err(_) => dtype.getattr("name")?.extract()?,
    };
    match name.as_str() {
        "float32" | "float" => Ok(ExampleKind::Float),
        "int64" => Ok(ExampleKind::Int64),
        "bytes" | "string" | "str" => Ok(ExampleKind::Bytes),
        other => Err(PyValueError::new_err(format!(
            "a tf.train.Example holds float32, int64 or bytes values, not {other:?}"
        ))),
    }
}

fn default_values(
    py: Python<'_>,
    kind: ExampleKind,
    default: &Bound<'_, PyAny>,
) -> PyResult<Values> {
    let flat = py
        .import("numpy")?
        .call_method1("ravel", (default,))?
        .call_method0("tolist")?;
    Ok(match kind {
        ExampleKind::Float => Values::Float(flat.extract()?),
        ExampleKind::Int64 => Values::Int64(flat.extract()?),
        ExampleKind::Bytes => Values::Bytes(
            flat.try_iter()?
                .map(|v| {
                    let v = v?;
                    match v.extract::<String>() {
                        Ok(s) => Ok(s.into_bytes()),
                        Err(_) => v.extract::<Vec<u8>>(),
                    }
                })
                .collect::<PyResult<_>>()?,
        ),
    })
}

/// `{name: FixedLen | VarLen | tf.io.FixedLenFeature | tf.io.VarLenFeature}`.
fn feature_specs(features: &Bound<'_, PyDict>) -> PyResult<Vec<FeatureSpec>> {
    let py = features.py();
    let mut specs = Vec::with_capacity(features.len());
    for (name, spec) in features.iter() {
        let name: String = name.extract()?;
        let class = spec.get_type().name()?.to_string();
        let kind = example_kind(&spec.getattr("dtype")?)?;
        let (shape, missing) = match class.as_str() {
            "FixedLen" | "FixedLenFeature" => {
                let dims: Vec<usize> = spec
                    .getattr("shape")?
                    .try_iter()?
                    .map(|d| d?.extract::<usize>())
                    .collect::<PyResult<_>>()?;
                let default = if spec.hasattr("default_value")? {
                    spec.getattr("default_value")?
                } else {
                    spec.getattr("default")?
                };
                let missing = if default.is_none() {
                    Missing::Error
                } else {
                    Missing::Default(default_values(py, kind, &default)?)
                };
                (Shape::Fixed(dims), missing)
            }
            "VarLen" | "VarLenFeature" => (Shape::Var, Missing::Empty),
            other => {
                return Err(PyTypeError::new_err(format!(
                    "features[{name:?}] is a {other}; use shardflow.FixedLen / VarLen or tf.io.FixedLenFeature / VarLenFeature"
                )));
            }
        };
        specs.push(FeatureSpec {
            name,
            kind,
            shape,
            missing,
        });
    }
    Ok(specs)
}

impl PyDataset {
    fn with(&self, op: Op) -> PyDataset {
        PyDataset {
            inner: self.inner.with_op(op),
        }
    }

    fn transform(&self, func: &Bound<'_, PyAny>, kind: Kind) -> PyResult<PyDataset> {
        check_callable(func)?;
        Ok(self.with(Op::Transform(Arc::new(PyTransform {
            func: func.clone().unbind(),
            kind,
        }))))
    }

    /// Starts one pass over the dataset's records, in decoded batches.
    pub fn start(&self, py: Python<'_>) -> PyResult<BatchReceiver> {
        let run = RunOptions::default();
        let ds = self.inner.clone();
        Ok(py.detach(|| ds.start(run, Arc::new(Stats::default())))?)
    }
}

#[pymethods]
impl PyDataset {
    /// Shuffles shard order (seeded, new each epoch) and rows through a buffer of
    /// `buffer_size` rows.
    #[pyo3(signature = (seed=None, buffer_size=None))]
    fn shuffle(&self, seed: Option<u64>, buffer_size: Option<usize>) -> PyResult<PyDataset> {
        let buffer_rows = buffer_size.unwrap_or(pipeline::DEFAULT_SHUFFLE_BUFFER);
        if buffer_rows == 0 {
            return Err(PyValueError::new_err("buffer_size must be at least 1"));
        }
        Ok(self.with(Op::Shuffle {
            seed: seed.unwrap_or_else(random_seed),
            buffer_rows,
        }))
    }

    fn take(&self, n: i64) -> PyResult<PyDataset> {
        Ok(self.with(Op::Take(non_negative("n", n)?)))
    }

    fn skip(&self, n: i64) -> PyResult<PyDataset> {
        Ok(self.with(Op::Skip(non_negative("n", n)?)))
    }

    /// Keeps the samples for which `fn(sample)` is true.
    fn filter(&self, func: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
        self.transform(func, Kind::Filter)
    }

    /// `fn(sample) -> dict`, or with `batched=True`, `fn(batch) -> dict of columns` on
    /// `batch_size` rows at a time (default 1000).
    #[pyo3(signature = (func, batched=false, batch_size=None))]
    fn map(
        &self,
        func: &Bound<'_, PyAny>,
        batched: bool,
        batch_size: Option<usize>,
    ) -> PyResult<PyDataset> {
        let kind = match (batched, batch_size) {
            (false, None) => Kind::Map,
            (false, Some(_)) => {
                return Err(PyValueError::new_err(
                    "batch_size= is only used with batched=True",
                ));
            }
            (true, Some(0)) => return Err(PyValueError::new_err("batch_size must be at least 1")),
            (true, rows) => Kind::MapBatched {
                batch_rows: rows.unwrap_or(DEFAULT_MAP_BATCH),
            },
        };
        self.transform(func, kind)
    }

    /// `fn(sample) -> iterable of samples`.
    fn flat_map(&self, func: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
        self.transform(func, Kind::FlatMap)
    }

    /// Number of samples, where metadata tells it (Parquet) and no filter hides it.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let rows = py.detach(|| self.inner.num_rows())?;
        match rows {
            Some(rows) => Ok(rows as usize),
            None => Err(PyTypeError::new_err(format!(
                "the length of this {} dataset is not known without reading it",
                self.inner.format_name()
            ))),
        }
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<SampleIterator> {
        Ok(SampleIterator {
            receiver: Some(self.start(py)?),
            rows: VecDeque::new(),
        })
    }

    /// The shard files, in read order before shuffling.
    #[getter]
    fn shards(&self) -> Vec<String> {
        self.inner.shards().iter().map(|s| s.url.clone()).collect()
    }

    #[getter]
    fn format(&self) -> &'static str {
        self.inner.format_name()
    }

    /// Column names of the records (before any map/flat_map changes them).
    #[getter]
    fn column_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let schema = py.detach(|| self.inner.source_schema())?;
        Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
    }

    /// One pass over the records as an Arrow stream (e.g. `pyarrow.RecordBatchReader.from_stream(ds)`).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The protocol lets a producer ignore the request; consumers cast.
        let _ = requested_schema;
        let fallback = if self.inner.keeps_source_schema() {
            Some(py.detach(|| self.inner.source_schema())?)
        } else {
            None
        };
        stream_capsule(py, self.start(py)?, fallback)
    }

    fn __repr__(&self) -> String {
        let ops: Vec<String> = self
            .inner
            .ops()
            .iter()
            .map(|op| format!("{op:?}"))
            .collect();
        format!(
            "shardflow.Dataset(format={}, shards={}, ops=[{}])",
            self.inner.format_name(),
            self.inner.shards().len(),
            ops.join(", ")
        )
    }
}

/// Yields one dict per sample.
#[pyclass(name = "SampleIterator", module = "shardflow")]
pub struct SampleIterator {
    receiver: Option<BatchReceiver>,
    rows: VecDeque<Py<PyDict>>,
}

#[pymethods]
impl SampleIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyDict>>> {
        loop {
            if let Some(row) = self.rows.pop_front() {
                return Ok(Some(row));
            }
            let Some(receiver) = self.receiver.as_mut() else {
                return Ok(None);
            };
            let batch: Option<RecordBatch> =
                next_batch(py, receiver).inspect_err(|_| self.receiver = None)?;
            match batch {
                Some(batch) => self
                    .rows
                    .extend(batch_to_rows(py, &batch)?.into_iter().map(Bound::unbind)),
                None => self.receiver = None,
            }
        }
    }
}
