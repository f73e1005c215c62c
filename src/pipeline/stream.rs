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
