//! The functions that make a `shardflow.Dataset`: `dataset(...)` over files, the
//! in-memory constructors (`from_arrow`, `from_pandas`, `from_dict`, `from_list`), and
//! the combinations (`concatenate`, `interleave`); also the file listing and reading
//! that `load_dataset` builds on.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::args::{DEFAULT_SEED, feature_specs, parse_options, source_list, storage_from};
use super::arrow_ffi::{batches_from_py, schema_from_py};
use super::dataset::PyDataset;
use super::from_python::{columns_to_batch, rows_to_batch};
use crate::format::{OnError, ReadOptions};
use crate::pipeline::{self, Dataset};
use crate::source::ShardMeta;

/// Opens a dataset from paths, `file://` URLs, globs (`data/*.parquet`), brace ranges
/// (`shard-{000..099}.parquet`) or a list of these.
///
/// `decoded_cache` (a directory, or `True` for `decoded/` under the cache directory)
/// keeps each unit decoded once as an Arrow file there, mapped by every later read
/// instead of decoding it again (see the Performance page).
#[pyfunction]
#[pyo3(signature = (source, format=None, *, columns=None, schema=None, features=None, format_options=None, storage_options=None, on_error="raise", decoded_cache=None, _listing=None))]
#[allow(clippy::too_many_arguments)]
pub fn dataset(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    format: Option<String>,
    columns: Option<Vec<String>>,
    schema: Option<&Bound<'_, PyAny>>,
    features: Option<&Bound<'_, PyDict>>,
    format_options: Option<&Bound<'_, PyDict>>,
    storage_options: Option<&Bound<'_, PyDict>>,
    on_error: &str,
    decoded_cache: Option<&Bound<'_, PyAny>>,
    _listing: Option<Vec<(String, Option<u64>, Option<String>)>>,
) -> PyResult<PyDataset> {
    let specs = source_list(source)?;
    let listing = _listing.map(|entries| {
        entries
            .into_iter()
            .map(|(url, size, etag)| ShardMeta {
                url,
                size,
                etag,
                rows: None,
            })
            .collect()
    });
    let columns_arg = columns.clone();
    let options = ReadOptions {
        columns,
        schema: schema.map(schema_from_py).transpose()?,
        features: features.map(feature_specs).transpose()?,
        format_options: format_options
            .map(parse_options)
            .transpose()?
            .unwrap_or_default(),
        on_error: OnError::parse(on_error)?,
        images: None,
        media_features: Default::default(),
        decoded_cache: decoded_cache_dir(decoded_cache)?,
    };
    let storage = storage_from(storage_options)?;
    let inner =
        py.detach(|| Dataset::open_listed(&specs, listing, format.as_deref(), options, storage))?;
    // A remote listing travels with the pickled recipe, so that worker processes (and
    // every rank's spawned workers) list nothing: listings are what rate limits count.
    // Not a manifest's (its shards know their rows): the manifest is read again.
    let shards = inner.shards();
    let listed_remotely = shards
        .iter()
        .all(|s| crate::source::local_path(&s.url).is_none() && s.rows.is_none());
    let listing = listed_remotely.then(|| {
        shards
            .into_iter()
            .map(|s| (s.url, s.size, s.etag))
            .collect::<Vec<_>>()
    });
    let kwargs = PyDict::new(py);
    kwargs.set_item("source", source)?;
    kwargs.set_item("format", format)?;
    kwargs.set_item("columns", columns_arg)?;
    kwargs.set_item("schema", schema)?;
    kwargs.set_item("features", features)?;
    kwargs.set_item("format_options", format_options)?;
    kwargs.set_item("storage_options", storage_options)?;
    kwargs.set_item("on_error", on_error)?;
    kwargs.set_item("decoded_cache", decoded_cache)?;
    kwargs.set_item("_listing", listing)?;
    Ok(PyDataset {
        inner,
        recipe: vec![("dataset", kwargs.into_any().unbind())],
        access: Default::default(),
        epoch: Default::default(),
    })
}

/// The directory of `decoded_cache=`: a path, or `True` for `decoded/` under the user's
/// cache directory (`$SHARDFLOW_CACHE_DIR`, else `~/.cache/shardflow`).
fn decoded_cache_dir(given: Option<&Bound<'_, PyAny>>) -> PyResult<Option<std::path::PathBuf>> {
    let Some(given) = given.filter(|g| !g.is_none()) else {
        return Ok(None);
    };
    if let Ok(flag) = given.extract::<bool>() {
        return match flag {
            false => Ok(None),
            true => crate::format::index::user_cache_dir()
                .map(|d| Some(d.join("decoded")))
                .ok_or_else(|| {
                    PyValueError::new_err(
                        "decoded_cache=True needs a cache directory: set SHARDFLOW_CACHE_DIR or HOME, or pass a path",
                    )
                }),
        };
    }
    Ok(Some(given.extract::<std::path::PathBuf>()?))
}

/// The files `source` names, as `dataset(source)` lists them: `(url, size, version)` each
/// (`load_dataset` resolves a repo's splits from this, and passes it on as `_listing`).
#[pyfunction]
#[pyo3(signature = (source, storage_options=None))]
pub fn _list_files(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(String, Option<u64>, Option<String>)>> {
    let specs = source_list(source)?;
    let storage = storage_from(storage_options)?;
    let shards = py.detach(|| crate::source::resolve(&specs, &storage))?;
    Ok(shards
        .into_iter()
        .map(|s| (s.url, s.size, s.etag))
        .collect())
}

/// The bytes of one file or object (a repo's README.md); `size` as its listing said.
#[pyfunction]
#[pyo3(signature = (url, size=None, storage_options=None))]
pub fn _read_file(
    py: Python<'_>,
    url: String,
    size: Option<u64>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<pyo3::types::PyBytes>> {
    let storage = storage_from(storage_options)?;
    let bytes = py.detach(|| crate::source::read_whole(url, size, &storage))?;
    Ok(pyo3::types::PyBytes::new(py, &bytes).unbind())
}

/// A dataset over Arrow data already in memory: anything exporting the Arrow PyCapsule
/// interface (a pyarrow Table, RecordBatch or RecordBatchReader, a polars DataFrame), or
/// a Hugging Face `datasets.Dataset` (its rows as it shows them: a shuffle, select or
/// filter of it applied). Each batch read is a copy, so writing into it never changes
/// `data`.
#[pyfunction]
pub fn from_arrow(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
    PyDataset::from_arrow(py, data)
}

/// A dataset over a pandas DataFrame's columns (its index left out, as
/// `datasets.Dataset.from_pandas(df, preserve_index=False)`); needs pyarrow.
#[pyfunction]
pub fn from_pandas(py: Python<'_>, df: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
    let options = PyDict::new(py);
    options.set_item("preserve_index", false)?;
    let table = py.import("pyarrow")?.getattr("Table")?.call_method(
        "from_pandas",
        (df,),
        Some(&options),
    )?;
    let (schema, batches) = batches_from_py(&table)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("df", df)?;
    Ok(PyDataset::in_memory(
        py,
        schema,
        batches,
        ("from_pandas", kwargs),
    ))
}

/// A dataset over columns: `{name: list or numpy array}`, all of one length.
#[pyfunction]
pub fn from_dict(py: Python<'_>, columns: &Bound<'_, PyDict>) -> PyResult<PyDataset> {
    let batch = columns_to_batch(py, columns.as_any())?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("columns", columns)?;
    Ok(PyDataset::in_memory(
        py,
        batch.schema(),
        vec![batch],
        ("from_dict", kwargs),
    ))
}

/// A dataset over rows: a list of dicts with the same keys.
#[pyfunction]
pub fn from_list(py: Python<'_>, rows: &Bound<'_, PyList>) -> PyResult<PyDataset> {
    let items: Vec<Bound<'_, PyAny>> = rows.iter().collect();
    let batch = rows_to_batch(py, &items)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("rows", rows)?;
    Ok(PyDataset::in_memory(
        py,
        batch.schema(),
        vec![batch],
        ("from_list", kwargs),
    ))
}

/// `sf.concatenate([a, b, ...])`: the rows of each dataset in turn, as one schema
/// (equal, or columns that widen: see the README).
#[pyfunction]
pub fn concatenate(py: Python<'_>, datasets: Vec<Bound<'_, PyDataset>>) -> PyResult<PyDataset> {
    let parts: Vec<Dataset> = datasets.iter().map(|d| d.get().inner.clone()).collect();
    let inner = py.detach(|| Dataset::combine(parts, None))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("datasets", PyList::new(py, &datasets)?)?;
    Ok(PyDataset {
        inner,
        recipe: vec![("concatenate", kwargs.into_any().unbind())],
        access: Default::default(),
        epoch: Default::default(),
    })
}

/// `sf.interleave(datasets, probabilities=None, seed=None, stopping_strategy=...)`:
/// rows drawn from the datasets by seeded weighted choice (in turn without
/// `probabilities`), new each epoch. `"first_exhausted"` stops when one runs out;
/// `"all_exhausted"` starts the ones that run out over until each has run out once;
/// `"all_exhausted_without_replacement"` stops drawing from the ones that run out, so
/// every row of every dataset comes exactly once.
#[pyfunction]
#[pyo3(signature = (datasets, probabilities=None, seed=None, stopping_strategy="first_exhausted"))]
pub fn interleave(
    py: Python<'_>,
    datasets: Vec<Bound<'_, PyDataset>>,
    probabilities: Option<Vec<f64>>,
    seed: Option<u64>,
    stopping_strategy: &str,
) -> PyResult<PyDataset> {
    let stopping = match stopping_strategy {
        "first_exhausted" => pipeline::Stopping::FirstExhausted,
        "all_exhausted" => pipeline::Stopping::AllExhausted,
        "all_exhausted_without_replacement" => pipeline::Stopping::AllWithoutReplacement,
        other => {
            return Err(PyValueError::new_err(format!(
                "stopping_strategy must be \"first_exhausted\", \"all_exhausted\" or \"all_exhausted_without_replacement\", not {other:?}"
            )));
        }
    };
    let seed = seed.unwrap_or(DEFAULT_SEED);
    let mix = pipeline::Mix {
        weights: probabilities.clone(),
        seed,
        stopping,
    };
    let parts: Vec<Dataset> = datasets.iter().map(|d| d.get().inner.clone()).collect();
    let inner = py.detach(|| Dataset::combine(parts, Some(mix)))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("datasets", PyList::new(py, &datasets)?)?;
    kwargs.set_item("probabilities", probabilities)?;
    kwargs.set_item("seed", seed)?;
    kwargs.set_item("stopping_strategy", stopping_strategy)?;
    Ok(PyDataset {
        inner,
        recipe: vec![("interleave", kwargs.into_any().unbind())],
        access: Default::default(),
        epoch: Default::default(),
    })
}
