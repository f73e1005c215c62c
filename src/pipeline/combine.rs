//! Several datasets read as one: one after another (`concatenate`), or mixed row by row
//! by seeded weighted draws (`interleave`). A part's stream is opened when it is first
//! needed, so a concatenation of many datasets reads one at a time. How the parts are
//! divided between the readers of an epoch is [`Combined::plan`].

use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::dataset::{Combined, Dataset, Mix, Stopping};
use super::ops::{self, Draws};
use super::plan::RunOptions;
use super::rng::Rng;
use super::rows::{self, RowList, Share};
use super::stats::Stats;
use super::stream::{BatchIter, conform, interleave_rows};
use crate::error::{Error, Result};

/// How one reader reads a combined dataset in an epoch (see [`Combined::plan`]).
pub(super) struct Plan {
    /// The reader's share of each part.
    pub(super) shares: Vec<Share>,
    /// For a part that is itself a combination read as it is: the range of its rows,
    /// as one reader reads them, that this reader reads (see [`Combined::plan`]).
    pub(super) slices: Vec<Option<Range<u64>>>,
    /// Rows the reader reads from the parts, and rows it delivers after its stream is
    /// cut or padded to what every reader delivers; `None` when a part's rows are not
    /// known.
    pub(super) rows: Option<(u64, u64)>,
}

impl Combined {
    /// How part `i` is read within `run` of the combination, whose ops draw as `outer`:
    /// as `share` of it, its positions numbered from its first leaf, not batched, in the
    /// epoch the combination's origin draws for.
    pub(super) fn part_run(
        &self,
        i: usize,
        run: &RunOptions,
        outer: Draws,
        share: Share,
    ) -> RunOptions {
        let leaf = run.leaf + self.parts[..i].iter().map(Dataset::leaves).sum::<u64>();
        RunOptions {
            leaf,
            epoch: outer.origin(),
            batch_rows: None,
            skip_rows: 0,
            // The combination conforms its parts' batches to one schema.
            byte_views: false,
            ..run.clone()
        }
        .with_share(share)
    }

    /// Every part's rows in `run`'s epoch (all readers' together), when all are known.
    pub(super) fn part_counts(&self, run: &RunOptions, outer: Draws) -> Result<Option<Vec<u64>>> {
        Ok(self.each_part_count(run, outer)?.into_iter().collect())
    }

    /// Each part's rows in `run`'s epoch (all readers' together), where known.
    fn each_part_count(&self, run: &RunOptions, outer: Draws) -> Result<Vec<Option<u64>>> {
        (0..self.parts.len())
            .map(|i| self.parts[i].rows_of_run(&self.part_run(i, run, outer, Share::WHOLE)))
            .collect()
    }

    /// How `run`'s reader reads the combination. Each part is split between the ranks
    /// (and a rank's rows between its workers) on its own, but where the rows left over
    /// by the parts before it stopped, so that every reader reads as many rows of the
    /// parts together, give or take one (see [`rows::cut`]). Padding and `drop_last`
    /// then apply once, against the combined total, not to each part. Mixings that
    /// repeat or leave out rows (`first_exhausted`, `all_exhausted`) are cut to the
    /// shortest reader's mixing or carried on to the longest's, so that ranks take as
    /// many steps. Those lengths come from replaying every reader's draws on row counts
    /// (a pass over the epoch's draws, no data): with `mixed_lengths` false they are
    /// left out (`rows: None` for such mixings).
    ///
    /// A part that is itself a combination read as it is (a concatenate or interleave
    /// with no op that reads its rows by index) is one dataset here: read as a single
    /// reader reads it, and cut like any other part, so the rows it gives do not depend
    /// on the division (a nested mix is mixed once, not by each reader from its own
    /// shares). Each reader reads it up to the end of its range.
    pub(super) fn plan(&self, run: &RunOptions, outer: Draws, mixed_lengths: bool) -> Result<Plan> {
        let share = run.share();
        let counts = self.each_part_count(run, outer)?;
        // A part read as one dataset: the range of its rows this reader reads (a part's
        // share is never padded: one range, or none).
        let slices = |shares: &[Share]| -> Vec<Option<Range<u64>>> {
            (0..self.parts.len())
                .map(|i| match counts[i] {
                    Some(n) if self.parts[i].streamed_combination().is_some() => {
                        Some(shares[i].of(&[0..n]).0.first().cloned().unwrap_or(0..0))
                    }
                    _ => None,
                })
                .collect()
        };
        let Some(counts) = counts.iter().copied().collect::<Option<Vec<u64>>>() else {
            // Rows unknown: every row once, but readers' counts may differ.
            let plain = Share {
                pad: false,
                even: false,
                ..share
            };
            let shares = vec![plain; self.parts.len()];
            return Ok(Plan {
                slices: slices(&shares),
                shares,
                rows: None,
            });
        };
        let shares = part_shares(share, &counts);
        let slices = slices(&shares);
        let total: u64 = counts.iter().sum();
        let rows = match &self.mix {
            Some(mix) if mix.stopping != Stopping::AllWithoutReplacement && !mixed_lengths => None,
            Some(mix) if mix.stopping != Stopping::AllWithoutReplacement => {
                let mixed = (0..share.parts)
                    .map(|reader| {
                        let shares = part_shares(
                            Share {
                                part: reader,
                                ..share
                            },
                            &counts,
                        );
                        let held: Vec<u64> = shares
                            .iter()
                            .zip(&counts)
                            .map(|(s, &n)| s.rows(n))
                            .collect();
                        let rng = Rng::new(mix.seed, outer.origin(), reader as u64);
                        Ok((mixed_rows(&held, mix, rng)?, held))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let lengths = mixed.iter().map(|(rows, _)| *rows);
                let target = match mix.stopping {
                    Stopping::FirstExhausted => lengths.min(),
                    _ => lengths.max(),
                }
                .unwrap_or(0);
                // Readers that cannot reach a length every reader shares: one with no
                // rows of a part under first_exhausted stops every rank at once; one
                // with no rows at all cannot carry on under all_exhausted.
                let drawn = |i: usize| mix.weights.as_ref().is_none_or(|w| w[i] > 0.0);
                let stuck = mixed.iter().find(|(_, held)| match mix.stopping {
                    Stopping::FirstExhausted => (0..held.len()).any(|i| held[i] == 0 && drawn(i)),
                    _ => target > 0 && held.iter().all(|&n| n == 0),
                });
                // (One reader's mixing just ends as its strategy says.)
                if let Some((_, held)) = stuck.filter(|_| share.parts > 1) {
                    let i = (0..held.len())
                        .find(|&i| held[i] == 0 && drawn(i))
                        .unwrap_or(0);
                    return Err(Error::invalid_argument(format!(
                        "interleave: dataset {i} has {} rows, too few to give each of the {} \
                         readers (ranks x workers) one, so the readers cannot take as many \
                         steps; give it more rows or use fewer ranks or workers",
                        counts[i], share.parts
                    )));
                }
                Some((mixed[share.part].0, target))
            }
            _ => {
                let (ranks, rank) = (share.ranks(), share.rank());
                let rank_own = rows::cut_len(total, ranks, rank, share.first.0);
                let rank_target = if share.even {
                    total / ranks
                } else if share.pad {
                    total.div_ceil(ranks)
                } else {
                    rank_own
                };
                let of_rank =
                    |rows| rows::cut_len(rows, share.workers(), share.worker(), share.first.1);
                Some((of_rank(rank_own), of_rank(rank_target)))
            }
        };
        Ok(Plan {
            shares,
            slices,
            rows,
        })
    }

    /// The combination's rows for `run`'s reader (see [`Combined::plan`]).
    pub(super) fn stream(
        self: &Arc<Self>,
        run: &RunOptions,
        outer: Draws,
        stats: &Arc<Stats>,
    ) -> Result<BatchIter> {
        // A single reader's mixing ends as its strategy says: no length to share.
        let plan = self.plan(run, outer, run.parts > 1)?;
        let open: Open = {
            let (c, stats, run, shares, slices) = (
                self.clone(),
                stats.clone(),
                run.clone(),
                plan.shares.clone(),
                plan.slices.clone(),
            );
            Box::new(move |i| {
                let stream = match &slices[i] {
                    Some(range) => {
                        let whole = c.part_run(i, &run, outer, Share::WHOLE);
                        let read =
                            ops::Skip::new(c.parts[i].stream(&whole, stats.clone())?, range.start);
                        Box::new(ops::Take::new(Box::new(read), range.end - range.start))
                            as BatchIter
                    }
                    None => {
                        c.parts[i].stream(&c.part_run(i, &run, outer, shares[i]), stats.clone())?
                    }
                };
                let (schema, track) = (c.schema.clone(), run.track);
                Ok(Box::new(stream.map(move |b| {
                    let (b, positions) = rows::detach(b?);
                    let b = conform(b, &schema)?;
                    // Parts must agree on the hidden column for their rows to mix.
                    match positions {
                        Some(positions) => rows::attach(b, positions),
                        None if track => rows::attach_unknown(b),
                        None => Ok(b),
                    }
                })) as BatchIter)
            })
        };
        let stream: BatchIter = match &self.mix {
            None => Box::new(Chain::new(open, self.parts.len())),
            Some(mix) => {
                // One reader's mixing ends as its strategy says; several share a length.
                let replaces = mix.stopping != Stopping::AllWithoutReplacement;
                let target = plan
                    .rows
                    .filter(|_| replaces && run.parts > 1)
                    .map(|(_, target)| target);
                let mixer = Mixer::new(
                    open,
                    self.parts.len(),
                    mix,
                    Rng::new(mix.seed, outer.origin(), run.part as u64),
                    self.schema.clone(),
                    target,
                );
                if replaces {
                    return Ok(Box::new(mixer));
                }
                Box::new(mixer)
            }
        };
        let Some((own, target)) = plan.rows else {
            return Ok(stream);
        };
        Ok(if target < own {
            Box::new(ops::Take::new(stream, target))
        } else if target > own {
            // Padded with the first rows of the whole combination, as a single reader
            // reads it (again, if it has fewer rows than are missing).
            let whole = run.whole();
            let total = self
                .part_counts(&whole, outer)?
                .unwrap_or_default()
                .iter()
                .sum::<u64>();
            let rounds = (target - own).div_ceil(total.max(1));
            let (c, padding_stats) = (self.clone(), stats.clone());
            let padding = (0..rounds).flat_map(move |_| {
                c.stream(&whole, outer, &padding_stats)
                    .unwrap_or_else(|e| Box::new(std::iter::once(Err(e))))
            });
            let padded = stream.chain(ops::Take::new(Box::new(padding), target - own));
            Box::new(ops::Padding::new(Box::new(padded), own, stats.clone()))
        } else {
            stream
        })
    }

    /// The rows (tagged positions) `run`'s reader reads, padding included (what
    /// [`Dataset::planned_rows`] says of a combination).
    pub(super) fn planned_rows(&self, run: &RunOptions, outer: Draws) -> Result<RowList> {
        let plan = self.plan(run, outer, false)?;
        let mut all = Vec::new();
        for i in 0..self.parts.len() {
            let part = &self.parts[i];
            all.extend(match &plan.slices[i] {
                Some(range) => {
                    let whole =
                        part.planned_rows_as_part(&self.part_run(i, run, outer, Share::WHOLE))?;
                    rows::sublist(&whole, range.start, range.end)
                }
                None => part.planned_rows_as_part(&self.part_run(i, run, outer, plan.shares[i]))?,
            });
        }
        // (A mixing that repeats rows reads from all of them: its length is not needed.)
        let Some((own, target)) = plan.rows else {
            return Ok(all);
        };
        if target < own {
            // A mixing's cut row is one of them, but which depends on the draws: all of
            // them are listed (at most one row more to read after an elastic resume).
            if self.mix.is_none() {
                all = rows::sublist(&all, 0, target);
            }
        } else if target > own {
            let whole = self.planned_rows(&run.whole(), outer)?;
            let mut missing = target - own;
            while missing > 0 && !whole.is_empty() {
                let n = missing.min(rows::list_len(&whole));
                all.extend(rows::sublist(&whole, 0, n));
                missing -= n;
            }
        }
        Ok(all)
    }
}

pub(super) fn part_shares(share: Share, counts: &[u64]) -> Vec<Share> {
    let (mut first_rank, mut first_worker) = share.first;
    counts
        .iter()
        .map(|&n| {
            let part = Share {
                pad: false,
                even: false,
                first: (first_rank % share.ranks(), first_worker % share.workers()),
                ..share
            };
            first_rank += n;
            first_worker += rows::cut_len(n, share.ranks(), share.rank(), part.first.0);
            part
        })
        .collect()
}

/// Opens part `i`'s stream for this epoch, its batches already in the common schema.
pub type Open = Box<dyn Fn(usize) -> Result<BatchIter> + Send>;

/// Rows per batch an interleaving emits.
const MIX_BATCH_ROWS: usize = 1024;

pub struct Chain {
    open: Open,
    parts: usize,
    next: usize,
    current: Option<BatchIter>,
}

impl Chain {
    pub fn new(open: Open, parts: usize) -> Self {
        Self {
            open,
            parts,
            next: 0,
            current: None,
        }
    }
}

impl Iterator for Chain {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(current) = self.current.as_mut() {
                match current.next() {
                    Some(item) => return Some(item),
                    None => self.current = None,
                }
            }
            if self.next >= self.parts {
                return None;
            }
            match (self.open)(self.next) {
                Ok(stream) => self.current = Some(stream),
                Err(e) => {
                    self.next = self.parts;
                    return Some(Err(e));
                }
            }
            self.next += 1;
        }
    }
}

/// One part's stream and the batch being drawn from.
struct Feed {
    stream: BatchIter,
    batch: Option<RecordBatch>,
    /// Next row of `batch`.
    row: usize,
    /// Whether this pass over the part has given a row.
    gave: bool,
}

pub struct Mixer {
    open: Open,
    feeds: Vec<Option<Feed>>,
    /// Relative weights, for weighted draws; `None`: take parts in turn.
    weights: Option<Vec<f64>>,
    /// Running sums of the weights of the parts still drawn (recomputed when one is
    /// retired), so a draw is a search, not a sum.
    cumulative: Vec<f64>,
    turn: usize,
    rng: Rng,
    stopping: Stopping,
    /// Which parts have run out at least once.
    exhausted: Vec<bool>,
    /// Parts no longer drawn: run out without replacement, or empty for this reader.
    retired: Vec<bool>,
    /// Rows to deliver, when the mixing is cut or carried on to a length every reader
    /// shares (see `Combined::plan`); `None`: as the stopping strategy ends it.
    target: Option<u64>,
    produced: u64,
    schema: SchemaRef,
    done: bool,
    /// The row just drawn was the last of the mixing.
    finished: bool,
}

/// What drawing from a part gave.
enum Drawn {
    Row(RecordBatch, usize),
    /// The part has no rows left and is not drawn again: draw another.
    Again,
    End,
}

impl Mixer {
    pub fn new(
        open: Open,
        parts: usize,
        mix: &Mix,
        rng: Rng,
        schema: SchemaRef,
        target: Option<u64>,
    ) -> Self {
        let mut mixer = Self {
            open,
            feeds: (0..parts).map(|_| None).collect(),
            weights: mix.weights.clone(),
            cumulative: Vec::new(),
            turn: 0,
            rng,
            stopping: mix.stopping,
            exhausted: vec![false; parts],
            retired: vec![false; parts],
            target,
            produced: 0,
            schema,
            done: false,
            finished: false,
        };
        mixer.reweigh();
        mixer
    }

    fn reweigh(&mut self) {
        let Some(weights) = &self.weights else { return };
        let mut sum = 0.0;
        self.cumulative = (0..weights.len())
            .map(|i| {
                if self.live(i) {
                    sum += weights[i];
                }
                sum
            })
            .collect();
    }

    /// Whether part `i` can still be drawn.
    fn live(&self, i: usize) -> bool {
        !self.retired[i]
    }

    /// Takes part `part` out of the draws; whether another part is left to draw.
    fn retire(&mut self, part: usize) -> Drawn {
        self.retired[part] = true;
        self.reweigh();
        if self.any_live() {
            Drawn::Again
        } else {
            Drawn::End
        }
    }

    fn draw(&mut self) -> usize {
        let parts = self.feeds.len();
        match &self.weights {
            None => loop {
                let part = self.turn % parts;
                self.turn += 1;
                if self.live(part) {
                    return part;
                }
            },
            Some(_) => {
                let total = self.cumulative.last().copied().unwrap_or(0.0);
                let x = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
                let i = self.cumulative.partition_point(|&c| c <= x);
                if i < parts {
                    return i;
                }
                // Rounding at the very top lands past the end: the last part with weight.
                (0..parts)
                    .rev()
                    .find(|&j| {
                        self.cumulative[j] > if j > 0 { self.cumulative[j - 1] } else { 0.0 }
                    })
                    .unwrap_or(parts - 1)
            }
        }
    }

    /// Whether any part can still be drawn: with weights, one of positive weight.
    fn any_live(&self) -> bool {
        match &self.weights {
            Some(_) => self.cumulative.last().is_some_and(|&total| total > 0.0),
            None => (0..self.feeds.len()).any(|i| self.live(i)),
        }
    }

    /// The next row of part `part`.
    fn next_row(&mut self, part: usize) -> Result<Drawn> {
        loop {
            if self.feeds[part].is_none() {
                self.feeds[part] = Some(Feed {
                    stream: (self.open)(part)?,
                    batch: None,
                    row: 0,
                    gave: false,
                });
            }
            let Some(feed) = self.feeds[part].as_mut() else {
                continue;
            };
            if let Some(batch) = feed.batch.clone()
                && feed.row < batch.num_rows()
            {
                feed.row += 1;
                feed.gave = true;
                let row = feed.row - 1;
                // As in `datasets`, the mixing ends on the row that runs out the first
                // part (first_exhausted) or completes the last part's pass
                // (all_exhausted): look ahead at each part's end.
                if self.stopping != Stopping::AllWithoutReplacement && feed.row == batch.num_rows()
                {
                    // (Empty batches say nothing of whether rows are left.)
                    let next = loop {
                        match feed.stream.next() {
                            Some(Ok(b)) if b.num_rows() == 0 => {}
                            other => break other,
                        }
                    };
                    match next {
                        Some(next) => {
                            feed.batch = Some(next?);
                            feed.row = 0;
                        }
                        None => {
                            self.exhausted[part] = true;
                            self.feeds[part] = None;
                            // With a target, all_exhausted carries on to it instead (a
                            // first_exhausted target is never past this row).
                            self.finished = self.stopping == Stopping::FirstExhausted
                                || (self.target.is_none() && self.exhausted.iter().all(|&e| e));
                        }
                    }
                }
                return Ok(Drawn::Row(batch, row));
            }
            match feed.stream.next() {
                Some(batch) => {
                    feed.batch = Some(batch?);
                    feed.row = 0;
                }
                None => {
                    self.exhausted[part] = true;
                    let had_rows = feed.gave;
                    self.feeds[part] = None;
                    return Ok(match self.stopping {
                        Stopping::FirstExhausted => Drawn::End,
                        // A part with no rows for this reader cannot start over: the
                        // others go on without it, and end if they have all run out.
                        Stopping::AllExhausted if !had_rows => match self.retire(part) {
                            Drawn::Again
                                if self.target.is_none() && self.exhausted.iter().all(|&e| e) =>
                            {
                                Drawn::End
                            }
                            drawn => drawn,
                        },
                        Stopping::AllExhausted
                            if self.target.is_none() && self.exhausted.iter().all(|&e| e) =>
                        {
                            Drawn::End
                        }
                        // Start it over until every part has run out once (or the
                        // target is reached).
                        Stopping::AllExhausted => continue,
                        Stopping::AllWithoutReplacement => self.retire(part),
                    });
                }
            }
        }
    }
}

impl Iterator for Mixer {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(MIX_BATCH_ROWS);
        while picks.len() < MIX_BATCH_ROWS {
            if !self.any_live() || self.target.is_some_and(|t| self.produced >= t) {
                self.done = true;
                break;
            }
            let part = self.draw();
            match self.next_row(part) {
                Ok(Drawn::Again) => {}
                Ok(Drawn::Row(batch, row)) => {
                    // Batches are shared (Arc'd) buffers: compare by identity.
                    let at = batches
                        .iter()
                        .position(|b| {
                            b.num_rows() == batch.num_rows()
                                && b.columns()
                                    .iter()
                                    .zip(batch.columns())
                                    .all(|(x, y)| std::sync::Arc::ptr_eq(x, y))
                        })
                        .unwrap_or_else(|| {
                            batches.push(batch);
                            batches.len() - 1
                        });
                    picks.push((at, row));
                    self.produced += 1;
                    if self.finished {
                        self.done = true;
                        break;
                    }
                }
                Ok(Drawn::End) => {
                    self.done = true;
                    break;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        if picks.is_empty() {
            return None;
        }
        let sources: Vec<&RecordBatch> = batches.iter().collect();
        Some(
            interleave_rows(&sources, &picks)
                .map_err(|e| Error::Internal(format!("interleaving rows: {e}")))
                .and_then(|b| rows::around(b, |b| conform(b, &self.schema))),
        )
    }
}

/// Rows a mixing of parts holding `counts` rows delivers, drawn with `rng` (as a reader
/// whose parts hold those rows would draw them): the mixer itself, run over rows with
/// no columns.
pub fn mixed_rows(counts: &[u64], mix: &Mix, rng: Rng) -> Result<u64> {
    let empty = std::sync::Arc::new(arrow_schema::Schema::empty());
    let (parts, counts) = (counts.len(), counts.to_vec());
    let schema = empty.clone();
    let open: Open = Box::new(move |i| {
        let rows = counts[i] as usize;
        let batch = RecordBatch::try_new_with_options(
            schema.clone(),
            Vec::new(),
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| Error::Internal(format!("counting a mixing: {e}")))?;
        Ok(Box::new((rows > 0).then_some(Ok(batch)).into_iter()) as BatchIter)
    });
    let mut rows = 0;
    for batch in Mixer::new(open, parts, mix, rng, empty, None) {
        rows += batch?.num_rows() as u64;
    }
    Ok(rows)
}
