//! Converting the arguments the Python API takes (paths, options dicts, TFRecord feature
//! specs, seeds, column names) into the core's values.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple};

use crate::format::example::{FeatureSpec, Kind as ExampleKind, Missing, Shape, Values};
use crate::options::{OptionValue, Options};
use crate::source::{Storage, StorageOptions};

/// Paths given as str, os.PathLike or a list of them.
pub(super) fn source_list(source: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
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

/// The seed of a shuffle the user gave none. Fixed, not random, so that every rank and
/// worker process (each building its own loader) shuffles the same way, as PyTorch's
/// `DistributedSampler` does with its default `seed=0`; the order still changes with
/// the epoch.
pub const DEFAULT_SEED: u64 = 0;

pub(super) fn non_negative(name: &str, n: i64) -> PyResult<u64> {
    u64::try_from(n).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {n}")))
}

pub(super) fn check_callable(func: &Bound<'_, PyAny>) -> PyResult<()> {
    if func.is_callable() {
        Ok(())
    } else {
        Err(PyTypeError::new_err("expected a callable"))
    }
}

pub(super) fn storage_from(storage_options: Option<&Bound<'_, PyDict>>) -> PyResult<Arc<Storage>> {
    let options = match storage_options {
        Some(given) => StorageOptions::parse(&parse_options(given)?)?,
        None => StorageOptions::default(),
    };
    Ok(Storage::new(options)?)
}

pub(super) fn parse_options(options: &Bound<'_, PyDict>) -> PyResult<Options> {
    fn option_value(key: &str, value: &Bound<'_, PyAny>) -> PyResult<OptionValue> {
        // bool first: Python's bool is an int.
        Ok(if value.is_instance_of::<PyBool>() {
            OptionValue::Bool(value.extract()?)
        } else if value.is_instance_of::<pyo3::types::PyInt>() {
            OptionValue::Int(value.extract()?)
        } else if value.is_instance_of::<pyo3::types::PyFloat>() {
            OptionValue::Float(value.extract()?)
        } else if let Ok(s) = value.extract::<String>() {
            OptionValue::Str(s)
        } else if let Ok(map) = value.cast::<PyDict>() {
            OptionValue::Map(parse_options(map)?.0)
        } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
            OptionValue::List(
                value
                    .try_iter()?
                    .map(|item| option_value(key, &item?))
                    .collect::<PyResult<_>>()?,
            )
        } else {
            return Err(PyTypeError::new_err(format!(
                "option {key:?} must be a bool, int, float, str, list or dict"
            )));
        })
    }
    let mut map = std::collections::BTreeMap::new();
    for (key, v) in options.iter() {
        let key: String = key.extract()?;
        let v = option_value(&key, &v)?;
        map.insert(key, v);
    }
    Ok(Options(map))
}

pub(super) fn example_kind(dtype: &Bound<'_, PyAny>) -> PyResult<ExampleKind> {
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

pub(super) fn default_values(
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
pub(super) fn feature_specs(features: &Bound<'_, PyDict>) -> PyResult<Vec<FeatureSpec>> {
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
                // An Arrow tensor holds at most 2^31 - 1 values.
                let width = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
                if width.is_none_or(|w| i32::try_from(w).is_err()) {
                    return Err(crate::error::Error::invalid_argument(format!(
                        "features[{name:?}] shape {dims:?} has more than 2^31 values"
                    ))
                    .into());
                }
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

pub(super) fn name_list(names: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(one) = names.extract::<String>() {
        return Ok(vec![one]);
    }
    names.extract()
}
