//! How `Dataset._column_types` describes columns to the Python side (dtype and
//! per-sample shape, struct fields nested).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

pub(super) fn column_types<'py>(
    py: Python<'py>,
    fields: &arrow_schema::Fields,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for field in fields {
        let d = PyDict::new(py);
        d.set_item("name", field.name())?;
        let (dtype, shape) = describe_type(py, field, &d)?;
        d.set_item("dtype", dtype)?;
        d.set_item("shape", PyTuple::new(py, shape)?)?;
        out.append(d)?;
    }
    Ok(out)
}

/// (dtype, per-sample shape) of a column; struct fields go into `d["fields"]`.
fn describe_type(
    py: Python<'_>,
    field: &arrow_schema::Field,
    d: &Bound<'_, PyDict>,
) -> PyResult<(String, Vec<Option<usize>>)> {
    use arrow_schema::DataType as T;
    let marked = field
        .metadata()
        .contains_key(crate::format::webdataset::JSON_KEY)
        || field
            .metadata()
            .contains_key(crate::format::webdataset::NPY_KEY);
    if marked {
        return Ok(("object".into(), vec![]));
    }
    if crate::format::is_variable_tensor(field) {
        // Images of their own sizes: an array per sample, of no one shape.
        d.set_item("variable_shape", true)?;
        return Ok(("object".into(), vec![]));
    }
    let scalar = |dt: &T| -> Option<&'static str> {
        Some(match dt {
            T::Boolean => "bool",
            T::Int8 => "int8",
            T::Int16 => "int16",
            T::Int32 => "int32",
            T::Int64 => "int64",
            T::UInt8 => "uint8",
            T::UInt16 => "uint16",
            T::UInt32 => "uint32",
            T::UInt64 => "uint64",
            T::Float16 => "float16",
            T::Float32 => "float32",
            T::Float64 => "float64",
            T::Utf8 | T::LargeUtf8 | T::Utf8View => "string",
            T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_) => "bytes",
            _ => return None,
        })
    };
    let dt = match field.data_type() {
        T::Dictionary(_, value) => value.as_ref(),
        other => other,
    };
    if let Some(name) = scalar(dt) {
        return Ok((name.into(), vec![]));
    }
    match dt {
        T::FixedSizeList(_, _) => {
            let mut shape = Vec::new();
            let mut current = dt;
            while let T::FixedSizeList(item, size) = current {
                shape.push(*size as usize);
                current = item.data_type();
            }
            let Some(name) = scalar(current) else {
                return Ok(("object".into(), vec![]));
            };
            let declared = crate::format::tensor_shape(field).filter(|s| {
                crate::format::shape_product(1, s) == crate::format::shape_product(1, &shape)
            });
            let mut shape = declared.unwrap_or(shape);
            if let Some(complex) = field.metadata().get(crate::format::npy::COMPLEX_KEY) {
                shape.pop();
                return Ok((complex.clone(), shape.into_iter().map(Some).collect()));
            }
            Ok((name.into(), shape.into_iter().map(Some).collect()))
        }
        T::List(item) | T::LargeList(item) => match scalar(item.data_type()) {
            Some(name) => Ok((name.into(), vec![None])),
            None => Ok(("object".into(), vec![])),
        },
        T::Struct(fields) => {
            d.set_item("fields", column_types(py, fields)?)?;
            Ok(("struct".into(), vec![]))
        }
        _ => Ok(("object".into(), vec![])),
    }
}
