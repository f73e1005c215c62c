//! Arrow -> Python. Numeric columns become numpy arrays over the Arrow buffer itself
//! (the array's base object keeps the buffer alive); fixed-size lists of numbers become
//! `(rows, *shape)` tensors the same way. Everything else becomes Python objects with
//! the values `pyarrow`'s `to_pylist()` gives.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, RecordBatch};
use arrow_buffer::{ArrowNativeType, Buffer};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, TimeUnit};
use numpy::npyffi::{self, NPY_ARRAY_WRITEABLE, PY_ARRAY_API, npy_intp};
use numpy::{PyArray1, PyArrayDescr, PyArrayDescrMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyBytes, PyDict, PyList, PySlice, PyString, PyTuple};

use crate::format::npy::{COMPLEX_KEY, FIXED_WIDTH_KEY};
use crate::format::tensor_shape as declared_tensor_shape;
use crate::format::webdataset::{JSON_KEY, NPY_KEY};

/// Keeps an Arrow buffer alive for as long as a numpy array views it.
#[pyclass(frozen, name = "_ArrowBuffer", module = "shardflow._native")]
pub struct ArrowBufferOwner {
    buffer: Buffer,
}

#[pymethods]
impl ArrowBufferOwner {
    /// Address of the first byte, for tests that check no copy was made.
    #[getter]
    fn address(&self) -> usize {
        self.buffer.as_ptr() as usize
    }
}

/// A numpy array of `shape` over `buffer`, without copying.
fn view_buffer<'py>(
    py: Python<'py>,
    dtype: &str,
    shape: &[usize],
    buffer: Buffer,
) -> PyResult<Bound<'py, PyAny>> {
    let descr = PyArrayDescr::new(py, dtype)?;
    let itemsize = descr.itemsize();
    let needed = shape
        .iter()
        .try_fold(itemsize, |bytes, &d| bytes.checked_mul(d));
    if needed.is_none_or(|needed| needed > buffer.len()) {
        return Err(PyValueError::new_err(format!(
            "internal error: a {dtype} view of shape {shape:?} does not fit its {}-byte buffer",
            buffer.len()
        )));
    }
    let data = buffer.as_ptr() as *mut std::ffi::c_void;
    let owner = Bound::new(py, ArrowBufferOwner { buffer })?;
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: `data` points at `prod(shape) * itemsize` readable bytes (checked above)
    // owned by `owner`, which becomes the array's base (the reference is stolen) and so
    // outlives it. Arrow buffers are never written through again once built, and every
    // buffer viewed here belongs to this batch alone, so the view may be writeable.
    unsafe {
        let array = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as i32,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data,
            NPY_ARRAY_WRITEABLE,
            std::ptr::null_mut(),
        );
        if array.is_null() {
            return Err(PyErr::fetch(py));
        }
        if PY_ARRAY_API.PyArray_SetBaseObject(py, array.cast(), owner.into_ptr()) != 0 {
            pyo3::ffi::Py_DecRef(array);
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, array))
    }
}

/// The numpy dtype that has the same memory layout as an Arrow fixed-width type.
fn numpy_dtype(dt: &DataType) -> Option<String> {
    let unit = |u: &TimeUnit| match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    };
    Some(match dt {
        DataType::Int8 => "int8".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::UInt16 => "uint16".into(),
        DataType::UInt32 => "uint32".into(),
        DataType::UInt64 => "uint64".into(),
        DataType::Float16 => "float16".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::Timestamp(u, _) => format!("datetime64[{}]", unit(u)),
        DataType::Date64 => "datetime64[ms]".into(),
        DataType::Duration(u) => format!("timedelta64[{}]", unit(u)),
        _ => return None,
    })
}

/// The values buffer of a fixed-width array, sliced to the array's rows.
fn values_buffer(array: &dyn Array) -> Option<Buffer> {
    let width = array.data_type().primitive_width()?;
    let data = array.to_data();
    let buffer = data.buffers().first()?;
    Some(buffer.slice_with_length(data.offset() * width, data.len() * width))
}

/// For nested fixed-size lists of numbers with no nulls: the leaf values and the shape
/// of one row.
fn tensor_parts(array: &dyn Array) -> Option<(ArrayRef, Vec<usize>)> {
    let mut shape = Vec::new();
    let mut current = array.slice(0, array.len());
    while let DataType::FixedSizeList(_, size) = current.data_type() {
        if current.null_count() > 0 {
            return None;
        }
        shape.push(*size as usize);
        current = current.as_fixed_size_list().values().clone();
    }
    (!shape.is_empty() && current.null_count() == 0 && numpy_dtype(current.data_type()).is_some())
        .then_some((current, shape))
}

/// One column as a numpy array: zero-copy where the layout allows.
pub fn column_to_numpy<'py>(
    py: Python<'py>,
    array: &ArrayRef,
    field: &Field,
) -> PyResult<Bound<'py, PyAny>> {
    let n = array.len();
    if crate::format::is_variable_tensor(field) {
        // Images of their own sizes: an object array of (H, W, C) arrays.
        return object_array(py, variable_tensors(py, array.as_ref())?);
    }
    match array.data_type() {
        DataType::Dictionary(_, value_type) => {
            let decoded = arrow_cast::cast(array, value_type).map_err(to_type_error)?;
            column_to_numpy(
                py,
                &decoded,
                &Field::new(field.name(), value_type.as_ref().clone(), true),
            )
        }
        dt if numpy_dtype(dt).is_some() => {
            let dtype = numpy_dtype(dt).unwrap_or_default();
            let buffer = values_buffer(array.as_ref())
                .ok_or_else(|| PyTypeError::new_err(format!("no values buffer for {dt}")))?;
            let view = view_buffer(py, &dtype, &[n], buffer)?;
            if array.null_count() == 0 {
                return Ok(view);
            }
            fill_nulls(py, view, array.as_ref())
        }
        DataType::Date32 => {
            // numpy has no 32-bit dates: widen (a copy), then mark nulls NaT.
            let buffer = values_buffer(array.as_ref()).unwrap_or_default();
            let days = view_buffer(py, "int32", &[n], buffer)?
                .call_method1("astype", ("datetime64[D]",))?;
            if array.null_count() > 0 {
                let nat = py.import("numpy")?.getattr("datetime64")?.call1(("NaT",))?;
                days.set_item(null_mask(py, array.as_ref()), nat)?;
            }
            Ok(days)
        }
        DataType::Boolean if array.null_count() == 0 => {
            let values: Vec<bool> = array.as_boolean().values().iter().collect();
            Ok(PyArray1::from_vec(py, values).into_any())
        }
        DataType::FixedSizeList(_, _) => match tensor_parts(array.as_ref()) {
            Some((leaf, mut shape)) => {
                if let Some(declared) = declared_tensor_shape(field)
                    && crate::format::shape_product(1, &declared)
                        == crate::format::shape_product(1, &shape)
                {
                    shape = declared;
                }
                let dtype = numpy_dtype(leaf.data_type()).unwrap_or_default();
                let buffer = values_buffer(leaf.as_ref()).unwrap_or_default();
                let mut full = vec![n];
                full.extend(shape);
                let tensor = view_buffer(py, &dtype, &full, buffer)?;
                match field.metadata().get(COMPLEX_KEY) {
                    // Pairs of floats viewed as complex numbers; the pair axis goes away.
                    Some(complex) => {
                        full.pop();
                        tensor
                            .call_method1("view", (complex.as_str(),))?
                            .call_method1("reshape", (full,))
                    }
                    None => Ok(tensor),
                }
            }
            None => match declared_tensor_shape(field) {
                // Tensors of booleans, bytes or strings: their values, reshaped.
                Some(shape) if array.null_count() == 0 => {
                    let list = array.as_fixed_size_list();
                    let leaf_field = Field::new("item", list.value_type(), true);
                    let mut values = column_to_numpy(py, list.values(), &leaf_field)?;
                    if let Some(dtype) = field.metadata().get(FIXED_WIDTH_KEY) {
                        values = fixed_width(py, &values, dtype)?;
                    }
                    let mut full = vec![n];
                    full.extend(shape);
                    values.call_method1("reshape", (full,))
                }
                _ => object_array(py, column_to_py(py, array.as_ref())?),
            },
        },
        DataType::Utf8 | DataType::LargeUtf8 if field.metadata().get(JSON_KEY).is_some() => {
            object_array(py, field_values(py, array, field)?)
        }
        DataType::Binary | DataType::LargeBinary if field.metadata().get(NPY_KEY).is_some() => {
            let arrays = field_values(py, array, field)?;
            // One (rows, *shape) array when every row holds an array of one dtype and shape.
            let np = py.import("numpy")?;
            let first = arrays.first().map(|a| a.bind(py).clone());
            let uniform = match &first {
                Some(first) if !first.is_none() => {
                    let key = |a: &Bound<'_, PyAny>| -> PyResult<(String, Vec<usize>)> {
                        Ok((
                            a.getattr("dtype")?.str()?.to_string(),
                            a.getattr("shape")?.extract()?,
                        ))
                    };
                    let want = key(first)?;
                    arrays.iter().all(|a| {
                        let a = a.bind(py);
                        !a.is_none() && key(a).is_ok_and(|k| k == want)
                    })
                }
                _ => false,
            };
            if uniform {
                np.call_method1("stack", (pyo3::types::PyList::new(py, &arrays)?,))
            } else {
                object_array(py, arrays)
            }
        }
        DataType::List(_) | DataType::LargeList(_) => match ragged_views(py, array.as_ref())? {
            Some(views) => object_array(py, views),
            None => object_array(py, column_to_py(py, array.as_ref())?),
        },
        DataType::Struct(fields) if array.null_count() == 0 => {
            let dict = PyDict::new(py);
            let columns = array.as_struct().columns();
            for (child_field, child) in fields.iter().zip(columns) {
                dict.set_item(child_field.name(), column_to_numpy(py, child, child_field)?)?;
            }
            Ok(dict.into_any())
        }
        _ => object_array(py, column_to_py(py, array.as_ref())?),
    }
}

/// Nulls in numeric columns: NaN for floats, NaT for times (a copy); other types with
/// nulls become object arrays holding `None`.
fn fill_nulls<'py>(
    py: Python<'py>,
    view: Bound<'py, PyAny>,
    array: &dyn Array,
) -> PyResult<Bound<'py, PyAny>> {
    let fill: Bound<'py, PyAny> = match array.data_type() {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            f64::NAN.into_pyobject(py)?.into_any()
        }
        DataType::Timestamp(..) | DataType::Date64 | DataType::Duration(_) => {
            let kind = if matches!(array.data_type(), DataType::Duration(_)) {
                "timedelta64"
            } else {
                "datetime64"
            };
            py.import("numpy")?.getattr(kind)?.call1(("NaT",))?
        }
        _ => return object_array(py, column_to_py(py, array)?),
    };
    let out = view.call_method0("copy")?;
    out.set_item(null_mask(py, array), fill)?;
    Ok(out)
}

fn null_mask<'py>(py: Python<'py>, array: &dyn Array) -> Bound<'py, PyArray1<bool>> {
    PyArray1::from_vec(py, (0..array.len()).map(|i| array.is_null(i)).collect())
}

/// Arrow's variable-shape tensors (decoded images at their own size): each row's tensor
/// as a numpy array of its shape, a view of the column's values (None for a null row).
fn variable_tensors(py: Python<'_>, array: &dyn Array) -> PyResult<Vec<Py<PyAny>>> {
    let parts = array.as_struct();
    let (Some(data), Some(shape)) = (parts.column_by_name("data"), parts.column_by_name("shape"))
    else {
        return Err(PyTypeError::new_err(
            "a variable-shape tensor needs data and shape",
        ));
    };
    let views = ragged_views(py, data.as_ref())?
        .ok_or_else(|| PyTypeError::new_err("variable-shape tensor data of no numpy type"))?;
    let shape = shape.as_fixed_size_list();
    views
        .into_iter()
        .enumerate()
        .map(|(i, view)| {
            if array.is_null(i) {
                return Ok(py.None());
            }
            let dims = shape.value(i);
            let dims = dims.as_primitive::<arrow_array::types::Int32Type>();
            let dims: Vec<usize> = dims.values().iter().map(|&d| d.max(0) as usize).collect();
            Ok(view.bind(py).call_method1("reshape", (dims,))?.unbind())
        })
        .collect()
}

/// Lists of numbers as 1-D numpy views into one shared values buffer (None for null lists).
fn ragged_views(py: Python<'_>, array: &dyn Array) -> PyResult<Option<Vec<Py<PyAny>>>> {
    // Fixed-size lists are tensors and maps are pairs: only variable-length lists.
    let ragged = matches!(
        array.data_type(),
        DataType::List(_) | DataType::LargeList(_)
    );
    let Some((values, offsets)) = list_parts(array).filter(|_| ragged) else {
        return Ok(None);
    };
    let Some(dtype) = numpy_dtype(values.data_type()) else {
        return Ok(None);
    };
    if values.null_count() > 0 {
        return Ok(None);
    }
    let buffer = values_buffer(values.as_ref()).unwrap_or_default();
    let whole = view_buffer(py, &dtype, &[values.len()], buffer)?;
    (0..array.len())
        .map(|i| {
            if array.is_null(i) {
                return Ok(py.None());
            }
            let slice = PySlice::new(py, offsets[i] as isize, offsets[i + 1] as isize, 1);
            Ok(whole.get_item(slice)?.unbind())
        })
        .collect::<PyResult<Vec<_>>>()
        .map(Some)
}

/// The child values of a list or map column, cut to the span its rows use, and each
/// row's bounds in them (`offsets[i]..offsets[i + 1]`, counted from 0). A batch is a
/// slice of its row group, and slicing a list or map array keeps the parent's whole
/// child array; without the cut, converting a batch would cost its whole row group.
fn list_parts(array: &dyn Array) -> Option<(ArrayRef, Vec<usize>)> {
    fn cut<O: ArrowNativeType>(values: &ArrayRef, offsets: &[O]) -> (ArrayRef, Vec<usize>) {
        let start = offsets.first().map_or(0, |o| o.as_usize());
        let end = offsets.last().map_or(start, |o| o.as_usize());
        let rebased = offsets.iter().map(|o| o.as_usize() - start).collect();
        (values.slice(start, end - start), rebased)
    }
    match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            Some(cut(list.values(), list.value_offsets()))
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            Some(cut(list.values(), list.value_offsets()))
        }
        DataType::Map(_, _) => {
            let map = array.as_map();
            Some(cut(
                &(Arc::new(map.entries().clone()) as ArrayRef),
                map.value_offsets(),
            ))
        }
        // Slicing a fixed-size list slices its values too.
        DataType::FixedSizeList(_, size) => {
            let size = *size as usize;
            let o = (0..=array.len()).map(|i| i * size).collect();
            Some((array.as_fixed_size_list().values().clone(), o))
        }
        _ => None,
    }
}

fn object_array<'py>(py: Python<'py>, values: Vec<Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, values).into_any())
}

fn to_type_error(e: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(e.to_string())
}

/// A batch as `dict[str, np.ndarray]`.
pub fn batch_to_numpy<'py>(py: Python<'py>, batch: &RecordBatch) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        dict.set_item(field.name(), column_to_numpy(py, column, field)?)?;
    }
    Ok(dict)
}

/// A batch as one dict per row. Tensor columns give numpy arrays per row; everything
/// else gives plain Python values.
pub fn batch_to_rows<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let schema = batch.schema();
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let name = PyString::new(py, field.name());
        columns.push((name, field_values(py, column, field)?));
    }
    (0..batch.num_rows())
        .map(|row| {
            let dict = PyDict::new(py);
            for (name, values) in &columns {
                dict.set_item(name, values[row].bind(py))?;
            }
            Ok(dict)
        })
        .collect()
}

/// Bytes or text (an object array) as numpy's fixed-width `S<n>` / `U<n>` dtype: the
/// declared width, or wider where a value needs it (files of one dataset may declare
/// different widths), so nothing is cut.
fn fixed_width<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    declared: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let kind = &declared[..declared.len().min(1)];
    let natural = values.call_method1("astype", (kind,))?;
    let dtype = py
        .import("numpy")?
        .call_method1("promote_types", (natural.getattr("dtype")?, declared))?;
    natural.call_method1("astype", (dtype,))
}

/// One column's values for per-sample use: numpy arrays for tensors (fixed-size lists
/// of numbers) and `.npy` members, parsed documents for JSON text, plain Python values
/// (as `pyarrow`'s `to_pylist()` gives them) otherwise.
pub fn field_values(py: Python<'_>, column: &ArrayRef, field: &Field) -> PyResult<Vec<Py<PyAny>>> {
    let n = column.len();
    if crate::format::is_variable_tensor(field) {
        return variable_tensors(py, column.as_ref());
    }
    if let DataType::Struct(children) = column.data_type()
        && children
            .iter()
            .any(|c| crate::format::is_variable_tensor(c))
    {
        // Decoded audio (`{array, sampling_rate, path}`): dicts whose tensors are arrays.
        let cells = column.as_struct();
        let values = children
            .iter()
            .zip(cells.columns())
            .map(|(child, values)| field_values(py, values, child))
            .collect::<PyResult<Vec<_>>>()?;
        return (0..n)
            .map(|i| {
                if cells.is_null(i) {
                    return Ok(py.None());
                }
                let dict = PyDict::new(py);
                for (child, values) in children.iter().zip(&values) {
                    dict.set_item(child.name(), values[i].bind(py))?;
                }
                Ok(dict.into_any().unbind())
            })
            .collect();
    }
    // Fixed-size lists of numbers are tensors: one array per sample (a view of the
    // batch's), as in the batch output, rather than a list of Python numbers.
    let tensor = declared_tensor_shape(field).is_some() || tensor_parts(column.as_ref()).is_some();
    if tensor {
        // A missing sample (a WebDataset field a sample lacks) is None; the others are
        // views of the values, read through a null-free view of the column.
        let dense: Option<ArrayRef> = match column.data_type() {
            _ if column.null_count() == 0 => Some(column.clone()),
            DataType::FixedSizeList(child, size) => Some(Arc::new(
                FixedSizeListArray::try_new(
                    child.clone(),
                    *size,
                    column.as_fixed_size_list().values().clone(),
                    None,
                )
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            )),
            _ => None,
        };
        if let Some(dense) = dense {
            let tensors = column_to_numpy(py, &dense, field)?;
            // `a[i, ...]` keeps 0-d arrays as arrays (not numpy scalars), like `np.load`.
            let ellipsis = py.Ellipsis();
            return (0..n)
                .map(|i| match column.is_null(i) {
                    true => Ok(py.None()),
                    false => Ok(tensors.get_item((i, &ellipsis))?.unbind()),
                })
                .collect();
        }
    }
    if field.metadata().get(JSON_KEY).is_some() {
        let loads = py.import("json")?.getattr("loads")?;
        return map_values(py, column, |text| loads.call1((text,)));
    }
    if field.metadata().get(NPY_KEY).is_some() {
        return map_values(py, column, |bytes| {
            npy_to_numpy(py, bytes.cast::<PyBytes>()?.as_bytes())
        });
    }
    column_to_py(py, column.as_ref())
}

/// Python values of a column with `f` applied to every non-null one.
fn map_values<'py>(
    py: Python<'py>,
    column: &ArrayRef,
    f: impl Fn(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Vec<Py<PyAny>>> {
    column_to_py(py, column.as_ref())?
        .into_iter()
        .map(|v| {
            let v = v.into_bound(py);
            if v.is_none() {
                Ok(v.unbind())
            } else {
                Ok(f(&v)?.unbind())
            }
        })
        .collect()
}

/// An `.npy` file's bytes as a (writable) numpy array. The header is checked by our own
/// parser first, so object arrays (pickles) are refused before numpy sees anything.
fn npy_to_numpy<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let header = crate::format::npy::parse_header(bytes).map_err(PyValueError::new_err)?;
    let body = &bytes[header.data_offset.min(bytes.len())..];
    if Some(body.len() as u64) != header.data_len() {
        return Err(PyValueError::new_err(format!(
            "the .npy header promises {:?} bytes of data, there are {}",
            header.data_len(),
            body.len()
        )));
    }
    let np = py.import("numpy")?;
    let data = pyo3::types::PyByteArray::new(py, body);
    let flat = np.call_method1("frombuffer", (data, header.descr()))?;
    let order = if header.fortran { "F" } else { "C" };
    let kwargs = [("order", order)].into_py_dict(py)?;
    flat.call_method("reshape", (header.shape.clone(),), Some(&kwargs))
}

/// A batch as `dict[str, list]`.
pub fn batch_to_pydict<'py>(py: Python<'py>, batch: &RecordBatch) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        dict.set_item(
            field.name(),
            PyList::new(py, column_to_py(py, column.as_ref())?)?,
        )?;
    }
    Ok(dict)
}

struct PyDatetime {
    date_fromordinal: Py<PyAny>,
    datetime: Py<PyAny>,
    time: Py<PyAny>,
    timedelta: Py<PyAny>,
    utc: Py<PyAny>,
    decimal: Py<PyAny>,
}

fn datetime_api(py: Python<'_>) -> PyResult<&PyDatetime> {
    static API: PyOnceLock<PyDatetime> = PyOnceLock::new();
    API.get_or_try_init(py, || {
        let dt = py.import("datetime")?;
        Ok(PyDatetime {
            date_fromordinal: dt.getattr("date")?.getattr("fromordinal")?.unbind(),
            datetime: dt.getattr("datetime")?.unbind(),
            time: dt.getattr("time")?.unbind(),
            timedelta: dt.getattr("timedelta")?.unbind(),
            utc: dt.getattr("timezone")?.getattr("utc")?.unbind(),
            decimal: py.import("decimal")?.getattr("Decimal")?.unbind(),
        })
    })
}

/// `datetime.date.toordinal()` of 1970-01-01.
const UNIX_EPOCH_ORDINAL: i64 = 719_163;

fn to_micros(value: i64, unit: &TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => value.saturating_mul(1_000_000),
        TimeUnit::Millisecond => value.saturating_mul(1_000),
        TimeUnit::Microsecond => value,
        // datetime has microsecond resolution; round toward minus infinity like pyarrow.
        TimeUnit::Nanosecond => value.div_euclid(1_000),
    }
}

fn timezone<'py>(py: Python<'py>, tz: &str) -> PyResult<Bound<'py, PyAny>> {
    let api = datetime_api(py)?;
    if tz.eq_ignore_ascii_case("utc") || tz == "+00:00" || tz == "Z" {
        return Ok(api.utc.bind(py).clone());
    }
    if let Some((sign, rest)) = tz.split_at_checked(1)
        && (sign == "+" || sign == "-")
        && let Some((h, m)) = rest.split_once(':')
        && let (Ok(h), Ok(m)) = (h.parse::<i64>(), m.parse::<i64>())
    {
        let minutes = if sign == "-" {
            -(h * 60 + m)
        } else {
            h * 60 + m
        };
        let offset = api
            .timedelta
            .bind(py)
            .call((), Some(&[("minutes", minutes)].into_py_dict(py)?))?;
        return py.import("datetime")?.getattr("timezone")?.call1((offset,));
    }
    py.import("zoneinfo")?.getattr("ZoneInfo")?.call1((tz,))
}

/// A column's values of this many bytes in all are copied into their `bytes` on several
/// threads: a batch of 256 KB values (64 MB) took the consumer's thread 20 ms alone.
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// Binary values `value(0..n)` as `bytes` (None for nulls). Large columns are allocated
/// as `bytes` first, under the GIL, then filled on a thread per core without it: the copy
/// into Python is what a consumer of large values waits for (the loader's threads hand it
/// views of the values where they lie, see `crate::pipeline::interleave_viewing`).
fn bytes_values<'a>(
    py: Python<'_>,
    n: usize,
    value: impl Fn(usize) -> Option<&'a [u8]>,
) -> PyResult<Vec<Py<PyAny>>> {
    let total: usize = (0..n).filter_map(&value).map(<[u8]>::len).sum();
    let threads = match total >= PARALLEL_COPY_BYTES {
        true => crate::pipeline::default_num_threads(),
        false => 1,
    };
    if threads <= 1 {
        return Ok((0..n)
            .map(|i| match value(i) {
                Some(v) => PyBytes::new(py, v).into_any().unbind(),
                None => py.None(),
            })
            .collect());
    }
    let mut out = Vec::with_capacity(n);
    // (where the value goes, the value)
    let mut copies: Vec<(usize, &[u8])> = Vec::with_capacity(n);
    for i in 0..n {
        let Some(v) = value(i) else {
            out.push(py.None());
            continue;
        };
        // SAFETY: a new `bytes` of `v.len()` bytes whose contents are set below, before
        // anything else can see it; null (an exception set) where allocation failed.
        let object = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), v.len() as isize),
            )?
        };
        // SAFETY: `object` is a `bytes`; its buffer holds `v.len()` bytes.
        let to = unsafe { pyo3::ffi::PyBytes_AsString(object.as_ptr()) } as usize;
        copies.push((to, v));
        out.push(object.unbind());
    }
    // Contiguous runs of values, about as many bytes each.
    let share = total.div_ceil(threads);
    let mut runs: Vec<&[(usize, &[u8])]> = Vec::with_capacity(threads);
    let (mut start, mut bytes) = (0, 0);
    for (k, (_, v)) in copies.iter().enumerate() {
        bytes += v.len();
        if bytes >= share || k + 1 == copies.len() {
            runs.push(&copies[start..=k]);
            (start, bytes) = (k + 1, 0);
        }
    }
    py.detach(|| {
        std::thread::scope(|scope| {
            for run in runs {
                scope.spawn(move || {
                    for &(to, v) in run {
                        // SAFETY: each `bytes` buffer is written once, by one thread, while
                        // only this function holds the object; `v` does not overlap it.
                        unsafe {
                            std::ptr::copy_nonoverlapping(v.as_ptr(), to as *mut u8, v.len())
                        };
                    }
                });
            }
        })
    });
    Ok(out)
}

/// One column as Python values (None for nulls), like `pyarrow.Array.to_pylist()`.
pub fn column_to_py(py: Python<'_>, array: &dyn Array) -> PyResult<Vec<Py<PyAny>>> {
    let n = array.len();
    macro_rules! prim {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Ok(py.None())
                    } else {
                        Ok(a.value(i).into_pyobject(py)?.into_any().unbind())
                    }
                })
                .collect()
        }};
    }
    macro_rules! each {
        ($a:expr, |$v:ident| $body:expr) => {{
            let a = $a;
            (0..n)
                .map(|i| -> PyResult<Py<PyAny>> {
                    if a.is_null(i) {
                        Ok(py.None())
                    } else {
                        let $v = a.value(i);
                        Ok($body)
                    }
                })
                .collect()
        }};
    }
    match array.data_type() {
        DataType::Null => Ok((0..n).map(|_| py.None()).collect()),
        DataType::Boolean => each!(array.as_boolean(), |v| v
            .into_pyobject(py)?
            .to_owned()
            .into_any()
            .unbind()),
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float16 => each!(array.as_primitive::<Float16Type>(), |v| v
            .to_f64()
            .into_pyobject(py)?
            .into_any()
            .unbind()),
        DataType::Float32 => each!(array.as_primitive::<Float32Type>(), |v| (v as f64)
            .into_pyobject(py)?
            .into_any()
            .unbind()),
        DataType::Float64 => prim!(Float64Type),
        DataType::Utf8 => each!(array.as_string::<i32>(), |v| PyString::new(py, v)
            .into_any()
            .unbind()),
        DataType::LargeUtf8 => each!(array.as_string::<i64>(), |v| PyString::new(py, v)
            .into_any()
            .unbind()),
        DataType::Utf8View => each!(array.as_string_view(), |v| PyString::new(py, v)
            .into_any()
            .unbind()),
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            bytes_values(py, n, |i| (!a.is_null(i)).then(|| a.value(i)))
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            bytes_values(py, n, |i| (!a.is_null(i)).then(|| a.value(i)))
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            bytes_values(py, n, |i| (!a.is_null(i)).then(|| a.value(i)))
        }
        DataType::FixedSizeBinary(_) => {
            each!(array.as_fixed_size_binary(), |v| PyBytes::new(py, v)
                .into_any()
                .unbind())
        }
        DataType::Date32 => {
            let fromordinal = datetime_api(py)?.date_fromordinal.bind(py);
            each!(array.as_primitive::<Date32Type>(), |v| fromordinal
                .call1((UNIX_EPOCH_ORDINAL + v as i64,))?
                .unbind())
        }
        DataType::Date64 => {
            let fromordinal = datetime_api(py)?.date_fromordinal.bind(py);
            each!(array.as_primitive::<Date64Type>(), |v| fromordinal
                .call1((UNIX_EPOCH_ORDINAL + v.div_euclid(86_400_000),))?
                .unbind())
        }
        DataType::Timestamp(unit, tz) => timestamps_to_py(py, array, unit, tz.as_deref()),
        DataType::Time32(unit) | DataType::Time64(unit) => {
            let a = arrow_cast::cast(array, &DataType::Int64).map_err(to_type_error)?;
            let a = a.as_primitive::<Int64Type>();
            times_to_py(
                py,
                (0..n).map(|i| (!a.is_null(i)).then(|| to_micros(a.value(i), unit))),
            )
        }
        DataType::Duration(unit) => {
            let a = arrow_cast::cast(array, &DataType::Int64).map_err(to_type_error)?;
            let timedelta = datetime_api(py)?.timedelta.bind(py);
            let unit = *unit;
            each!(a.as_primitive::<Int64Type>(), |v| timedelta
                .call((0, 0, to_micros(v, &unit)), None)?
                .unbind())
        }
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => {
            let decimal = datetime_api(py)?.decimal.bind(py);
            let formatter =
                ArrayFormatter::try_new(array, &FormatOptions::default()).map_err(to_type_error)?;
            (0..n)
                .map(|i| {
                    if array.is_null(i) {
                        Ok(py.None())
                    } else {
                        Ok(decimal.call1((formatter.value(i).to_string(),))?.unbind())
                    }
                })
                .collect()
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) => {
            let (values, offsets) =
                list_parts(array).ok_or_else(|| to_type_error("not a list or map"))?;
            let items = column_to_py(py, values.as_ref())?;
            (0..n)
                .map(|i| {
                    if array.is_null(i) {
                        return Ok(py.None());
                    }
                    let row = items[offsets[i]..offsets[i + 1]].iter().map(|v| v.bind(py));
                    Ok(PyList::new(py, row)?.into_any().unbind())
                })
                .collect()
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let names: Vec<Bound<'_, PyString>> =
                fields.iter().map(|f| PyString::new(py, f.name())).collect();
            let children = s
                .columns()
                .iter()
                .map(|c| column_to_py(py, c.as_ref()))
                .collect::<PyResult<Vec<_>>>()?;
            (0..n)
                .map(|i| {
                    if s.is_null(i) {
                        return Ok(py.None());
                    }
                    let dict = PyDict::new(py);
                    for (name, values) in names.iter().zip(&children) {
                        dict.set_item(name, values[i].bind(py))?;
                    }
                    Ok(dict.into_any().unbind())
                })
                .collect()
        }
        DataType::Map(_, _) => {
            let (entries, offsets) =
                list_parts(array).ok_or_else(|| to_type_error("not a list or map"))?;
            let entries = entries.as_struct();
            let keys = column_to_py(py, entries.column(0).as_ref())?;
            let values = column_to_py(py, entries.column(1).as_ref())?;
            (0..n)
                .map(|i| {
                    if array.is_null(i) {
                        return Ok(py.None());
                    }
                    let pairs = (offsets[i]..offsets[i + 1])
                        .map(|j| PyTuple::new(py, [keys[j].bind(py), values[j].bind(py)]))
                        .collect::<PyResult<Vec<_>>>()?;
                    Ok(PyList::new(py, pairs)?.into_any().unbind())
                })
                .collect()
        }
        DataType::Dictionary(_, value_type) => {
            let decoded = arrow_cast::cast(array, value_type).map_err(to_type_error)?;
            column_to_py(py, decoded.as_ref())
        }
        other => Err(PyTypeError::new_err(format!(
            "Arrow type {other} has no Python conversion in shardflow; use output=\"arrow\""
        ))),
    }
}

fn timestamps_to_py(
    py: Python<'_>,
    array: &dyn Array,
    unit: &TimeUnit,
    tz: Option<&str>,
) -> PyResult<Vec<Py<PyAny>>> {
    let api = datetime_api(py)?;
    let datetime = api.datetime.bind(py);
    let timedelta = api.timedelta.bind(py);
    let epoch = match tz {
        Some(_) => datetime.call((1970, 1, 1, 0, 0, 0, 0, api.utc.bind(py)), None)?,
        None => datetime.call1((1970, 1, 1))?,
    };
    let zone = match tz {
        Some(tz) => Some(timezone(py, tz)?),
        None => None,
    };
    let values = arrow_cast::cast(array, &DataType::Int64).map_err(to_type_error)?;
    let values = values.as_primitive::<Int64Type>();
    (0..array.len())
        .map(|i| {
            if values.is_null(i) {
                return Ok(py.None());
            }
            let delta = timedelta.call((0, 0, to_micros(values.value(i), unit)), None)?;
            let mut value = epoch.call_method1("__add__", (delta,))?;
            if let Some(zone) = &zone {
                value = value.call_method1("astimezone", (zone,))?;
            }
            Ok(value.unbind())
        })
        .collect()
}

fn times_to_py(
    py: Python<'_>,
    micros: impl Iterator<Item = Option<i64>>,
) -> PyResult<Vec<Py<PyAny>>> {
    let time = datetime_api(py)?.time.bind(py);
    micros
        .map(|us| match us {
            None => Ok(py.None()),
            Some(us) => {
                let us = us.rem_euclid(86_400_000_000);
                let (h, rest) = (us / 3_600_000_000, us % 3_600_000_000);
                let (m, rest) = (rest / 60_000_000, rest % 60_000_000);
                Ok(time
                    .call1((h, m, rest / 1_000_000, rest % 1_000_000))?
                    .unbind())
            }
        })
        .collect()
}
