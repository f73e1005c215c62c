//! WHAT order and shape records arrive in: the dataset description (shards, format,
//! chained ops), the epoch plan, and the stages that run on the pipeline thread.

mod batch;
mod decode;
pub mod ops;
mod prefetch;
mod random_access;
pub mod rng;
mod shuffle;
pub mod stats;

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::format::{self, Format, PreparedShards, ReadOptions};
use crate::source::{self, Io, IoCounters, ShardMeta, Storage};
pub use batch::Rebatch;
use decode::UnitSlice;
pub use ops::{BatchTransform, Op};
pub use prefetch::{BatchReceiver, Received};
pub use random_access::RandomAccess;
use rng::Rng;
pub use stats::{Stats, StatsSnapshot};

pub type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Rows in the shuffle buffer when the user gives no `buffer_size`.
pub const DEFAULT_SHUFFLE_BUFFER: usize = 10_000;

/// Shards plus how to read them; prepared (footers read, schema known) on first use and
/// shared by every dataset derived from it.
pub struct DataSource {
    shards: Vec<ShardMeta>,
    format: Arc<dyn Format>,
    options: ReadOptions,
    prepared: Mutex<Option<Arc<PreparedShards>>>,
    /// Where remote shards are read from, shared by every loader of the dataset.
    storage: Arc<Storage>,
    /// I/O done while preparing (not part of any loader's stats).
    counters: Arc<IoCounters>,
}

/// An immutable description of a dataset: a source and the ops chained onto it.
#[derive(Clone)]
pub struct Dataset {
    source: Arc<DataSource>,
    ops: Vec<Op>,
}

impl Dataset {
    /// Resolves the shard list now, so a missing file or an empty glob fails here.
    pub fn open(
        specs: &[String],
        format: Option<&str>,
        options: ReadOptions,
        storage: Arc<Storage>,
    ) -> Result<Self> {
        let shards = source::resolve(specs, &storage)?;
        let format = format::by_name(match format {
            Some(name) => name,
            None => format::infer(&shards)?,
        })?;
        Ok(Self {
            source: Arc::new(DataSource {
                shards,
                format,
                options,
                prepared: Mutex::new(None),
                storage,
                counters: Arc::default(),
            }),
            ops: Vec::new(),
        })
    }

    pub fn format_name(&self) -> &'static str {
        self.source.format.name()
    }

    pub fn shards(&self) -> &[ShardMeta] {
        &self.source.shards
    }

    /// The I/O context for a reader charging `counters`.
    pub fn io(&self, counters: Arc<IoCounters>) -> Io {
        Io {
            storage: self.source.storage.clone(),
            counters,
        }
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn on_error(&self) -> format::OnError {
        self.source.options.on_error
    }

    pub fn with_op(&self, op: Op) -> Self {
        let mut ds = self.clone();
        ds.ops.push(op);
        ds
    }

    /// Reads footers / infers the schema once; a failure is returned and retried next time.
    pub fn prepared(&self) -> Result<Arc<PreparedShards>> {
        let mut slot = self
            .source
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(prepared) = slot.as_ref() {
            return Ok(prepared.clone());
        }
        let prepared = Arc::new(self.source.format.prepare(
            self.source.shards.clone(),
            &self.source.options,
            &Io {
                storage: self.source.storage.clone(),
                counters: self.source.counters.clone(),
            },
        )?);
        *slot = Some(prepared.clone());
        Ok(prepared)
    }

    /// The schema of the source's records (before any user function changes them).
    pub fn source_schema(&self) -> Result<SchemaRef> {
        Ok(self.prepared()?.schema.clone())
    }

    /// Map-style access by row index (see `RandomAccess`).
    pub fn random_access(&self) -> Result<RandomAccess> {
        RandomAccess::new(self.prepared()?, &self.ops, self.io(Arc::default()))
    }

    /// Whether no user function changes the records' columns.
    pub fn keeps_source_schema(&self) -> bool {
        !self.ops.iter().any(|op| matches!(op, Op::Transform(_)))
    }

    /// Number of rows, when metadata and the ops make it known.
    pub fn num_rows(&self) -> Result<Option<u64>> {
        self.rows_of_part(0, 1, false)
    }

    /// Rows one part of an epoch delivers after the ops, when that is known.
    pub fn rows_of_part(&self, part: usize, parts: usize, even: bool) -> Result<Option<u64>> {
        let prepared = self.prepared()?;
        let total: Option<u64> = prepared.units.iter().map(|u| u.rows).sum();
        let mut rows = total.map(|t| {
            let (start, end) = part_range(t, part, parts, even);
            end - start
        });
        for op in &self.ops {
            rows = match op {
                Op::Shuffle { .. } => rows,
                Op::Take(n) => rows.map(|r| r.min(*n)),
                Op::Skip(n) => rows.map(|r| r.saturating_sub(*n)),
                Op::Transform(t) if t.preserves_rows() => rows,
                Op::Transform(_) => None,
            };
        }
        Ok(rows)
    }

    /// The seed that permutes unit order: the first shuffle's, unless a take/skip comes
    /// before it (then *which* rows are taken must not depend on the seed).
    fn unit_shuffle_seed(&self) -> Option<u64> {
        for op in &self.ops {
            match op {
                Op::Shuffle { seed, .. } => return Some(*seed),
                Op::Take(_) | Op::Skip(_) => return None,
                Op::Transform(_) => {}
            }
        }
        None
    }

    /// The units this part reads this epoch, in order: all units, permuted when shuffling,
    /// then this part's share. With row counts known, each part gets a contiguous range
    /// of the epoch's rows (sizes differ by at most one; with `drop_last`, all equal and
    /// the remainder dropped); otherwise whole units are dealt round-robin.
    fn epoch_plan(&self, prepared: &PreparedShards, run: &RunOptions) -> Vec<UnitSlice> {
        let mut order: Vec<usize> = (0..prepared.units.len()).collect();
        if let Some(seed) = self.unit_shuffle_seed() {
            Rng::new(seed, run.epoch, 0).shuffle(&mut order);
        }
        let whole = |unit| UnitSlice {
            unit,
            skip: 0,
            take: None,
        };
        if run.parts <= 1 {
            return order.into_iter().map(whole).collect();
        }
        let rows: Option<Vec<u64>> = order.iter().map(|&u| prepared.units[u].rows).collect();
        let Some(rows) = rows else {
            return order
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % run.parts == run.part)
                .map(|(_, u)| whole(u))
                .collect();
        };
        let total: u64 = rows.iter().sum();
        let (start, end) = part_range(total, run.part, run.parts, run.drop_last);
        let mut slices = Vec::new();
        let mut at = 0;
        for (unit, n) in order.into_iter().zip(rows) {
            let (lo, hi) = (at.max(start), (at + n).min(end));
            if hi > lo {
                let partial = lo > at || hi < at + n;
                slices.push(UnitSlice {
                    unit,
                    skip: lo - at,
                    take: partial.then_some(hi - lo),
                });
            }
            at += n;
        }
        slices
    }

    /// Builds this epoch's stream of batches. Runs on the pipeline thread.
    pub fn stream(&self, run: &RunOptions, stats: Arc<Stats>) -> Result<BatchIter> {
        let prepared = self.prepared()?;
        stats.skipped_units.fetch_add(
            prepared.skipped_shards,
            std::sync::atomic::Ordering::Relaxed,
        );
        let slices = self.epoch_plan(&prepared, run);
        let io = self.io(stats.io.clone());
        let mut stream: BatchIter = Box::new(decode::UnitDecoder::new(
            prepared,
            slices,
            run.num_threads,
            self.on_error(),
            io,
            stats,
        )?);
        for (stage, op) in self.ops.iter().enumerate() {
            stream = match op {
                Op::Shuffle { seed, buffer_rows } => Box::new(shuffle::ShuffleBuffer::new(
                    stream,
                    Rng::new(*seed, run.epoch, 1 + stage as u64),
                    *buffer_rows,
                )),
                Op::Take(n) => Box::new(ops::Take::new(stream, *n)),
                Op::Skip(n) => Box::new(ops::Skip::new(stream, *n)),
                Op::Transform(t) => Box::new(ops::Transformed::new(stream, t.clone())),
            };
        }
        if let Some(rows) = run.batch_rows {
            stream = Box::new(Rebatch::new(stream, rows, run.drop_last));
        }
        Ok(stream)
    }

    /// Starts a background pipeline thread for one epoch.
    pub fn start(&self, run: RunOptions, stats: Arc<Stats>) -> Result<BatchReceiver> {
        if run.parts == 0 || run.part >= run.parts {
            return Err(Error::invalid_argument(format!(
                "part {} of {} does not exist (rank must be below world_size)",
                run.part, run.parts
            )));
        }
        if run.num_threads == 0 {
            return Err(Error::invalid_argument("num_threads must be at least 1"));
        }
        let ds = self.clone();
        prefetch::spawn(run.prefetch, stats.clone(), move || ds.stream(&run, stats))
    }
}

/// Rows `[start, end)` of `total` that part `part` of `parts` reads.
fn part_range(total: u64, part: usize, parts: usize, even: bool) -> (u64, u64) {
    let (part, parts) = (part as u128, parts.max(1) as u128);
    let total = total as u128;
    if even {
        let each = total / parts;
        ((part * each) as u64, ((part + 1) * each) as u64)
    } else {
        (
            (part * total / parts) as u64,
            ((part + 1) * total / parts) as u64,
        )
    }
}

/// How one epoch is run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub epoch: u64,
    /// This reader's share of the data: part `part` of `parts` (rank and worker combined).
    pub part: usize,
    pub parts: usize,
    /// Re-batch to exactly this many rows; `None` passes decoded batches through.
    pub batch_rows: Option<usize>,
    /// Drop a last short batch; across several parts, also give every part the same
    /// number of rows.
    pub drop_last: bool,
    pub num_threads: usize,
    /// Batches buffered between the pipeline thread and the consumer.
    pub prefetch: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            epoch: 0,
            part: 0,
            parts: 1,
            batch_rows: None,
            drop_last: false,
            num_threads: default_num_threads(),
            prefetch: 4,
        }
    }
}

/// Default decode threads: one per core.
pub fn default_num_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
