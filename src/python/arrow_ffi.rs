//! The Arrow PyCapsule interface: batches, datasets and loaders hand their data to
//! pyarrow, polars or duckdb through the C data interface, without copying.

use std::ffi::CStr;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema, to_ffi};
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{Array, RecordBatch, RecordBatchReader, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

use crate::pipeline::{BatchReceiver, Received};

const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";
const STREAM: &CStr = c"arrow_array_stream";

fn arrow_error(e: ArrowError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// An Arrow schema handed to Python through the PyCapsule interface
/// (`pyarrow.schema(ds.schema)`, `polars.Schema`, ...).
#[pyclass(frozen, name = "Schema", module = "shardflow")]
pub struct PySchema {
    pub schema: arrow_schema::SchemaRef,
}

impl PySchema {
    /// The same columns with their storage types (extension types' metadata dropped).
    pub fn storage(&self) -> PySchema {
        /// The field with no metadata, nor any in a struct's fields.
        fn bare(field: &arrow_schema::Field) -> arrow_schema::Field {
            let field = field
                .clone()
                .with_metadata(std::collections::HashMap::new());
            match field.data_type() {
                arrow_schema::DataType::Struct(children) => {
                    let children: arrow_schema::Fields = children.iter().map(|c| bare(c)).collect();
                    field.with_data_type(arrow_schema::DataType::Struct(children))
                }
                _ => field,
            }
        }
        let fields: Vec<arrow_schema::Field> =
            self.schema.fields().iter().map(|f| bare(f)).collect();
        PySchema {
            schema: std::sync::Arc::new(arrow_schema::Schema::new(fields)),
        }
    }
}

#[pymethods]
impl PySchema {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_schema__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        schema_capsule(py, &self.schema)
    }

    /// The column names, in order.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PySchema>()
            .is_ok_and(|o| o.get().schema == self.schema)
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect();
        format!("shardflow.Schema({})", fields.join(", "))
    }
}

pub fn schema_capsule<'py>(py: Python<'py>, schema: &Schema) -> PyResult<Bound<'py, PyCapsule>> {
    let ffi = FFI_ArrowSchema::try_from(schema).map_err(arrow_error)?;
    PyCapsule::new_with_value(py, ffi, SCHEMA)
}

/// `(schema capsule, array capsule)` for a batch exported as a struct array.
pub fn batch_capsules<'py>(py: Python<'py>, batch: &RecordBatch) -> PyResult<Bound<'py, PyTuple>> {
    let array = StructArray::from(batch.clone());
    let (ffi_array, ffi_schema) = to_ffi(&array.to_data()).map_err(arrow_error)?;
    let schema = PyCapsule::new_with_value(py, ffi_schema, SCHEMA)?;
    let array: Bound<'py, PyCapsule> =
        PyCapsule::new_with_value::<FFI_ArrowArray>(py, ffi_array, ARRAY)?;
    PyTuple::new(py, [schema.into_any(), array.into_any()])
}

/// Serves batches from a running pipeline to a C-level stream consumer.
struct ReceiverReader {
    schema: SchemaRef,
    first: Option<RecordBatch>,
    receiver: BatchReceiver,
}

impl Iterator for ReceiverReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(batch) = self.first.take() {
            return Some(Ok(batch));
        }
        // The consumer may call in holding the GIL while the pipeline needs it for a user
        // function: give it up while waiting.
        let wait = |receiver: &mut BatchReceiver| receiver.recv_timeout(Duration::from_secs(3600));
        loop {
            let receiver = &mut self.receiver;
            let got = match super::fork::attach(|py| py.detach(|| wait(receiver))) {
                Some(got) => got,
                None => wait(receiver),
            };
            match got {
                Ok(Received::Batch(batch)) => return Some(Ok(batch)),
                Ok(Received::End) => return None,
                Ok(Received::Timeout) => continue,
                Err(e) => return Some(Err(ArrowError::ExternalError(Box::new(e)))),
            }
        }
    }
}

impl RecordBatchReader for ReceiverReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// A stream capsule over a started pipeline. The schema is the first batch's, or
/// `fallback_schema` when the stream is empty.
pub fn stream_capsule<'py>(
    py: Python<'py>,
    mut receiver: BatchReceiver,
    fallback_schema: Option<SchemaRef>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let first = super::wait::next_batch(py, &mut receiver)?;
    let schema = match (&first, fallback_schema) {
        (Some(batch), _) => batch.schema(),
        (None, Some(schema)) => schema,
        (None, None) => Arc::new(Schema::empty()),
    };
    let reader = ReceiverReader {
        schema,
        first,
        receiver,
    };
    PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(reader)), STREAM)
}

/// The record batches of an object exporting `__arrow_c_stream__` (a pyarrow Table or
/// RecordBatchReader, a polars DataFrame, ...) or `__arrow_c_array__` (a RecordBatch or a
/// struct array), without copying them.
pub fn batches_from_py(obj: &Bound<'_, PyAny>) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    if obj.hasattr("__arrow_c_stream__")? {
        let capsule = obj.call_method0("__arrow_c_stream__")?;
        let capsule = capsule.cast::<PyCapsule>()?;
        let ptr = capsule.pointer_checked(Some(STREAM))?;
        // SAFETY: a capsule named "arrow_array_stream" holds a valid FFI_ArrowArrayStream;
        // `from_raw` moves it out and leaves a released one, which the capsule's
        // destructor then leaves alone.
        let reader = unsafe {
            arrow_array::ffi_stream::RecordBatchStreamReader::from_raw(
                ptr.as_ptr() as *mut FFI_ArrowArrayStream
            )
        }
        .map_err(arrow_error)?;
        let schema = reader.schema();
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(arrow_error)?;
        return Ok((schema, batches));
    }
    if obj.hasattr("__arrow_c_array__")? {
        let pair = obj.call_method0("__arrow_c_array__")?;
        let (schema_capsule, array_capsule) =
            pair.extract::<(Bound<'_, PyCapsule>, Bound<'_, PyCapsule>)>()?;
        let schema_ptr = schema_capsule.pointer_checked(Some(SCHEMA))?;
        let array_ptr = array_capsule.pointer_checked(Some(ARRAY))?;
        // SAFETY: the capsules hold a valid FFI_ArrowSchema (borrowed, it stays owned by
        // its capsule) and FFI_ArrowArray (moved out, leaving a released one behind).
        let data = unsafe {
            let schema = &*(schema_ptr.as_ptr() as *const FFI_ArrowSchema);
            let array = FFI_ArrowArray::from_raw(array_ptr.as_ptr() as *mut FFI_ArrowArray);
            arrow_array::ffi::from_ffi(array, schema)
        }
        .map_err(arrow_error)?;
        let DataType::Struct(_) = data.data_type() else {
            return Err(PyTypeError::new_err(
                "from_arrow needs a table, record batch or struct array, not a single column",
            ));
        };
        let batch = RecordBatch::from(StructArray::from(data));
        return Ok((batch.schema(), vec![batch]));
    }
    Err(PyTypeError::new_err(
        "from_arrow needs an object with __arrow_c_stream__ or __arrow_c_array__ (a pyarrow Table or RecordBatch, a polars DataFrame, ...)",
    ))
}

/// A schema from an object exporting `__arrow_c_schema__` (e.g. `pyarrow.Schema`), or
/// from a dict `{name: type}` with types as strings like `"int64"`, `"string"`,
/// `"list<float32>"`.
pub fn schema_from_py(obj: &Bound<'_, PyAny>) -> PyResult<SchemaRef> {
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut fields = Vec::with_capacity(dict.len());
        for (name, ty) in dict.iter() {
            let name: String = name.extract()?;
            let ty: String = ty.extract().map_err(|_| {
                PyTypeError::new_err(
                    "schema dict values must be type names such as \"int64\" or \"string\"",
                )
            })?;
            fields.push(Field::new(name, parse_type(&ty)?, true));
        }
        return Ok(Arc::new(Schema::new(fields)));
    }
    if !obj.hasattr("__arrow_c_schema__")? {
        return Err(PyTypeError::new_err(
            "schema= must be a dict of type names or an object with __arrow_c_schema__ (e.g. pyarrow.schema)",
        ));
    }
    let capsule = obj.call_method0("__arrow_c_schema__")?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let ptr = capsule.pointer_checked(Some(SCHEMA))?;
    // SAFETY: a capsule named "arrow_schema" holds an FFI_ArrowSchema that stays owned by
    // the capsule while we read it (we do not move it out).
    let ffi = unsafe { &*(ptr.as_ptr() as *const FFI_ArrowSchema) };
    let schema = Schema::try_from(ffi).map_err(arrow_error)?;
    Ok(Arc::new(schema))
}

fn parse_type(name: &str) -> PyResult<DataType> {
    let name = name.trim();
    if let Some(inner) = name.strip_prefix("list<").and_then(|s| s.strip_suffix('>')) {
        return Ok(DataType::List(Arc::new(Field::new_list_field(
            parse_type(inner)?,
            true,
        ))));
    }
    Ok(match name {
        "bool" | "boolean" => DataType::Boolean,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float16" => DataType::Float16,
        "float32" | "float" => DataType::Float32,
        "float64" | "double" => DataType::Float64,
        "string" | "str" | "utf8" => DataType::Utf8,
        "binary" | "bytes" => DataType::Binary,
        "null" => DataType::Null,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown type name {other:?} in schema=; use e.g. \"int64\", \"float32\", \"string\", \"list<int64>\", or pass a pyarrow schema"
            )));
        }
    })
}
