//! Map-style access: `ds[i]` and batches of arbitrary indices, for every format (stream
//! formats through their record index), through the ops that keep rows addressable
//! (`select`, `take`, `skip`, a full-permutation `shuffle`, per-sample `map`) and across
//! `concatenate`.
//!
//! A batch of indices is served with one read per run of neighbouring records (stream
//! formats read by range) or one decode per work unit (Parquet row groups, compressed
//! files), one unit after another, each unit's rows taken and the unit let go. Decoded
//! units are kept in a small LRU so samplers that revisit units, or walk them in order,
//! decode each unit once; when the rows outgrow it, a unit barely touched is decoded only
//! where its wanted rows are (Parquet pages, or values of an uncompressed dictionary
//! page). Streams of indices (a full shuffle, `select`) ask for them in gathers sized by
//! bytes, so memory follows the gather, not the data; where each visit to a unit decodes
//! all of it, a visit also takes the rows the next gathers want from it (`index_stream`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow_array::{Array, RecordBatch};
use arrow_schema::SchemaRef;

use super::ops::{BatchTransform, Draws, Indices, Op, Weights};
use super::rng::Rng;
use crate::error::{Error, Position, Result};
use crate::format::index::RecordAccess;
use crate::format::{BatchSink, PreparedShards, UnitJob};
use crate::source::{self, Io, IoCounters};

/// Decoded units kept, as a share of the memory limit (the loader's, or the default for
/// `ds[i]`): half, beside the quarter a gather holds.
pub(super) const CACHE_SHARE: u64 = 2;
/// A unit is decoded only where wanted rows are (where its format can) when they are at
/// most one in this many of its rows.
const PARTIAL_DECODE_SHARE: u64 = 4;
/// Neighbouring records of a remote shard closer than this are read together: a request
/// costs more than the bytes between them.
const REMOTE_RUN_GAP_BYTES: u64 = 64 * 1024;
/// ... and of a local file: a read costs a few microseconds, the records between cost
/// their decoding (about 100 µs per 64 KiB of JSON).
const LOCAL_RUN_GAP_BYTES: u64 = 4 * 1024;

/// Units of a remote store read side by side by one request (a few pages each): requests
/// wait on the store's latency, not on the cores.
const REMOTE_UNIT_READS: usize = 16;

/// Rows read at a time by a filter's pass at most (see `RandomAccess::kept_by`).
const FILTER_PASS_ROWS: u64 = 8192;

/// What filters kept, by the rows they were run over: their pass is made once per
/// process, not once per epoch, loader or dataset made from it.
mod kept {
    use std::sync::{Arc, Mutex, Weak};

    use super::{BatchTransform, Indices};

    /// Passes remembered, the latest last.
    const KEPT: usize = 32;

    type Entry = (String, Weak<dyn BatchTransform>, Indices);

    static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    /// The key names the filter by its address: it counts only while that filter lives.
    pub fn get(key: &str, filter: &Arc<dyn BatchTransform>) -> Option<Indices> {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(_, f, _)| f.strong_count() > 0);
        let at = cache.iter().position(|(k, f, _)| {
            k == key && f.upgrade().is_some_and(|f| Arc::ptr_eq(&f, filter))
        })?;
        let entry = cache.remove(at);
        let kept = entry.2.clone();
        cache.push(entry);
        Some(kept)
    }

    pub fn put(key: &str, filter: &Arc<dyn BatchTransform>, kept: Indices) {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= KEPT {
            cache.remove(0);
        }
        cache.push((key.to_string(), Arc::downgrade(filter), kept));
    }
}

/// A decoded unit in the cache: its index, its batches and their size in memory.
type CachedUnit = (usize, Arc<Vec<RecordBatch>>, usize);

/// Rows of one prepared source.
struct Files {
    prepared: Arc<PreparedShards>,
    /// `starts[u]`: index of unit `u`'s first row; the last entry is the total.
    starts: Vec<u64>,
    records: Option<RecordAccess>,
    cache: Mutex<VecDeque<CachedUnit>>,
    /// Bytes a row takes decoded, from the last rows decoded (0: none yet).
    decoded_row_bytes: std::sync::atomic::AtomicU64,
    io: Io,
    /// Local shards read lately, kept open (a few: a dataset can have more files than a
    /// process may open), so that `ds[i]` costs no `open` of its file.
    open_files: Mutex<VecDeque<OpenFile>>,
    /// Bytes of decoded units the cache keeps (see [`RandomAccess::bound_memory`]).
    cache_bytes: std::sync::atomic::AtomicU64,
    /// By unit: whether some of its rows are read without the rest (found when first
    /// asked; see [`crate::format::UnitJobs::reads_rows_alone`]).
    rows_alone: Vec<std::sync::OnceLock<bool>>,
}

/// A local shard kept open: its index, the counters its reads charge, its source.
type OpenFile = (usize, Arc<IoCounters>, Arc<dyn source::Source>);

/// Local shards kept open by a random-access reader.
const OPEN_FILES: usize = 32;

enum Rows {
    Files(Files),
    /// `concatenate`: each part's rows follow the previous part's.
    Concat {
        parts: Vec<Arc<RandomAccess>>,
        starts: Vec<u64>,
        schema: SchemaRef,
    },
}

/// Weighted draws of row numbers.
mod sample {
    use super::{Error, Result, Rng};

    /// Uniform in [0, 1).
    fn unit(rng: &mut Rng) -> f64 {
        (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` rows, each drawn with probability proportional to its weight.
    pub fn with_replacement(weights: &[f64], n: u64, rng: &mut Rng) -> Vec<u64> {
        let mut cumulative = Vec::with_capacity(weights.len());
        let mut sum = 0.0;
        for w in weights {
            sum += w;
            cumulative.push(sum);
        }
        (0..n)
            .map(|_| {
                let x = unit(rng) * sum;
                let i = cumulative.partition_point(|&c| c <= x);
                // Rounding at the very top lands past the end, or on a zero weight.
                (i.min(weights.len() - 1)..weights.len())
                    .chain((0..i).rev())
                    .find(|&j| weights[j] > 0.0)
                    .unwrap_or(0) as u64
            })
            .collect()
    }

    /// `n` distinct rows in a weighted random order (Efraimidis and Spirakis: each row's
    /// key is an exponential draw over its weight; the smallest keys come first).
    pub fn without_replacement(weights: &[f64], n: u64, rng: &mut Rng) -> Result<Vec<u64>> {
        let positive = weights.iter().filter(|&&w| w > 0.0).count() as u64;
        if n > positive {
            return Err(Error::invalid_argument(format!(
                "cannot draw {n} distinct rows without replacement: only {positive} have a weight above zero"
            )));
        }
        let mut keyed: Vec<(f64, u64)> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (-(1.0 - unit(rng)).ln() / w, i as u64))
            .filter(|(key, _)| key.is_finite())
            .collect();
        keyed.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        Ok(keyed.into_iter().take(n as usize).map(|(_, i)| i).collect())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn draws_follow_the_weights() {
            let weights = [1.0, 0.0, 3.0, 6.0];
            let draws = with_replacement(&weights, 100_000, &mut Rng::new(1, 0, 0));
            let mut counts = [0u64; 4];
            for d in draws {
                counts[d as usize] += 1;
            }
            assert_eq!(counts[1], 0);
            for (count, w) in counts.iter().zip(weights) {
                assert!(
                    (*count as f64 / 100_000.0 - w / 10.0).abs() < 0.01,
                    "{counts:?}"
                );
            }
            let order = without_replacement(&weights, 3, &mut Rng::new(1, 0, 0)).unwrap();
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, vec![0, 2, 3]);
            assert!(without_replacement(&weights, 4, &mut Rng::new(1, 0, 0)).is_err());
        }
    }
}

/// How an op renumbers rows: output row `i` is input row `map(i)`.
enum IndexMap {
    Offset(u64),
    Select(Indices),
    Permute(Vec<u64>),
}

impl IndexMap {
    fn apply(&self, i: u64) -> u64 {
        match self {
            IndexMap::Offset(n) => i + n,
            IndexMap::Select(indices) => indices.get(i),
            IndexMap::Permute(order) => order[i as usize],
        }
    }
}

pub struct RandomAccess {
    rows: Rows,
    /// Applied last to first to turn an output index into a source row.
    maps: Vec<IndexMap>,
    len: u64,
    /// Applied first to last, each with the number of `maps` before it (the indices it
    /// sees are those of that level).
    transforms: Vec<(Arc<dyn BatchTransform>, usize)>,
    schema: SchemaRef,
}

impl RandomAccess {
    /// Keeps the decoded units cached within half of `memory_limit` (a loader's, reading
    /// through this dataset), letting the least recently used go now if they pass it.
    pub fn bound_memory(&self, memory_limit: u64) {
        self.bound_cache(memory_limit / CACHE_SHARE);
    }

    /// Keeps the decoded units cached within `bytes`.
    pub(super) fn bound_cache(&self, bytes: u64) {
        match &self.rows {
            Rows::Files(files) => {
                files
                    .cache_bytes
                    .store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
                files.evict();
            }
            Rows::Concat { parts, .. } => parts.iter().for_each(|p| p.bound_cache(bytes)),
        }
    }

    /// Random access to an (indexed) prepared source.
    pub(super) fn files(prepared: Arc<PreparedShards>, io: Io) -> Result<Self> {
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
        let schema = prepared.schema.clone();
        let rows_alone = prepared.units.iter().map(|_| Default::default()).collect();
        Ok(Self {
            rows: Rows::Files(Files {
                records: prepared.record_access(),
                prepared,
                starts,
                cache: Mutex::new(VecDeque::new()),
                decoded_row_bytes: Default::default(),
                rows_alone,
                io,
                open_files: Mutex::new(VecDeque::new()),
                cache_bytes: (super::autotune::DEFAULT_MEMORY_LIMIT / CACHE_SHARE).into(),
            }),
            maps: Vec::new(),
            len: total,
            transforms: Vec::new(),
            schema,
        })
    }

    /// The rows of `parts` one after another, as `schema`.
    pub(super) fn concat(parts: Vec<Arc<RandomAccess>>, schema: SchemaRef) -> Self {
        let mut starts = vec![0u64];
        for part in &parts {
            starts.push(starts.last().copied().unwrap_or(0) + part.len());
        }
        Self {
            len: starts.last().copied().unwrap_or(0),
            rows: Rows::Concat {
                parts,
                starts,
                schema: schema.clone(),
            },
            maps: Vec::new(),
            transforms: Vec::new(),
            schema,
        }
    }

    /// These rows with `ops` applied, in `epoch` (which a full-permutation shuffle
    /// depends on). Only ops that keep rows addressable can be.
    /// Access through `ops`, each drawing as `draws` says. `key` names the rows so far
    /// (the origin's fingerprint), so that what a filter keeps is found once per process.
    pub(super) fn with_ops(mut self, ops: &[Op], draws: Draws, mut key: String) -> Result<Self> {
        for (stage, op) in ops.iter().enumerate() {
            key.push_str(&format!("\0{op:?}@{}", draws.stage(stage)));
            match op {
                Op::Take(n) => self.len = self.len.min(*n),
                Op::Skip(n) => {
                    let n = (*n).min(self.len);
                    self.len -= n;
                    self.maps.push(IndexMap::Offset(n));
                }
                Op::Select(indices) => {
                    if let Some(bad) = indices.first_at_or_above(self.len) {
                        return Err(Error::invalid_argument(format!(
                            "select: index {bad} is out of range for {} rows",
                            self.len
                        )));
                    }
                    self.len = indices.len();
                    self.maps.push(IndexMap::Select(indices.clone()));
                }
                Op::Permute { seed } => {
                    let mut order: Vec<u64> = (0..self.len).collect();
                    draws.rng(*seed, stage).shuffle(&mut order);
                    self.maps.push(IndexMap::Permute(order));
                }
                Op::Sample {
                    weights,
                    num_samples,
                    replacement,
                    seed,
                } => {
                    let weights = self.weights(weights)?;
                    let n = num_samples.unwrap_or(self.len);
                    let mut rng = draws.rng(*seed, stage);
                    let order = if *replacement {
                        sample::with_replacement(&weights, n, &mut rng)
                    } else {
                        sample::without_replacement(&weights, n, &mut rng)?
                    };
                    self.len = n;
                    self.maps.push(IndexMap::Permute(order));
                }
                Op::Transform(t) if t.preserves_rows() => {
                    if let Some(schema) = t.output_schema(&self.schema) {
                        self.schema = schema;
                    }
                    self.transforms.push((t.clone(), self.maps.len()));
                    key.push_str(&format!("#{:p}", Arc::as_ptr(t)));
                }
                Op::Transform(t) if t.filters() => {
                    // As `datasets` runs a filter: once over the rows, keeping the row
                    // numbers that pass.
                    key.push_str(&format!("#{:p}", Arc::as_ptr(t)));
                    let kept = self.kept_by(t, &key)?;
                    self.len = kept.len();
                    self.maps.push(IndexMap::Select(kept));
                }
                other => {
                    return Err(Error::invalid_argument(format!(
                        "indexing needs every row in place, so it cannot follow {other:?}; index the dataset before it, iterate it, or read it into memory first (sf.from_arrow(ds.to_arrow()))"
                    )));
                }
            }
        }
        Ok(self)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The rows (numbers) that `filter` keeps, found by one pass over them in order, or
    /// from an earlier pass over the same rows (`key`) in this process.
    fn kept_by(&self, filter: &Arc<dyn BatchTransform>, key: &str) -> Result<Indices> {
        if let Some(kept) = kept::get(key, filter) {
            return Ok(kept);
        }
        let mut rows = Vec::new();
        let mut start = 0;
        let mut size = GatherSize::new(FILTER_PASS_ROWS, FILTER_PASS_BYTES);
        while start < self.len {
            let end = (start + size.rows()).min(self.len);
            let mut batch = self.rows(&(start..end).collect::<Vec<_>>())?;
            size.saw(&batch);
            if filter.wants_indices() {
                batch = super::rows::with_index(batch, start..end)?;
            }
            let mask = filter.keep(&batch).ok_or_else(|| {
                Error::Internal(format!("{} gives no verdict on rows", filter.describe()))
            })??;
            rows.extend(
                (0..mask.len())
                    .filter(|&i| mask.is_valid(i) && mask.value(i))
                    .map(|i| start + i as u64),
            );
            start = end;
        }
        let kept = Indices::list(rows);
        kept::put(key, filter, kept.clone());
        Ok(kept)
    }

    /// One weight per row, as `weights` says, checked.
    fn weights(&self, weights: &Weights) -> Result<Arc<[f64]>> {
        let values: Arc<[f64]> = match weights {
            Weights::Rows { values, .. } => values.clone(),
            Weights::Column { name, values } => match values.get() {
                Some(v) => v.clone(),
                None => {
                    let read = self.column_values(name)?;
                    values.get_or_init(|| read).clone()
                }
            },
            Weights::Sources(per_source) => {
                let Rows::Concat { starts, .. } = &self.rows else {
                    return Err(Error::invalid_argument(
                        "source_weights need a dataset made by sf.concatenate (one weight per dataset)",
                    ));
                };
                if !self.maps.is_empty() || per_source.len() + 1 != starts.len() {
                    return Err(Error::invalid_argument(format!(
                        "source_weights has {} weights, but weighted_sample follows a concatenation of {} datasets only when nothing is between them",
                        per_source.len(),
                        starts.len() - 1
                    )));
                }
                // A draw picks a source by its weight, then a row of it uniformly.
                let mut rows = Vec::with_capacity(self.len as usize);
                for (i, w) in per_source.iter().enumerate() {
                    let n = starts[i + 1] - starts[i];
                    rows.extend(std::iter::repeat_n(w / n.max(1) as f64, n as usize));
                }
                rows.into()
            }
        };
        if values.len() as u64 != self.len {
            return Err(Error::invalid_argument(format!(
                "{} weights for {} rows",
                values.len(),
                self.len
            )));
        }
        if values.iter().any(|w| !w.is_finite() || *w < 0.0) || values.iter().sum::<f64>() <= 0.0 {
            return Err(Error::invalid_argument(
                "weights must be finite, non-negative and not all zero",
            ));
        }
        Ok(values)
    }

    /// Every row's value of numeric column `name`, as floats.
    fn column_values(&self, name: &str) -> Result<Arc<[f64]>> {
        use arrow_array::Array;
        const CHUNK: u64 = 65_536;
        let mut out = Vec::with_capacity(self.len as usize);
        let mut start = 0;
        while start < self.len {
            let end = (start + CHUNK).min(self.len);
            let batch = self.rows(&(start..end).collect::<Vec<_>>())?;
            let column = batch.column_by_name(name).ok_or_else(|| Error::Schema {
                url: String::new(),
                message: format!(
                    "no column {name:?} to take weights from; the columns are {:?}",
                    crate::format::field_names(&batch.schema())
                ),
            })?;
            let floats =
                arrow_cast::cast(column, &arrow_schema::DataType::Float64).map_err(|e| {
                    Error::Schema {
                        url: String::new(),
                        message: format!("weights column {name:?}: {e}"),
                    }
                })?;
            if floats.null_count() > 0 {
                return Err(Error::invalid_argument(format!(
                    "weights column {name:?} has nulls"
                )));
            }
            let floats = floats
                .as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .ok_or_else(|| Error::Internal("a cast to float64 gave another type".into()))?;
            out.extend_from_slice(floats.values());
            start = end;
        }
        Ok(out.into())
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The row of `rows` that each output row is, in output order.
    pub(super) fn source_rows(&self) -> Vec<u64> {
        (0..self.len).map(|i| self.source_row(i)).collect()
    }

    /// The row of `rows` that output row `index` (in range) is.
    pub(super) fn source_row(&self, index: u64) -> u64 {
        self.maps.iter().rev().fold(index, |i, map| map.apply(i))
    }

    /// Units these rows are read from, numbered across the parts of a concatenation.
    fn units(&self) -> u64 {
        match &self.rows {
            Rows::Files(files) => files.prepared.units.len() as u64,
            Rows::Concat { parts, .. } => parts.iter().map(|p| p.units()).sum(),
        }
    }

    /// The unit that output row `index` (in range) is decoded from, where reading it
    /// costs a visit to a unit that is not kept for the next: its rows outgrow the unit
    /// cache, and it is not read as a record by range.
    pub(super) fn revisited_unit(&self, index: u64) -> Option<u64> {
        let row = self.source_row(index);
        match &self.rows {
            Rows::Files(files) => {
                let unit = files.starts.partition_point(|&s| s <= row) - 1;
                if files.records.is_some()
                    || !files.may_outgrow_cache()
                    || files.reads_rows_alone(unit)
                {
                    return None;
                }
                Some(unit as u64)
            }
            Rows::Concat { parts, starts, .. } => {
                let part = starts.partition_point(|&s| s <= row) - 1;
                let before: u64 = parts[..part].iter().map(|p| p.units()).sum();
                Some(before + parts[part].revisited_unit(row - starts[part])?)
            }
        }
    }

    /// The unit that output row `index` (in range) is read from, numbered across the
    /// parts of a concatenation.
    pub(super) fn unit_of(&self, index: u64) -> u64 {
        let row = self.source_row(index);
        match &self.rows {
            Rows::Files(files) => (files.starts.partition_point(|&s| s <= row) - 1) as u64,
            Rows::Concat { parts, starts, .. } => {
                let part = starts.partition_point(|&s| s <= row) - 1;
                let before: u64 = parts[..part].iter().map(|p| p.units()).sum();
                before + parts[part].unit_of(row - starts[part])
            }
        }
    }

    /// The files' bytes and rows that these rows are read from (0 bytes where a size is
    /// not known): what they take stored, before any is decoded.
    pub(super) fn stored(&self) -> (u64, u64) {
        match &self.rows {
            Rows::Files(files) => (
                files
                    .prepared
                    .shards
                    .iter()
                    .map(|s| s.size.unwrap_or(0))
                    .sum(),
                files.starts.last().copied().unwrap_or(0),
            ),
            Rows::Concat { parts, .. } => parts
                .iter()
                .map(|p| p.stored())
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        }
    }

    /// The files' bytes per row of the rows these are read from (0 where a size is not
    /// known): what a row takes stored, before any is decoded.
    pub(super) fn stored_row_bytes(&self) -> u64 {
        let (bytes, rows) = self.stored();
        bytes.checked_div(rows).unwrap_or(0)
    }

    /// Where rows are read from the pages that hold them (Parquet with an offset index):
    /// what a row read alone fetches, as a multiple of its stored bytes, on average over
    /// up to 64 units spread over the rows (see [`crate::format::UnitJobs::row_read_share`]).
    /// `None` where some unit's pages are not known.
    pub(super) fn row_read_share(&self) -> Option<f64> {
        fn shares(access: &RandomAccess) -> Option<(f64, f64)> {
            match &access.rows {
                Rows::Files(files) => {
                    let units = &files.prepared.units;
                    let step = (units.len() / 64).max(1);
                    units
                        .iter()
                        .step_by(step)
                        .try_fold((0.0, 0.0), |(sum, n), unit| {
                            let share = files.prepared.row_read_share(unit)?;
                            let rows = unit.rows.unwrap_or(0) as f64;
                            Some((sum + share * rows, n + rows))
                        })
                }
                Rows::Concat { parts, .. } => parts.iter().try_fold((0.0, 0.0), |(sum, n), p| {
                    let (s, r) = shares(p)?;
                    Some((sum + s, n + r))
                }),
            }
        }
        let (sum, rows) = shares(self)?;
        (rows > 0.0).then(|| sum / rows)
    }

    /// Whether rows are taken from decoded units that the cache keeps (as far as the
    /// rows decoded so far tell), not read as records by range or by page.
    pub(super) fn keeps_units(&self) -> bool {
        match &self.rows {
            Rows::Files(files) => files.records.is_none() && !files.may_outgrow_cache(),
            Rows::Concat { parts, .. } => parts.iter().all(|p| p.keeps_units()),
        }
    }

    /// Whether output rows are a file's rows as stored, so that a unit can be read as
    /// a stream ([`Self::stream_unit`]): not where ops change rows, datasets are
    /// concatenated, or rows are read as records by range.
    pub(super) fn streams_units(&self) -> bool {
        matches!(&self.rows, Rows::Files(files) if files.records.is_none())
            && self.transforms.is_empty()
    }

    /// Where output row `index` (in range) lies, where [`Self::streams_units`]: its unit
    /// and its offset among the unit's rows.
    pub(super) fn unit_offset(&self, index: u64) -> (u64, u64) {
        let row = self.source_row(index);
        match &self.rows {
            Rows::Files(files) => {
                let unit = files.starts.partition_point(|&s| s <= row) - 1;
                (unit as u64, row - files.starts[unit])
            }
            Rows::Concat { .. } => (self.unit_of(index), 0),
        }
    }

    /// Unit `unit`'s rows, all of them in their stored order, each batch handed to `sink`
    /// as the decoder makes it (a quarter MiB or so): never the whole unit's batches at
    /// once, which a row group of 1,000 rows of 256 KiB (256 MiB) would be. The page being
    /// decoded is held meanwhile, and pyarrow cuts a page every 1,024 values at most: such
    /// a row group is one page. Reads counted in `counters`. Only where
    /// [`Self::streams_units`].
    pub(super) fn stream_unit(
        &self,
        unit: u64,
        counters: &Arc<IoCounters>,
        sink: &mut BatchSink,
    ) -> Result<()> {
        let Rows::Files(files) = &self.rows else {
            return Err(Error::Internal(
                "a concatenation's units are not streamed".into(),
            ));
        };
        let unit = unit as usize;
        let work = &files.prepared.units[unit];
        let io = Io {
            storage: files.io.storage.clone(),
            counters: counters.clone(),
        };
        let job = files.prepared.streamed_job(work, &io);
        files.decode_into(unit, job, work.rows.unwrap_or(0), &io, sink)
    }

    /// The rows at `indices`, in that order, as one batch.
    pub fn rows(&self, indices: &[u64]) -> Result<RecordBatch> {
        self.rows_charged(indices, None)
    }

    /// [`Self::rows`], their reads counted in `counters` (a loader's) where given, else
    /// in the dataset's.
    pub fn rows_charged(
        &self,
        indices: &[u64],
        counters: Option<&Arc<IoCounters>>,
    ) -> Result<RecordBatch> {
        self.rows_read(indices, counters, false)
    }

    /// [`Self::rows_charged`]; with `views`, rows gathered from decoded copies mapped
    /// whole give their binary columns as views into them, not copies (see
    /// [`super::stream::interleave_viewing`]), unless functions run on the rows here.
    pub fn rows_read(
        &self,
        indices: &[u64],
        counters: Option<&Arc<IoCounters>>,
        views: bool,
    ) -> Result<RecordBatch> {
        let mut source = Vec::with_capacity(indices.len());
        for &index in indices {
            if index >= self.len {
                return Err(Error::invalid_argument(format!(
                    "index {index} is out of range for {} rows",
                    self.len
                )));
            }
            source.push(self.source_row(index));
        }
        let mut out = match &self.rows {
            Rows::Files(files) => {
                let io = match counters {
                    Some(counters) => &Io {
                        storage: files.io.storage.clone(),
                        counters: counters.clone(),
                    },
                    None => &files.io,
                };
                files.rows(&source, io, views && self.transforms.is_empty())?
            }
            Rows::Concat {
                parts,
                starts,
                schema,
            } => concat_rows(parts, starts, schema, &source, counters)?,
        };
        for (transform, level) in &self.transforms {
            if transform.wants_indices() {
                let at_level = indices.iter().map(|&i| {
                    self.maps[*level..]
                        .iter()
                        .rev()
                        .fold(i, |i, map| map.apply(i))
                });
                out = super::rows::with_index(out, at_level)?;
            }
            let mut batches = if transform.parallel() && out.num_rows() > 1 {
                // A costly transform (tokenizing) over the gathered rows, in one piece
                // per core: here it runs on the reading thread, not the batch threads.
                let threads = super::autotune::default_num_threads().max(1);
                let pieces = super::ops::pieces(&out, out.num_rows().div_ceil(threads));
                in_parallel(&pieces, |piece| transform.apply(piece.clone()))?
                    .into_iter()
                    .flatten()
                    .collect()
            } else {
                transform.apply(out)?
            };
            out = match batches.pop() {
                Some(only) if batches.is_empty() => only,
                last => {
                    batches.extend(last);
                    let schema = batches
                        .first()
                        .map(|b| b.schema())
                        .unwrap_or_else(|| self.schema.clone());
                    arrow_select::concat::concat_batches(&schema, &batches)
                        .map_err(|e| Error::Internal(e.to_string()))?
                }
            };
        }
        Ok(out)
    }
}

fn concat_rows(
    parts: &[Arc<RandomAccess>],
    starts: &[u64],
    schema: &SchemaRef,
    indices: &[u64],
    counters: Option<&Arc<IoCounters>>,
) -> Result<RecordBatch> {
    let mut wanted: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let mut picks = Vec::with_capacity(indices.len());
    for &index in indices {
        let part = starts.partition_point(|&s| s <= index) - 1;
        let rows = wanted.entry(part).or_default();
        picks.push((part, rows.len()));
        rows.push(index - starts[part]);
    }
    let wanted: Vec<(usize, Vec<u64>)> = wanted.into_iter().collect();
    let fetched: Vec<(usize, RecordBatch)> = in_parallel(&wanted, |(part, rows)| {
        let batch = parts[*part].rows_charged(rows, counters)?;
        Ok((*part, super::stream::conform(batch, schema)?))
    })?;
    let slot: HashMap<usize, usize> = fetched
        .iter()
        .enumerate()
        .map(|(i, (part, _))| (*part, i))
        .collect();
    let sources: Vec<&RecordBatch> = fetched.iter().map(|(_, b)| b).collect();
    let flat: Vec<(usize, usize)> = picks.iter().map(|&(p, r)| (slot[&p], r)).collect();
    gather(schema, &sources, &flat)
}

fn gather(
    schema: &SchemaRef,
    sources: &[&RecordBatch],
    flat: &[(usize, usize)],
) -> Result<RecordBatch> {
    if flat.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    super::stream::interleave_rows(sources, flat)
        .map_err(|e| Error::Internal(format!("gather failed: {e}")))
}

/// Rows `offsets` (counted across `batches`, the decoded rows of unit `unit`) as one
/// batch, in that order.
fn take_rows(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    offsets: &[u64],
    unit: usize,
) -> Result<RecordBatch> {
    let flat = locate(batches, offsets, unit)?;
    let sources: Vec<&RecordBatch> = batches.iter().collect();
    gather(schema, &sources, &flat)
}

/// Where rows `offsets` (counted across `batches`, the decoded rows of unit `unit`) are:
/// (batch, row in it).
fn locate(batches: &[RecordBatch], offsets: &[u64], unit: usize) -> Result<Vec<(usize, usize)>> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut total = 0u64;
    for batch in batches {
        starts.push(total);
        total += batch.num_rows() as u64;
    }
    offsets
        .iter()
        .map(|&offset| {
            if offset >= total {
                return Err(Error::Internal(format!(
                    "row {offset} of unit {unit} is missing from its decoded batches"
                )));
            }
            let batch = starts.partition_point(|&s| s <= offset) - 1;
            Ok((batch, (offset - starts[batch]) as usize))
        })
        .collect()
}

/// A unit's rows asked for by one request: batches holding them, and where each is.
struct Picked {
    batches: Vec<RecordBatch>,
    /// For the k-th row asked for: (index in `batches`, row in that batch).
    rows: Vec<(usize, usize)>,
}

impl Picked {
    /// The rows `offsets` of `batches` (unit `unit`'s), referenced where `keep`, else
    /// copied out (so that the batches can go at once).
    fn from(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        offsets: &[u64],
        unit: usize,
        keep: bool,
    ) -> Result<Self> {
        if keep {
            return Ok(Self {
                batches: batches.to_vec(),
                rows: locate(batches, offsets, unit)?,
            });
        }
        Ok(Self {
            batches: vec![take_rows(schema, batches, offsets, unit)?],
            rows: (0..offsets.len()).map(|k| (0, k)).collect(),
        })
    }
}

/// `f` over `items` on scoped threads (one per core at most), results in order. Not
/// rayon's global pool: a forked child (a PyTorch worker) inherits a pool whose threads
/// it does not have, and would wait on them forever.
fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    in_parallel_on(super::autotune::default_num_threads(), items, f)
}

/// [`in_parallel`] on `threads` threads at most.
fn in_parallel_on<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let threads = threads.min(items.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<R>>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let out = f(item);
                    *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(out);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| Err(Error::Internal("a parallel task did not run".into())))
        })
        .collect()
}

/// The first entry of a most-recently-used-first list that `found` picks, moved to the
/// front.
fn touch<T>(list: &mut VecDeque<T>, found: impl Fn(&T) -> bool) -> Option<&T> {
    let entry = list
        .iter()
        .position(found)
        .and_then(|pos| list.remove(pos))?;
    list.push_front(entry);
    list.front()
}

/// Records `[first, end)` of one shard, read as one range.
struct Run {
    shard: usize,
    first: u64,
    end: u64,
}

impl Files {
    fn rows(&self, indices: &[u64], io: &Io, views: bool) -> Result<RecordBatch> {
        // Where each row comes from: a record of a shard read by range, or the k-th row
        // taken from a decoded unit (by its slot in `units`).
        enum From {
            Record(usize, u64),
            Unit(usize, usize),
        }
        let mut slot_of: HashMap<usize, usize> = HashMap::new();
        let mut from = Vec::with_capacity(indices.len());
        let mut records: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        // Each unit touched, with the offsets of the rows wanted from it.
        let mut units: Vec<(usize, Vec<u64>)> = Vec::new();
        for &index in indices {
            let unit = self.starts.partition_point(|&s| s <= index) - 1;
            let offset = index - self.starts[unit];
            let work = &self.prepared.units[unit];
            match self.records.as_ref().and_then(|r| r.first_record(work)) {
                Some(first) => {
                    records.entry(work.shard).or_default().push(first + offset);
                    from.push(From::Record(work.shard, first + offset));
                }
                None => {
                    let slot = *slot_of.entry(unit).or_insert_with(|| {
                        units.push((unit, Vec::new()));
                        units.len() - 1
                    });
                    let wanted = &mut units[slot].1;
                    from.push(From::Unit(slot, wanted.len()));
                    wanted.push(offset);
                }
            }
        }
        // Whether each unit is kept as a decoded copy, asked once per gather (a `stat`).
        // Before reading: a read may keep a unit it decoded.
        let kept: Vec<bool> = units
            .iter()
            .map(|(unit, _)| self.prepared.kept(&self.prepared.units[*unit]))
            .collect();
        // Only rows of copies mapped whole are left where they lie: a batch in the queue
        // would otherwise hold a decoded unit's memory past the cache's bound.
        let views = views && records.is_empty() && kept.iter().all(|&k| k);
        let runs = self.runs(records);
        let run_batches = self.read_runs(&runs, io)?;
        // A unit's wanted rows are taken as soon as it is decoded, and the unit let go
        // (unless the cache keeps it): a request holds the rows it returns and a unit per
        // thread, not every unit it touches.
        // One row asked for (`ds[i]`) decodes and caches its unit, for its neighbours;
        // a gather of many decodes only the rows it wants from units it barely touches.
        // On this thread, one unit after another: decoded on threads of their own (made
        // per gather, or kept in a pool), a shuffled epoch's RSS grew gather after gather
        // (180 to 630 MiB over 600 MiB of 256 KiB rows, about 20% faster); here it stays
        // flat.
        // Decided once for the whole request (each unit's decode teaches the row size).
        let outgrows = self.may_outgrow_cache();
        let partial = indices.len() > 1 && outgrows;
        // Where the rows fit the cache, the units this request decodes whole stay cached
        // anyway: they are decoded side by side first (the first gathers of a shuffled
        // epoch decode most of the data), then their rows taken from the cache.
        if !outgrows {
            let uncached: Vec<usize> = units
                .iter()
                .map(|(unit, _)| *unit)
                .filter(|&unit| !self.is_cached(unit))
                .collect();
            if uncached.len() > 1 {
                in_parallel(&uncached, |&unit| self.unit_batches(unit, io).map(drop))?;
            }
        }
        // A request from one unit holds that unit while it takes its rows anyway: its
        // rows are gathered from it once, not copied out first.
        let keep_whole = !outgrows || units.len() == 1;
        let work: Vec<(&(usize, Vec<u64>), bool)> = units.iter().zip(kept).collect();
        let pick = |((unit, offsets), kept): &(&(usize, Vec<u64>), bool)| {
            self.unit_rows(*unit, offsets, *kept, partial, keep_whole, io)
        };
        // Units of a remote store read by the pages that hold the rows (pages its metadata
        // locates) wait on its answers, not on the cores: they are read side by side
        // (those pages are all each read holds).
        let side_by_side = partial
            && work.len() > 1
            && work.iter().all(|((unit, _), kept)| {
                self.is_remote(self.prepared.units[*unit].shard)
                    && !self.is_cached(*unit)
                    && (*kept || self.format_reads_rows_alone(*unit))
            });
        let picked: Vec<Picked> = match side_by_side {
            true => in_parallel_on(REMOTE_UNIT_READS, &work, pick)?,
            false => work.iter().map(pick).collect::<Result<_>>()?,
        };
        // Each unit's first batch among the sources.
        let mut first_batch = Vec::with_capacity(picked.len());
        let mut sources: Vec<&RecordBatch> = run_batches.iter().collect();
        for p in &picked {
            first_batch.push(sources.len());
            sources.extend(&p.batches);
        }
        let flat: Vec<(usize, usize)> = from
            .into_iter()
            .map(|place| match place {
                From::Record(shard, record) => {
                    let run = runs.partition_point(|r| (r.shard, r.end) <= (shard, record));
                    (run, (record - runs[run].first) as usize)
                }
                From::Unit(slot, k) => {
                    let (batch, row) = picked[slot].rows[k];
                    (first_batch[slot] + batch, row)
                }
            })
            .collect();
        if views && !flat.is_empty() {
            return super::stream::interleave_viewing(&sources, &flat)
                .map_err(|e| Error::Internal(format!("gather failed: {e}")));
        }
        gather(&self.prepared.schema, &sources, &flat)
    }

    /// Rows `offsets` of unit `unit`, in that order (`kept`: whether the unit is kept as
    /// a decoded copy). With `partial`, a unit not in the
    /// cache whose rows are mostly not wanted is decoded only where they are, where the
    /// format can (see [`crate::format::UnitJobs::rows_job`]), and those rows kept as
    /// decoded (unless their buffers are much larger than they: then copied); else the
    /// whole unit is decoded and cached, for the neighbours of the rows asked for now,
    /// and referenced where `keep_whole` (the cache holds every unit anyway), else its
    /// rows copied out.
    fn unit_rows(
        &self,
        unit: usize,
        offsets: &[u64],
        kept: bool,
        partial: bool,
        keep_whole: bool,
        io: &Io,
    ) -> Result<Picked> {
        let work = &self.prepared.units[unit];
        if partial && !self.is_cached(unit) {
            let mut wanted = offsets.to_vec();
            wanted.sort_unstable();
            wanted.dedup();
            if let Some(job) = self
                .reads_pages_of(unit, wanted.len() as u64, kept)
                .then(|| self.prepared.rows_job(work, &wanted, io))
                .flatten()
            {
                let batches = self.decoded(unit, job, wanted.len() as u64, io)?;
                self.saw_rows(&batches, wanted.len() as u64);
                let flat: Vec<u64> = offsets
                    .iter()
                    .map(|o| wanted.binary_search(o).unwrap_or(0) as u64)
                    .collect();
                let held: usize = batches.iter().map(RecordBatch::get_array_memory_size).sum();
                // A unit kept decoded gives its rows as views of its mapped copy:
                // referenced, as their pages are the page cache's, not memory the loader
                // holds.
                let compact = kept
                    || held as u64
                        <= 2 * batches
                            .iter()
                            .map(crate::batch_bytes::batch_bytes)
                            .sum::<u64>();
                return Picked::from(&self.prepared.schema, &batches, &flat, unit, compact);
            }
        }
        let batches = self.unit_batches(unit, io)?;
        Picked::from(&self.prepared.schema, &batches, offsets, unit, keep_whole)
    }

    /// Whether `wanted` rows of a unit not cached are read from the pages holding them
    /// (where the format can), not by decoding the whole unit: where it is kept decoded,
    /// where the format reads rows alone, or where they are few of its rows.
    fn reads_pages_of(&self, unit: usize, wanted: u64, kept: bool) -> bool {
        kept || self.format_reads_rows_alone(unit)
            || wanted.saturating_mul(PARTIAL_DECODE_SHARE)
                <= self.prepared.units[unit].rows.unwrap_or(0)
    }

    /// Whether shard `shard` is read from a remote store.
    fn is_remote(&self, shard: usize) -> bool {
        source::local_path(&self.prepared.shards[shard].url).is_none()
    }

    /// Whether the rows, decoded, may not fit the cache (as far as the rows decoded so far
    /// tell; before any, they may): cached units would then be let go before they are
    /// asked for again.
    fn may_outgrow_cache(&self) -> bool {
        // The cache keeps its latest unit whatever its size: one unit is never let go.
        if self.prepared.units.len() <= 1 {
            return false;
        }
        let per_row = self
            .decoded_row_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        let rows = self.starts.last().copied().unwrap_or(0);
        // Three quarters: the estimate counts the values' bytes, the cache their buffers,
        // and a dataset just under the limit would have its units let go in turn, each
        // decoded again by every gather (1,000 rows of 256 KiB against 256 MiB: 2.4x the
        // data read, 5x the time).
        per_row == 0 || per_row.saturating_mul(rows) > self.cache_limit() / 4 * 3
    }

    /// Learns the bytes a row takes decoded from `rows` rows just decoded (the bytes their
    /// values take: a few rows decoded from pages sit in buffers much larger).
    fn saw_rows(&self, batches: &[RecordBatch], rows: u64) {
        let size: u64 = batches.iter().map(crate::batch_bytes::batch_bytes).sum();
        if let Some(per_row) = size.checked_div(rows) {
            self.decoded_row_bytes
                .store(per_row.max(1), std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether reading some of the unit's rows reads about their bytes alone: by the
    /// format (asked once), or because the unit is kept decoded (asked each time, as a
    /// read may have kept it since).
    fn reads_rows_alone(&self, unit: usize) -> bool {
        self.format_reads_rows_alone(unit) || self.prepared.kept(&self.prepared.units[unit])
    }

    /// [`Self::reads_rows_alone`] by the format alone. An error finding out leaves the
    /// unit to be read whole, which reports it.
    fn format_reads_rows_alone(&self, unit: usize) -> bool {
        *self.rows_alone[unit].get_or_init(|| {
            self.prepared
                .reads_rows_alone(&self.prepared.units[unit], &self.io)
                .unwrap_or(false)
        })
    }

    fn cache_limit(&self) -> u64 {
        self.cache_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn is_cached(&self, unit: usize) -> bool {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.iter().any(|(u, _, _)| *u == unit)
    }

    /// The wanted records grouped into runs read with one request each, in (shard,
    /// record) order.
    fn runs(&self, records: BTreeMap<usize, Vec<u64>>) -> Vec<Run> {
        let Some(access) = &self.records else {
            return Vec::new();
        };
        let mut runs: Vec<Run> = Vec::new();
        for (shard, mut wanted) in records {
            wanted.sort_unstable();
            wanted.dedup();
            let offsets = &access.indexes[shard].offsets;
            let gap = match self.is_remote(shard) {
                true => REMOTE_RUN_GAP_BYTES,
                false => LOCAL_RUN_GAP_BYTES,
            };
            for record in wanted {
                match runs.last_mut() {
                    Some(run)
                        if run.shard == shard
                            && offsets[record as usize] - offsets[run.end as usize] <= gap =>
                    {
                        run.end = record + 1
                    }
                    _ => runs.push(Run {
                        shard,
                        first: record,
                        end: record + 1,
                    }),
                }
            }
        }
        runs
    }

    /// Fetches every run at once, then decodes them in parallel: one batch per run.
    fn read_runs(&self, runs: &[Run], io: &Io) -> Result<Vec<RecordBatch>> {
        let Some(access) = &self.records else {
            return Ok(Vec::new());
        };
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let reads: Vec<(Arc<dyn source::Source>, std::ops::Range<u64>)> = runs
            .iter()
            .map(|run| {
                let offsets = &access.indexes[run.shard].offsets;
                let range = offsets[run.first as usize]..offsets[run.end as usize];
                Ok((self.source(run.shard, io)?, range))
            })
            .collect::<Result<_>>()?;
        let fetched: Vec<bytes::Bytes> = if reads.iter().any(|(source, _)| source.is_remote()) {
            // Every request in flight at once on the I/O runtime.
            let rt = source::runtime()?;
            let tasks: Vec<_> = reads
                .into_iter()
                .map(|(source, range)| rt.spawn(async move { source.read_range(range).await }))
                .collect();
            rt.block_on(async {
                let mut out = Vec::with_capacity(tasks.len());
                for task in tasks {
                    out.push(
                        task.await
                            .map_err(|e| Error::Internal(format!("read task failed: {e}")))??,
                    );
                }
                Ok::<_, Error>(out)
            })?
        } else {
            // Local reads on this thread: a hand-off to the runtime's threads and back
            // cost more than the read of a record (about 60 of a `ds[i]`'s 100 µs).
            reads
                .into_iter()
                .map(|(source, range)| source.read_range_blocking(range))
                .collect::<Result<_>>()?
        };
        let runs: Vec<(&Run, bytes::Bytes)> = runs.iter().zip(fetched).collect();
        in_parallel(&runs, |(run, data)| {
            let data = data.clone();
            let shard = &self.prepared.shards[run.shard];
            let index = &access.indexes[run.shard];
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                access.codec.decode_records(shard, index, data, run.first)
            }))
            .unwrap_or_else(|panic| {
                Err(Error::decode(
                    &shard.url,
                    self.prepared.format,
                    Position::Byte(index.offsets[run.first as usize]),
                    format!(
                        "the decoder failed: {}",
                        crate::error::panic_message(&*panic)
                    ),
                ))
            })?;
            let batch =
                arrow_select::concat::concat_batches(&self.prepared.schema, &decoded.batches)
                    .map_err(|e| Error::Internal(e.to_string()))?;
            let expected = (run.end - run.first) as usize;
            if batch.num_rows() != expected {
                return Err(Error::decode(
                    &shard.url,
                    self.prepared.format,
                    Position::Byte(index.offsets[run.first as usize]),
                    format!(
                        "records {}..{} gave {} rows, not {expected}: some could not be decoded",
                        run.first,
                        run.end,
                        batch.num_rows()
                    ),
                ));
            }
            Ok(batch)
        })
    }

    /// Shard `shard`'s source, charging `io`'s counters: kept open if local.
    fn source(&self, shard: usize, io: &Io) -> Result<Arc<dyn source::Source>> {
        let meta = &self.prepared.shards[shard];
        if self.is_remote(shard) {
            return io.open(meta);
        }
        let mut open = self.open_files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, source)) = touch(&mut open, |(s, counters, _)| {
            *s == shard && Arc::ptr_eq(counters, &io.counters)
        }) {
            return Ok(source.clone());
        }
        let source = io.open(meta)?;
        open.push_front((shard, io.counters.clone(), source.clone()));
        open.truncate(OPEN_FILES);
        Ok(source)
    }

    fn unit_batches(&self, unit: usize, io: &Io) -> Result<Arc<Vec<RecordBatch>>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, batches, _)) = touch(&mut cache, |(u, _, _)| *u == unit) {
            return Ok(batches.clone());
        }
        drop(cache);
        let work = &self.prepared.units[unit];
        let job = self.prepared.job(work);
        let batches = Arc::new(self.decoded(unit, job, work.rows.unwrap_or(0), io)?);
        let size: usize = batches.iter().map(RecordBatch::get_array_memory_size).sum();
        self.saw_rows(&batches, work.rows.unwrap_or(0));
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_front((unit, batches.clone(), size));
        self.evict();
        Ok(batches)
    }

    /// Lets the least recently used units go until the cache is within its limit (the
    /// latest one is kept whatever its size).
    fn evict(&self) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut total: usize = cache.iter().map(|(_, _, s)| s).sum();
        let limit = usize::try_from(self.cache_limit()).unwrap_or(usize::MAX);
        while total > limit && cache.len() > 1 {
            total -= cache.pop_back().map_or(0, |(_, _, s)| s);
        }
    }

    /// Runs `job` (unit `unit`'s, decoding `rows` rows) on this thread, its batches
    /// collected.
    fn decoded(&self, unit: usize, job: UnitJob, rows: u64, io: &Io) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        self.decode_into(unit, job, rows, io, &mut |batch| batches.push(batch))?;
        Ok(batches)
    }

    /// Runs `job` (unit `unit`'s, decoding `rows` rows) on this thread, each batch handed
    /// to `sink` as it is decoded. As on the pipeline's threads, a decoder tripping on
    /// corrupt bytes is that unit's data error, not a crash.
    fn decode_into(
        &self,
        unit: usize,
        job: UnitJob,
        rows: u64,
        io: &Io,
        sink: &mut BatchSink,
    ) -> Result<()> {
        let work = &self.prepared.units[unit];
        let url = &self.prepared.shards[work.shard].url;
        let mut decoded_rows = 0u64;
        let mut counted = |batch: RecordBatch| {
            decoded_rows += batch.num_rows() as u64;
            sink(batch);
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_job(unit, job, io, &mut counted)
        }))
        .unwrap_or_else(|panic| {
            Err(Error::decode(
                url.as_str(),
                self.prepared.format,
                Position::Unknown,
                format!(
                    "the decoder failed: {}",
                    crate::error::panic_message(&*panic)
                ),
            ))
        })?;
        // Records skipped as undecodable (on_error="skip") leave the unit short of the
        // rows its index counted, and every later row would be read at the wrong index.
        if work.rows.is_some() && decoded_rows != rows {
            return Err(Error::decode(
                url.as_str(),
                self.prepared.format,
                Position::Unknown,
                format!(
                    "{decoded_rows} of its {rows} records could be decoded, so its rows cannot be read by index"
                ),
            ));
        }
        Ok(())
    }

    /// Fetches what `job` needs and decodes it on this thread, into `sink`.
    fn run_job(&self, unit: usize, job: UnitJob, io: &Io, sink: &mut BatchSink) -> Result<()> {
        let shard = &self.prepared.shards[self.prepared.units[unit].shard];
        let mut tasks = Vec::new();
        match job {
            UnitJob::Ready(task) => tasks.push(task),
            UnitJob::Ranges { ranges, decode } => {
                let source = self.source(self.prepared.units[unit].shard, io)?;
                let fetched = source::read_ranges_blocking(&*source, shard.size, ranges)?;
                let rest = decode(fetched, sink)?.batches;
                rest.into_iter().for_each(sink);
                return Ok(());
            }
            UnitJob::Stream(job) => {
                let source = self.source(self.prepared.units[unit].shard, io)?;
                job(source.open_stream()?, &mut |task| {
                    tasks.push(task);
                    true
                })?;
            }
        }
        for task in tasks {
            let rest = task(sink)?.batches;
            rest.into_iter().for_each(&mut *sink);
        }
        Ok(())
    }
}

/// How many rows a gather asks for at a time, so that one holds about `GATHER_BYTES`:
/// few at first, then as many as the rows seen so far fit.
pub(super) struct GatherSize {
    rows: u64,
    max_rows: u64,
    bytes: u64,
    /// Bytes a row takes, from the last gather (0: none seen yet).
    pub(super) row_bytes: u64,
}

/// Bytes of rows gathered per step of a filter's pass: wide rows (images, audio) are
/// asked for a few at a time, narrow ones by thousands.
const FILTER_PASS_BYTES: u64 = 32 << 20;
/// Rows of a first gather, before their size is known.
const FIRST_GATHER_ROWS: u64 = 64;

impl GatherSize {
    /// Gathers of at most `max_rows` rows and about `bytes` bytes.
    pub(super) fn new(max_rows: u64, bytes: u64) -> Self {
        Self {
            rows: FIRST_GATHER_ROWS.min(max_rows).max(1),
            max_rows: max_rows.max(1),
            bytes: bytes.max(1),
            row_bytes: 0,
        }
    }

    pub(super) fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes a gather holds at most.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gathers of about `bytes` at most from now on.
    pub(super) fn cap_bytes(&mut self, bytes: u64) {
        self.bytes = self.bytes.min(bytes.max(1));
        self.rows = (self.bytes / self.row_bytes.max(1)).clamp(1, self.max_rows);
    }

    /// Follows the size of the rows of `batch`, the last gather's.
    pub(super) fn saw(&mut self, batch: &RecordBatch) {
        if let Some(per_row) =
            crate::batch_bytes::batch_bytes(batch).checked_div(batch.num_rows() as u64)
        {
            self.row_bytes = per_row.max(1);
            self.rows = (self.bytes / self.row_bytes).clamp(1, self.max_rows);
        }
    }
}
