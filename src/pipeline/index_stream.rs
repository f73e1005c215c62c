//! A head read by index: the rows of a random-access dataset streamed in the order an
//! epoch's plan gives them (what `select` and a full-permutation `shuffle` read
//! through), a gather at a time; where units are decoded whole at each visit and outgrow
//! memory, through the external two-pass shuffle (`spill`), or reading ahead for later
//! gathers where spilling is off.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use arrow_array::RecordBatch;

use super::autotune::{SpillOptions, Tuning};
use super::random_access::{CACHE_SHARE, GatherSize, RandomAccess};
use super::rng::Rng;
use super::spill::{Delivery, Spill, SpillPlan};
use super::stats::{ReadPlan, Stats};
use crate::error::{Error, Result};

/// Streams rows of a random-access dataset in the order given, a gather at a time: what
/// `select` and a full-permutation `shuffle` read through. With `leaf`, each row carries
/// its position (its index, tagged with the leaf).
pub struct IndexStream {
    access: Arc<RandomAccess>,
    /// The loader's counters, which the reads are charged to.
    stats: Arc<Stats>,
    rows: VecDeque<std::ops::Range<u64>>,
    leaf: Option<u64>,
    size: GatherSize,
    memory_limit: u64,
    ahead: ReadAhead,
    /// Threads a spill reads units on, and where it may spill (None: it may not, or it
    /// failed once).
    threads: usize,
    spill_options: Option<SpillOptions>,
    /// Rows of the batches that this stream's batches are re-batched into next (the
    /// loader's, or the windows of the op after the head; 0 if none).
    batch_rows: u64,
    /// Rows gathered so far (by gathers, not read ahead or spilled).
    gathered: u64,
    /// The spill delivering the rows, with the rows it was given (read another way if
    /// it fails before delivering any).
    spill: Option<(Spill, super::rows::RowList)>,
    /// The spill's first rows, read where they lie while its first pass runs.
    early: Option<Early>,
    /// Binary columns come as views of their values (see [`Self::viewing`]).
    views: bool,
}

/// A spill serves no row before its first pass has read every unit. Where a few rows
/// are read from their pages alone at little cost (Parquet with an offset index), the
/// stream reads its first two batches there (within a bucket's worth of rows, one at
/// least), and drops them from what the spill then delivers: the first batch does not
/// wait for the first pass. The spill starts once the first is read, which then has the
/// store to itself (read beside it from S3, a first batch of 256 rows of 256 KiB took
/// 1.2 s). Only two: those rows are read twice, and their reads slow the first pass (a
/// bucket's worth from S3 made the epoch 3.5-4.1 s against 3.2 s).
struct Early {
    /// The rows left to read so (the spill's first, in its order), until the spill
    /// delivers.
    rows: VecDeque<std::ops::Range<u64>>,
    /// Rows read so, and rows the spill has delivered since (in the same order).
    served: u64,
    delivered: u64,
}

/// Rows fetched per step of an [`IndexStream`] at most.
const STREAM_CHUNK_ROWS: u64 = 65_536;
/// Bytes of rows per gather where their units stay cached (see [`IndexStream::decide`]),
/// and per gather a spill delivers.
const KEPT_GATHER_BYTES: u64 = 8 << 20;
/// A spill's buckets, as a share of the memory limit: the bucket served and the next,
/// read while it is, hold a quarter.
const SPILL_BUCKET_SHARE: u64 = 8;
/// A spill's first rows are read where they lie meanwhile (see [`Early`]) where a row
/// read alone fetches at most this many times its stored bytes.
const EARLY_ROW_READ_SHARE: f64 = 16.0;
/// Rows per read of [`Early`] where the loader's batches are not known.
const EARLY_ROWS: u64 = 64;
/// Reads of [`Early`] at most, within a bucket's worth of rows (one at least).
const EARLY_BATCHES: u64 = 2;
/// Reading ahead or gathering visits each unit about this many times or more before
/// spilling is chosen: a spill costs a write and a read of local disk besides its visit.
const SPILL_AT_VISITS: f64 = 2.0;

/// Reading ahead, for rows whose units are decoded whole at each visit (they outgrow the
/// unit cache, and their files cannot be read by page: Parquet with a dictionary page per
/// column chunk and no page index, compressed stream units).
///
/// A permutation spreads each unit's rows over the whole epoch, so gathers of G rows
/// visit every unit once per gather: the data is decoded N/G times over. Here a visit
/// also takes the unit's rows that gathers within the next W rows want, and holds them
/// until their gather's turn: the unit is visited again only for a row past that
/// window, about N/W times in all. A unit's held rows run down from one visit to the
/// next, so all units together hold about W/2 rows, if their visits are spread out:
/// each unit's first window is cut short by a fraction drawn from its number, or every
/// unit would come due in the same gather and all hold a whole window. `budget` bytes
/// bound what is held (W is twice the rows it holds; the nearest rows are read ahead
/// first when it is reached). The rows, and their order, are those of gathers alone.
struct ReadAhead {
    /// Bytes of rows held at most.
    budget: u64,
    /// Whether reading ahead was tried (once, after the first gather taught the row size).
    decided: bool,
    /// Rows per gather, fixed once reading ahead starts (0: not started).
    width: u64,
    /// The gathers to come, cut from the stream's rows as the window reaches them.
    upcoming: VecDeque<Gather>,
    next_id: u64,
    /// Rows held by the gather they are for: (their offsets in it, the rows in that order).
    held: HashMap<u64, Vec<(Vec<usize>, RecordBatch)>>,
    held_bytes: u64,
    /// Units visited so far (their first window was cut short).
    visited: std::collections::HashSet<u64>,
}

/// One gather's rows: `positions`, and the unit each is read from where reading it
/// revisits a unit (see [`RandomAccess::revisited_unit`]).
struct Gather {
    id: u64,
    positions: std::ops::Range<u64>,
    units: Vec<Option<u64>>,
    /// The offsets a visit for an earlier gather already took.
    taken: Vec<bool>,
}

impl IndexStream {
    /// Rows of the next gather: what its size asks, cut to end where a batch of the
    /// re-batching after this stream ends, or stretched to that end where it is near
    /// (within a few gathers' bytes). Its batches are then slices of gathers, never copies
    /// joining two (a pack's windows of 1,000 rows of token lists joined from 8 MiB
    /// gathers copied every row a second time).
    fn gather_rows(&self) -> u64 {
        let rows = self.size.rows();
        let window = self.batch_rows;
        if window == 0 || self.size.row_bytes == 0 {
            return rows;
        }
        let at = self.gathered;
        let end = (at + rows) / window * window;
        if end > at {
            return end - at;
        }
        let to_end = window - at % window;
        if to_end.saturating_mul(self.size.row_bytes) <= self.size.bytes().saturating_mul(4) {
            to_end
        } else {
            rows
        }
    }

    /// Gathers hold about a quarter of `memory_limit` of rows: a permutation of rows
    /// larger than the units they come from revisits each unit once per gather, so fewer,
    /// larger gathers read less. Where units are revisited, half of it holds rows read
    /// ahead (see [`ReadAhead`]) and the unit cache an eighth.
    pub fn new(
        access: Arc<RandomAccess>,
        rows: super::rows::RowList,
        leaf: Option<u64>,
        tuning: &Tuning,
        batch_rows: Option<usize>,
        stats: Arc<Stats>,
    ) -> Self {
        let memory_limit = tuning.memory_limit;
        Self {
            access,
            stats,
            threads: tuning.threads,
            batch_rows: batch_rows.unwrap_or(0) as u64,
            gathered: 0,
            spill_options: (tuning.spill.bytes != Some(0)).then(|| tuning.spill.clone()),
            spill: None,
            early: None,
            views: false,
            rows: rows.into_iter().filter(|r| r.start < r.end).collect(),
            leaf,
            size: GatherSize::new(STREAM_CHUNK_ROWS, memory_limit / 4),
            memory_limit,
            ahead: ReadAhead {
                budget: memory_limit / 4,
                decided: false,
                width: 0,
                upcoming: VecDeque::new(),
                next_id: 0,
                held: HashMap::new(),
                held_bytes: 0,
                visited: Default::default(),
            },
        }
    }

    /// With `views`, every batch gives its binary columns as `BinaryView` arrays: gathers
    /// from files mapped whole (a decoded copy) point into them, other rows into their
    /// own buffers (see [`super::stream::interleave_viewing`]).
    pub fn viewing(self, views: bool) -> Self {
        Self { views, ..self }
    }

    /// The next `width` rows at most, within one range of the stream's rows.
    fn cut(&mut self, width: u64) -> Option<std::ops::Range<u64>> {
        cut_front(&mut self.rows, width)
    }

    /// Chooses how the rows are read, once: by gathers (rows read where they lie, or
    /// units kept in memory), through a spill, or reading ahead (see [`ReadPlan`]).
    /// Where units are revisited (decoded whole at each visit), a spill is started before
    /// the first gather if the files alone outgrow the unit cache; else the first gather
    /// teaches the row size, and the choice follows.
    ///
    /// Gathers of G rows visit each unit about once per gather, the cache sparing the
    /// share of the data it holds (c): N/G (1 - c) visits. Reading ahead over a window of
    /// W rows visits each about N/W + 1 times, and the cache shrinks to an eighth of
    /// `memory_limit`, as the rows held take its place. On data under about 1.5 times
    /// `memory_limit` the cache does as well (a shuffle of 524 MB from S3 took 2,392 ms to
    /// its first batch and ran at 332 rows/s reading ahead, against 500 rows/s through
    /// the cache). A spill visits each unit once, and writes and reads the rows once.
    fn decide(&mut self) {
        if self.ahead.decided {
            return;
        }
        let next = self.rows.front().map(|r| r.start);
        let revisited = next.is_some_and(|p| self.access.revisited_unit(p).is_some());
        let rows = super::rows::list_len(self.rows.make_contiguous()) as f64;
        let cache = (self.memory_limit / CACHE_SHARE) as f64;
        if self.size.row_bytes == 0 {
            let stored = rows * self.access.stored_row_bytes() as f64;
            // Rows read from their pages, where each page holds several: reading them
            // where they lie reads a row's page for each row, which for this many rows
            // may come to the files read more than SPILL_AT_VISITS times over (one
            // reader's full shuffle of pages of 4 rows reads them 4 times), where a spill
            // reads them once.
            let rereads = || {
                self.access.row_read_share().is_some_and(|share| {
                    rows * share > SPILL_AT_VISITS * self.access.stored().1 as f64
                })
            };
            if stored > cache * 0.75 && self.spill_options.is_some() && (revisited || rereads()) {
                self.ahead.decided = true;
                self.start_spill_or_read_ahead();
            }
            return;
        }
        self.ahead.decided = true;
        if !revisited {
            // Units the cache keeps are decoded once however the rows are gathered:
            // small gathers then reuse the memory the last one freed, where large ones
            // each fault in fresh pages (a full shuffle of 311 MB of token lists in one
            // row group: 0.75 s in gathers of 128 MiB, 0.42 s in gathers of 8 MB).
            if self.access.keeps_units() {
                self.size.cap_bytes(KEPT_GATHER_BYTES);
                self.stats.read_by(ReadPlan::InMemory);
            } else {
                self.stats.read_by(ReadPlan::InPlace);
            }
            return;
        }
        let data = self.access.len() as f64 * self.size.row_bytes as f64;
        let cached = (cache / data).min(1.0);
        let by_gathers = rows / self.size.rows() as f64 * (1.0 - cached);
        let ahead = rows / self.window().max(1) as f64 + 1.0;
        if by_gathers.min(ahead) >= SPILL_AT_VISITS {
            self.start_spill_or_read_ahead();
        } else if ahead < by_gathers {
            self.read_ahead();
        } else {
            self.stats.read_by(ReadPlan::Gather);
        }
    }

    /// Hands the rows to a spill, where spilling is allowed; else reads ahead.
    fn start_spill_or_read_ahead(&mut self) {
        let Some(options) = self.spill_options.clone() else {
            return self.read_ahead();
        };
        let rows: super::rows::RowList = self.rows.drain(..).collect();
        // Each unit is visited once: none is worth keeping.
        self.access.bound_cache(1);
        let plan = SpillPlan {
            access: self.access.clone(),
            stats: self.stats.clone(),
            rows: rows.clone(),
            threads: self.threads,
            units_bytes: self.memory_limit / 2,
            gather_bytes: KEPT_GATHER_BYTES.min(self.memory_limit / 4),
            bucket_bytes: self.memory_limit / SPILL_BUCKET_SHARE,
            batch_rows: self.batch_rows,
            options,
            views: self.views,
        };
        let early = self
            .access
            .row_read_share()
            .is_some_and(|share| share <= EARLY_ROW_READ_SHARE);
        let spill = match early {
            // Started once the first batch is read: it then has the disk or the network
            // to itself.
            true => Spill::deferred(plan),
            false => Spill::start(plan),
        };
        if early {
            let row_bytes = match self.size.row_bytes {
                0 => self.access.stored_row_bytes(),
                bytes => bytes,
            };
            let width = self.early_width();
            let bucket_rows = self.memory_limit / SPILL_BUCKET_SHARE / row_bytes.max(1);
            let batches = (bucket_rows / width).clamp(1, EARLY_BATCHES);
            self.early = Some(Early {
                rows: super::rows::sublist(&rows, 0, batches * width)
                    .into_iter()
                    .collect(),
                served: 0,
                delivered: 0,
            });
        }
        self.spill = Some((spill, rows));
        self.stats.read_by(ReadPlan::Spill);
    }

    /// Rows per read of [`Early`]: the loader's batch.
    fn early_width(&self) -> u64 {
        match self.batch_rows {
            0 => EARLY_ROWS,
            rows => rows,
        }
    }

    /// The next batch of the spill's rows read where they lie, while its first pass runs
    /// and rows are left; None once the spill delivers (or no row is left).
    fn next_early(&mut self) -> Option<(u64, Result<RecordBatch>)> {
        let width = self.early_width();
        let (spill, _) = self.spill.as_mut()?;
        let early = self.early.as_mut()?;
        if spill.ready() {
            early.rows.clear();
        }
        let Some(positions) = cut_front(&mut early.rows, width) else {
            spill.begin();
            return None;
        };
        early.served += positions.end - positions.start;
        let indices: Vec<u64> = positions.clone().collect();
        let out = self.access.rows_read(&indices, Some(&self.stats.io), false);
        if let Some((spill, _)) = self.spill.as_mut() {
            spill.begin();
        }
        Some((positions.start, out))
    }

    /// Reads ahead from now on (see [`ReadAhead`]).
    fn read_ahead(&mut self) {
        self.ahead.width = self.size.rows().min(self.window() / 8).max(1);
        self.access.bound_cache(self.memory_limit / 8);
        self.stats.read_by(ReadPlan::ReadAhead);
    }

    /// The next gather from the spill; None once it has delivered every row, or if it
    /// failed before delivering any (its rows are then read another way).
    fn next_spilled(&mut self) -> Option<(u64, Result<RecordBatch>)> {
        if let Some(early) = self.next_early() {
            return Some(early);
        }
        let served = self.early.as_ref().map_or(0, |e| e.served);
        if served > 0 && served >= super::rows::list_len(&self.spill.as_ref()?.1) {
            // Every row was read where it lies: the spill is not waited for.
            self.spill = None;
            return None;
        }
        loop {
            let (spill, _) = self.spill.as_mut()?;
            return match spill.next() {
                Some(Delivery::Gather(start, out)) => {
                    let Ok(batch) = out else {
                        self.spill = None;
                        return Some((start, out));
                    };
                    // Rows read where they lie already are not delivered again.
                    let rows = batch.num_rows() as u64;
                    let skip = match self.early.as_mut() {
                        Some(early) => {
                            let skip = early.served.saturating_sub(early.delivered).min(rows);
                            early.delivered += rows;
                            skip
                        }
                        None => 0,
                    };
                    match skip {
                        0 => Some((start, Ok(batch))),
                        _ if skip == rows => continue,
                        _ => Some((
                            start + skip,
                            Ok(batch.slice(skip as usize, (rows - skip) as usize)),
                        )),
                    }
                }
                Some(Delivery::Fallback(why)) => {
                    // Nothing was delivered: the rows are read by gathers instead.
                    self.stats.notice(format!(
                        "the full shuffle could not spill ({why}), so its rows are read from the files instead, decoding the data several times; give spill_dir= a directory with room, or spill_bytes= more"
                    ));
                    let (_, rows) = self.spill.take()?;
                    self.rows = super::rows::sublist(&rows, served, u64::MAX)
                        .into_iter()
                        .collect();
                    self.early = None;
                    self.spill_options = None;
                    self.ahead.decided = false;
                    None
                }
                None => {
                    self.spill = None;
                    self.rows.clear();
                    None
                }
            };
        }
    }

    /// Rows after a gather that a visit for it reads ahead (W).
    fn window(&self) -> u64 {
        2 * self.ahead.budget / self.size.row_bytes.max(1)
    }

    /// Cuts gathers until the upcoming ones cover the window.
    fn fill(&mut self) {
        let reach = self.ahead.width + self.window();
        let mut covered: u64 = self
            .ahead
            .upcoming
            .iter()
            .map(|g| g.positions.end - g.positions.start)
            .sum();
        while covered < reach {
            let Some(positions) = self.cut(self.ahead.width) else {
                break;
            };
            covered += positions.end - positions.start;
            let units: Vec<Option<u64>> = positions
                .clone()
                .map(|p| self.access.revisited_unit(p))
                .collect();
            let ahead = &mut self.ahead;
            ahead.upcoming.push_back(Gather {
                id: ahead.next_id,
                taken: vec![false; units.len()],
                positions,
                units,
            });
            ahead.next_id += 1;
        }
    }

    /// The next gather's rows, reading ahead: its rows not held yet, with the rows of the
    /// same units that later gathers within the window want (as many as the budget
    /// holds). Returns the gather's first position with them.
    fn next_ahead(&mut self) -> Option<(u64, Result<RecordBatch>)> {
        self.fill();
        let window = self.window();
        let ahead = &mut self.ahead;
        let current = ahead.upcoming.pop_front()?;
        let held = ahead.held.remove(&current.id).unwrap_or_default();
        for (_, batch) in &held {
            ahead.held_bytes = ahead
                .held_bytes
                .saturating_sub(batch.get_array_memory_size() as u64);
        }
        let missing: Vec<usize> = (0..current.units.len())
            .filter(|&o| !current.taken[o])
            .collect();
        // Each unit visited now, with the rows after this gather its window reaches.
        let mut reach: HashMap<u64, u64> = HashMap::new();
        for unit in missing.iter().filter_map(|&o| current.units[o]) {
            reach
                .entry(unit)
                .or_insert_with(|| match ahead.visited.insert(unit) {
                    true => window * Rng::new(unit, 0, 0).below(1024) as u64 / 1024,
                    false => window,
                });
        }
        // Later gathers' rows from those units, nearest first, as many as the budget
        // holds.
        let room = (ahead.budget.saturating_sub(ahead.held_bytes) / self.size.row_bytes.max(1))
            .min(2 * ahead.width);
        let mut extra: Vec<(usize, usize)> = Vec::new();
        let mut after = 0u64;
        'gathers: for (g, gather) in ahead.upcoming.iter().enumerate() {
            for (o, unit) in gather.units.iter().enumerate() {
                if extra.len() as u64 >= room || after >= window {
                    break 'gathers;
                }
                if !gather.taken[o]
                    && unit.is_some_and(|u| reach.get(&u).is_some_and(|&r| after < r))
                {
                    extra.push((g, o));
                }
                after += 1;
            }
        }
        let start = current.positions.start;
        let mut request: Vec<u64> = missing.iter().map(|&o| start + o as u64).collect();
        request.extend(
            extra
                .iter()
                .map(|&(g, o)| ahead.upcoming[g].positions.start + o as u64),
        );
        let read = match self.access.rows_charged(&request, Some(&self.stats.io)) {
            Ok(read) => read,
            Err(e) => return Some((start, Err(e))),
        };
        self.size.saw(&read);
        // Each later gather's rows copied out of the read, so that they go with it.
        let mut k = missing.len();
        for group in extra.chunk_by(|a, b| a.0 == b.0) {
            let picks: Vec<(usize, usize)> = (k..k + group.len()).map(|r| (0, r)).collect();
            k += group.len();
            let rows = match super::stream::interleave_rows(&[&read], &picks) {
                Ok(rows) => rows,
                Err(e) => {
                    return Some((start, Err(Error::Internal(format!("gather failed: {e}")))));
                }
            };
            let gather = &mut ahead.upcoming[group[0].0];
            group.iter().for_each(|&(_, o)| gather.taken[o] = true);
            ahead.held_bytes += rows.get_array_memory_size() as u64;
            let offsets = group.iter().map(|&(_, o)| o).collect();
            ahead
                .held
                .entry(gather.id)
                .or_default()
                .push((offsets, rows));
        }
        if held.is_empty() && extra.is_empty() {
            return Some((start, Ok(read)));
        }
        // The gather in its order: from the read, or held since an earlier one.
        let mut from: Vec<(usize, usize)> = vec![(0, 0); current.units.len()];
        for (r, &o) in missing.iter().enumerate() {
            from[o] = (0, r);
        }
        for (b, (offsets, _)) in held.iter().enumerate() {
            for (r, &o) in offsets.iter().enumerate() {
                from[o] = (b + 1, r);
            }
        }
        let mut sources = vec![&read];
        sources.extend(held.iter().map(|(_, batch)| batch));
        let out = super::stream::interleave_rows(&sources, &from)
            .map_err(|e| Error::Internal(format!("gather failed: {e}")));
        Some((start, out))
    }
}

/// The next `width` rows of `rows` at most, within one range.
fn cut_front(
    rows: &mut VecDeque<std::ops::Range<u64>>,
    width: u64,
) -> Option<std::ops::Range<u64>> {
    let range = rows.front_mut()?;
    let stop = (range.start + width).min(range.end);
    let cut = range.start..stop;
    range.start = stop;
    if range.start >= range.end {
        rows.pop_front();
    }
    Some(cut)
}

impl Iterator for IndexStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.decide();
        let spilled = self.spill.is_some().then(|| self.next_spilled()).flatten();
        if spilled.is_none() {
            // A spill that failed gives its rows back: decided anew.
            self.decide();
        }
        let (start, out) = if let Some(spilled) = spilled {
            spilled
        } else if self.ahead.width > 0 {
            self.next_ahead()?
        } else {
            let positions = self.cut(self.gather_rows())?;
            self.gathered += positions.end - positions.start;
            let indices: Vec<u64> = positions.clone().collect();
            let out = self
                .access
                .rows_read(&indices, Some(&self.stats.io), self.views);
            if let Ok(batch) = &out {
                self.size.saw(batch);
            }
            (positions.start, out)
        };
        let out = match self.views {
            true => out.and_then(super::stream::viewing),
            false => out,
        };
        let out = out.and_then(|batch| match self.leaf {
            Some(leaf) => super::rows::attach_run(batch, super::rows::tag(leaf, start)),
            None => Ok(batch),
        });
        if out.is_err() {
            self.rows.clear();
            self.ahead.upcoming.clear();
            self.spill = None;
        }
        Some(out)
    }
}
