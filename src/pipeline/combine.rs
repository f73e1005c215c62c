//! Several datasets read as one: one after another (`concatenate`), or mixed row by row
//! by seeded weighted draws (`interleave`). A part's stream is opened when it is first
//! needed, so a concatenation of many datasets reads one at a time.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::rng::Rng;
use super::{BatchIter, Mix, Stopping};
use crate::error::{Error, Result};

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
            super::interleave_rows(&sources, &picks)
                .map_err(|e| Error::Internal(format!("interleaving rows: {e}")))
                .and_then(|b| super::rows::around(b, |b| super::conform(b, &self.schema))),
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
