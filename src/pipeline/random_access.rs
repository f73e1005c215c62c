//! Map-style access: `ds[i]` and batches of arbitrary indices, for datasets whose row
//! counts are known (Parquet, NPY/NPZ rows, raw files, ...). A row is found by its work
//! unit; decoded units are kept in a small LRU so samplers that revisit units (or walk
//! them in order) decode each unit once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_select::interleave::interleave_record_batch;

use super::ops::{BatchTransform, Op};
use crate::error::{Error, Result};
use crate::format::{PreparedShards, UnitJob};
use crate::source::{self, Io, ranges::RangeSet};

/// Decoded units kept, by their size in memory.
const CACHE_BYTES: usize = 256 * 1024 * 1024;

/// A decoded unit in the cache: its index, its batches and their size in memory.
type CachedUnit = (usize, Arc<Vec<RecordBatch>>, usize);

pub struct RandomAccess {
    prepared: Arc<PreparedShards>,
    /// `starts[u]`: global index of unit `u`'s first row; the last entry is the total.
    starts: Vec<u64>,
    transforms: Vec<Arc<dyn BatchTransform>>,
    cache: Mutex<VecDeque<CachedUnit>>,
    io: Io,
}

impl RandomAccess {
    /// Random access to `prepared` with `ops` applied; only ops that keep every row in
    /// place (per-sample `map`) can be.
    pub fn new(prepared: Arc<PreparedShards>, ops: &[Op], io: Io) -> Result<Self> {
        let mut transforms = Vec::new();
        for op in ops {
            match op {
                Op::Transform(t) if t.preserves_rows() => transforms.push(t.clone()),
                other => {
                    return Err(Error::invalid_argument(format!(
                        "indexing needs every row in place, so it cannot follow {other:?}; index the dataset before it, or use a sampler"
                    )));
                }
            }
        }
        let mut starts = Vec::with_capacity(prepared.units.len() + 1);
        let mut total = 0u64;
        for unit in &prepared.units {
            starts.push(total);
            total += unit.rows.ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{} data does not say how many rows each part holds, so it cannot be indexed; iterate it instead",
                    prepared.format
                ))
            })?;
        }
        starts.push(total);
        Ok(Self {
            prepared,
            starts,
            transforms,
            cache: Mutex::new(VecDeque::new()),
            io,
        })
    }

    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows at `indices`, in that order, as one batch.
    pub fn rows(&self, indices: &[u64]) -> Result<RecordBatch> {
        let len = self.len();
        let mut units: Vec<(usize, Arc<Vec<RecordBatch>>)> = Vec::new();
        let mut picks = Vec::with_capacity(indices.len());
        let mut flat: Vec<(usize, usize)> = Vec::new();
        for &index in indices {
            if index >= len {
                return Err(Error::invalid_argument(format!(
                    "index {index} is out of range for {len} rows"
                )));
            }
            let unit = self.starts.partition_point(|&s| s <= index) - 1;
            let position = match units.iter().position(|(u, _)| *u == unit) {
                Some(p) => p,
                None => {
                    units.push((unit, self.unit_batches(unit)?));
                    units.len() - 1
                }
            };
            // Locate the row inside the unit's batches.
            let mut offset = (index - self.starts[unit]) as usize;
            let batches = &units[position].1;
            let mut batch = 0;
            while batch < batches.len() && offset >= batches[batch].num_rows() {
                offset -= batches[batch].num_rows();
                batch += 1;
            }
            if batch == batches.len() {
                return Err(Error::Internal(format!(
                    "row {index} is missing from its decoded unit"
                )));
            }
            picks.push((position, batch, offset));
        }
        // Number the (unit, batch) pairs used, for one gather.
        let mut sources: Vec<&RecordBatch> = Vec::new();
        let mut keys: Vec<(usize, usize)> = Vec::new();
        for (position, batch, offset) in picks {
            let key = (position, batch);
            let source = match keys.iter().position(|k| *k == key) {
                Some(s) => s,
                None => {
                    keys.push(key);
                    sources.push(&units[position].1[batch]);
                    keys.len() - 1
                }
            };
            flat.push((source, offset));
        }
        let mut out = if flat.is_empty() {
            RecordBatch::new_empty(self.prepared.schema.clone())
        } else {
            interleave_record_batch(&sources, &flat)
                .map_err(|e| Error::Internal(format!("gather failed: {e}")))?
        };
        for transform in &self.transforms {
            let mut batches = transform.apply(out)?;
            out = match batches.pop() {
                Some(only) if batches.is_empty() => only,
                last => {
                    batches.extend(last);
                    let schema = batches
                        .first()
                        .map(|b| b.schema())
                        .unwrap_or_else(|| self.prepared.schema.clone());
                    arrow_select::concat::concat_batches(&schema, &batches)
                        .map_err(|e| Error::Internal(e.to_string()))?
                }
            };
        }
        Ok(out)
    }

    fn unit_batches(&self, unit: usize) -> Result<Arc<Vec<RecordBatch>>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = cache
            .iter()
            .position(|(u, _, _)| *u == unit)
            .and_then(|pos| cache.remove(pos))
        {
            let batches = entry.1.clone();
            cache.push_front(entry);
            return Ok(batches);
        }
        drop(cache);
        // As on the pipeline's threads, a decoder tripping on corrupt bytes is that
        // unit's data error, not a crash.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decode(unit)))
            .unwrap_or_else(|panic| {
                let url = &self.prepared.shards[self.prepared.units[unit].shard].url;
                Err(Error::decode(
                    url.as_str(),
                    self.prepared.format,
                    crate::error::Position::Unknown,
                    format!(
                        "the decoder failed: {}",
                        crate::error::panic_message(&*panic)
                    ),
                ))
            });
        let batches = Arc::new(decoded?);
        let size = batches.iter().map(RecordBatch::get_array_memory_size).sum();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.push_front((unit, batches.clone(), size));
        let mut total: usize = cache.iter().map(|(_, _, s)| s).sum();
        while total > CACHE_BYTES && cache.len() > 1 {
            total -= cache.pop_back().map_or(0, |(_, _, s)| s);
        }
        Ok(batches)
    }

    /// Fetches and decodes one unit on this thread.
    fn decode(&self, unit: usize) -> Result<Vec<RecordBatch>> {
        let work = &self.prepared.units[unit];
        let shard = &self.prepared.shards[work.shard];
        let job = match self.prepared.job(work) {
            UnitJob::Ready(task) => return Ok(task()?.batches),
            job => job,
        };
        let source = self.io.open(shard)?;
        let mut tasks = Vec::new();
        match job {
            UnitJob::Ready(task) => tasks.push(task),
            UnitJob::Ranges { ranges, decode } => {
                let rt = source::runtime()?;
                let fetched = rt.block_on(async {
                    let size = match shard.size {
                        Some(size) => size,
                        None => source.size().await?,
                    };
                    let mut set = RangeSet::new(size);
                    for range in ranges {
                        set.insert(range.start, source.read_range(range).await?);
                    }
                    Ok::<_, Error>(set)
                })?;
                return Ok(decode(fetched)?.batches);
            }
            UnitJob::Stream(job) => {
                job(source.open_stream()?, &mut |task| {
                    tasks.push(task);
                    true
                })?;
            }
        }
        let mut batches = Vec::new();
        for task in tasks {
            batches.extend(task()?.batches);
        }
        Ok(batches)
    }
}
