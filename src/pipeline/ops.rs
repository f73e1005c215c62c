//! Dataset operations applied in the order the user chained them.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::BatchIter;
use super::batch::Rebatch;
pub use super::shuffle::BufferBounds;
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
    /// What the transform is, for people and for a dataset's fingerprint
    /// (e.g. `map(train.normalize)`).
    fn describe(&self) -> String;
}

#[derive(Clone)]
pub enum Op {
    /// Seeded shuffle: shard/unit order (when nothing before it selects rows by position)
    /// plus a row buffer bounded in rows and bytes.
    Shuffle {
        seed: u64,
        buffer: BufferBounds,
    },
    Take(u64),
    Skip(u64),
    Transform(Arc<dyn BatchTransform>),
}

impl Op {
    /// Whether the op selects rows by their position in the dataset, so it must count
    /// in the dataset's order, before the epoch is split between ranks and workers.
    pub fn counts_rows(&self) -> bool {
        matches!(self, Op::Take(_) | Op::Skip(_))
    }
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Shuffle { seed, buffer } => write!(
                f,
                "shuffle(seed={seed}, buffer_size={}, buffer_bytes={})",
                buffer.rows, buffer.bytes
            ),
            Op::Take(n) => write!(f, "take({n})"),
            Op::Skip(n) => write!(f, "skip({n})"),
            Op::Transform(t) => f.write_str(&t.describe()),
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

/// Part `part` of `parts`' rows of a stream that every part reads whole: rows `part`,
/// `part + parts`, ... (dealt like cards), of the first `limit` rows when given.
pub struct Deal {
    upstream: Option<BatchIter>,
    part: u64,
    parts: u64,
    /// Position in the whole stream of the next upstream row.
    at: u64,
    limit: Option<u64>,
}

impl Deal {
    pub fn new(upstream: BatchIter, part: usize, parts: usize, limit: Option<u64>) -> Self {
        Self {
            upstream: Some(upstream),
            part: part as u64,
            parts: parts.max(1) as u64,
            at: 0,
            limit,
        }
    }
}

impl Iterator for Deal {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.limit.is_some_and(|limit| self.at >= limit) {
                self.upstream = None;
                return None;
            }
            let batch = match self.upstream.as_mut()?.next()? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(e)),
            };
            let mut rows = batch.num_rows() as u64;
            if let Some(limit) = self.limit {
                rows = rows.min(limit - self.at);
            }
            // The first row of this batch that is ours, then every `parts`-th.
            let first = (self.part + self.parts - self.at % self.parts) % self.parts;
            let mine: Vec<u64> = (first..rows).step_by(self.parts as usize).collect();
            self.at += batch.num_rows() as u64;
            if mine.is_empty() {
                continue;
            }
            let indices = arrow_array::UInt64Array::from(mine);
            return Some(
                arrow_select::take::take_record_batch(&batch, &indices).map_err(|e| {
                    crate::error::Error::Internal(format!("cannot select this part's rows: {e}"))
                }),
            );
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
