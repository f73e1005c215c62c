//! How many bytes a record batch holds: what the prefetch queue, the shuffle buffer and
//! the random-access cache bound memory by. A property of the batch, used from
//! `format` and `pipeline` alike.

use arrow_array::RecordBatch;

/// Bytes of `batch`'s values: the slices it covers, not the whole buffers it may share
/// with other batches (arrow's `get_slice_memory_size`).
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| column_bytes(c.as_ref()))
        .sum()
}

/// One column's `get_slice_memory_size`, read off the array itself for the common types.
/// `to_data` builds an `ArrayData` (with its buffer list) only to be measured: for every
/// batch, on the pipeline thread, that was allocations the consumer's thread then freed.
fn column_bytes(column: &dyn arrow_array::Array) -> u64 {
    use arrow_array::cast::AsArray;
    use arrow_schema::DataType;
    let rows = column.len();
    // As `ArrayData`, which drops a null buffer without nulls (a slice's may have none).
    let nulls = if column.null_count() > 0 {
        rows.div_ceil(8)
    } else {
        0
    };
    let values = match column.data_type() {
        DataType::Binary => Some(byte_span(column.as_binary::<i32>().value_offsets())),
        DataType::Utf8 => Some(byte_span(column.as_string::<i32>().value_offsets())),
        DataType::LargeBinary => Some(byte_span(column.as_binary::<i64>().value_offsets())),
        DataType::LargeUtf8 => Some(byte_span(column.as_string::<i64>().value_offsets())),
        // The views, and the values they point to outside themselves (arrow counts the
        // views alone, not the values a gather's views share with its sources).
        DataType::BinaryView => {
            let views = column.as_binary_view().views();
            let outside: usize = views
                .iter()
                .map(|&view| view as u32 as usize)
                .filter(|&len| len > 12)
                .sum();
            Some(std::mem::size_of_val(views.as_ref()) + outside)
        }
        DataType::FixedSizeList(_, _) => {
            let values = column.as_fixed_size_list().values();
            (values.data_type().primitive_width().is_some())
                .then(|| column_bytes(values.as_ref()) as usize)
        }
        other => other.primitive_width().map(|width| rows * width),
    };
    match values {
        Some(values) => (values + nulls) as u64,
        None => {
            let data = column.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| data.get_buffer_memory_size()) as u64
        }
    }
}

/// A byte array's offsets and the values they span.
fn byte_span<O: arrow_buffer::ArrowNativeType>(offsets: &[O]) -> usize {
    let span = match (offsets.first(), offsets.last()) {
        (Some(first), Some(last)) => last.as_usize() - first.as_usize(),
        _ => 0,
    };
    std::mem::size_of_val(offsets) + span
}

#[cfg(test)]
mod tests {
    #[test]
    fn batch_bytes_is_arrows_slice_size_for_every_type() {
        use arrow_array::builder::{ListBuilder, StringBuilder};
        use arrow_array::{
            Array, ArrayRef, BinaryArray, BooleanArray, FixedSizeListArray, Float32Array,
            Int64Array, LargeStringArray, RecordBatch,
        };
        use std::sync::Arc;
        let rows = 300;
        let mut lists = ListBuilder::new(StringBuilder::new());
        for i in 0..rows {
            lists.values().append_value(format!("{i}"));
            lists.append(i % 3 != 0);
        }
        let pixels = Float32Array::from_iter_values((0..rows * 4).map(|v| v as f32));
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "int",
                Arc::new(Int64Array::from_iter(
                    (0..rows).map(|i| (i % 5 != 0).then_some(i as i64)),
                )),
            ),
            (
                "bytes",
                Arc::new(BinaryArray::from_iter_values(
                    (0..rows).map(|i| vec![1u8; i % 7]),
                )),
            ),
            (
                "text",
                Arc::new(LargeStringArray::from_iter(
                    (0..rows).map(|i| (i % 4 != 0).then(|| "x".repeat(i % 9))),
                )),
            ),
            (
                "flag",
                Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(i % 2 == 0)))),
            ),
            (
                "pixels",
                Arc::new(
                    FixedSizeListArray::try_new(
                        Arc::new(arrow_schema::Field::new(
                            "item",
                            arrow_schema::DataType::Float32,
                            false,
                        )),
                        4,
                        Arc::new(pixels),
                        None,
                    )
                    .unwrap(),
                ),
            ),
            ("list", Arc::new(lists.finish())),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        for (offset, len) in [(0, rows), (17, 100), (299, 1), (50, 0)] {
            let slice = batch.slice(offset, len);
            for column in slice.columns() {
                let data = column.to_data();
                assert_eq!(
                    super::column_bytes(column.as_ref()),
                    data.get_slice_memory_size().unwrap() as u64,
                    "{} at {offset}+{len}",
                    column.data_type()
                );
            }
        }
    }
}
