//! The dataset verbs that read or change features: `ds.features` and `cast` (which
//! `cast_column` calls), whose `Image` and `Audio` features set how a column decodes
//! where it is read (`Dataset::with_media_features`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::arrow_ffi::schema_from_py;
use super::dataset::PyDataset;
use crate::pipeline;

impl PyDataset {
    /// The recipe as a Python list of `(method, args)`.
    fn recipe_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.recipe
                .iter()
                .map(|(method, args)| (*method, args.clone_ref(py))),
        )
    }

    pub(super) fn features_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let recipe = self.recipe_list(py)?;
        let stored = py.detach(|| self.inner.stored_features())?;
        // Decoded images are tensors (an Arrow extension type pyarrow may not read);
        // their feature is still the `Image` they were.
        let storage = self.schema(py)?.storage();
        py.import("shardflow.features")?
            .call_method1("_features_of", (recipe, stored, storage))
    }

    pub(super) fn cast_to(
        &self,
        py: Python<'_>,
        schema: &Bound<'_, PyAny>,
        on_invalid: &str,
    ) -> PyResult<PyDataset> {
        // Features (`datasets`' or shardflow's) cast to their Arrow types; media
        // features (`Image`, `Audio`) set how their columns decode where they are read.
        let features = py.import("shardflow.features")?;
        let schema = &features.call_method1("_cast_schema", (schema,))?;
        let recipe = self.recipe_list(py)?;
        let (arrow_part, media): (Bound<'_, PyAny>, Option<String>) = features
            .call_method1("_cast_plan", (schema, recipe))?
            .extract()?;
        let mut base = self.inner.clone();
        if let Some(media) = media {
            let media = serde_json::from_str(&media)
                .map_err(|e| PyValueError::new_err(format!("media features: {e}")))?;
            base = py.detach(|| base.with_media_features(media))?;
        }
        let target = schema_from_py(&arrow_part)?;
        let invalid_to_null = match on_invalid {
            "raise" => false,
            "null" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "on_invalid must be \"raise\" or \"null\", not {other:?}"
                )));
            }
        };
        let args = PyDict::new(py);
        args.set_item("schema", schema)?;
        args.set_item("on_invalid", on_invalid)?;
        let op = pipeline::Columns::Cast {
            target,
            invalid_to_null,
        };
        let recast = PyDataset {
            inner: base,
            recipe: self
                .recipe
                .iter()
                .map(|(m, a)| (*m, a.clone_ref(py)))
                .collect(),
            access: Default::default(),
            epoch: Default::default(),
        };
        recast.columns(py, op, "cast", args.into_any())
    }
}
