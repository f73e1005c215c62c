//! Python -> Arrow, for what user functions (`map`, `flat_map`) return. Column types are
//! inferred from the values: Python scalars, numpy scalars and arrays (same-shaped arrays
//! become fixed-shape tensor columns, 1-D arrays of varying length become lists), lists
//! and dicts, with None as null.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, FixedSizeListArray, Float64Array, Int64Array,
    LargeListArray, NullArray, RecordBatch, StringArray, StructArray, make_array,
};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, Fields, Schema};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple,
};

use crate::format::tensor_field;

/// Numeric element types numpy and Arrow share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl Num {
    fn from_numpy(name: &str) -> Option<Num> {
        Some(match name {
            "bool" => Num::Bool,
            "int8" => Num::I8,
            "int16" => Num::I16,
            "int32" => Num::I32,
            "int64" => Num::I64,
            "uint8" => Num::U8,
            "uint16" => Num::U16,
            "uint32" => Num::U32,
            "uint64" => Num::U64,
            "float16" => Num::F16,
            "float32" => Num::F32,
            "float64" => Num::F64,
            _ => return None,
        })
    }

    fn numpy_name(self) -> &'static str {
        match self {
            Num::Bool => "bool",
            Num::I8 => "int8",
            Num::I16 => "int16",
            Num::I32 => "int32",
            Num::I64 => "int64",
            Num::U8 => "uint8",
            Num::U16 => "uint16",
            Num::U32 => "uint32",
            Num::U64 => "uint64",
            Num::F16 => "float16",
            Num::F32 => "float32",
            Num::F64 => "float64",
        }
    }

    fn data_type(self) -> DataType {
        match self {
            Num::Bool => DataType::Boolean,
            Num::I8 => DataType::Int8,
            Num::I16 => DataType::Int16,
            Num::I32 => DataType::Int32,
            Num::I64 => DataType::Int64,
            Num::U8 => DataType::UInt8,
            Num::U16 => DataType::UInt16,
            Num::U32 => DataType::UInt32,
            Num::U64 => DataType::UInt64,
            Num::F16 => DataType::Float16,
            Num::F32 => DataType::Float32,
            Num::F64 => DataType::Float64,
        }
    }

    /// The Python kind a numpy scalar of this type mixes with.
    fn python_kind(self) -> Kind {
        match self {
            Num::Bool => Kind::Bool,
            Num::F16 | Num::F32 | Num::F64 => Kind::Float,
            _ => Kind::Int,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Null,
    Bool,
    Int,
    Float,
    Str,
    Bytes,
    /// numpy scalars (or 0-d arrays) of one dtype.
    Scalar(Num),
    /// numpy arrays of one dtype and shape.
    Tensor(Num, Vec<usize>),
    /// 1-D numpy arrays of one dtype and varying length.
    Ragged(Num),
    List(Box<Kind>),
    Struct(Vec<(String, Kind)>),
}

impl Kind {
    fn name(&self) -> String {
        match self {
            Kind::Null => "None".into(),
            Kind::Bool => "bool".into(),
            Kind::Int => "int".into(),
            Kind::Float => "float".into(),
            Kind::Str => "str".into(),
            Kind::Bytes => "bytes".into(),
            Kind::Scalar(n) => format!("numpy {}", n.numpy_name()),
            Kind::Tensor(n, shape) => format!("{} array of shape {shape:?}", n.numpy_name()),
            Kind::Ragged(n) => format!("1-D {} arrays", n.numpy_name()),
            Kind::List(_) => "list".into(),
            Kind::Struct(_) => "dict".into(),
        }
    }

    fn data_type(&self) -> DataType {
        match self {
            Kind::Null => DataType::Null,
            Kind::Bool => DataType::Boolean,
            Kind::Int => DataType::Int64,
            Kind::Float => DataType::Float64,
            Kind::Str => DataType::Utf8,
            Kind::Bytes => DataType::Binary,
            Kind::Scalar(n) => n.data_type(),
            Kind::Tensor(n, shape) => DataType::FixedSizeList(
                Arc::new(Field::new_list_field(n.data_type(), false)),
                shape.iter().product::<usize>() as i32,
            ),
            Kind::Ragged(n) => {
                DataType::LargeList(Arc::new(Field::new_list_field(n.data_type(), false)))
            }
            Kind::List(item) => {
                DataType::LargeList(Arc::new(Field::new_list_field(item.data_type(), true)))
            }
            Kind::Struct(fields) => DataType::Struct(struct_fields(fields)),
        }
    }

    fn field(&self, name: &str) -> Field {
        match self {
            Kind::Tensor(num, shape) => tensor_field(name, num.data_type(), shape, true),
            _ => Field::new(name, self.data_type(), true),
        }
    }
}

fn struct_fields(fields: &[(String, Kind)]) -> Fields {
    fields.iter().map(|(name, kind)| kind.field(name)).collect()
}

fn is_numpy_array(value: &Bound<'_, PyAny>) -> bool {
    value.cast::<PyUntypedArray>().is_ok()
}

fn is_numpy_scalar(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let generic = py.import("numpy")?.getattr("generic")?;
    value.is_instance(&generic)
}

fn numpy_num(array: &Bound<'_, PyUntypedArray>) -> Option<Num> {
    Num::from_numpy(&array.dtype().str().ok()?.to_string_lossy()).or_else(|| {
        let name = array
            .dtype()
            .getattr("name")
            .ok()?
            .extract::<String>()
            .ok()?;
        Num::from_numpy(&name)
    })
}

fn kind_of(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Kind> {
    if value.is_none() {
        return Ok(Kind::Null);
    }
    // bool before int: Python's bool is an int subclass.
    if value.is_exact_instance_of::<pyo3::types::PyBool>() {
        return Ok(Kind::Bool);
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(Kind::Int);
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(Kind::Float);
    }
    if value.is_instance_of::<PyString>() {
        return Ok(Kind::Str);
    }
    if value.is_instance_of::<PyBytes>() || value.is_instance_of::<PyByteArray>() {
        return Ok(Kind::Bytes);
    }
    if let Ok(array) = value.cast::<PyUntypedArray>() {
        return match numpy_num(array) {
            Some(num) if array.ndim() == 0 => Ok(Kind::Scalar(num)),
            Some(num) => Ok(Kind::Tensor(num, array.shape().to_vec())),
            // Arrays of strings or objects are lists of their items.
            None => kind_of(py, &value.call_method0("tolist")?),
        };
    }
    if is_numpy_scalar(py, value)? {
        let array = py.import("numpy")?.call_method1("asarray", (value,))?;
        return kind_of(py, &array);
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut fields = Vec::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            let name: String = k.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "dict keys must be str, got {}",
                    k.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?;
            fields.push((name, kind_of(py, &v)?));
        }
        return Ok(Kind::Struct(fields));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let mut item = Kind::Null;
        for v in value.try_iter()? {
            item = merge(item, kind_of(py, &v?)?)?;
        }
        return Ok(Kind::List(Box::new(item)));
    }
    Err(PyTypeError::new_err(format!(
        "cannot store a value of type {} in a column",
        value.get_type().name()?
    )))
}

fn merge(a: Kind, b: Kind) -> PyResult<Kind> {
    Ok(match (a, b) {
        (Kind::Null, k) | (k, Kind::Null) => k,
        (a, b) if a == b => a,
        (Kind::Int, Kind::Float) | (Kind::Float, Kind::Int) => Kind::Float,
        (Kind::Scalar(x), Kind::Scalar(y)) => merge(x.python_kind(), y.python_kind())?,
        (Kind::Scalar(x), other) | (other, Kind::Scalar(x)) => merge(x.python_kind(), other)?,
        (Kind::Tensor(x, s), Kind::Tensor(y, t)) if x == y && s.len() == 1 && t.len() == 1 => {
            Kind::Ragged(x)
        }
        (Kind::Ragged(x), Kind::Tensor(y, s)) | (Kind::Tensor(y, s), Kind::Ragged(x))
            if x == y && s.len() == 1 =>
        {
            Kind::Ragged(x)
        }
        (Kind::List(a), Kind::List(b)) => Kind::List(Box::new(merge(*a, *b)?)),
        (Kind::Struct(mut a), Kind::Struct(b)) => {
            for (name, kind) in b {
                match a.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, existing)) => *existing = merge(existing.clone(), kind)?,
                    None => a.push((name, kind)),
                }
            }
            Kind::Struct(a)
        }
        (a, b) => {
            return Err(PyTypeError::new_err(format!(
                "a column mixes {} and {} values",
                a.name(),
                b.name()
            )));
        }
    })
}

fn validity(values: &[Bound<'_, PyAny>]) -> Option<NullBuffer> {
    let valid: Vec<bool> = values.iter().map(|v| !v.is_none()).collect();
    let nulls = NullBuffer::from(valid);
    (nulls.null_count() > 0).then_some(nulls)
}

/// Copies the bytes of numpy array(s) stacked as `dtype` (None becomes zeros).
fn numpy_bytes(py: Python<'_>, values: &Bound<'_, PyAny>, num: Num) -> PyResult<Buffer> {
    let np = py.import("numpy")?;
    let array = np.call_method1("ascontiguousarray", (values, num.numpy_name()))?;
    let buffer = PyUntypedBuffer::get(&array)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("expected a contiguous array"));
    }
    // SAFETY: the buffer is contiguous and `len_bytes` long while `buffer` is held.
    let bytes =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    Ok(if num == Num::Bool {
        // Arrow booleans are bits.
        arrow_buffer::BooleanBuffer::from(bytes.iter().map(|&b| b != 0).collect::<Vec<_>>())
            .into_inner()
    } else {
        Buffer::from_slice_ref(bytes)
    })
}

fn primitive(
    len: usize,
    num: Num,
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> PyResult<ArrayRef> {
    let data = ArrayData::builder(num.data_type())
        .len(len)
        .add_buffer(values)
        .nulls(nulls)
        .build()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(make_array(data))
}

/// Each value through `extract`, with `None` kept as a null.
fn nullable<'a, 'py: 'a, T>(
    values: &'a [Bound<'py, PyAny>],
    extract: impl Fn(&Bound<'py, PyAny>) -> PyResult<T> + 'a,
) -> impl Iterator<Item = PyResult<Option<T>>> + 'a {
    values.iter().map(move |v| {
        if v.is_none() {
            Ok(None)
        } else {
            extract(v).map(Some)
        }
    })
}

fn build(py: Python<'_>, values: &[Bound<'_, PyAny>], kind: &Kind) -> PyResult<ArrayRef> {
    let n = values.len();
    let overflow = |e: PyErr| PyValueError::new_err(format!("cannot store the value: {e}"));
    Ok(match kind {
        Kind::Null => Arc::new(NullArray::new(n)),
        Kind::Bool => {
            Arc::new(nullable(values, |v| v.is_truthy()).collect::<PyResult<BooleanArray>>()?)
        }
        Kind::Int => Arc::new(
            nullable(values, |v| v.extract::<i64>().map_err(overflow))
                .collect::<PyResult<Int64Array>>()?,
        ),
        Kind::Float => {
            Arc::new(nullable(values, |v| v.extract::<f64>()).collect::<PyResult<Float64Array>>()?)
        }
        Kind::Str => Arc::new(
            nullable(values, |v| v.extract::<String>()).collect::<PyResult<StringArray>>()?,
        ),
        Kind::Bytes => {
            let owned = nullable(values, |v| match v.cast::<PyBytes>() {
                Ok(b) => Ok(b.as_bytes().to_vec()),
                Err(_) => Ok(v.cast::<PyByteArray>()?.to_vec()),
            })
            .collect::<PyResult<Vec<Option<Vec<u8>>>>>()?;
            Arc::new(BinaryArray::from_iter(owned))
        }
        Kind::Scalar(num) => {
            let zero = 0i64.into_pyobject(py)?.into_any();
            let filled = PyList::new(
                py,
                values.iter().map(|v| if v.is_none() { &zero } else { v }),
            )?;
            primitive(
                n,
                *num,
                numpy_bytes(py, filled.as_any(), *num)?,
                validity(values),
            )?
        }
        Kind::Tensor(num, shape) => {
            let np = py.import("numpy")?;
            let zeros = np.call_method1("zeros", (shape.clone(), num.numpy_name()))?;
            let filled: Vec<Bound<'_, PyAny>> = values
                .iter()
                .map(|v| {
                    if v.is_none() {
                        zeros.clone()
                    } else {
                        v.clone()
                    }
                })
                .collect();
            let size: usize = shape.iter().product();
            let leaf = if n == 0 {
                primitive(0, *num, Buffer::from_vec(Vec::<u8>::new()), None)?
            } else {
                let stacked = np.call_method1("stack", (PyList::new(py, filled)?,))?;
                primitive(n * size, *num, numpy_bytes(py, &stacked, *num)?, None)?
            };
            let item = Arc::new(Field::new_list_field(num.data_type(), false));
            Arc::new(
                FixedSizeListArray::try_new_with_length(
                    item,
                    size as i32,
                    leaf,
                    validity(values),
                    n,
                )
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            )
        }
        Kind::Ragged(num) => {
            let np = py.import("numpy")?;
            let mut lengths = Vec::with_capacity(n);
            let mut parts = Vec::new();
            for v in values {
                if v.is_none() {
                    lengths.push(0);
                } else {
                    lengths.push(v.len()?);
                    parts.push(v.clone());
                }
            }
            let total: usize = lengths.iter().sum();
            let leaf = if parts.is_empty() {
                primitive(0, *num, Buffer::from_vec(Vec::<u8>::new()), None)?
            } else {
                let joined = np.call_method1("concatenate", (PyList::new(py, parts)?,))?;
                primitive(total, *num, numpy_bytes(py, &joined, *num)?, None)?
            };
            let item = Arc::new(Field::new_list_field(num.data_type(), false));
            Arc::new(
                LargeListArray::try_new(
                    item,
                    OffsetBuffer::from_lengths(lengths),
                    leaf,
                    validity(values),
                )
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            )
        }
        Kind::List(item_kind) => {
            let mut lengths = Vec::with_capacity(n);
            let mut items = Vec::new();
            for v in values {
                if v.is_none() {
                    lengths.push(0);
                    continue;
                }
                let seq = if is_numpy_array(v) {
                    v.call_method0("tolist")?
                } else {
                    v.clone()
                };
                let before = items.len();
                for item in seq.try_iter()? {
                    items.push(item?);
                }
                lengths.push(items.len() - before);
            }
            let child = build(py, &items, item_kind)?;
            let item = Arc::new(Field::new_list_field(item_kind.data_type(), true));
            Arc::new(
                LargeListArray::try_new(
                    item,
                    OffsetBuffer::from_lengths(lengths),
                    child,
                    validity(values),
                )
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            )
        }
        Kind::Struct(fields) => {
            let mut children = Vec::with_capacity(fields.len());
            for (name, child_kind) in fields {
                let column = values
                    .iter()
                    .map(|v| {
                        if v.is_none() {
                            return Ok(py.None().into_bound(py));
                        }
                        let dict = v.cast::<PyDict>()?;
                        Ok(dict
                            .get_item(name)?
                            .unwrap_or_else(|| py.None().into_bound(py)))
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                children.push(build(py, &column, child_kind)?);
            }
            if fields.is_empty() {
                Arc::new(StructArray::new_empty_fields(n, validity(values)))
            } else {
                Arc::new(
                    StructArray::try_new(struct_fields(fields), children, validity(values))
                        .map_err(|e| PyValueError::new_err(e.to_string()))?,
                )
            }
        }
    })
}

/// One column from its values, with the field describing it.
fn column(py: Python<'_>, name: &str, values: &[Bound<'_, PyAny>]) -> PyResult<(Field, ArrayRef)> {
    let mut kind = Kind::Null;
    for v in values {
        kind = merge(kind, kind_of(py, v)?)
            .map_err(|e| PyTypeError::new_err(format!("column {name:?}: {e}")))?;
    }
    let array = build(py, values, &kind)
        .map_err(|e| PyTypeError::new_err(format!("column {name:?}: {e}")))?;
    Ok((kind.field(name), array))
}

fn to_batch(fields: Vec<Field>, arrays: Vec<ArrayRef>, rows: usize) -> PyResult<RecordBatch> {
    let schema = Arc::new(Schema::new(fields));
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema, arrays, &options)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Rows (mappings) to a batch; keys in first-seen order, a missing key is null.
pub fn rows_to_batch(py: Python<'_>, rows: &[Bound<'_, PyAny>]) -> PyResult<RecordBatch> {
    let mut names: Vec<String> = Vec::new();
    let mut dicts = Vec::with_capacity(rows.len());
    for row in rows {
        let mapping = row.cast::<PyMapping>().map_err(|_| {
            PyTypeError::new_err(format!(
                "the function must return a dict per sample, not {}",
                row.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let dict = PyDict::new(py);
        dict.update(mapping)?;
        for key in dict.keys() {
            let key: String = key
                .extract()
                .map_err(|_| PyTypeError::new_err("sample keys must be str"))?;
            if !names.contains(&key) {
                names.push(key);
            }
        }
        dicts.push(dict);
    }
    let mut fields = Vec::with_capacity(names.len());
    let mut arrays = Vec::with_capacity(names.len());
    for name in &names {
        let values = dicts
            .iter()
            .map(|d| {
                Ok(d.get_item(name)?
                    .unwrap_or_else(|| py.None().into_bound(py)))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let (field, array) = column(py, name, &values)?;
        fields.push(field);
        arrays.push(array);
    }
    to_batch(fields, arrays, rows.len())
}

/// A mapping of column name -> sequence or array (rows along the first axis) to a batch.
pub fn columns_to_batch(py: Python<'_>, columns: &Bound<'_, PyAny>) -> PyResult<RecordBatch> {
    let mapping = columns
        .cast::<PyMapping>()
        .map_err(|_| PyTypeError::new_err("a batched function must return a dict of columns"))?;
    let mut fields = Vec::new();
    let mut arrays = Vec::new();
    let mut rows: Option<usize> = None;
    for item in mapping.items()?.iter() {
        let (key, value) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?;
        let name: String = key
            .extract()
            .map_err(|_| PyTypeError::new_err("column names must be str"))?;
        let values: Vec<Bound<'_, PyAny>> = if let Ok(array) = value.cast::<PyUntypedArray>()
            && array.ndim() >= 1
        {
            // Iterating a numpy array yields its rows (as arrays or numpy scalars).
            value.try_iter()?.collect::<PyResult<_>>()?
        } else {
            value
                .try_iter()
                .map_err(|_| {
                    PyTypeError::new_err(format!("column {name:?} must be a sequence or an array"))
                })?
                .collect::<PyResult<_>>()?
        };
        match rows {
            Some(r) if r != values.len() => {
                return Err(PyValueError::new_err(format!(
                    "columns have different lengths: {r} and {} ({name:?})",
                    values.len()
                )));
            }
            _ => rows = Some(values.len()),
        }
        let (field, array) = column(py, &name, &values)?;
        fields.push(field);
        arrays.push(array);
    }
    to_batch(fields, arrays, rows.unwrap_or(0))
}
