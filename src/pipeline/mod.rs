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

use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::format::{self, Format, PreparedShards, ReadOptions};
use crate::source::{self, Io, IoCounters, ShardMeta, Storage};
pub use batch::Rebatch;
use decode::UnitSlice;
pub use ops::{BatchTransform, BufferBounds, Op};
pub use prefetch::{BatchReceiver, Received};
pub use random_access::RandomAccess;
use rng::Rng;
pub use stats::{Stats, StatsSnapshot};

pub type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// Bytes of batches that may wait for the consumer, by default.
pub const DEFAULT_PREFETCH_BYTES: u64 = 256 << 20;

/// The shuffle buffer when the user gives no `buffer_size` / `buffer_bytes`: 10,000
/// rows, or 128 MiB of them, whichever is fewer. The rows it holds keep their decoded
/// batches alive (up to about twice their bytes before the buffer compacts), so this
/// keeps a plain `DataLoader(ds.shuffle())` over large rows such as images under 1 GiB.
pub const DEFAULT_SHUFFLE_BUFFER: BufferBounds = BufferBounds {
    rows: 10_000,
    bytes: 128 << 20,
};

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

    /// Records already in memory, one work unit per batch.
    pub fn from_batches(
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        columns: Option<Vec<String>>,
    ) -> Self {
        let (format, shards) = format::memory::InMemory::new(schema, batches);
        Self {
            source: Arc::new(DataSource {
                shards,
                format: Arc::new(format),
                options: ReadOptions {
                    columns,
                    ..ReadOptions::default()
                },
                prepared: Mutex::new(None),
                storage: Storage::local_only(),
                counters: Arc::default(),
            }),
            ops: Vec::new(),
        }
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

    /// A digest of what the dataset's records are: the shards (URL, size, ETag), the
    /// format and its options, and the ops with their seeds. A saved loader state names
    /// it, so that it is never resumed over other data.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let source = &self.source;
        let mut hash = Sha256::new();
        hash.update(source.format.name());
        for shard in &source.shards {
            hash.update(format!(
                "\0{}\0{:?}\0{:?}",
                shard.url, shard.size, shard.etag
            ));
        }
        hash.update(format!("\0{:?}", source.options));
        for op in &self.ops {
            hash.update(format!("\0{op:?}"));
        }
        let digest = hash.finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads footers / infers the schema once; a failure is returned and retried next
    /// time. The lock is not held while preparing: that is network I/O for remote data,
    /// and a `fork()` meanwhile would leave the child a lock nobody releases. Callers that
    /// race each prepare, and all keep the first result stored.
    pub fn prepared(&self) -> Result<Arc<PreparedShards>> {
        if let Some(prepared) = self.lock_prepared().as_ref() {
            return Ok(prepared.clone());
        }
        let source = &self.source;
        let io = Io {
            storage: source.storage.clone(),
            counters: source.counters.clone(),
        };
        // Footers, headers and schema inference parse untrusted bytes: a panic there is
        // a bug, reported as an error rather than unwinding into Python.
        let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            source
                .format
                .prepare(source.shards.clone(), &source.options, &io)
        }))
        .map_err(|panic| {
            Error::Internal(format!(
                "preparing the {} shards failed: {}",
                source.format.name(),
                crate::error::panic_message(&*panic)
            ))
        })??;
        Ok(self
            .lock_prepared()
            .get_or_insert_with(|| Arc::new(prepared))
            .clone())
    }

    fn lock_prepared(&self) -> std::sync::MutexGuard<'_, Option<Arc<PreparedShards>>> {
        self.source
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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

    /// Where the epoch is split between parts (see [`Split`]).
    fn split(&self, prepared: &PreparedShards) -> Split {
        let Some(last) = self.ops.iter().rposition(Op::counts_rows) else {
            return Split::Units;
        };
        let known: Option<u64> = prepared.units.iter().map(|u| u.rows).sum();
        let in_place = self.ops[..=last].iter().all(|op| match op {
            Op::Take(_) | Op::Skip(_) => true,
            Op::Transform(t) => t.preserves_rows(),
            Op::Shuffle { .. } => false,
        });
        match known {
            Some(total) if in_place => {
                let (mut start, mut len) = (0u64, total);
                for op in &self.ops[..=last] {
                    match op {
                        Op::Skip(n) => {
                            let n = (*n).min(len);
                            start += n;
                            len -= n;
                        }
                        Op::Take(n) => len = len.min(*n),
                        _ => {}
                    }
                }
                Split::Window {
                    rows: start..start + len,
                    after: last + 1,
                }
            }
            _ => Split::Rows { after: last + 1 },
        }
    }

    /// Rows one part of an epoch delivers after the ops, when that is known.
    pub fn rows_of_part(&self, part: usize, parts: usize, even: bool) -> Result<Option<u64>> {
        let prepared = self.prepared()?;
        let total: Option<u64> = prepared.units.iter().map(|u| u.rows).sum();
        let (mut rows, rest) = match self.split(&prepared) {
            Split::Units => (total.map(|t| part_len(t, part, parts, even)), 0),
            Split::Window { rows, after } => (
                Some(part_len(rows.end - rows.start, part, parts, even)),
                after,
            ),
            Split::Rows { after } => {
                let global = rows_through(total, &self.ops[..after]);
                (global.map(|t| dealt_rows(t, part, parts, even)), after)
            }
        };
        rows = rows_through(rows, &self.ops[rest..]);
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

    /// The units part `part` of `parts` reads this epoch, in order: all units, permuted
    /// when shuffling, then this part's share of the rows in `window` (all rows when
    /// None). With row counts known, each part gets a contiguous range of the rows
    /// (sizes differ by at most one; with `even`, all equal and the remainder dropped);
    /// otherwise whole units are dealt round-robin.
    fn epoch_plan(
        &self,
        prepared: &PreparedShards,
        epoch: u64,
        (part, parts, even): (usize, usize, bool),
        window: Option<Range<u64>>,
    ) -> Vec<UnitSlice> {
        let mut order: Vec<usize> = (0..prepared.units.len()).collect();
        if let Some(seed) = self.unit_shuffle_seed() {
            Rng::new(seed, epoch, 0).shuffle(&mut order);
        }
        let whole = |unit| UnitSlice {
            unit,
            skip: 0,
            take: None,
        };
        if parts <= 1 && window.is_none() {
            return order.into_iter().map(whole).collect();
        }
        let rows: Option<Vec<u64>> = order.iter().map(|&u| prepared.units[u].rows).collect();
        let Some(rows) = rows else {
            return order
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % parts == part)
                .map(|(_, u)| whole(u))
                .collect();
        };
        let window = window.unwrap_or(0..rows.iter().sum());
        let (lo, hi) = part_range(window.end - window.start, part, parts, even);
        let (start, end) = (window.start + lo, window.start + hi);
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
        let split = self.split(&prepared);
        let this_part = (run.part, run.parts, run.drop_last);
        let slices = match &split {
            Split::Units => self.epoch_plan(&prepared, run.epoch, this_part, None),
            // The window applies every take/skip up to `after`; the row-wise transforms
            // among them still run below.
            Split::Window { rows, .. } => {
                self.epoch_plan(&prepared, run.epoch, this_part, Some(rows.clone()))
            }
            // Every part reads the whole epoch up to the last take/skip, then keeps its
            // own rows of it.
            Split::Rows { .. } => self.epoch_plan(&prepared, run.epoch, (0, 1, false), None),
        };
        let io = self.io(stats.io.clone());
        let mut stream: BatchIter = Box::new(decode::UnitDecoder::new(
            prepared.clone(),
            slices,
            run.num_threads,
            self.on_error(),
            io,
            stats.clone(),
        )?);
        let total: Option<u64> = prepared.units.iter().map(|u| u.rows).sum();
        for (stage, op) in self.ops.iter().enumerate() {
            if let Split::Window { after, .. } = split
                && stage < after
                && matches!(op, Op::Take(_) | Op::Skip(_))
            {
                continue;
            }
            stream = match op {
                Op::Shuffle { seed, buffer } => Box::new(shuffle::ShuffleBuffer::new(
                    stream,
                    Rng::new(*seed, run.epoch, 1 + stage as u64),
                    *buffer,
                    stats.clone(),
                )),
                Op::Take(n) => Box::new(ops::Take::new(stream, *n)),
                Op::Skip(n) => Box::new(ops::Skip::new(stream, *n)),
                Op::Transform(t) => Box::new(ops::Transformed::new(stream, t.clone())),
            };
            if let Split::Rows { after } = split
                && stage + 1 == after
                && run.parts > 1
            {
                let global = rows_through(total, &self.ops[..after]);
                let limit = match (run.drop_last, global) {
                    (true, Some(rows)) => Some(rows / run.parts as u64 * run.parts as u64),
                    _ => None,
                };
                stream = Box::new(ops::Deal::new(stream, run.part, run.parts, limit));
            }
        }
        if run.skip_rows > 0 {
            stream = Box::new(ops::Skip::new(stream, run.skip_rows));
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
        prefetch::spawn(run.prefetch, run.prefetch_bytes, stats.clone(), move || {
            ds.stream(&run, stats)
        })
    }
}

/// How an epoch is divided between the parts (ranks x workers) that read it, so that
/// take/skip count rows of the whole dataset, never of each part.
enum Split {
    /// No take/skip: each part reads its share of the units (or of their rows) and runs
    /// every op on it.
    Units,
    /// Row counts are known and every op up to the last take/skip keeps rows in place:
    /// those take/skips become the window of rows that the parts share.
    Window { rows: Range<u64>, after: usize },
    /// Otherwise every part runs the ops before `after` over the whole epoch and keeps
    /// every `parts`-th row of the result, starting at its own.
    Rows { after: usize },
}

/// Rows left after `ops`, from `rows` in, where that can be known.
fn rows_through(mut rows: Option<u64>, ops: &[Op]) -> Option<u64> {
    for op in ops {
        rows = match op {
            Op::Shuffle { .. } => rows,
            Op::Take(n) => rows.map(|r| r.min(*n)),
            Op::Skip(n) => rows.map(|r| r.saturating_sub(*n)),
            Op::Transform(t) if t.preserves_rows() => rows,
            Op::Transform(_) => None,
        };
    }
    rows
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

fn part_len(total: u64, part: usize, parts: usize, even: bool) -> u64 {
    let (start, end) = part_range(total, part, parts, even);
    end - start
}

/// Rows that part `part` keeps when rows are dealt round-robin (see [`ops::Deal`]).
fn dealt_rows(total: u64, part: usize, parts: usize, even: bool) -> u64 {
    let parts = parts.max(1) as u64;
    let each = total / parts;
    if even || (part as u64) >= total % parts {
        each
    } else {
        each + 1
    }
}

/// Bytes of `batch`'s values: the slices it covers, not the whole buffers it may share
/// with other batches.
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    use arrow_array::Array;
    batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| data.get_buffer_memory_size()) as u64
        })
        .sum()
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
    /// Batches buffered between the pipeline thread and the consumer, and the bytes of
    /// them at most (whichever bound is reached first).
    pub prefetch: usize,
    pub prefetch_bytes: u64,
    /// Rows of this part's stream to pass over first (resuming mid-epoch).
    pub skip_rows: u64,
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
            prefetch_bytes: DEFAULT_PREFETCH_BYTES,
            skip_rows: 0,
        }
    }
}

/// Default decode threads: one per core.
pub fn default_num_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
