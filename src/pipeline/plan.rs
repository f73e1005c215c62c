//! How an epoch is divided: where its rows start (the head: units, rows fetched by
//! index, or combined parts), where it is split between the parts that read it (ranks x
//! workers), each part's rows and padding, and how many rows each delivers. Nothing
//! here reads rows; `run` reads what this plans.
//!
//! The rules, as the executable model in `tests/model/__init__.py` states them (each
//! names the model function that holds it):
//! - **Global ops first.** Every op up to the last take/skip, and everything that reads
//!   rows by index (`select`, `shard`, a full shuffle, a weighted sample), runs on the
//!   whole dataset before the epoch is divided: a take/skip counts rows of the whole
//!   dataset, never of a part (`anatomy`, `parts`). Here: [`Head`] (the index ops) and
//!   [`Split`] (the take/skips).
//! - **Contiguous runs.** When every op up to the last take/skip keeps rows in place,
//!   the epoch's rows are cut into contiguous runs, one per rank, and each rank's run
//!   between its workers (`contiguous`): [`Split::Window`] and [`Split::Units`], cut by
//!   [`Share`] (`rows::cut`, the model's `cut`).
//! - **Dealing after filters.** When a filter, flat_map, buffered shuffle or combination
//!   comes before the last take/skip, every part reads that stream whole and keeps
//!   every `parts`-th row (`dealt`): [`Split::Rows`], dealt by `ops::Deal`.
//! - **Padding.** Without `drop_last`, on several ranks, a rank short of `ceil(T/R)`
//!   rows gets the epoch's first rows again (`contiguous`, `dealt`); with `drop_last`
//!   every rank gets `T // R` (`part_rows`, `RunOptions::pad`).
//! - **Combined datasets split once.** A concatenate or interleave read as it is is
//!   divided part by part, each part's left-over rows going on where the previous
//!   part's stopped, then padded or cut once against the combined total
//!   (`combined_parts`, `shares`, `balanced`): `combine`'s `Combined::plan`.
//! - **Splits freeze the order before them.** Every op before the last pick draws as in
//!   epoch 0; ops after it draw anew each epoch (`draw_epoch`): [`Draws`](super::ops::Draws).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::autotune::Tuning;
use super::dataset::{Combined, Dataset, Origin, Stopping};
use super::decode::UnitSlice;
use super::ops::Op;
use super::random_access::RandomAccess;
use super::rng::Rng;
use super::rows::{self, RowList, RowSet, Share};
use crate::error::{Error, Result};
use crate::format::{OnError, PreparedShards};

/// How one epoch is run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub epoch: u64,
    /// This reader's share of the data: part `part` of `parts` (rank and worker combined:
    /// part = rank x workers + worker), see [`Share`].
    pub part: usize,
    pub parts: usize,
    pub workers: usize,
    /// Where left-over rows start between ranks and between workers (see [`Share`]).
    pub first: (u64, u64),
    /// Re-batch to exactly this many rows; `None` passes decoded batches through.
    pub batch_rows: Option<usize>,
    /// Drop a last short batch; across several parts, also give every part the same
    /// number of rows.
    pub drop_last: bool,
    /// Decode threads, how far to read and decode ahead, and the memory that may take;
    /// shared by a loader's epochs, which go on from the depths the last one reached.
    pub tuning: Arc<Tuning>,
    /// Rows of this part's stream to pass over first (resuming mid-epoch).
    pub skip_rows: u64,
    /// With `drop_last` off, give shorter parts the first rows again so that every part
    /// reads as many rows (see [`Share`]); padding rows are counted in the stats.
    pub pad: bool,
    /// Read stream formats through their record index, so that every unit's rows are
    /// known: parts then get exact, equal shares, and rows have positions.
    pub count_rows: bool,
    /// Attach each row's position (see [`rows`]) as a hidden last column.
    pub track: bool,
    /// Resuming on another number of parts: the rows (tagged positions) still to read
    /// this epoch, divided between the parts instead of the whole epoch.
    pub remaining: Option<Arc<RowSet>>,
    /// Number of this dataset's first leaf (a part of a combined dataset starts after
    /// its predecessors' leaves).
    pub leaf: u64,
    /// Set when the consumer is gone (`break`, Ctrl-C, a dropped iterator): the run's
    /// decoders stop waiting for fetches and drop the requests in flight.
    pub cancel: Arc<AtomicBool>,
    /// Ops of a longer chain before these ones, whose rows were read into memory as
    /// this dataset (see `Dataset::materialized`): the ops draw as at their place there.
    pub stages_before: usize,
    /// The consumer turns each binary value into a Python `bytes` (numpy and torch
    /// output): a shuffle's gathers may then give binary columns as views of the values
    /// where they lie (`BinaryView`, see [`super::stream::interleave_viewing`]), where no
    /// op after them looks into the rows.
    pub byte_views: bool,
}

impl RunOptions {
    /// How a loader reads epoch `epoch` as part `part` of `parts`, in batches of
    /// `batch_rows`. Rows are counted exactly (stream formats through their index), so
    /// parts get equal shares and every row has a position for an elastic resume.
    pub fn loader(
        epoch: u64,
        (part, parts, workers): (usize, usize, usize),
        batch_rows: usize,
        drop_last: bool,
        pad: bool,
        tuning: Arc<Tuning>,
    ) -> Self {
        Self {
            epoch,
            part,
            parts,
            workers,
            batch_rows: Some(batch_rows),
            drop_last,
            pad,
            tuning,
            count_rows: true,
            ..Self::default()
        }
    }

    pub fn share(&self) -> Share {
        Share {
            part: self.part,
            parts: self.parts,
            workers: self.workers,
            even: self.drop_last,
            pad: self.pad,
            first: self.first,
        }
    }

    /// This run read as `share` (the inverse of [`RunOptions::share`]).
    pub fn with_share(self, share: Share) -> RunOptions {
        RunOptions {
            part: share.part,
            parts: share.parts,
            workers: share.workers,
            drop_last: share.even,
            pad: share.pad,
            first: share.first,
            ..self
        }
    }

    /// This run as a single reader reads it: every row once, no padding.
    pub fn whole(&self) -> RunOptions {
        RunOptions {
            part: 0,
            parts: 1,
            workers: 1,
            first: (0, 0),
            drop_last: false,
            pad: false,
            skip_rows: 0,
            batch_rows: None,
            ..self.clone()
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            epoch: 0,
            part: 0,
            parts: 1,
            workers: 1,
            first: (0, 0),
            batch_rows: None,
            drop_last: false,
            tuning: Arc::default(),
            skip_rows: 0,
            pad: false,
            count_rows: false,
            track: false,
            remaining: None,
            leaf: 0,
            cancel: Arc::default(),
            stages_before: 0,
            byte_views: false,
        }
    }
}

/// Where an epoch's rows start: the source's units, or (for `select` and a
/// full-permutation `shuffle`) rows fetched by index; `rest` is where the ops run as a
/// stream begin.
pub(super) struct Head {
    pub(super) kind: HeadKind,
    pub(super) rows: Option<u64>,
    pub(super) rest: usize,
}

pub(super) enum HeadKind {
    Units(Arc<PreparedShards>),
    Indexed(Arc<RandomAccess>),
    Combined(Arc<Combined>),
}

/// How an epoch is divided between the parts (ranks x workers) that read it, so that
/// take/skip count rows of the whole dataset, never of each part.
pub(super) enum Split {
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

impl Split {
    /// Whether the `i`-th op after the head is applied by the parts' plan (a take/skip
    /// within the window), not run on the stream.
    pub(super) fn applies(&self, i: usize, op: &Op) -> bool {
        matches!(self, Split::Window { after, .. } if i < *after)
            && matches!(op, Op::Take(_) | Op::Skip(_))
    }
}

/// One part's rows of an epoch (see [`Dataset::part_rows`]).
pub(super) struct PartRows {
    /// Head positions of its share, in order.
    pub rows: RowList,
    /// Head positions of the rows it reads again to be as long as the longest part.
    pub padding: RowList,
    /// Behind a filter balanced by a pass over the rows: what it keeps of them.
    pub kept: Option<Kept>,
}

impl PartRows {
    /// Rows the part delivers after the op that `kept` counts after (or the head).
    pub(super) fn len(&self) -> u64 {
        match self.kept {
            Some(kept) => kept.share + kept.padding,
            None => rows::list_len(&self.rows) + rows::list_len(&self.padding),
        }
    }
}

/// Where the epoch is split between parts (see [`Split`]), for `ops` run as a stream
/// after `head`.
pub(super) fn split(head: &Head, ops: &[Op]) -> Split {
    let Some(last) = ops.iter().rposition(Op::counts_rows) else {
        return Split::Units;
    };
    let in_place = ops[..=last].iter().all(|op| match op {
        Op::Take(_) | Op::Skip(_) => true,
        Op::Transform(t) => t.preserves_rows(),
        Op::Shuffle { .. } | Op::Permute { .. } | Op::Select(_) | Op::Sample { .. } => false,
    });
    // Only units and indexed rows can start at a row number.
    let windows = !matches!(head.kind, HeadKind::Combined(_));
    match head.rows {
        Some(total) if in_place && windows => {
            let (mut start, mut len) = (0u64, total);
            for op in &ops[..=last] {
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

/// Rows left after `ops`, from `rows` in, where that can be known.
pub(super) fn rows_through(mut rows: Option<u64>, ops: &[Op]) -> Option<u64> {
    for op in ops {
        rows = match op {
            Op::Shuffle { .. } | Op::Permute { .. } => rows,
            Op::Select(indices) => Some(indices.len()),
            Op::Sample { num_samples, .. } => num_samples.or(rows),
            // Nothing taken is known to be nothing, whatever came before.
            Op::Take(0) => Some(0),
            Op::Take(n) => rows.map(|r| r.min(*n)),
            Op::Skip(n) => rows.map(|r| r.saturating_sub(*n)),
            Op::Transform(t) if t.preserves_rows() => rows,
            Op::Transform(_) => None,
        };
    }
    rows
}

impl Dataset {
    /// Number of rows, when metadata and the ops make it known (stream formats are not
    /// indexed for it).
    pub fn num_rows(&self) -> Result<Option<u64>> {
        self.rows_of_part(Share::WHOLE, false)
    }

    /// Number of rows, indexing stream formats to count them where needed; `None` when
    /// a filter or flat_map decides them.
    pub fn len(&self) -> Result<Option<u64>> {
        self.rows_of_part(Share::WHOLE, true)
    }

    /// Where this epoch's rows come from (see [`Head`]). With `counted`, a stream
    /// format's units come from its record index, so their rows are known.
    pub(super) fn head(&self, epoch: u64, counted: bool) -> Result<Head> {
        if let Some(last) = self.ops.iter().rposition(Op::needs_index) {
            let prefix = Dataset {
                origin: self.origin.clone(),
                ops: self.ops[..=last].to_vec(),
            };
            let access = prefix.random_access_with(self.draws(epoch))?;
            return Ok(Head {
                rows: Some(access.len()),
                kind: HeadKind::Indexed(Arc::new(access)),
                rest: last + 1,
            });
        }
        Ok(match &self.origin {
            Origin::Files(_) => {
                let mut prepared = self.prepared()?;
                // Formats with a record codec count their rows by indexing; others
                // either know them or leave them unknown.
                if counted && prepared.record_codec().is_some() {
                    prepared = self.indexed()?;
                }
                Head {
                    rows: prepared.units.iter().map(|u| u.rows).sum(),
                    kind: HeadKind::Units(prepared),
                    rest: 0,
                }
            }
            Origin::Combined(c) => Head {
                rows: match c.mix {
                    None => c
                        .parts
                        .iter()
                        .map(|p| if counted { p.len() } else { p.num_rows() })
                        .sum::<Result<Option<u64>>>()?,
                    Some(_) => None,
                },
                kind: HeadKind::Combined(c.clone()),
                rest: 0,
            },
        })
    }

    /// Rows one part of an epoch delivers after the ops, when that is known.
    pub fn rows_of_part(&self, share: Share, count_rows: bool) -> Result<Option<u64>> {
        let run = RunOptions {
            count_rows,
            ..RunOptions::default()
        }
        .with_share(share);
        self.rows_of_run(&run)
    }

    /// Rows part `run.part` delivers after the ops in `run`'s epoch, when known.
    pub fn rows_of_run(&self, run: &RunOptions) -> Result<Option<u64>> {
        let head = self.head(run.epoch, run.count_rows)?;
        let ops = &self.ops[head.rest..];
        let split = split_for(self, &head, run)?;
        let (rows, rest) = match &split {
            // Rows left by an elastic resume are counted only as they are dealt.
            Split::Rows { .. } if run.remaining.is_some() => return Ok(None),
            Split::Rows { after } => {
                let head_rows = match (&head.kind, head.rows) {
                    // A mixing's length: its draws replayed on the parts' counts.
                    (HeadKind::Combined(c), None) => c
                        .plan(&run.whole(), self.draws(run.epoch), true)?
                        .rows
                        .map(|(_, rows)| rows),
                    (_, rows) => rows,
                };
                let global = rows_through(head_rows, &ops[..*after]);
                (global.map(|t| run.share().rows(t)), *after)
            }
            Split::Units | Split::Window { .. } => match &head.kind {
                HeadKind::Combined(c) => {
                    let rows = c.plan(run, self.draws(run.epoch), true)?.rows;
                    (rows.map(|(_, rows)| rows), 0)
                }
                _ => {
                    let rest = match split {
                        Split::Window { after, .. } => after,
                        _ => 0,
                    };
                    match self.part_rows(&head, &split, run)? {
                        // Counted where the filters' pass counted them.
                        Some(part) if part.kept.is_some() => {
                            let after = part.kept.map_or(0, |k| k.after);
                            (Some(part.len()), after + 1)
                        }
                        part => (part.map(|p| p.len()), rest),
                    }
                }
            },
        };
        Ok(rows_through(rows, &ops[rest..]))
    }

    /// The rows of this dataset's head that part `run.part` reads this epoch, in order,
    /// as head positions (untagged), and the padding that follows them; `None` when the
    /// rows are not known. The epoch's rows are the window of a global take/skip, or all
    /// of them, or (resuming on another number of parts) this leaf's rows still to read;
    /// behind a filter that ranks must not feel, they are cut by the rows it keeps
    /// (see [`balance`](super::balance)).
    pub(super) fn part_rows(
        &self,
        head: &Head,
        split: &Split,
        run: &RunOptions,
    ) -> Result<Option<PartRows>> {
        let all: RowList = match (&run.remaining, split) {
            (Some(remaining), _) => {
                let base = rows::tag(run.leaf, 0);
                remaining
                    .within(base..rows::tag(run.leaf + 1, 0))
                    .iter()
                    .map(|r| r.start - base..r.end - base)
                    .collect()
            }
            (None, Split::Window { rows, .. }) => vec![rows.clone()],
            (None, _) => match head.rows {
                Some(rows) => vec![0..rows],
                None => return Ok(None),
            },
        };
        if let Some((rows, padding, kept)) = self.kept_share(head, split, run, &all)? {
            return Ok(Some(PartRows {
                rows,
                padding,
                kept: Some(kept),
            }));
        }
        let (rows, padding) = run.share().of(&all);
        Ok(Some(PartRows {
            rows,
            padding,
            kept: None,
        }))
    }

    /// The units in this epoch's order: permuted when a shuffle comes first.
    pub(super) fn unit_order(&self, prepared: &PreparedShards, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..prepared.units.len()).collect();
        if let Some((stage, seed)) = unit_shuffle_seed(&self.ops) {
            let epoch = self.draws(epoch).stage(stage);
            Rng::new(seed, epoch, 0).shuffle(&mut order);
        }
        order
    }

    /// How `parallelism` readers (at most one per unit) would divide one epoch, for
    /// engines that schedule the reading themselves (Ray Data): each reader's rows after
    /// the ops, the files it opens and the bytes of them it reads (in proportion to its
    /// rows of each file), where known.
    pub fn read_plan(&self, parallelism: usize) -> Result<Vec<PartPlan>> {
        let head = self.head(0, true)?;
        let ops = &self.ops[head.rest..];
        let split = split(&head, ops);
        let units = match &head.kind {
            HeadKind::Units(prepared) => prepared.units.len(),
            _ => parallelism,
        };
        let parts = parallelism.min(units).max(1);
        let order = match &head.kind {
            HeadKind::Units(prepared) => Some(self.unit_order(prepared, 0)),
            _ => None,
        };
        let mut plans = Vec::with_capacity(parts);
        for part in 0..parts {
            let run = RunOptions {
                part,
                parts,
                count_rows: true,
                ..RunOptions::default()
            };
            let rows = self.rows_of_run(&run)?;
            let reads = match (&head.kind, &order) {
                (HeadKind::Units(prepared), Some(order)) => {
                    self.part_rows(&head, &split, &run)?.and_then(|part| {
                        unit_slices(prepared, order, &part.rows, None)
                            .map(|slices| (prepared.clone(), slices))
                    })
                }
                _ => None,
            };
            let plan = match reads {
                Some((prepared, slices)) => {
                    let mut shard_rows: Vec<u64> = vec![0; prepared.shards.len()];
                    for unit in &prepared.units {
                        shard_rows[unit.shard] += unit.rows.unwrap_or(0);
                    }
                    let mut read: std::collections::BTreeMap<usize, u64> = Default::default();
                    for slice in &slices {
                        let unit = &prepared.units[slice.unit];
                        let n = slice.take.unwrap_or(unit.rows.unwrap_or(0) - slice.skip);
                        *read.entry(unit.shard).or_default() += n;
                    }
                    let bytes = read
                        .iter()
                        .map(|(&shard, &n)| {
                            let size = prepared.shards[shard].size?;
                            Some(size * n / shard_rows[shard].max(1))
                        })
                        .sum();
                    PartPlan {
                        rows,
                        files: read
                            .keys()
                            .map(|&s| prepared.shards[s].url.clone())
                            .collect(),
                        bytes,
                    }
                }
                None => PartPlan {
                    rows,
                    files: self.shards().into_iter().map(|s| s.url).collect(),
                    bytes: None,
                },
            };
            plans.push(plan);
        }
        Ok(plans)
    }

    /// Whether a part's delivered rows are always the first rows of its share, in order
    /// (no shuffle buffer, filter or mixing after the split), so that one part's count
    /// of rows delivered tells what every part has delivered.
    pub fn lockstep(&self, count_rows: bool) -> Result<bool> {
        let head = self.head(0, count_rows)?;
        let ops = &self.ops[head.rest..];
        Ok(!matches!(head.kind, HeadKind::Combined(_))
            && head.rows.is_some()
            && !matches!(split(&head, ops), Split::Rows { .. })
            && ops.iter().all(|op| match op {
                Op::Take(_) | Op::Skip(_) => true,
                // Rows a function skips differ between ranks.
                Op::Transform(t) => t.preserves_rows() && !t.skips_failed_rows(),
                Op::Shuffle { .. } | Op::Permute { .. } | Op::Select(_) | Op::Sample { .. } => {
                    false
                }
            }))
    }

    /// Whether unreadable records are skipped (`on_error="skip"`), here or in a part.
    pub(super) fn skips_records(&self) -> bool {
        match &self.origin {
            Origin::Files(source) => source.options.on_error == OnError::Skip,
            Origin::Combined(c) => c.parts.iter().any(Dataset::skips_records),
        }
    }

    /// Whether the rest of an epoch would be mixed anew from the rows left by an
    /// interleave that leaves rows out (`first_exhausted`), here or in a part, read as a
    /// stream (not by index, which reads its mix once). Where such a mix ends depends on
    /// every row it draws from, so the rows it left out of the epoch cannot be told apart
    /// from rows still to come, and an elastic resume would lose rows or deliver rows the
    /// epoch left out: the epoch resumes only on the division that saved it. (An
    /// `all_exhausted` mix of the rows left still delivers each of them, repeating some,
    /// as that strategy does.)
    pub fn remixes(&self) -> bool {
        self.streamed_combination().is_some_and(|c| {
            c.mix
                .as_ref()
                .is_some_and(|m| m.stopping == Stopping::FirstExhausted)
                || c.parts.iter().any(Dataset::remixes)
        })
    }

    /// The combination this dataset reads as a stream (its head is the combination
    /// itself: no op after it reads rows by index), if it is one. What [`Dataset::head`]
    /// would make a `HeadKind::Combined`, without building the head.
    pub(super) fn streamed_combination(&self) -> Option<&Combined> {
        match &self.origin {
            Origin::Combined(c) if !self.ops.iter().any(Op::needs_index) => Some(c),
            _ => None,
        }
    }

    /// The rows (tagged positions) part `run.part` reads this epoch, padding included,
    /// in order: what an epoch's rows are made of, for elastic resume. Where the epoch is
    /// dealt (`Split::Rows`: every part reads the whole stream), its rows are places in
    /// that stream ([`rows::dealt_positions`]): all it may hold, as how many is known
    /// only once it is read, or those left by an earlier elastic resume.
    pub fn planned_rows(&self, run: &RunOptions) -> Result<RowList> {
        let head = self.head(run.epoch, run.count_rows)?;
        let split = split_for(self, &head, run)?;
        if !matches!(split, Split::Rows { .. }) {
            return self.planned_head_rows(&head, &split, run);
        }
        // A function taking row indices keeps the head's positions past the dealing.
        if self.takes_indices() {
            return Err(Error::invalid_argument(ROWS_SPLIT_NOT_ELASTIC));
        }
        let all = rows::dealt_positions();
        Ok(match &run.remaining {
            Some(remaining) => remaining.within(all).iter().collect(),
            None => vec![all],
        })
    }

    /// Where `run`'s epoch is dealt (`Split::Rows`): after the op of that index
    /// (counted after the head); `None` where it is divided by rows.
    pub fn dealt_at(&self, run: &RunOptions) -> Result<Option<usize>> {
        let head = self.head(run.epoch, run.count_rows)?;
        Ok(match split_for(self, &head, run)? {
            Split::Rows { after } => Some(head.rest + after),
            _ => None,
        })
    }

    /// Whether a function in the chain takes row indices (`with_indices`).
    pub(super) fn takes_indices(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::Transform(t) if t.wants_indices()))
    }

    /// [`Dataset::planned_rows`] of a dataset read within a combination, whose rows are
    /// known only by its head's positions: a part that deals its own stream cannot say.
    pub(super) fn planned_rows_as_part(&self, run: &RunOptions) -> Result<RowList> {
        let head = self.head(run.epoch, run.count_rows)?;
        let split = split_for(self, &head, run)?;
        if matches!(split, Split::Rows { .. }) {
            return Err(Error::invalid_argument(ROWS_SPLIT_NOT_ELASTIC));
        }
        self.planned_head_rows(&head, &split, run)
    }

    /// The head positions `run`'s reader reads, where the epoch is divided by them.
    fn planned_head_rows(&self, head: &Head, split: &Split, run: &RunOptions) -> Result<RowList> {
        if let HeadKind::Combined(c) = &head.kind {
            return c.planned_rows(run, self.draws(run.epoch));
        }
        let part = self.part_rows(head, split, run)?.ok_or_else(|| {
            Error::invalid_argument(
                "the rows of this dataset are not known, so its epoch cannot be divided anew",
            )
        })?;
        let base = rows::tag(run.leaf, 0);
        Ok(part
            .rows
            .into_iter()
            .chain(part.padding)
            .map(|r| base + r.start..base + r.end)
            .collect())
    }
}

/// The stage and seed of the shuffle that permutes unit order: the first shuffle's, unless
/// a take/skip comes before it (then *which* rows are taken must not depend on the seed),
/// or an op that makes rows of runs of rows (a pack, a batched map that changes the
/// rows' number: which rows go together must not depend on it either).
pub(super) fn unit_shuffle_seed(ops: &[Op]) -> Option<(usize, u64)> {
    for (stage, op) in ops.iter().enumerate() {
        match op {
            Op::Shuffle { seed, .. } => return Some((stage, *seed)),
            Op::Take(_) | Op::Skip(_) | Op::Select(_) | Op::Permute { .. } | Op::Sample { .. } => {
                return None;
            }
            Op::Transform(t) if t.batch_rows().is_some() && !t.preserves_rows() => return None,
            Op::Transform(_) => {}
        }
    }
    None
}

/// The slices of units (taken in `order`) that hold `rows` (head positions), in the
/// order of `rows`, each numbered with its position under `leaf` when given; `None`
/// when some unit's rows are not known.
pub(super) fn unit_slices(
    prepared: &PreparedShards,
    order: &[usize],
    rows: &[Range<u64>],
    leaf: Option<u64>,
) -> Option<Vec<UnitSlice>> {
    let mut starts = Vec::with_capacity(order.len() + 1);
    let mut total = 0u64;
    for &unit in order {
        starts.push(total);
        total += prepared.units[unit].rows?;
    }
    starts.push(total);
    let mut slices = Vec::new();
    for range in rows {
        let mut at = range.start;
        // The first unit that ends after `at`.
        let mut i = starts[1..].partition_point(|&end| end <= at);
        while at < range.end && i < order.len() {
            let (lo, hi) = (starts[i], starts[i + 1]);
            if hi > at {
                let end = hi.min(range.end);
                let whole = at == lo && end == hi;
                slices.push(UnitSlice {
                    unit: order[i],
                    skip: at - lo,
                    take: (!whole).then_some(end - at),
                    position: leaf.map(|leaf| rows::tag(leaf, at)),
                });
                at = end;
            }
            i += 1;
        }
    }
    Some(slices)
}

// ---------------------------------------------------------------------------------------
// Equal shares behind a filter or flat_map. A part that runs a filter on its own share
// learns how many rows it keeps only as it runs, and the ranks of a DDP job must take
// as many steps (a rank that runs out first leaves the others waiting for it). So where
// a reading pads or trims its ranks to equal (`pad` or `drop_last`, on several ranks):
// - **Filters** (and row-preserving maps before them) over files with known rows (read
//   by units or by index) are run once over the rows, as random access after a filter runs them (once per process,
//   then remembered for every epoch, loader and dataset made from the same filter). The
//   epoch is then divided by the rows the filters keep: each rank's run of the epoch
//   ends where its share of the kept rows does, so every rank keeps as many rows, give
//   or take one, and padding and `drop_last` work on kept rows as on any other.
//   Cost: one extra pass of the filter over the data in each process, and 8 bytes per
//   kept row.
// - **Anything else that changes the number of rows** (a flat_map, a batched map, a
//   filter taking row indices, a filter over a combined dataset, a filter after a
//   take/skip that follows one) is dealt: every part reads the epoch through that op and
//   keeps every `parts`-th row of it, as after a take/skip behind a filter
//   ([`Split::Rows`]); so is a combination whose parts' rows a filter or flat_map within
//   them decides. Cost: every part reads and runs the op over the whole epoch.

/// Whether `run` makes its ranks equal (padding or trimming them), so that the ops after
/// the split must not leave ranks with different numbers of rows.
fn equalizes(run: &RunOptions) -> bool {
    run.share().ranks() > 1 && (run.pad || run.drop_last)
}

/// The index (in `ops`) of the last op run on each part's stream that changes the
/// number of rows, when there is one (after `from`: what a dealt split runs whole).
fn last_row_change(ops: &[Op], split: &Split) -> Option<usize> {
    let from = match split {
        Split::Rows { after } => *after,
        _ => 0,
    };
    ops.iter().enumerate().rposition(|(i, op)| {
        i >= from && !split.applies(i, op) && matches!(op, Op::Transform(t) if !t.preserves_rows())
    })
}

/// The ops a filter pass runs over the origin's rows, when the filters after the
/// split can be balanced by one: every row-preserving function before the last filter
/// (in the head too: they make the rows the filters see) and the filters after the
/// split, and the index (after the head) of the last filter. `None` when something
/// else changes the rows' number, or nothing does.
fn filter_pass(ds: &Dataset, head: &Head, split: &Split) -> Option<(Vec<Op>, usize)> {
    let (before, ops) = ds.ops.split_at(head.rest);
    let last = last_row_change(ops, split)?;
    // Rows numbered in the origin's order, the same in every epoch: files, or a
    // concatenation of datasets read by index (not a mix, which draws anew). Records
    // skipped as unreadable (`on_error="skip"`) have no row for the pass to run the
    // filters on: such rows are dealt.
    let origin = match &ds.origin {
        Origin::Files(_) => true,
        Origin::Combined(c) => c.mix.is_none() && c.parts.iter().all(Dataset::addressable),
    } && !ds.skips_records();
    if !origin || matches!(head.kind, HeadKind::Combined(_)) || head.rows.is_none() {
        return None;
    }
    let mut pass = Vec::new();
    for op in before {
        match op {
            Op::Transform(t) if t.wants_indices() => return None,
            // The head's own filters made its rows already.
            Op::Transform(t) if t.preserves_rows() => pass.push(op.clone()),
            _ => {}
        }
    }
    for (i, op) in ops[..=last].iter().enumerate() {
        match op {
            // A shuffle buffer moves rows, and a filter keeps each row or not whatever
            // its place; the split's take/skip are its window.
            Op::Shuffle { .. } => {}
            Op::Take(_) | Op::Skip(_) if split.applies(i, op) => {}
            Op::Transform(t) if t.wants_indices() => return None,
            Op::Transform(t) if t.preserves_rows() || t.filters() => pass.push(op.clone()),
            _ => return None,
        }
    }
    Some((pass, last))
}

/// Where `run`'s epoch is split between its parts (see [`split`]): where ranks must
/// stay equal, an op after the split that changes the rows' number and that no filter
/// pass can balance is dealt (the split moves to just after it).
pub(super) fn split_for(ds: &Dataset, head: &Head, run: &RunOptions) -> Result<Split> {
    let ops = &ds.ops[head.rest..];
    let split = split(head, ops);
    // The rows left of an epoch that was dealt are places in the dealt stream, which
    // only dealing it again tells apart: a division resuming one deals it where a
    // division keeping its ranks equal does, whatever its own ranks (the loader checks
    // that this is where the saving division dealt it).
    let resumes_dealt = run.remaining.as_ref().is_some_and(|r| r.holds_dealt());
    if !equalizes(run) && !resumes_dealt {
        return Ok(split);
    }
    let last = last_row_change(ops, &split);
    // A combination whose parts' rows are not known (a filter or flat_map within a
    // part) cannot be cut into equal shares: its stream is dealt.
    if let (HeadKind::Combined(c), Split::Units) = (&head.kind, &split)
        && c.part_counts(run, ds.draws(run.epoch))?.is_none()
    {
        return Ok(Split::Rows {
            after: last.map_or(0, |last| last + 1),
        });
    }
    Ok(match last {
        Some(last)
            if matches!(split, Split::Rows { .. }) || filter_pass(ds, head, &split).is_none() =>
        {
            Split::Rows { after: last + 1 }
        }
        _ => split,
    })
}

/// Rows the filters keep of one part's run, where a filter pass balanced them: the
/// rows of its share, then of its padding, and the op after which they are counted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kept {
    pub share: u64,
    pub padding: u64,
    /// Index (in the ops after the head) of the last filter.
    pub after: usize,
}

impl Dataset {
    /// Part `run.part`'s rows of `all` (head positions in this epoch's order), cut by
    /// the rows the filters after the split keep, where `run` equalizes its ranks and a
    /// filter pass can tell those rows (see the module's doc): the head positions it
    /// reads (non-kept rows between kept ones included), its padding, and the kept rows
    /// of each. `None` where no filter needs balancing.
    pub(super) fn kept_share(
        &self,
        head: &Head,
        split: &Split,
        run: &RunOptions,
        all: &RowList,
    ) -> Result<Option<(RowList, RowList, Kept)>> {
        if !equalizes(run) || matches!(split, Split::Rows { .. }) {
            return Ok(None);
        }
        let Some((pass, after)) = filter_pass(self, head, split) else {
            return Ok(None);
        };
        let through = Dataset {
            origin: self.origin.clone(),
            ops: pass,
        };
        // The origin's rows the filters keep, ascending, as this epoch draws them: a
        // part of a concatenation that shuffles after a take numbers its rows anew
        // each epoch.
        let kept = through
            .random_access_with(self.draws(run.epoch))?
            .source_rows();
        let positions = match &head.kind {
            HeadKind::Units(prepared) => {
                kept_positions(prepared, &self.unit_order(prepared, run.epoch), &kept)
            }
            HeadKind::Indexed(access) => (0..access.len())
                .filter(|&i| kept.binary_search(&access.source_row(i)).is_ok())
                .collect(),
            HeadKind::Combined(_) => return Ok(None),
        };
        // The kept rows of `all`, in its order: one run of positions per range of it.
        let mut runs: Vec<&[u64]> = Vec::with_capacity(all.len());
        for range in all {
            let from = positions.partition_point(|&p| p < range.start);
            let to = positions.partition_point(|&p| p < range.end);
            runs.push(&positions[from..to]);
        }
        let total: u64 = runs.iter().map(|r| r.len() as u64).sum();
        let (rows, padding) = run.share().of(&[0..total]);
        let reads = |list: &RowList| -> RowList {
            list.iter()
                .flat_map(|k| head_positions(&runs, k.clone()))
                .collect()
        };
        let kept = Kept {
            share: rows::list_len(&rows),
            padding: rows::list_len(&padding),
            after,
        };
        Ok(Some((reads(&rows), reads(&padding), kept)))
    }
}

/// The head positions (in an epoch whose units come in `order`) of the source rows
/// `kept` (row numbers in the units' own order, ascending), ascending.
fn kept_positions(prepared: &PreparedShards, order: &[usize], kept: &[u64]) -> Vec<u64> {
    let mut starts = Vec::with_capacity(prepared.units.len() + 1);
    let mut total = 0;
    for unit in &prepared.units {
        starts.push(total);
        total += unit.rows.unwrap_or(0);
    }
    starts.push(total);
    let mut positions = Vec::with_capacity(kept.len());
    let mut at = 0;
    for &unit in order {
        let (lo, hi) = (starts[unit], starts[unit + 1]);
        let from = kept.partition_point(|&r| r < lo);
        let to = kept.partition_point(|&r| r < hi);
        positions.extend(kept[from..to].iter().map(|r| at + (r - lo)));
        at += hi - lo;
    }
    positions
}

/// The head positions that hold kept rows `k` (numbered across `runs`, each a run of
/// kept positions within one range of the epoch): for each run they touch, from the
/// first kept row to just after the last (the rows between are read and filtered out
/// again).
fn head_positions(runs: &[&[u64]], k: Range<u64>) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut first = 0u64;
    for run in runs {
        let last = first + run.len() as u64;
        let (from, to) = (k.start.max(first), k.end.min(last));
        if from < to {
            let (a, b) = ((from - first) as usize, (to - first) as usize);
            out.push(run[a]..run[b - 1] + 1);
        }
        first = last;
    }
    out
}

/// Why a pipeline whose rows are dealt (a take/skip after a shuffle buffer, filter or
/// flat_map; a flat_map or pack on ranks kept equal) cannot resume on another division
/// here: a function taking row indices, a part of a combination that deals its own
/// rows, or a division that deals the epoch at another op (or not at all).
pub const ROWS_SPLIT_NOT_ELASTIC: &str = "this pipeline has a take/skip after a shuffle buffer, \
    filter or flat_map (or a flat_map or pack on ranks kept equal), so every rank reads the whole \
    stream and keeps its own rows of it; such an epoch resumes on another division only where that \
    division deals the same stream after the same op (as ranks kept equal deal it), with no \
    function taking row indices and no combined part dealing its own; here it can resume only on \
    the same number of ranks and workers";

/// One reader's part of an epoch (see [`Dataset::read_plan`]).
#[derive(Debug, Clone)]
pub struct PartPlan {
    pub rows: Option<u64>,
    pub files: Vec<String>,
    pub bytes: Option<u64>,
}

#[cfg(test)]
mod balance_tests {
    use super::*;

    #[test]
    fn kept_rows_map_to_the_runs_that_hold_them() {
        let runs: [&[u64]; 2] = [&[1, 3, 4, 8], &[20, 22]];
        assert_eq!(head_positions(&runs, 0..4), vec![1..9]);
        assert_eq!(head_positions(&runs, 1..3), vec![3..5]);
        assert_eq!(head_positions(&runs, 3..5), vec![8..9, 20..21]);
        assert_eq!(head_positions(&runs, 5..6), vec![22..23]);
        assert!(head_positions(&runs, 6..6).is_empty());
    }
}
