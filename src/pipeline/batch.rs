//! Re-batching to exactly `batch_rows` rows across unit and shard boundaries. A batch
//! that lies inside one upstream batch is a zero-copy slice of it.

use std::collections::VecDeque;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;

use super::BatchIter;
use crate::error::{Error, Result};

pub struct Rebatch {
    upstream: BatchIter,
    batch_rows: usize,
    drop_last: bool,
    queued: VecDeque<RecordBatch>,
    queued_rows: usize,
    upstream_done: bool,
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
        let schema: SchemaRef = parts[0].schema();
        concat_batches(&schema, &parts)
            .map_err(|e| Error::Internal(format!("cannot assemble a batch: {e}")))
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
