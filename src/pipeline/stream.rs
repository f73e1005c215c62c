//! The stream of record batches that stages pass along, and what makes batches of
//! several datasets one stream: a schema they can all be read as, each batch conformed
//! to it, and rows picked across batches.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::format;

pub type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Rows picked from `batches` as `(batch, row)` pairs, as one batch. Unlike
/// `interleave_record_batch` alone, this also takes batches with no columns (JSON lines
/// of `{}`), which have rows but nothing to count them by.
pub fn interleave_rows(
    batches: &[&RecordBatch],
    picks: &[(usize, usize)],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    match batches.first() {
        Some(first) if first.num_columns() == 0 => RecordBatch::try_new_with_options(
            first.schema(),
            Vec::new(),
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(picks.len())),
        ),
        _ => arrow_select::interleave::interleave_record_batch(batches, picks),
    }
}

/// Rows picked from `batches` as [`interleave_rows`] gives them, but each binary column
/// as views of its values where they lie (`BinaryView`): no value is copied, and the
/// batch holds the buffers it points into. For sources that cost nothing to hold (files
/// mapped from the page cache) and a consumer that turns each value into Python `bytes`
/// anyway: that is then the one copy of it, as in `datasets`' iteration over its
/// memory-mapped Arrow, where gathering first copied every value twice.
pub fn interleave_viewing(
    batches: &[&RecordBatch],
    picks: &[(usize, usize)],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let Some(first) = batches.first() else {
        return interleave_rows(batches, picks);
    };
    if !first.schema().fields().iter().any(|f| viewable(f)) {
        return interleave_rows(batches, picks);
    }
    with_columns(first, |i, field| {
        let arrays: Vec<&dyn arrow_array::Array> =
            batches.iter().map(|b| b.column(i).as_ref()).collect();
        match viewable(field) {
            true => view_values(&arrays, picks),
            false => arrow_select::interleave::interleave(&arrays, picks),
        }
    })
}

/// `batch`'s schema and metadata with each column made by `column(i, field)`; a field whose
/// column comes as views is marked with its type before (see [`unviewed`]).
fn with_columns(
    batch: &RecordBatch,
    mut column: impl FnMut(
        usize,
        &arrow_schema::Field,
    ) -> std::result::Result<arrow_array::ArrayRef, arrow_schema::ArrowError>,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let made = column(i, field)?;
        let mut field = field.as_ref().clone();
        if made.data_type() != field.data_type() {
            let mut metadata = field.metadata().clone();
            metadata.insert(VIEWED.to_string(), field.data_type().to_string());
            field = field
                .with_data_type(made.data_type().clone())
                .with_metadata(metadata);
        }
        fields.push(field);
        columns.push(made);
    }
    let schema = arrow_schema::Schema::new_with_metadata(fields, schema.metadata().clone());
    RecordBatch::try_new(Arc::new(schema), columns)
}

/// Marks a field that [`interleave_viewing`] gave as views, with its type before.
const VIEWED: &str = "shardflow.viewed_from";

/// `batch` with the columns [`interleave_viewing`] gave as views back in their own types
/// (their values copied): what leaves the loader as Arrow.
pub fn unviewed(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| f.metadata().contains_key(VIEWED))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let mut metadata = field.metadata().clone();
        match metadata.remove(VIEWED) {
            Some(from) => {
                let data_type = match from == arrow_schema::DataType::LargeBinary.to_string() {
                    true => arrow_schema::DataType::LargeBinary,
                    false => arrow_schema::DataType::Binary,
                };
                columns.push(
                    arrow_cast::cast(column, &data_type)
                        .map_err(|e| Error::Internal(e.to_string()))?,
                );
                fields.push(
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(data_type)
                        .with_metadata(metadata),
                );
            }
            None => {
                columns.push(column.clone());
                fields.push(field.as_ref().clone());
            }
        }
    }
    let schema = arrow_schema::Schema::new_with_metadata(fields, schema.metadata().clone());
    RecordBatch::try_new(Arc::new(schema), columns).map_err(|e| Error::Internal(e.to_string()))
}

/// `batch` with its binary columns as views of their own values (see
/// [`interleave_viewing`]); nothing is copied.
pub fn viewing(batch: RecordBatch) -> Result<RecordBatch> {
    if !batch.schema().fields().iter().any(|f| viewable(f)) {
        return Ok(batch);
    }
    let every: Vec<(usize, usize)> = (0..batch.num_rows()).map(|row| (0, row)).collect();
    with_columns(&batch, |i, field| match viewable(field) {
        true => view_values(&[batch.column(i).as_ref()], &every),
        // Not gathered again: the other columns stay as they are.
        false => Ok(batch.column(i).clone()),
    })
    .map_err(|e| Error::Internal(e.to_string()))
}

/// Whether [`interleave_viewing`] gives this column as views: plain binary values, not
/// those whose metadata says how Python reads them (NumPy arrays, tensors).
fn viewable(field: &arrow_schema::Field) -> bool {
    matches!(
        field.data_type(),
        arrow_schema::DataType::Binary | arrow_schema::DataType::LargeBinary
    ) && field.metadata().is_empty()
}

/// Values `picks` of binary `arrays` as a `BinaryView` array over their value buffers.
fn view_values(
    arrays: &[&dyn arrow_array::Array],
    picks: &[(usize, usize)],
) -> std::result::Result<arrow_array::ArrayRef, arrow_schema::ArrowError> {
    use arrow_array::cast::AsArray;
    match arrays.first().map(|a| a.data_type()) {
        Some(arrow_schema::DataType::LargeBinary) => {
            let arrays: Vec<_> = arrays.iter().map(|a| a.as_binary::<i64>()).collect();
            view_binary(&arrays, picks)
        }
        Some(arrow_schema::DataType::Binary) => {
            let arrays: Vec<_> = arrays.iter().map(|a| a.as_binary::<i32>()).collect();
            view_binary(&arrays, picks)
        }
        other => Err(arrow_schema::ArrowError::InvalidArgumentError(format!(
            "no views of {other:?} values"
        ))),
    }
}

/// [`view_values`] of arrays of one offset width.
fn view_binary<O: arrow_array::OffsetSizeTrait>(
    arrays: &[&arrow_array::GenericBinaryArray<O>],
    picks: &[(usize, usize)],
) -> std::result::Result<arrow_array::ArrayRef, arrow_schema::ArrowError> {
    use arrow_array::Array;
    // A view addresses its block with 32 bits: a larger values buffer is copied.
    if arrays.iter().any(|a| a.values().len() >= u32::MAX as usize) {
        let dynamic: Vec<&dyn Array> = arrays.iter().map(|a| *a as &dyn Array).collect();
        let copied = arrow_select::interleave::interleave(&dynamic, picks)?;
        return arrow_cast::cast(&copied, &arrow_schema::DataType::BinaryView);
    }
    let mut builder = arrow_array::builder::BinaryViewBuilder::with_capacity(picks.len());
    let mut blocks: Vec<Option<u32>> = vec![None; arrays.len()];
    for &(from, row) in picks {
        let array = arrays[from];
        if array.is_null(row) {
            builder.append_null();
            continue;
        }
        let offsets = array.value_offsets();
        let (start, end) = (offsets[row].as_usize(), offsets[row + 1].as_usize());
        let block =
            *blocks[from].get_or_insert_with(|| builder.append_block(array.values().clone()));
        builder.try_append_view(block, start as u32, (end - start) as u32)?;
    }
    Ok(Arc::new(builder.finish()))
}

/// Rows `rows` of `batch`, in that order, as one batch: each row's values copied whole
/// (`take` of a list column builds an index per value first, a copy of 8 bytes per token
/// of a pack).
pub fn select_rows(
    batch: &RecordBatch,
    rows: &[usize],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let picks: Vec<(usize, usize)> = rows.iter().map(|&r| (0, r)).collect();
    interleave_rows(&[batch], &picks)
}

/// `batch` as `schema`: columns matched by name, in the schema's order, cast to its
/// types; what `concatenate` and `interleave` do to each part's batches.
pub fn conform(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema() == *schema {
        return Ok(batch);
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let column = batch
            .column_by_name(field.name())
            .ok_or_else(|| Error::Schema {
                url: String::new(),
                message: format!("a batch has no column {:?}", field.name()),
            })?;
        let column = if column.data_type() == field.data_type() {
            column.clone()
        } else {
            arrow_cast::cast(column, field.data_type()).map_err(|e| Error::Schema {
                url: String::new(),
                message: format!(
                    "column {:?}: cannot read {} as {}: {e}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                ),
            })?
        };
        columns.push(column);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options)
        .map_err(|e| Error::Internal(format!("conforming a batch: {e}")))
}

/// The type that values of types `a` and `b` can both be read as, if any: null widens
/// to anything, narrower to wider integers, integers to floats, text to large text. A
/// list is one logical type whatever its offsets or item name: `List` and `LargeList`
/// of any item name unify to `List<item>` (as pyarrow and `datasets` write lists;
/// `LargeList<item>` where both are large, as `datasets` keeps its `LargeList`), their
/// items unified in turn, and fixed-size lists of one size to `FixedSizeList<item>`;
/// structs with the same fields in the same order unify field by field.
fn wider(a: &arrow_schema::DataType, b: &arrow_schema::DataType) -> Option<arrow_schema::DataType> {
    use arrow_schema::{DataType as T, Field};
    if a == b {
        return Some(a.clone());
    }
    let rank = |t: &T| match t {
        T::Int8 => Some(1),
        T::Int16 => Some(2),
        T::Int32 => Some(3),
        T::Int64 => Some(4),
        T::Float32 => Some(5),
        T::Float64 => Some(6),
        _ => None,
    };
    match (a, b) {
        (T::Null, other) | (other, T::Null) => Some(other.clone()),
        (T::Utf8 | T::LargeUtf8, T::Utf8 | T::LargeUtf8) => Some(T::LargeUtf8),
        (T::Binary | T::LargeBinary, T::Binary | T::LargeBinary) => Some(T::LargeBinary),
        (T::List(x) | T::LargeList(x), T::List(y) | T::LargeList(y)) => {
            let item = Arc::new(Field::new(
                "item",
                wider(x.data_type(), y.data_type())?,
                x.is_nullable() || y.is_nullable(),
            ));
            // Large lists stay large (whose item Parquet names "element", IPC "item").
            Some(match (a, b) {
                (T::LargeList(_), T::LargeList(_)) => T::LargeList(item),
                _ => T::List(item),
            })
        }
        // Parquet names a fixed-size list's item "element", Arrow IPC "item".
        (T::FixedSizeList(x, n), T::FixedSizeList(y, m)) if n == m => {
            let item = wider(x.data_type(), y.data_type())?;
            Some(T::FixedSizeList(
                Arc::new(Field::new("item", item, x.is_nullable() || y.is_nullable())),
                *n,
            ))
        }
        (T::Struct(x), T::Struct(y))
            if x.len() == y.len() && x.iter().zip(y.iter()).all(|(f, g)| f.name() == g.name()) =>
        {
            let fields = x
                .iter()
                .zip(y.iter())
                .map(|(f, g)| {
                    wider(f.data_type(), g.data_type())
                        .map(|t| Field::new(f.name(), t, f.is_nullable() || g.is_nullable()))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(T::Struct(fields.into()))
        }
        _ => match (rank(a), rank(b)) {
            (Some(x), Some(y)) => {
                let wide = if x >= y { a } else { b };
                // An int64 meeting a float32 needs a float64 to keep its values.
                Some(if x.max(y) == 5 && x.min(y) == 4 {
                    T::Float64
                } else {
                    wide.clone()
                })
            }
            _ => None,
        },
    }
}

/// The one schema that batches of every schema in `schemas` can be read as: the same
/// column names (any order; the first schema's order is kept), each column's types equal
/// or one widening to the other (see `wider`). Anything else is a `SchemaError` naming
/// the column.
pub fn unify_schemas(schemas: &[SchemaRef]) -> Result<SchemaRef> {
    use arrow_schema::{Field, Schema};
    let first = &schemas[0];
    let mismatch = |message: String| Error::Schema {
        url: String::new(),
        message,
    };
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    for (n, schema) in schemas.iter().enumerate().skip(1) {
        for field in schema.fields() {
            if first.index_of(field.name()).is_err() {
                return Err(mismatch(format!(
                    "column {:?} is in dataset {n} but not in dataset 0 (whose columns are {:?})",
                    field.name(),
                    format::field_names(first)
                )));
            }
        }
        for out in fields.iter_mut() {
            let Ok(theirs) = schema.field_with_name(out.name()) else {
                return Err(mismatch(format!(
                    "column {:?} is in dataset 0 but not in dataset {n} (whose columns are {:?})",
                    out.name(),
                    format::field_names(schema)
                )));
            };
            let Some(unified) = wider(out.data_type(), theirs.data_type()) else {
                return Err(mismatch(format!(
                    "column {:?} is {} in dataset 0 but {} in dataset {n}, and neither widens to the other",
                    out.name(),
                    out.data_type(),
                    theirs.data_type()
                )));
            };
            *out = Field::new(
                out.name(),
                unified,
                out.is_nullable() || theirs.is_nullable(),
            )
            .with_metadata(out.metadata().clone());
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch};

    fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
        let values: Vec<Option<Vec<u8>>> = ids
            .clone()
            .map(|i| match i % 4 {
                0 => None,
                1 => Some(vec![i as u8; 5]),
                _ => Some(vec![i as u8; 1000 + i as usize]),
            })
            .collect();
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
            ),
            ("blob", Arc::new(BinaryArray::from_iter(values)) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn views_point_into_the_sources_and_export_as_the_copy_would() {
        let (a, b) = (batch(0..10), batch(10..30).slice(3, 15));
        let picks = [(1, 4), (0, 2), (0, 0), (1, 14), (0, 9), (1, 0), (0, 1)];
        let copied = super::interleave_rows(&[&a, &b], &picks).unwrap();
        let viewed = super::interleave_viewing(&[&a, &b], &picks).unwrap();
        let views = viewed.column(1).as_binary_view();
        // Nothing copied: the long values' bytes are the sources' own.
        let sources = [
            a.column(1).as_binary::<i32>(),
            b.column(1).as_binary::<i32>(),
        ];
        for (k, &(from, row)) in picks.iter().enumerate() {
            assert_eq!(views.is_null(k), sources[from].is_null(row));
            if !views.is_null(k) && views.value(k).len() > 12 {
                assert_eq!(views.value(k).as_ptr(), sources[from].value(row).as_ptr());
            }
        }
        let lengths: u64 = (0..views.len())
            .map(|k| views.value(k).len() as u64)
            .filter(|&n| n > 12)
            .sum();
        assert_eq!(
            crate::batch_bytes::batch_bytes(&viewed),
            // ids, views, the values outside the views, the null bitmap
            picks.len() as u64 * 8 + picks.len() as u64 * 16 + lengths + 1
        );
        assert_eq!(super::unviewed(&viewed).unwrap(), copied);
        // Rows already copied as views of their own buffer: the same batch back.
        let own = super::viewing(copied.clone()).unwrap();
        assert_eq!(own.column(1).as_binary_view(), views);
        assert_eq!(super::unviewed(&own).unwrap(), copied);
    }
}
