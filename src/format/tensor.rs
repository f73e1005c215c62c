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
            // `List`, as the canonical type has it (pyarrow reads no other): a batch
            // holds at most 2^31 values (see `variable_tensor_column`).
            Field::new(
                "data",
                DataType::List(Arc::new(Field::new_list_field(leaf, false))),
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

/// Each row's decoded tensor: its values (row-major) and shape; `None` for a null row;
/// `Err` for one that did not decode (why).
pub type DecodedTensor<T> = std::result::Result<Option<(Vec<T>, Vec<i32>)>, String>;

/// A variable-shape tensor column (see [`variable_tensor_field`]) of `rows` (a null or
/// undecodable row holds no values, of shape `empty`), and each row's outcome. `Err`
/// where the batch's values pass 2^31, more than the type's offsets count.
pub fn variable_tensor_column<T: arrow_array::ArrowPrimitiveType>(
    rows: Vec<DecodedTensor<T::Native>>,
    empty: &[i32],
    nulls: Option<arrow_buffer::NullBuffer>,
) -> std::result::Result<
    (
        arrow_array::StructArray,
        Vec<std::result::Result<(), String>>,
    ),
    String,
> {
    let total: usize = rows
        .iter()
        .map(|r| {
            r.as_ref()
                .map_or(0, |r| r.as_ref().map_or(0, |(v, _)| v.len()))
        })
        .sum();
    if total > i32::MAX as usize {
        return Err(format!(
            "{total} values decoded in one batch, more than a variable-shape tensor column holds (2^31): resize, crop, or read smaller batches"
        ));
    }
    let mut values = Vec::with_capacity(total);
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    offsets.push(0i32);
    let mut shapes = Vec::with_capacity(rows.len() * empty.len());
    let mut outcomes = Vec::with_capacity(rows.len());
    for row in rows {
        match row {
            Ok(Some((decoded, shape))) => {
                values.extend_from_slice(&decoded);
                shapes.extend(shape);
                outcomes.push(Ok(()));
            }
            Ok(None) => {
                shapes.extend_from_slice(empty);
                outcomes.push(Ok(()));
            }
            Err(e) => {
                shapes.extend_from_slice(empty);
                outcomes.push(Err(e));
            }
        }
        offsets.push(values.len() as i32);
    }
    let leaf = T::DATA_TYPE;
    let DataType::Struct(fields) =
        variable_tensor_field("", leaf.clone(), &vec![None; empty.len()])
            .data_type()
            .clone()
    else {
        return Err("a variable-shape tensor is a struct".into());
    };
    let data = arrow_array::ListArray::try_new(
        Arc::new(Field::new_list_field(leaf, false)),
        arrow_buffer::OffsetBuffer::new(offsets.into()),
        Arc::new(arrow_array::PrimitiveArray::<T>::new(values.into(), None)),
        None,
    )
    .map_err(|e| e.to_string())?;
    let shape = arrow_array::FixedSizeListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Int32, false)),
        empty.len() as i32,
        Arc::new(arrow_array::Int32Array::from(shapes)),
        None,
    )
    .map_err(|e| e.to_string())?;
    let array =
        arrow_array::StructArray::try_new(fields, vec![Arc::new(data), Arc::new(shape)], nulls)
            .map_err(|e| e.to_string())?;
    Ok((array, outcomes))
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
