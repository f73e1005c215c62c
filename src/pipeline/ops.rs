//! Dataset operations applied in the order the user chained them.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::BatchIter;
use super::batch::Rebatch;
use crate::error::Result;

/// A user function over batches (filter, map, flat_map). The Python layer implements it;
/// the core only calls it, in order, from the pipeline thread.
pub trait BatchTransform: Send + Sync {
    /// Turns one batch into zero or more batches.
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>>;
    /// Whether every input row gives exactly one output row, so lengths stay known.
    fn preserves_rows(&self) -> bool;
    /// Rows per call for functions that want fixed-size batches.
    fn batch_rows(&self) -> Option<usize> {
        None
    }
}

#[derive(Clone)]
pub enum Op {
    /// Seeded shuffle: shard/unit order (when nothing before it selects rows by position)
    /// plus a row buffer of `buffer_rows`.
    Shuffle {
        seed: u64,
        buffer_rows: usize,
    },
    Take(u64),
    Skip(u64),
    Transform(Arc<dyn BatchTransform>),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Shuffle { seed, buffer_rows } => {
                write!(f, "shuffle(seed={seed}, buffer_size={buffer_rows})")
            }
            Op::Take(n) => write!(f, "take({n})"),
            Op::Skip(n) => write!(f, "skip({n})"),
            Op::Transform(_) => write!(f, "transform"),
        }
    }
}

/// The first `n` rows; stops pulling (and so stops reading) once they are out.
pub struct Take {
    upstream: Option<BatchIter>,
    remaining: u64,
}

impl Take {
    pub fn new(upstream: BatchIter, n: u64) -> Self {
        Self {
            upstream: Some(upstream),
            remaining: n,
        }
    }
}

impl Iterator for Take {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            // Dropping the upstream cancels its background reads.
            self.upstream = None;
            return None;
        }
        let item = self.upstream.as_mut()?.next();
        match item {
            Some(Ok(batch)) => {
                let rows = batch.num_rows() as u64;
                let keep = rows.min(self.remaining);
                self.remaining -= keep;
                Some(Ok(if keep == rows {
                    batch
                } else {
                    batch.slice(0, keep as usize)
                }))
            }
            other => other,
        }
    }
}

/// Everything after the first `n` rows.
pub struct Skip {
    upstream: BatchIter,
    remaining: u64,
}

impl Skip {
    pub fn new(upstream: BatchIter, n: u64) -> Self {
        Self {
            upstream,
            remaining: n,
        }
    }
}

impl Iterator for Skip {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let batch = match self.upstream.next()? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(e)),
            };
            let rows = batch.num_rows() as u64;
            if self.remaining >= rows {
                self.remaining -= rows;
                continue;
            }
            let skip = std::mem::take(&mut self.remaining) as usize;
            return Some(Ok(batch.slice(skip, batch.num_rows() - skip)));
        }
    }
}

/// Applies a user function batch by batch.
pub struct Transformed {
    upstream: BatchIter,
    transform: Arc<dyn BatchTransform>,
    out: std::collections::VecDeque<RecordBatch>,
}

impl Transformed {
    pub fn new(upstream: BatchIter, transform: Arc<dyn BatchTransform>) -> Self {
        let upstream: BatchIter = match transform.batch_rows() {
            Some(rows) => Box::new(Rebatch::new(upstream, rows, false)),
            None => upstream,
        };
        Self {
            upstream,
            transform,
            out: Default::default(),
        }
    }
}

impl Iterator for Transformed {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(batch) = self.out.pop_front() {
                return Some(Ok(batch));
            }
            let batch = match self.upstream.next()? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(e)),
            };
            match self.transform.apply(batch) {
                Ok(batches) => self
                    .out
                    .extend(batches.into_iter().filter(|b| b.num_rows() > 0)),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
