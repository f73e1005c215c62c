//! Maps the crate's error enum onto the exception classes in `shardflow.errors`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::{Error, Position};

/// The class `shardflow.errors.<name>`, imported once.
macro_rules! exception_class {
    ($py:expr, $name:literal) => {{
        static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        CLASS
            .import($py, "shardflow.errors", $name)
            .map(|t| t.clone())
    }};
}

impl From<Error> for PyErr {
    fn from(error: Error) -> PyErr {
        Python::attach(|py| to_pyerr(py, error))
    }
}

fn to_pyerr(py: Python<'_>, error: Error) -> PyErr {
    let error = match error {
        // A user function's own exception comes back unchanged.
        Error::Callback(inner) => {
            return match inner.downcast::<PyErr>() {
                Ok(pyerr) => *pyerr,
                Err(other) => PyRuntimeError::new_err(other.to_string()),
            };
        }
        other => other,
    };
    let class = match &error {
        Error::Callback(_) => return PyRuntimeError::new_err(error.to_string()),
        Error::NotFound { .. } | Error::NotOnHub { .. } | Error::NoMatch { .. } => {
            exception_class!(py, "NotFoundError")
        }
        Error::PermissionDenied { .. } => exception_class!(py, "AccessDeniedError"),
        Error::Io { .. } => exception_class!(py, "ReadError"),
        Error::Exists { .. } => exception_class!(py, "AlreadyExistsError"),
        Error::Write { .. } => exception_class!(py, "WriteError"),
        Error::Decode { .. } => exception_class!(py, "DecodeError"),
        Error::Schema { .. } => exception_class!(py, "SchemaError"),
        Error::InvalidArgument(_) => exception_class!(py, "InvalidArgumentError"),
        Error::Template(_) => exception_class!(py, "TemplateError"),
        Error::Internal(_) => exception_class!(py, "InternalError"),
    };
    let class = match class {
        Ok(class) => class,
        Err(import_error) => return import_error,
    };
    let message = error.to_string();
    let exc = match class.call1((message,)) {
        Ok(exc) => exc,
        Err(e) => return e,
    };
    let position = match &error {
        Error::Io { position, .. } | Error::Decode { position, .. } => describe(position),
        _ => None,
    };
    // Attribute failures would only lose detail the message already carries.
    let _ = exc.setattr("url", error.url().map(crate::source::redact));
    let _ = exc.setattr("position", position);
    PyErr::from_value(exc)
}

fn describe(position: &Position) -> Option<String> {
    let text = position.to_string();
    let text = text.trim_start();
    let text = text
        .strip_prefix("at ")
        .or_else(|| text.strip_prefix("in "))
        .unwrap_or(text);
    (!text.is_empty()).then(|| text.to_string())
}

/// Wraps an exception raised by a user function so it crosses the core unchanged.
pub fn callback_error(err: PyErr) -> Error {
    Error::Callback(Box::new(err))
}
