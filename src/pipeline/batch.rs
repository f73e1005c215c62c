//! Re-batching to exactly `batch_rows` rows across unit and shard boundaries. A batch
//! that lies inside one upstream batch is a zero-copy slice of it.
//!
//! A batch assembled from several parts copies them. The values of its large columns
//! (tensors: `FixedSizeList` of a primitive type; bytes and strings) are copied into
//! buffers that come back to this re-batcher once every holder of the batch (numpy,
//! torch, the consumer) has let it go (`crate::buffers`). A fresh 38 MB buffer per batch of 256 224x224 RGB
//! images cost the pipeline thread 20-40 ms of page faults (the kernel zeroing new
//! pages), and the consumer as much again to hand the pages back: most of the serial
//! path.
//!
//! In a loader the joins run on the run's batch threads (see `assemble`).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::ByteArrayType;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, GenericByteArray, ListArray, RecordBatch, StructArray,
    make_array,
};
use arrow_buffer::{ArrowNativeType, OffsetBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use arrow_select::concat::concat;

use super::assemble::{BatchThreads, InOrder, Step};
use super::stream::BatchIter;
use crate::buffers::BufferPool;
use crate::error::{Error, Result};

pub struct Rebatch {
    upstream: BatchIter,
    batch_rows: usize,
    drop_last: bool,
    queued: VecDeque<RecordBatch>,
    /// Rows of the front queued batch already taken. (Slicing off what is left at each
    /// batch was a second slice per batch, and its allocations, on the pipeline thread.)
    front_taken: usize,
    queued_rows: usize,
    upstream_done: bool,
    buffers: Arc<BufferPool>,
    /// The batches being joined on the run's batch threads, when they are (`joining_on`).
    joins: Option<InOrder>,
}

impl Rebatch {
    pub fn new(upstream: BatchIter, batch_rows: usize, drop_last: bool) -> Self {
        Self {
            upstream,
            batch_rows: batch_rows.max(1),
            drop_last,
            queued: VecDeque::new(),
            front_taken: 0,
            queued_rows: 0,
            upstream_done: false,
            buffers: Arc::default(),
            joins: None,
        }
    }

    /// Joins batches on `threads`, several at once; they come out in order.
    pub fn joining_on(mut self, threads: Arc<BatchThreads>) -> Self {
        self.joins = Some(InOrder::new(threads));
        self
    }

    /// The parts of the next batch, taken off the queue; `None` at the end.
    fn next_parts(&mut self) -> Option<Result<Vec<RecordBatch>>> {
        while !self.upstream_done && self.queued_rows < self.batch_rows {
            match self.upstream.next() {
                Some(Ok(batch)) => {
                    if batch.num_rows() > 0 {
                        self.queued_rows += batch.num_rows();
                        self.queued.push_back(batch);
                    }
                }
                Some(Err(e)) => {
                    // The stream ends with its error: rows queued before it are no batch.
                    self.upstream_done = true;
                    self.queued.clear();
                    self.front_taken = 0;
                    self.queued_rows = 0;
                    return Some(Err(e));
                }
                None => self.upstream_done = true,
            }
        }
        let rows = self.queued_rows.min(self.batch_rows);
        if rows == 0 || (rows < self.batch_rows && self.drop_last) {
            return None;
        }
        Some(self.take_rows(rows))
    }

    /// Takes the first `rows` queued rows off the queue.
    fn take_rows(&mut self, rows: usize) -> Result<Vec<RecordBatch>> {
        let mut parts = Vec::new();
        let mut need = rows;
        while need > 0 {
            let ran_out = || Error::Internal("re-batching ran out of queued rows".into());
            let left = self.queued.front().ok_or_else(ran_out)?.num_rows() - self.front_taken;
            if left <= need {
                need -= left;
                let front = self.queued.pop_front().ok_or_else(ran_out)?;
                parts.push(match std::mem::take(&mut self.front_taken) {
                    0 => front,
                    taken => front.slice(taken, left),
                });
            } else {
                let front = self.queued.front().ok_or_else(ran_out)?;
                parts.push(front.slice(self.front_taken, need));
                self.front_taken += need;
                need = 0;
            }
        }
        self.queued_rows -= rows;
        Ok(parts)
    }
}

/// `parts` as one batch: the one part itself, or the parts' rows copied into one batch
/// (large columns into pooled buffers).
fn join(buffers: &Arc<BufferPool>, mut parts: Vec<RecordBatch>) -> Result<RecordBatch> {
    if parts.len() == 1 {
        // Moved out, not cloned: a clone is another column list to allocate on the
        // pipeline thread, for the consumer's thread to free.
        return parts
            .pop()
            .ok_or_else(|| Error::Internal("no parts to join".into()));
    }
    let mut pooled = 0;
    let columns = (0..parts[0].num_columns())
        .map(|i| {
            let column: Vec<&dyn Array> = parts.iter().map(|p| p.column(i).as_ref()).collect();
            match buffers.concat(&column) {
                Some(joined) => {
                    pooled += 1;
                    Ok(joined)
                }
                None => concat(&column),
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .and_then(|columns| RecordBatch::try_new(parts[0].schema(), columns))
        .map_err(|e| Error::Internal(format!("cannot assemble a batch: {e}")))?;
    // Up to `POOLED_PER_COLUMN` free buffers for each column of this batch that came
    // from the pool; none when none did.
    buffers.set_keep(pooled * POOLED_PER_COLUMN);
    Ok(columns)
}

/// Batches of these sizes are joined on the pipeline thread. From 1 MB their copy's
/// hand-off, whose latency on a busy machine made the consumer wait now and then,
/// deepened the prefetch by batches of megabytes (a full shuffle of 8 MB batches peaked
/// 40-60% higher in a third of its runs). Smaller joins go to the batch threads: where
/// a unit's rows do not divide into batches (row groups of 10k rows, a shuffle buffer's
/// outputs of 625) every few batches join two pieces, and those joins were a third of
/// the pipeline thread's CPU.
const INLINE_JOINS: Range<u64> = (1 << 20)..(16 << 20);

/// Free buffers kept per pooled column: as many as the batches that are usually out at
/// once beyond the one being filled (the prefetched one, the consumer's).
const POOLED_PER_COLUMN: usize = 2;

/// Columns with fewer value bytes are joined by arrow's `concat`: their memory is reused
/// by the allocator anyway, and pooling them would keep buffers that batches of other
/// sizes cannot use.
const POOLED_MIN_BYTES: usize = 64 * 1024;

impl BufferPool {
    /// `parts` of one column joined with their values in a pooled buffer: tensors
    /// (`FixedSizeList` of a fixed-width type) and bytes or strings, without nulls, of at
    /// least `POOLED_MIN_BYTES`; `None` for any other (arrow's `concat` joins those).
    fn concat(self: &Arc<Self>, parts: &[&dyn Array]) -> Option<ArrayRef> {
        use arrow_array::types::{BinaryType, LargeBinaryType, LargeUtf8Type, Utf8Type};
        if parts.iter().any(|p| p.null_count() > 0) {
            return None;
        }
        match parts[0].data_type() {
            DataType::FixedSizeList(..) => self.concat_tensors(parts),
            DataType::LargeBinary => self.concat_bytes::<LargeBinaryType>(parts),
            DataType::LargeUtf8 => self.concat_bytes::<LargeUtf8Type>(parts),
            DataType::Binary => self.concat_bytes::<BinaryType>(parts),
            DataType::Utf8 => self.concat_bytes::<Utf8Type>(parts),
            DataType::Struct(_) => self.concat_variable_tensors(parts),
            _ => None,
        }
    }

    fn concat_tensors(self: &Arc<Self>, parts: &[&dyn Array]) -> Option<ArrayRef> {
        let DataType::FixedSizeList(field, size) = parts[0].data_type() else {
            return None;
        };
        let width = field.data_type().primitive_width()?;
        let lists: Vec<&FixedSizeListArray> = parts
            .iter()
            .map(|p| p.as_any().downcast_ref::<FixedSizeListArray>())
            .collect::<Option<_>>()?;
        if lists.iter().any(|l| l.values().null_count() > 0) {
            return None;
        }
        let values: Vec<ArrayData> = lists.iter().map(|l| l.values().to_data()).collect();
        let total: usize = values.iter().map(|v| v.len() * width).sum();
        if total < POOLED_MIN_BYTES {
            return None;
        }
        let mut memory = self.take(total);
        for v in &values {
            let start = v.offset() * width;
            memory.extend_from_slice(
                &v.buffers().first()?.as_slice()[start..start + v.len() * width],
            );
        }
        let child = ArrayData::builder(field.data_type().clone())
            .len(total / width)
            .add_buffer(self.buffer(memory))
            .build()
            .ok()?;
        let joined =
            FixedSizeListArray::try_new(field.clone(), *size, make_array(child), None).ok()?;
        Some(Arc::new(joined))
    }

    /// Variable-shape tensors (images and clips each at its own size: a struct of
    /// `data`, a list of a fixed-width type, and `shape`): the values into a pooled buffer,
    /// the offsets and shapes joined beside them.
    fn concat_variable_tensors(self: &Arc<Self>, parts: &[&dyn Array]) -> Option<ArrayRef> {
        let DataType::Struct(fields) = parts[0].data_type() else {
            return None;
        };
        let (data_at, data_field) = fields.find("data")?;
        let (shape_at, _) = fields.find("shape")?;
        let DataType::List(item) = data_field.data_type() else {
            return None;
        };
        if fields.len() != 2 {
            return None;
        }
        let width = item.data_type().primitive_width()?;
        let structs: Vec<&StructArray> = parts
            .iter()
            .map(|p| p.as_struct_opt())
            .collect::<Option<_>>()?;
        let lists: Vec<&ListArray> = structs
            .iter()
            .map(|s| s.column(data_at).as_list_opt::<i32>())
            .collect::<Option<_>>()?;
        if lists
            .iter()
            .any(|l| l.null_count() > 0 || l.values().null_count() > 0)
        {
            return None;
        }
        let spans: Vec<(usize, usize)> = lists
            .iter()
            .map(|l| value_span(l.value_offsets()))
            .collect();
        let values: usize = spans.iter().map(|(start, end)| end - start).sum();
        // More values than `List` offsets count: arrow's `concat` says so.
        i32::from_usize(values)?;
        if values * width < POOLED_MIN_BYTES {
            return None;
        }
        let rows: usize = lists.iter().map(|l| l.len()).sum();
        // A quarter more than this batch: the next batches' sizes differ a little.
        let mut memory = self.take_with_room(values * width, values * width / 4);
        let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
        offsets.push(0);
        for (list, &(start, end)) in lists.iter().zip(&spans) {
            let part = list.values().to_data();
            let base = memory.len() / width;
            let at = part.offset();
            memory.extend_from_slice(
                &part.buffers().first()?.as_slice()[(at + start) * width..(at + end) * width],
            );
            offsets.extend(
                list.value_offsets()[1..]
                    .iter()
                    .map(|o| (o.as_usize() - start + base) as i32),
            );
        }
        let child = ArrayData::builder(item.data_type().clone())
            .len(values)
            .add_buffer(self.buffer(memory))
            .build()
            .ok()?;
        let data = ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            make_array(child),
            None,
        )
        .ok()?;
        let shapes: Vec<&dyn Array> = structs
            .iter()
            .map(|s| s.column(shape_at).as_ref())
            .collect();
        let shape = concat(&shapes).ok()?;
        let mut columns: Vec<ArrayRef> = vec![shape.clone(), shape];
        columns[data_at] = Arc::new(data);
        let joined = StructArray::try_new(fields.clone(), columns, None).ok()?;
        Some(Arc::new(joined))
    }

    fn concat_bytes<T: ByteArrayType>(self: &Arc<Self>, parts: &[&dyn Array]) -> Option<ArrayRef> {
        let arrays: Vec<&GenericByteArray<T>> = parts
            .iter()
            .map(|p| p.as_any().downcast_ref::<GenericByteArray<T>>())
            .collect::<Option<_>>()?;
        let spans: Vec<(usize, usize)> = arrays
            .iter()
            .map(|a| value_span(a.value_offsets()))
            .collect();
        let total: usize = spans.iter().map(|(start, end)| end - start).sum();
        // Offsets too narrow for the total: arrow's `concat` says so.
        T::Offset::from_usize(total)?;
        if total < POOLED_MIN_BYTES {
            return None;
        }
        let rows: usize = arrays.iter().map(|a| a.len()).sum();
        let mut memory = self.take(total);
        let mut offsets: Vec<T::Offset> = Vec::with_capacity(rows + 1);
        offsets.push(T::Offset::usize_as(0));
        for (array, &(start, end)) in arrays.iter().zip(&spans) {
            let base = memory.len();
            memory.extend_from_slice(&array.value_data()[start..end]);
            offsets.extend(
                array.value_offsets()[1..]
                    .iter()
                    .map(|o| T::Offset::usize_as(o.as_usize() - start + base)),
            );
        }
        // SAFETY: the offsets start at 0, never decrease and end at `total`, the values'
        // length; each value's bytes are the part's, whole, so strings stay UTF-8.
        let joined = unsafe {
            GenericByteArray::<T>::new_unchecked(
                OffsetBuffer::new_unchecked(ScalarBuffer::from(offsets)),
                self.buffer(memory),
                None,
            )
        };
        Some(Arc::new(joined))
    }
}

/// Where a part's values run in its values buffer: from its first offset to its last (a
/// slice's offsets need not start at 0).
fn value_span<O: ArrowNativeType>(offsets: &[O]) -> (usize, usize) {
    (offsets[0].as_usize(), offsets[offsets.len() - 1].as_usize())
}

impl Iterator for Rebatch {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let Some(mut joins) = self.joins.take() else {
            return self
                .next_parts()
                .map(|parts| parts.and_then(|parts| join(&self.buffers, parts)));
        };
        let batch = joins.next(|| {
            let parts = match self.next_parts()? {
                Ok(parts) => parts,
                Err(e) => return Some(Err(e)),
            };
            let inline =
                || INLINE_JOINS.contains(&parts.iter().map(crate::batch_bytes::batch_bytes).sum());
            Some(if parts.len() == 1 || inline() {
                join(&self.buffers, parts).map(Step::Ready)
            } else {
                let buffers = self.buffers.clone();
                Ok(Step::Make(Box::new(move || join(&buffers, parts))))
            })
        });
        self.joins = Some(joins);
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{LargeBinaryArray, StringArray, UInt8Array};
    use arrow_schema::{Field, Schema};

    /// Image side: 16 KiB tensors, so that a batch of 8 passes `POOLED_MIN_BYTES`.
    const PIXELS: usize = 16 * 1024;

    /// Batches of `rows` images (every byte the row's number), blobs of 10 KiB and
    /// names, their row numbers counting on from batch to batch.
    fn parts(sizes: &[usize]) -> Vec<RecordBatch> {
        let field = Arc::new(Field::new("item", DataType::UInt8, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "image",
                DataType::FixedSizeList(field.clone(), PIXELS as i32),
                false,
            ),
            Field::new("blob", DataType::LargeBinary, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let mut next = 0usize;
        sizes
            .iter()
            .map(|&rows| {
                let ids: Vec<usize> = (next..next + rows).collect();
                next += rows;
                let pixels: Vec<u8> = ids.iter().flat_map(|&i| vec![i as u8; PIXELS]).collect();
                let images = FixedSizeListArray::try_new(
                    field.clone(),
                    PIXELS as i32,
                    Arc::new(UInt8Array::from(pixels)),
                    None,
                )
                .unwrap();
                let blobs: LargeBinaryArray = ids
                    .iter()
                    .map(|&i| Some(vec![i as u8 ^ 0x5a; 10_240]))
                    .collect();
                let names = StringArray::from_iter_values(ids.iter().map(|i| format!("row {i}")));
                RecordBatch::try_new(
                    schema.clone(),
                    vec![Arc::new(images), Arc::new(blobs), Arc::new(names)],
                )
                .unwrap()
            })
            .collect()
    }

    /// Where a column's values live.
    fn values_ptr(batch: &RecordBatch, column: usize) -> *const u8 {
        let array = batch.column(column);
        match array.as_any().downcast_ref::<FixedSizeListArray>() {
            Some(list) => list.values().to_data().buffers()[0].as_ptr(),
            None => array.to_data().buffers()[1].as_ptr(),
        }
    }

    #[test]
    fn assembled_batches_match_arrow_and_reuse_returned_buffers() {
        let input = parts(&[5, 7, 2, 9, 6, 3]);
        let expected = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        let upstream: BatchIter = Box::new(input.into_iter().map(Ok));
        let mut rebatch = Rebatch::new(upstream, 8, false);
        let first = rebatch.next().unwrap().unwrap();
        let second = rebatch.next().unwrap().unwrap();
        assert_eq!(first, expected.slice(0, 8));
        assert_eq!(second, expected.slice(8, 8));
        let first_memory = [values_ptr(&first, 0), values_ptr(&first, 1)];
        assert_ne!(first_memory[0], values_ptr(&second, 0));
        drop(first);
        // The first batch's buffers are back in the pool: the third batch is written there.
        let third = rebatch.next().unwrap().unwrap();
        assert_eq!(first_memory, [values_ptr(&third, 0), values_ptr(&third, 1)]);
        assert_eq!(third, expected.slice(16, 8));
        // The small column is joined by arrow, its memory not pooled.
        assert!(third.column(2).to_data().buffers()[1].capacity() > 0);
        let last = rebatch.next().unwrap().unwrap();
        assert_eq!(last, expected.slice(24, 8));
        assert!(rebatch.next().is_none());
        // Held batches keep their values while the pool serves others.
        assert_eq!(second, expected.slice(8, 8));
    }

    #[test]
    fn joins_on_threads_give_the_batches_in_order_then_the_error() {
        let input = parts(&[5, 7, 2, 9, 6, 3, 8, 1, 4]);
        let expected = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        // Batches of 8 rows of about 26 KB each: joined on the threads.
        assert!(crate::batch_bytes::batch_bytes(&expected.slice(0, 8)) < INLINE_JOINS.start);
        let stats = Arc::new(super::super::Stats::default());
        let upstream: BatchIter = Box::new(input.into_iter().map(Ok).chain(std::iter::once(Err(
            Error::Internal("upstream broke".into()),
        ))));
        let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = BatchThreads::new(2, stats.clone(), cancel);
        let mut joined = Rebatch::new(upstream, 8, false).joining_on(threads);
        for i in 0..5 {
            assert_eq!(joined.next().unwrap().unwrap(), expected.slice(i * 8, 8));
        }
        // The 5 rows left over are never a batch: the error ends the stream.
        let err = joined.next().unwrap().unwrap_err();
        assert!(err.to_string().contains("upstream broke"), "{err}");
        assert!(joined.next().is_none());
        assert!(stats.assemble_ns.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }

    /// Batches of one variable-shape tensor column (images of their own sizes, as
    /// `uint16` so that offsets count values, not bytes), row `i` of `i % 7 + 1` rows of
    /// 400 values: batches of 64 rows of about 200 KB, enough to be pooled.
    fn variable_tensor_parts(sizes: &[usize]) -> Vec<RecordBatch> {
        use arrow_array::types::UInt16Type;
        let field =
            crate::format::variable_tensor_field("image", DataType::UInt16, &[None, Some(400)]);
        let schema = Arc::new(Schema::new(vec![field]));
        let mut next = 0usize;
        sizes
            .iter()
            .map(|&rows| {
                let tensors = (next..next + rows)
                    .map(|i| {
                        let h = i % 7 + 1;
                        Ok(Some((vec![i as u16; h * 400], vec![h as i32, 400])))
                    })
                    .collect();
                next += rows;
                let (column, _) =
                    crate::format::variable_tensor_column::<UInt16Type>(tensors, &[0, 400], None)
                        .unwrap();
                RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).unwrap()
            })
            .collect()
    }

    /// Where a variable-shape tensor column's values live.
    fn tensor_values_ptr(batch: &RecordBatch) -> *const u8 {
        let data = batch
            .column(0)
            .as_struct()
            .column(0)
            .as_list::<i32>()
            .values()
            .to_data();
        data.buffers()[0].as_ptr()
    }

    #[test]
    fn variable_shape_tensors_join_as_arrow_does_into_returned_buffers() {
        let input = variable_tensor_parts(&[40, 30, 25, 45, 35, 50]);
        let expected = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        // Sliced parts, as decoded units are cut at batch boundaries; every batch of 64
        // joins two or three.
        let mut sliced = input.clone();
        sliced[0] = input[0].slice(3, 37);
        sliced[2] = input[2].slice(0, 20);
        let want = arrow_select::concat::concat_batches(
            &expected.schema(),
            &[
                expected.slice(3, 37),
                expected.slice(40, 30),
                expected.slice(70, 20),
                expected.slice(95, 130),
            ],
        )
        .unwrap();
        let upstream: BatchIter = Box::new(sliced.into_iter().map(Ok));
        let mut rebatch = Rebatch::new(upstream, 64, false);
        let first = rebatch.next().unwrap().unwrap();
        let second = rebatch.next().unwrap().unwrap();
        assert_eq!(first, want.slice(0, 64));
        assert_eq!(second, want.slice(64, 64));
        let first_memory = tensor_values_ptr(&first);
        drop(first);
        let third = rebatch.next().unwrap().unwrap();
        assert_eq!(third, want.slice(128, 64));
        // The first batch's values buffer came back to the pool and holds the third's.
        assert_eq!(tensor_values_ptr(&third), first_memory);
        let mut rows = 192;
        for batch in rebatch {
            let batch = batch.unwrap();
            assert_eq!(batch, want.slice(rows, batch.num_rows()));
            rows += batch.num_rows();
        }
        assert_eq!(rows, want.num_rows());
        assert_eq!(second, want.slice(64, 64));
    }

    #[test]
    fn sliced_parts_keep_their_offsets() {
        let input = parts(&[6, 6]);
        let expected = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        let sliced = vec![input[0].slice(1, 5), input[1].slice(2, 3)];
        let upstream: BatchIter = Box::new(sliced.into_iter().map(Ok));
        let joined = Rebatch::new(upstream, 8, false).next().unwrap().unwrap();
        let want = arrow_select::concat::concat_batches(
            &expected.schema(),
            &[expected.slice(1, 5), expected.slice(8, 3)],
        )
        .unwrap();
        assert_eq!(joined, want);
    }
}
