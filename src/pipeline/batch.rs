//! Re-batching to exactly `batch_rows` rows across unit and shard boundaries. A batch
//! that lies inside one upstream batch is a zero-copy slice of it.
//!
//! A batch assembled from several parts copies them. Its fixed-width tensor columns
//! (images, embeddings: `FixedSizeList` of a primitive type) are copied into buffers
//! that come back to this re-batcher once every holder of the batch (numpy, torch, the
//! consumer) has let it go. A fresh 38 MB buffer per batch of 256 224x224 RGB images
//! cost the pipeline thread 20-40 ms of page faults (the kernel zeroing new pages), and
//! the consumer as much again to hand the pages back: most of the serial path.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use arrow_array::{Array, ArrayRef, FixedSizeListArray, RecordBatch, make_array};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::DataType;
use arrow_select::concat::concat;

use super::BatchIter;
use crate::error::{Error, Result};

pub struct Rebatch {
    upstream: BatchIter,
    batch_rows: usize,
    drop_last: bool,
    queued: VecDeque<RecordBatch>,
    queued_rows: usize,
    upstream_done: bool,
    buffers: Arc<BufferPool>,
}

impl Rebatch {
    pub fn new(upstream: BatchIter, batch_rows: usize, drop_last: bool) -> Self {
        Self {
            upstream,
            batch_rows: batch_rows.max(1),
            drop_last,
            queued: VecDeque::new(),
            queued_rows: 0,
            upstream_done: false,
            buffers: Arc::default(),
        }
    }

    /// Takes the first `rows` queued rows off the queue as one batch.
    fn take_rows(&mut self, rows: usize) -> Result<RecordBatch> {
        let mut parts = Vec::new();
        let mut need = rows;
        while need > 0 {
            let Some(front) = self.queued.pop_front() else {
                return Err(Error::Internal("re-batching ran out of queued rows".into()));
            };
            if front.num_rows() <= need {
                need -= front.num_rows();
                parts.push(front);
            } else {
                parts.push(front.slice(0, need));
                self.queued
                    .push_front(front.slice(need, front.num_rows() - need));
                need = 0;
            }
        }
        self.queued_rows -= rows;
        if let [single] = &parts[..] {
            return Ok(single.clone());
        }
        let columns = (0..parts[0].num_columns())
            .map(|i| {
                let column: Vec<&dyn Array> = parts.iter().map(|p| p.column(i).as_ref()).collect();
                match self.buffers.concat_tensors(&column) {
                    Some(joined) => Ok(joined),
                    None => concat(&column),
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .and_then(|columns| RecordBatch::try_new(parts[0].schema(), columns))
            .map_err(|e| Error::Internal(format!("cannot assemble a batch: {e}")))?;
        Ok(columns)
    }
}

/// Free buffers kept for the next batches: as many as the batches that are usually out
/// at once beyond the one being filled (the prefetched one, the consumer's).
const POOLED_BUFFERS: usize = 2;

/// Output buffers of re-batched tensor columns, used again (see the module's note).
#[derive(Default)]
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// A pooled buffer's memory while a batch holds it; back to the pool when dropped (or
/// freed, when the pool is gone or full).
struct Pooled {
    memory: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut free = pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOLED_BUFFERS {
                free.push(std::mem::take(&mut self.memory));
            }
        }
    }
}

impl BufferPool {
    /// An empty buffer that can hold `len` bytes: a free one of about that size, or new.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        match free
            .iter()
            .position(|m| m.capacity() >= len && m.capacity() <= len.saturating_mul(2))
        {
            Some(i) => {
                let mut memory = free.swap_remove(i);
                memory.clear();
                memory
            }
            None => Vec::with_capacity(len),
        }
    }

    fn buffer(self: &Arc<Self>, memory: Vec<u8>) -> Buffer {
        let ptr = NonNull::new(memory.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let len = memory.len();
        let owner = Arc::new(Pooled {
            memory,
            pool: Arc::downgrade(self),
        });
        // SAFETY: `ptr` points at `len` initialised bytes of `owner.memory`, whose heap
        // allocation neither moves nor changes while `owner` lives (the buffer keeps it).
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }

    /// `parts` of a `FixedSizeList` column of a fixed-width type without nulls, joined
    /// into a pooled buffer; `None` for any other column (arrow's `concat` joins those).
    fn concat_tensors(self: &Arc<Self>, parts: &[&dyn Array]) -> Option<ArrayRef> {
        let DataType::FixedSizeList(field, size) = parts[0].data_type() else {
            return None;
        };
        let width = field.data_type().primitive_width()?;
        let lists: Vec<&FixedSizeListArray> = parts
            .iter()
            .map(|p| p.as_any().downcast_ref::<FixedSizeListArray>())
            .collect::<Option<_>>()?;
        if lists
            .iter()
            .any(|l| l.null_count() > 0 || l.values().null_count() > 0)
        {
            return None;
        }
        let values: Vec<ArrayData> = lists.iter().map(|l| l.values().to_data()).collect();
        let total: usize = values.iter().map(|v| v.len() * width).sum();
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
        let rows = lists.iter().map(|l| l.len()).sum::<usize>();
        let joined =
            FixedSizeListArray::try_new(field.clone(), *size, make_array(child), None).ok()?;
        debug_assert_eq!(joined.len(), rows);
        Some(Arc::new(joined))
    }
}

impl Iterator for Rebatch {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.upstream_done && self.queued_rows < self.batch_rows {
            match self.upstream.next() {
                Some(Ok(batch)) => {
                    if batch.num_rows() > 0 {
                        self.queued_rows += batch.num_rows();
                        self.queued.push_back(batch);
                    }
                }
                Some(Err(e)) => return Some(Err(e)),
                None => self.upstream_done = true,
            }
        }
        let rows = self.queued_rows.min(self.batch_rows);
        if rows == 0 || (rows < self.batch_rows && self.drop_last) {
            return None;
        }
        Some(self.take_rows(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, UInt8Array};
    use arrow_schema::{Field, Schema};

    /// Batches of `rows` images (3 bytes each, the row's number) and labels.
    fn parts(sizes: &[usize]) -> Vec<RecordBatch> {
        let field = Arc::new(Field::new("item", DataType::UInt8, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new("image", DataType::FixedSizeList(field.clone(), 3), false),
            Field::new("label", DataType::Int64, false),
        ]));
        let mut next = 0u8;
        sizes
            .iter()
            .map(|&rows| {
                let first = next;
                next = next.wrapping_add(rows as u8);
                let pixels: Vec<u8> = (0..rows)
                    .flat_map(|r| [first.wrapping_add(r as u8); 3])
                    .collect();
                let images = FixedSizeListArray::try_new(
                    field.clone(),
                    3,
                    Arc::new(UInt8Array::from(pixels)),
                    None,
                )
                .unwrap();
                let labels =
                    Int64Array::from_iter_values((0..rows).map(|r| (first as usize + r) as i64));
                RecordBatch::try_new(schema.clone(), vec![Arc::new(images), Arc::new(labels)])
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn assembled_tensors_match_arrow_and_reuse_returned_buffers() {
        let input = parts(&[5, 7, 2, 9, 6, 3]);
        let expected = arrow_select::concat::concat_batches(&input[0].schema(), &input).unwrap();
        let upstream: BatchIter = Box::new(input.into_iter().map(Ok));
        let mut rebatch = Rebatch::new(upstream, 8, false);
        let values_ptr = |b: &RecordBatch| {
            let list = b
                .column(0)
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .unwrap();
            list.values().to_data().buffers()[0].as_ptr()
        };
        let first = rebatch.next().unwrap().unwrap();
        let second = rebatch.next().unwrap().unwrap();
        assert_ne!(values_ptr(&first), values_ptr(&second));
        let first_memory = values_ptr(&first);
        // The first batch as values in memory of their own, to compare later.
        let first_values = |b: &RecordBatch| {
            let list = b
                .column(0)
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .unwrap();
            let labels = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            let values = list.values().to_data();
            let bytes = values.buffers()[0].as_slice();
            let start = values.offset();
            (
                bytes[start..start + list.len() * 3].to_vec(),
                labels.values().to_vec(),
            )
        };
        let first_copy = first_values(&first);
        drop(first);
        // The first batch's buffer is back in the pool: the third batch is written there.
        let third = rebatch.next().unwrap().unwrap();
        assert_eq!(values_ptr(&third), first_memory);
        assert_eq!(first_copy, first_values(&expected.slice(0, 8)));
        let mut all = vec![second, third];
        all.extend(rebatch.map(Result::unwrap));
        let joined = arrow_select::concat::concat_batches(&expected.schema(), &all).unwrap();
        assert_eq!(joined, expected.slice(8, 24));
        all.insert(0, expected.slice(0, 8));
        assert_eq!(
            all.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            [8, 8, 8, 8]
        );
    }
}
