//! Tensor columns: the Arrow fields that hold fixed-shape tensors (FixedSizeList with the
//! `arrow.fixed_shape_tensor` extension) and variable-shape ones, and reading their shape.

use std::sync::Arc;

use arrow_schema::{DataType, Field};

/// `start` times the product of `dims`; `None` on overflow. Zero when any dimension is
/// zero, whatever the others: a `(2^60, 2^60, 0)` array holds nothing, and must not be
/// taken for one too large to count.
pub fn shape_product(start: usize, dims: &[usize]) -> Option<usize> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter().try_fold(start, |acc, &d| acc.checked_mul(d))
}

/// Field metadata of Arrow's canonical fixed-shape tensor extension type.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";

pub const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";

pub const TENSOR_EXTENSION: &str = "arrow.fixed_shape_tensor";

/// Arrow's canonical extension for tensors of one dtype and rank but their own shapes.
pub const VARIABLE_TENSOR_EXTENSION: &str = "arrow.variable_shape_tensor";

/// A fixed-shape tensor column: `FixedSizeList<leaf>(prod(shape))` tagged with its shape,
/// so consumers (our numpy conversion, pyarrow) see `(rows, *shape)`.
pub fn tensor_field(name: &str, leaf: DataType, shape: &[usize], nullable: bool) -> Field {
    // Callers have checked that the width fits (`npy::Header::check`, Example specs).
    let width = shape_product(1, shape).map_or(0, |w| w as i32);
    let storage = DataType::FixedSizeList(Arc::new(Field::new_list_field(leaf, false)), width);
    let shape_json = format!(
        "{{\"shape\":[{}]}}",
        shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    Field::new(name, storage, nullable).with_metadata([
        (EXTENSION_NAME_KEY.to_string(), TENSOR_EXTENSION.to_string()),
        (EXTENSION_METADATA_KEY.to_string(), shape_json),
    ])
}

/// A column of `ndim`-dimensional tensors of `leaf`, each of its own shape: Arrow's
/// canonical variable-shape tensor, a struct of `data` (each tensor's values, row-major)
/// and `shape`. `uniform` gives the dimensions every tensor shares (`None`: varies).
pub fn variable_tensor_field(name: &str, leaf: DataType, uniform: &[Option<usize>]) -> Field {
    let ndim = uniform.len() as i32;
    let storage = DataType::Struct(
        vec![
            Field::new(
                "data",
                DataType::LargeList(Arc::new(Field::new_list_field(leaf, false))),
                false,
            ),
            Field::new(
                "shape",
                DataType::FixedSizeList(
                    Arc::new(Field::new_list_field(DataType::Int32, false)),
                    ndim,
                ),
                false,
            ),
        ]
        .into(),
    );
    let uniform = serde_json::to_string(uniform).unwrap_or_else(|_| "null".into());
    Field::new(name, storage, true).with_metadata([
        (
            EXTENSION_NAME_KEY.to_string(),
            VARIABLE_TENSOR_EXTENSION.to_string(),
        ),
        (
            EXTENSION_METADATA_KEY.to_string(),
            format!("{{\"uniform_shape\":{uniform}}}"),
        ),
    ])
}

/// Whether `field` holds variable-shape tensors (see [`variable_tensor_field`]).
pub fn is_variable_tensor(field: &Field) -> bool {
    field.metadata().get(EXTENSION_NAME_KEY).map(String::as_str) == Some(VARIABLE_TENSOR_EXTENSION)
}

/// The shape a field declares through the tensor extension type.
pub fn tensor_shape(field: &Field) -> Option<Vec<usize>> {
    let metadata = field.metadata();
    if metadata.get(EXTENSION_NAME_KEY).map(String::as_str) != Some(TENSOR_EXTENSION) {
        return None;
    }
    let parsed: serde_json::Value =
        serde_json::from_str(metadata.get(EXTENSION_METADATA_KEY)?).ok()?;
    parsed
        .get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect()
}
