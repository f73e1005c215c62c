//! Dataset operations applied in the order the user chained them.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::batch::Rebatch;
use super::rows;
pub use super::shuffle::BufferBounds;
use super::stream::BatchIter;
use crate::error::{Error, Result};

/// A user function over batches (filter, map, flat_map). The Python layer implements it;
/// the core only calls it, in order, from the pipeline thread.
pub trait BatchTransform: Send + Sync {
    /// Turns one batch into zero or more batches.
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>>;
    /// For a filter: which rows of `batch` stay. The pipeline then selects them itself,
    /// so that what rides along with the rows (their positions) stays with them.
    fn keep(&self, batch: &RecordBatch) -> Option<Result<arrow_array::BooleanArray>> {
        let _ = batch;
        None
    }
    /// Whether every input row gives exactly one output row, so lengths stay known.
    fn preserves_rows(&self) -> bool;
    /// Whether it is a filter (see `keep`): random access runs it over the rows once and
    /// keeps the row numbers that pass.
    fn filters(&self) -> bool {
        false
    }
    /// Whether the function takes each row's index too (`with_indices=True`): its input
    /// batches then carry them as their last column, [`rows::INDEX_COLUMN`].
    fn wants_indices(&self) -> bool {
        false
    }
    /// Rows per call for functions that want fixed-size batches.
    fn batch_rows(&self) -> Option<usize> {
        None
    }
    /// What the transform is, for people and for a dataset's fingerprint
    /// (e.g. `map(train.normalize)`).
    fn describe(&self) -> String;
    /// Whether it runs Python code (and so holds the GIL while it works).
    fn runs_python(&self) -> bool {
        false
    }
    /// Whether it may run on the batch threads, several batches at once (a
    /// row-preserving transform that holds no GIL and costs enough to share out, such as
    /// tokenizing); the others run on the pipeline thread, one batch after another.
    fn parallel(&self) -> bool {
        false
    }
    /// The schema of its output for input of `input`, where that is known without
    /// running it.
    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        let _ = input;
        None
    }
    /// Whether rows it fails on are left out and counted (`on_error="skip"`) rather
    /// than raised: a row-preserving transform then gives fewer rows, each keeping its
    /// position. Random access cannot pass through it (its rows are read into memory
    /// once, as after a flat_map).
    fn skips_failed_rows(&self) -> bool {
        false
    }
    /// For a transform that [`skips_failed_rows`](Self::skips_failed_rows): the output
    /// for the rows of `batch` that did not fail, and which rows those are (`None`
    /// when none failed).
    fn apply_skipping(
        &self,
        batch: RecordBatch,
    ) -> Result<(RecordBatch, Option<arrow_array::BooleanArray>)> {
        let _ = batch;
        Err(Error::Internal(format!(
            "{} does not skip failed rows",
            self.describe()
        )))
    }
}

/// Row numbers chosen by `select`: a range or a list, with a digest of the list so a
/// dataset's fingerprint names exactly which rows it holds.
#[derive(Clone)]
pub enum Indices {
    Range { start: u64, len: u64 },
    List { rows: Arc<[u64]>, digest: String },
}

/// A short SHA-256 digest of values a user gave (row numbers, weights), for a dataset's
/// fingerprint.
fn digest_of<const N: usize>(values: impl Iterator<Item = [u8; N]>) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for v in values {
        hash.update(v);
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Indices {
    pub fn list(rows: Vec<u64>) -> Self {
        let digest = digest_of(rows.iter().map(|r| r.to_le_bytes()));
        Indices::List {
            rows: rows.into(),
            digest,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Indices::Range { len, .. } => *len,
            Indices::List { rows, .. } => rows.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: u64) -> u64 {
        match self {
            Indices::Range { start, .. } => start + i,
            Indices::List { rows, .. } => rows[i as usize],
        }
    }

    /// The first row number that is `bound` or more, if any.
    pub fn first_at_or_above(&self, bound: u64) -> Option<u64> {
        match self {
            Indices::Range { start, len } => {
                (*len > 0 && start + len > bound).then(|| (*start).max(bound))
            }
            Indices::List { rows, .. } => rows.iter().copied().find(|&r| r >= bound),
        }
    }
}

/// Where `weighted_sample` takes each row's weight from.
#[derive(Clone)]
pub enum Weights {
    /// One weight per row, given by the user; the digest names them in fingerprints.
    Rows { values: Arc<[f64]>, digest: String },
    /// A numeric column of the rows, read once (when first needed) and kept.
    Column {
        name: String,
        values: Arc<std::sync::OnceLock<Arc<[f64]>>>,
    },
    /// One weight per part of a concatenation: the chance that a draw comes from it.
    Sources(Vec<f64>),
}

impl Weights {
    pub fn rows(values: Vec<f64>) -> Self {
        let digest = digest_of(values.iter().map(|v| v.to_le_bytes()));
        Weights::Rows {
            values: values.into(),
            digest,
        }
    }

    pub fn column(name: String) -> Self {
        Weights::Column {
            name,
            values: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Weights::Rows { values, digest } => {
                write!(f, "{} row weights, sha256 {digest}", values.len())
            }
            Weights::Column { name, .. } => write!(f, "column {name:?}"),
            Weights::Sources(w) => write!(f, "source weights {w:?}"),
        }
    }
}

#[derive(Clone)]
pub enum Op {
    /// Seeded shuffle: shard/unit order (when nothing before it selects rows by position)
    /// plus a row buffer bounded in rows and bytes.
    Shuffle {
        seed: u64,
        buffer: BufferBounds,
    },
    /// A uniform permutation of all rows, new each epoch (`shuffle` without a buffer
    /// size on a dataset with random access).
    Permute {
        seed: u64,
    },
    Take(u64),
    Skip(u64),
    /// The rows at these positions, in this order.
    Select(Indices),
    /// `num_samples` rows drawn by weight, new each epoch: with replacement (rows may
    /// repeat) or without (a weighted random order of distinct rows).
    Sample {
        weights: Weights,
        num_samples: Option<u64>,
        replacement: bool,
        seed: u64,
    },
    Transform(Arc<dyn BatchTransform>),
}

impl Op {
    /// Whether the op selects rows by their position in the dataset, so it must count
    /// in the dataset's order, before the epoch is split between ranks and workers.
    pub fn counts_rows(&self) -> bool {
        matches!(self, Op::Take(_) | Op::Skip(_))
    }

    /// Whether random access goes through the op without reading the rows before it
    /// into memory: every op but a flat_map or batched map (which may change the rows'
    /// number) and a shuffle buffer. (A filter is run once over the rows; see
    /// `RandomAccess::with_ops`.)
    pub fn keeps_rows_addressable(&self) -> bool {
        match self {
            Op::Shuffle { .. } => false,
            Op::Transform(t) => (t.preserves_rows() && !t.skips_failed_rows()) || t.filters(),
            _ => true,
        }
    }

    /// Whether the op addresses rows by index, so the rows before it are read by
    /// random access.
    pub fn needs_index(&self) -> bool {
        matches!(self, Op::Select(_) | Op::Permute { .. } | Op::Sample { .. })
    }

    /// Whether the op picks rows by their position in the order before it: a split
    /// (take, skip, select, and so shard and train_test_split) or a weighted_sample,
    /// which reads its weights through that order. See [`Draws`].
    pub fn picks_by_position(&self) -> bool {
        matches!(
            self,
            Op::Take(_) | Op::Skip(_) | Op::Select(_) | Op::Sample { .. }
        )
    }
}

/// Which epoch each seeded draw of a dataset follows. A split must select the same rows
/// in every epoch (or a test split would leak into train), and a weighted_sample must
/// read its weights in the order it draws from; so everything before the last op that
/// picks rows by position (the source's order, an interleave's draws, the parts of a
/// combination, shuffles) draws as in epoch 0. Ops after it draw anew each epoch, so
/// `DataLoader(ds.shuffle(seed))` still reshuffles every epoch.
#[derive(Clone, Copy, Debug)]
pub struct Draws {
    epoch: u64,
    /// Index of the last op that picks by position.
    last_pick: Option<usize>,
    /// Ops of the whole chain before this one (see [`Draws::after`]).
    before: usize,
}

impl Draws {
    pub fn new(ops: &[Op], epoch: u64) -> Self {
        Self {
            epoch,
            last_pick: ops.iter().rposition(Op::picks_by_position),
            before: 0,
        }
    }

    /// The epoch of the dataset's origin: its unit order, an interleave's draws, and the
    /// epoch its combined parts run.
    pub fn origin(&self) -> u64 {
        if self.last_pick.is_some() {
            0
        } else {
            self.epoch
        }
    }

    /// The draws of the ops from `stage` on, as a chain of their own.
    pub fn after(&self, stage: usize) -> Self {
        Self {
            epoch: self.epoch,
            last_pick: self.last_pick.and_then(|last| last.checked_sub(stage)),
            before: self.before + stage,
        }
    }

    /// These draws for a chain whose first op is at `stage` of a longer one.
    pub fn placed_at(self, stage: usize) -> Self {
        Self {
            before: stage,
            ..self
        }
    }

    /// Ops of the whole chain before this one.
    pub fn before(&self) -> usize {
        self.before
    }

    /// The epoch the op at `stage` draws for.
    pub fn stage(&self, stage: usize) -> u64 {
        if self.last_pick.is_some_and(|last| stage < last) {
            0
        } else {
            self.epoch
        }
    }

    /// The random numbers of the op at `stage` with `seed`: a stream of its own, named
    /// by its place in the whole chain, so that the ops after a part read into memory
    /// (see `Dataset::random_access_with`) draw as they do when the chain streams.
    pub fn rng(&self, seed: u64, stage: usize) -> super::rng::Rng {
        super::rng::Rng::new(seed, self.stage(stage), 1 + (self.before + stage) as u64)
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
            Op::Permute { seed } => write!(f, "shuffle(seed={seed})"),
            Op::Sample {
                weights,
                num_samples,
                replacement,
                seed,
            } => write!(
                f,
                "weighted_sample({weights:?}, num_samples={num_samples:?}, replacement={replacement}, seed={seed})"
            ),
            Op::Select(Indices::Range { start, len }) => {
                write!(f, "select(range({start}, {}))", start + len)
            }
            Op::Select(Indices::List { rows, digest }) => {
                write!(f, "select({} rows, sha256 {digest})", rows.len())
            }
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

/// Part `share`'s rows of a stream that every part reads whole, dealt like cards: row
/// `j` goes to rank `(j + first) % ranks`, and a rank's `k`-th row to its worker
/// `(k + first) % workers` (see [`super::rows::Share`]). Every rank gets as many rows
/// when asked: `drop_last` deals only whole rounds (one row to each rank), and padding
/// gives a rank dealt fewer rows than the largest share the stream's first row again, to
/// the worker whose turn it is. Where the stream's length is not known before it ends
/// (a filter or flat_map before the take/skip), a part learns it at the end: it holds
/// back its row of a round until the round is complete, and pads once the stream ends.
pub struct Deal {
    upstream: Option<BatchIter>,
    share: super::rows::Share,
    /// Position in the whole stream of the next upstream row.
    at: u64,
    /// Rows dealt to this part's rank so far.
    rank_dealt: u64,
    rounds: Rounds,
    /// This part's row of a round not yet complete, and that round's end (whole rounds
    /// of a stream of unknown length).
    held: Option<(RecordBatch, u64)>,
    /// Rows the rank is padded to (`None`: the largest share of the whole stream, known
    /// at its end).
    pad_to: Option<(Option<u64>, Arc<super::stats::Stats>)>,
    /// The stream's first row, kept for padding.
    first: Option<RecordBatch>,
    /// Give each row its index in the whole stream as its position
    /// ([`rows::DEALT_LEAF`]), so that the rows a part delivered can be told on another
    /// division.
    track: bool,
    /// Resuming on another division: the positions of the stream still to deal (the
    /// others are passed over, not dealt).
    keep: Option<Arc<rows::RowSet>>,
    /// Rows of the whole stream seen so far, kept or not.
    seen: u64,
}

/// Which rows of the stream are dealt.
enum Rounds {
    All,
    /// The first rows, known up front.
    Limit(u64),
    /// Whole rounds only, the stream's length unknown.
    Whole,
}

impl Deal {
    pub fn new(upstream: BatchIter, share: super::rows::Share) -> Self {
        Self {
            upstream: Some(upstream),
            share,
            at: 0,
            rank_dealt: 0,
            rounds: Rounds::All,
            held: None,
            pad_to: None,
            first: None,
            track: false,
            keep: None,
            seen: 0,
        }
    }

    /// Gives the rows their positions in the whole stream, and deals only those of
    /// `keep` when given (the rows still to read of an epoch resumed elsewhere).
    pub fn tracking(mut self, keep: Option<Arc<rows::RowSet>>) -> Self {
        self.track = true;
        self.keep = keep;
        self
    }

    /// `batch` (the whole stream's next rows) with their positions, less the rows
    /// `keep` leaves out.
    fn positioned(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        if !self.track {
            return Ok(batch);
        }
        // Positions the head gave mean nothing past a dealing: the stream's own replace them.
        let (batch, _) = rows::detach(batch);
        let first = self.seen;
        self.seen += batch.num_rows() as u64;
        let all = (first..self.seen).map(|k| rows::tag(rows::DEALT_LEAF, k));
        let positions: Vec<u64> = match &self.keep {
            Some(keep) => all.filter(|&p| keep.contains(p)).collect(),
            None => all.collect(),
        };
        let batch = if positions.len() < batch.num_rows() {
            let kept: Vec<usize> = positions
                .iter()
                .map(|&p| (rows::row_of(p) - first) as usize)
                .collect();
            super::stream::select_rows(&batch, &kept)
                .map_err(|e| Error::Internal(format!("cannot keep the rows still to read: {e}")))?
        } else {
            batch
        };
        rows::attach(batch, arrow_array::UInt64Array::from(positions))
    }

    /// Deals whole rounds only (`drop_last`), of a stream of `rows` rows when known.
    pub fn whole_rounds(mut self, rows: Option<u64>) -> Self {
        let ranks = self.share.ranks();
        self.rounds = match rows {
            Some(rows) => Rounds::Limit(rows / ranks * ranks),
            None => Rounds::Whole,
        };
        self
    }

    /// Pads the rank to `rank_rows` rows, or (`None`) to the largest share of the stream.
    pub fn padded_to(mut self, rank_rows: Option<u64>, stats: Arc<super::stats::Stats>) -> Self {
        self.pad_to = Some((rank_rows, stats));
        self
    }

    /// Whether the rank's `k`-th row goes to this part's worker.
    fn ours(&self, k: u64) -> bool {
        (k + self.share.first.1) % self.share.workers() == self.share.worker()
    }

    /// The padding rows of this part, once the stream is dealt.
    fn pad(&mut self) -> Option<Result<RecordBatch>> {
        let (target, stats) = self.pad_to.take()?;
        let first = self.first.take()?;
        let target = target.unwrap_or_else(|| self.share.rank_rows(self.at));
        let rows = (self.rank_dealt..target).filter(|&k| self.ours(k)).count();
        if rows == 0 {
            return None;
        }
        stats
            .padded_rows
            .fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
        let batches = vec![first; rows];
        Some(
            arrow_select::concat::concat_batches(&batches[0].schema(), &batches)
                .map_err(|e| Error::Internal(format!("cannot pad this part: {e}"))),
        )
    }
}

impl Iterator for Deal {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Rounds::Limit(limit) = self.rounds
                && self.at >= limit
            {
                self.upstream = None;
            }
            let Some(upstream) = self.upstream.as_mut() else {
                // A round the stream ended in the middle of is not dealt.
                self.held = None;
                return self.pad();
            };
            let next = upstream.next();
            let batch = match next.map(|b| b.and_then(|b| self.positioned(b))) {
                Some(Ok(batch)) => batch,
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.upstream = None;
                    continue;
                }
            };
            if self.at == 0 && self.pad_to.is_some() && batch.num_rows() > 0 {
                self.first = Some(batch.slice(0, 1));
            }
            let mut rows = batch.num_rows() as u64;
            if let Rounds::Limit(limit) = self.rounds {
                rows = rows.min(limit - self.at);
            }
            let (rank, ranks) = (self.share.rank(), self.share.ranks());
            let mut mine = Vec::new();
            for j in 0..rows {
                if (self.at + j + self.share.first.0) % ranks == rank {
                    if self.ours(self.rank_dealt) {
                        mine.push(j);
                    }
                    self.rank_dealt += 1;
                }
            }
            let start = self.at;
            self.at += batch.num_rows() as u64;
            let mut out = Vec::new();
            if let Rounds::Whole = self.rounds {
                if let Some((_, end)) = &self.held
                    && *end <= self.at
                {
                    out.extend(self.held.take().map(|(row, _)| row));
                }
                // Our row of the round still incomplete waits for the round's end.
                if let Some(&j) = mine.last() {
                    let end = ((start + j) / ranks + 1) * ranks;
                    if end > self.at {
                        mine.pop();
                        self.held = Some((batch.slice(j as usize, 1), end));
                    }
                }
            }
            if mine.len() == batch.num_rows() {
                // Every row is this part's (a single reader, tracking positions).
                out.push(batch);
            } else if !mine.is_empty() {
                let mine: Vec<usize> = mine.into_iter().map(|j| j as usize).collect();
                match super::stream::select_rows(&batch, &mine) {
                    Ok(rows) => out.push(rows),
                    Err(e) => {
                        return Some(Err(Error::Internal(format!(
                            "cannot select this part's rows: {e}"
                        ))));
                    }
                }
            }
            match out.len() {
                0 => continue,
                1 => return out.pop().map(Ok),
                _ => {
                    return Some(
                        arrow_select::concat::concat_batches(&out[0].schema(), &out).map_err(|e| {
                            Error::Internal(format!("cannot select this part's rows: {e}"))
                        }),
                    );
                }
            }
        }
    }
}

/// Counts the rows after a part's first `share` rows: those read again to give the
/// part as many rows as the others (see `rows::Share`), in the stats.
pub struct Padding {
    upstream: BatchIter,
    /// Rows still to pass before the padding starts.
    share_left: u64,
    stats: Arc<super::stats::Stats>,
}

impl Padding {
    pub fn new(upstream: BatchIter, share: u64, stats: Arc<super::stats::Stats>) -> Self {
        Self {
            upstream,
            share_left: share,
            stats,
        }
    }
}

impl Iterator for Padding {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.upstream.next()?;
        if let Ok(batch) = &item {
            let rows = batch.num_rows() as u64;
            let padded = rows.saturating_sub(self.share_left);
            self.share_left = self.share_left.saturating_sub(rows);
            if padded > 0 {
                self.stats
                    .padded_rows
                    .fetch_add(padded, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Some(item)
    }
}

/// Applies a user function batch by batch.
pub struct Transformed {
    upstream: BatchIter,
    transform: Arc<dyn BatchTransform>,
    out: std::collections::VecDeque<RecordBatch>,
    stats: Arc<super::stats::Stats>,
    times: Arc<super::stage_times::OpTimes>,
}

impl Transformed {
    pub fn new(
        upstream: BatchIter,
        transform: Arc<dyn BatchTransform>,
        stats: Arc<super::stats::Stats>,
    ) -> Self {
        let upstream: BatchIter = match transform.batch_rows() {
            Some(rows) => Box::new(Rebatch::new(upstream, rows, false)),
            None => upstream,
        };
        let times = stats.op_times(transform.describe(), false);
        Self {
            upstream,
            transform,
            out: Default::default(),
            stats,
            times,
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
            match self.run(batch) {
                Ok(batches) => self
                    .out
                    .extend(batches.into_iter().filter(|b| b.num_rows() > 0)),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Transformed {
    fn run(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        run_transform(self.transform.as_ref(), batch, &self.stats, &self.times)
    }
}

/// A [`BatchTransform::parallel`] transform run on the batch threads: each batch of
/// upstream is handed to them as it comes, and the results come back in order.
pub struct TransformedOnThreads {
    upstream: BatchIter,
    transform: Arc<dyn BatchTransform>,
    made: super::assemble::InOrder,
    stats: Arc<super::stats::Stats>,
    times: Arc<super::stage_times::OpTimes>,
    /// Pieces of a large upstream batch not handed out yet.
    pieces: std::collections::VecDeque<RecordBatch>,
}

/// Rows of one task of a [`TransformedOnThreads`]: a larger upstream batch (a gather of
/// a full shuffle can hold thousands of rows) is cut so that every thread has work.
const PIECE_ROWS: usize = 128;

/// `batch` cut into consecutive pieces of at most `rows` rows (none for no rows).
pub fn pieces(batch: &RecordBatch, rows: usize) -> Vec<RecordBatch> {
    let rows = rows.max(1);
    (0..batch.num_rows())
        .step_by(rows)
        .map(|start| batch.slice(start, rows.min(batch.num_rows() - start)))
        .collect()
}

impl TransformedOnThreads {
    pub fn new(
        upstream: BatchIter,
        transform: Arc<dyn BatchTransform>,
        threads: Arc<super::assemble::BatchThreads>,
        stats: Arc<super::stats::Stats>,
    ) -> Self {
        let times = stats.op_times(transform.describe(), true);
        Self {
            upstream,
            transform,
            made: super::assemble::InOrder::new(threads),
            stats,
            times,
            pieces: Default::default(),
        }
    }
}

impl Iterator for TransformedOnThreads {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let (upstream, transform, stats) = (&mut self.upstream, &self.transform, &self.stats);
        let times = &self.times;
        let waiting = &mut self.pieces;
        self.made.next(|| {
            if waiting.is_empty() {
                match upstream.next()? {
                    Ok(batch) if batch.num_rows() > PIECE_ROWS => {
                        waiting.extend(pieces(&batch, PIECE_ROWS));
                    }
                    Ok(batch) => waiting.push_back(batch),
                    Err(e) => return Some(Err(e)),
                }
            }
            let batch = waiting.pop_front()?;
            let (transform, stats, times) = (transform.clone(), stats.clone(), times.clone());
            Some(Ok(super::assemble::Step::Make(Box::new(move || {
                let rows = batch.num_rows();
                match &mut run_transform(transform.as_ref(), batch, &stats, &times)?[..] {
                    [one] => Ok(std::mem::replace(one, RecordBatch::new_empty(one.schema()))),
                    other => Err(Error::Internal(format!(
                        "{} gave {} batches for one batch of {rows} rows",
                        transform.describe(),
                        other.len()
                    ))),
                }
            }))))
        })
    }
}

/// The function sees the batch without its row positions; they are put back on rows it
/// keeps in place (a filter's, a per-row map's, and the rows a skipping one did not fail
/// on). After a function that makes or reorders rows (flat_map, batched map) rows have
/// no positions any more.
fn run_transform(
    transform: &dyn BatchTransform,
    batch: RecordBatch,
    stats: &super::stats::Stats,
    times: &super::stage_times::OpTimes,
) -> Result<Vec<RecordBatch>> {
    // The span encloses the time counted (see the decode task's).
    let span = stats.trace().map(|t| t.span(times.name.as_str(), "op"));
    let (rows_in, start) = (batch.num_rows(), std::time::Instant::now());
    let out = run_transform_untimed(transform, batch, stats);
    let elapsed = start.elapsed();
    drop(span);
    if let Ok(out) = &out {
        times.record(
            rows_in,
            out.iter().map(RecordBatch::num_rows).sum(),
            elapsed,
        );
    }
    out
}

fn run_transform_untimed(
    transform: &dyn BatchTransform,
    batch: RecordBatch,
    stats: &super::stats::Stats,
) -> Result<Vec<RecordBatch>> {
    let (batch, positions) = rows::detach(batch);
    if transform.skips_failed_rows() {
        let (out, kept) = transform.apply_skipping(batch)?;
        let positions = match (positions, kept) {
            (positions, None) => positions,
            (positions, Some(kept)) => {
                let failed = kept.len() - kept.true_count();
                stats
                    .skipped_records
                    .fetch_add(failed as u64, std::sync::atomic::Ordering::Relaxed);
                positions
                    .map(|p| {
                        arrow_select::filter::filter(&p, &kept)
                            .map(|p| {
                                arrow_array::cast::AsArray::as_primitive::<
                                    arrow_array::types::UInt64Type,
                                >(p.as_ref())
                                .clone()
                            })
                            .map_err(|e| Error::Internal(format!("dropping failed rows: {e}")))
                    })
                    .transpose()?
            }
        };
        return Ok(vec![match positions {
            Some(positions) => rows::attach(out, positions)?,
            None => out,
        }]);
    }
    let Some(positions) = positions else {
        if transform.wants_indices() {
            return Err(Error::Internal(
                "a function taking row indices got rows without positions".into(),
            ));
        }
        return transform.apply(batch);
    };
    // The rows' indices in the dataset the function was added to: their positions
    // in its indexed head (see `Dataset::with_indices`).
    let given = |batch: RecordBatch| -> Result<RecordBatch> {
        if transform.wants_indices() {
            rows::with_index(batch, positions.values().iter().map(|&p| rows::row_of(p)))
        } else {
            Ok(batch)
        }
    };
    if let Some(keep) = transform.keep(&given(batch.clone())?) {
        let keep = keep?;
        let batch = rows::attach(batch, positions)?;
        return Ok(vec![
            arrow_select::filter::filter_record_batch(&batch, &keep)
                .map_err(|e| Error::Internal(format!("filtering rows: {e}")))?,
        ]);
    }
    let mut out = transform.apply(given(batch)?)?;
    if transform.preserves_rows()
        && let [only] = &mut out[..]
        && only.num_rows() == positions.len()
    {
        *only = rows::attach(only.clone(), positions)?;
    }
    Ok(out)
}

/// The column verbs: `select_columns`, `remove_columns`, `rename_columns` and `cast`.
/// Every row stays; only columns change, so the output schema is known up front.
#[derive(Debug, Clone)]
pub enum Columns {
    Select(Vec<String>),
    Remove(Vec<String>),
    Rename(Vec<(String, String)>),
    /// Casts the named columns to these fields' types. A value that does not convert
    /// (text that is not a number, a number out of range) is an error naming the column
    /// and the value, or with `invalid_to_null`, a null.
    Cast {
        target: SchemaRef,
        invalid_to_null: bool,
    },
}

impl Columns {
    /// The output schema for `input`, or a `SchemaError` naming the column at fault.
    pub fn check(&self, input: &SchemaRef) -> Result<SchemaRef> {
        use arrow_schema::{Field, Schema};
        let names = crate::format::field_names(input);
        let missing = |name: &str| crate::error::Error::Schema {
            url: String::new(),
            message: format!("no column {name:?}; the columns are {names:?}"),
        };
        let fields: Vec<Field> = match self {
            Columns::Select(columns) => crate::format::column_indices(&names, columns, "")?
                .into_iter()
                .map(|i| input.field(i).clone())
                .collect(),
            Columns::Remove(columns) => {
                if let Some(name) = columns.iter().find(|c| input.index_of(c).is_err()) {
                    return Err(missing(name));
                }
                input
                    .fields()
                    .iter()
                    .filter(|f| !columns.contains(f.name()))
                    .map(|f| f.as_ref().clone())
                    .collect()
            }
            Columns::Rename(pairs) => {
                if let Some((old, _)) = pairs.iter().find(|(o, _)| input.index_of(o).is_err()) {
                    return Err(missing(old));
                }
                input
                    .fields()
                    .iter()
                    .map(|f| match pairs.iter().find(|(old, _)| old == f.name()) {
                        Some((_, new)) => f.as_ref().clone().with_name(new),
                        None => f.as_ref().clone(),
                    })
                    .collect()
            }
            Columns::Cast { target, .. } => {
                for field in target.fields() {
                    let Ok(from) = input.field_with_name(field.name()) else {
                        return Err(missing(field.name()));
                    };
                    if !arrow_cast::can_cast_types(from.data_type(), field.data_type()) {
                        return Err(crate::error::Error::Schema {
                            url: String::new(),
                            message: format!(
                                "column {:?} cannot be cast from {} to {}",
                                field.name(),
                                from.data_type(),
                                field.data_type()
                            ),
                        });
                    }
                }
                input
                    .fields()
                    .iter()
                    .map(|f| match target.field_with_name(f.name()) {
                        Ok(to) => Field::new(
                            f.name(),
                            to.data_type().clone(),
                            f.is_nullable() || to.is_nullable(),
                        ),
                        Err(_) => f.as_ref().clone(),
                    })
                    .collect()
            }
        };
        let out = Schema::new(fields);
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = out.fields().iter().find(|f| !seen.insert(f.name().clone())) {
            return Err(crate::error::Error::Schema {
                url: String::new(),
                message: format!("two columns would be named {:?}", dup.name()),
            });
        }
        Ok(Arc::new(out))
    }
}

impl BatchTransform for Columns {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        let schema = self.check(&batch.schema())?;
        let columns = schema
            .fields()
            .iter()
            .zip(self.sources(&batch))
            .map(|(field, column)| {
                if column.data_type() == field.data_type() {
                    Ok(column)
                } else {
                    let options = arrow_cast::CastOptions {
                        safe: matches!(
                            self,
                            Columns::Cast {
                                invalid_to_null: true,
                                ..
                            }
                        ),
                        ..Default::default()
                    };
                    arrow_cast::cast_with_options(&column, field.data_type(), &options).map_err(
                        |e| crate::error::Error::Schema {
                            url: String::new(),
                            message: format!("column {:?}: {e}", field.name()),
                        },
                    )
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        Ok(vec![
            RecordBatch::try_new_with_options(schema, columns, &options)
                .map_err(|e| crate::error::Error::Internal(e.to_string()))?,
        ])
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        match self {
            Columns::Select(c) => format!("select_columns({c:?})"),
            Columns::Remove(c) => format!("remove_columns({c:?})"),
            Columns::Rename(p) => format!("rename_columns({p:?})"),
            Columns::Cast {
                target,
                invalid_to_null,
            } => format!("cast({target:?}, invalid_to_null={invalid_to_null})"),
        }
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        self.check(input).ok()
    }
}

impl Columns {
    /// The input columns the output's columns come from, in output order.
    fn sources(&self, batch: &RecordBatch) -> Vec<arrow_array::ArrayRef> {
        let schema = batch.schema();
        match self {
            Columns::Select(columns) => columns
                .iter()
                .filter_map(|c| batch.column_by_name(c).cloned())
                .collect(),
            Columns::Remove(columns) => schema
                .fields()
                .iter()
                .zip(batch.columns())
                .filter(|(f, _)| !columns.contains(f.name()))
                .map(|(_, c)| c.clone())
                .collect(),
            Columns::Rename(_) | Columns::Cast { .. } => batch.columns().to_vec(),
        }
    }
}

/// `batch(n)`: every `n` rows become one row whose columns are lists of their values
/// (as `datasets`' `IterableDataset.batch`); with `drop_last`, a last group of fewer
/// rows is left out.
#[derive(Debug)]
pub struct Batches {
    pub rows: usize,
    pub drop_last: bool,
}

impl Batches {
    fn list_of(field: &arrow_schema::Field) -> arrow_schema::Field {
        arrow_schema::Field::new(
            field.name(),
            arrow_schema::DataType::List(Arc::new(field.clone().with_name("item"))),
            false,
        )
    }
}

impl BatchTransform for Batches {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        if batch.num_rows() == 0 || (self.drop_last && batch.num_rows() < self.rows) {
            return Ok(Vec::new());
        }
        let schema = self
            .output_schema(&batch.schema())
            .ok_or_else(|| Error::Internal("batch(): no output schema for its input".into()))?;
        let offsets = arrow_buffer::OffsetBuffer::new(vec![0, batch.num_rows() as i32].into());
        let columns = batch
            .columns()
            .iter()
            .zip(batch.schema().fields())
            .map(|(column, field)| {
                Arc::new(arrow_array::ListArray::new(
                    Arc::new(field.as_ref().clone().with_name("item")),
                    offsets.clone(),
                    column.clone(),
                    None,
                )) as arrow_array::ArrayRef
            })
            .collect();
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(1));
        Ok(vec![
            RecordBatch::try_new_with_options(schema, columns, &options)
                .map_err(|e| Error::Internal(format!("batching rows: {e}")))?,
        ])
    }

    fn preserves_rows(&self) -> bool {
        false
    }

    fn batch_rows(&self) -> Option<usize> {
        Some(self.rows)
    }

    fn describe(&self) -> String {
        format!("batch({}, drop_last_batch={})", self.rows, self.drop_last)
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        Some(Arc::new(arrow_schema::Schema::new(
            input
                .fields()
                .iter()
                .map(|f| Self::list_of(f))
                .collect::<Vec<_>>(),
        )))
    }
}
