//! Row positions: where each row stands in an epoch's order, independent of how many
//! parts (ranks x workers) read it. They let a loader say exactly which rows it has
//! delivered, so an epoch can be resumed on another number of parts (elastic resume).
//!
//! A position is a row's index in its *leaf*'s epoch sequence (the units in epoch
//! order, or the rows of an indexed head), tagged with the leaf's number in the top
//! bits: a `concatenate` or `interleave` of several datasets has one leaf per part.
//! Positions travel with the rows as a hidden last column from the head of the pipeline
//! to the loader, which strips it before the user sees a batch.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};

/// The hidden column that carries positions through the pipeline.
pub const POSITION_COLUMN: &str = "__shardflow_position__";

/// Bits of a position that number the row within its leaf; the rest number the leaf.
pub const LEAF_SHIFT: u32 = 48;

pub fn tag(leaf: u64, row: u64) -> u64 {
    (leaf << LEAF_SHIFT) | row
}

/// The leaf of a dealt stream's positions: where every part reads the whole stream
/// through a filter, flat_map or pack and keeps every `parts`-th row (see
/// `plan::Split::Rows`), a row's position is its index in that stream, the same
/// whatever the division, so an epoch dealt alike on another division resumes there.
pub const DEALT_LEAF: u64 = (1 << (64 - LEAF_SHIFT)) - 2;

/// Every position a dealt stream's rows can have.
pub fn dealt_positions() -> Range<u64> {
    tag(DEALT_LEAF, 0)..tag(DEALT_LEAF + 1, 0)
}

/// The column that carries each row's index to a function that takes it (see
/// `BatchTransform::wants_indices`); the function removes it.
pub const INDEX_COLUMN: &str = "__shardflow_index__";

/// The row number a position holds, its leaf left out.
pub fn row_of(position: u64) -> u64 {
    position & ((1 << LEAF_SHIFT) - 1)
}

/// `batch` with `indices` as its last column, [`INDEX_COLUMN`].
pub fn with_index(batch: RecordBatch, indices: impl Iterator<Item = u64>) -> Result<RecordBatch> {
    with_last(batch, INDEX_COLUMN, UInt64Array::from_iter_values(indices))
        .map_err(|e| Error::Internal(format!("giving rows their indices: {e}")))
}

/// `batch` with `positions` as its last (hidden) column.
pub fn attach(batch: RecordBatch, positions: UInt64Array) -> Result<RecordBatch> {
    with_last(batch, POSITION_COLUMN, positions)
        .map_err(|e| Error::Internal(format!("attaching row positions: {e}")))
}

/// `batch` with `values` as a last column named `name`.
fn with_last(
    batch: RecordBatch,
    name: &str,
    values: UInt64Array,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = batch.schema();
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(name, DataType::UInt64, false)));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(values) as ArrayRef);
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
        &options,
    )
}

/// The position of a row whose place is not known (it was made by a flat_map in one
/// part of a combined dataset, say): a loader that sees one cannot resume elastically.
pub const UNKNOWN: u64 = u64::MAX;

/// `batch` with every row's position unknown.
pub fn attach_unknown(batch: RecordBatch) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    attach(batch, UInt64Array::from_value(UNKNOWN, rows))
}

/// Positions `start..start + rows` attached to `batch`.
pub fn attach_run(batch: RecordBatch, start: u64) -> Result<RecordBatch> {
    let rows = batch.num_rows() as u64;
    attach(batch, UInt64Array::from_iter_values(start..start + rows))
}

/// `batch` without its positions, and the positions if it had them.
pub fn detach(batch: RecordBatch) -> (RecordBatch, Option<UInt64Array>) {
    let schema = batch.schema_ref();
    if schema.fields().last().map(|f| f.name().as_str()) != Some(POSITION_COLUMN) {
        return (batch, None);
    }
    let visible = visible_schema(schema);
    let (_, mut columns, rows) = batch.into_parts();
    let positions = columns
        .pop()
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>().cloned());
    // SAFETY: the columns are the batch's, in its schema's order, less the last, and
    // `visible` is that schema less its last field.
    let batch = unsafe { RecordBatch::new_unchecked(visible, columns, rows) };
    (batch, positions)
}

thread_local! {
    /// The last schema whose positions this thread took off, and that schema without
    /// them. A stream's batches share their schema: building the visible one for each
    /// batch was a field list, a schema and its metadata allocated per batch on the
    /// consumer's thread, the serial path.
    static VISIBLE: std::cell::RefCell<Option<(SchemaRef, SchemaRef)>> = const { std::cell::RefCell::new(None) };
}

/// `schema` without its last field (the positions).
fn visible_schema(schema: &SchemaRef) -> SchemaRef {
    VISIBLE.with_borrow_mut(|cached| {
        if let Some((full, visible)) = cached.as_ref()
            && (Arc::ptr_eq(full, schema) || full == schema)
        {
            return visible.clone();
        }
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        fields.pop();
        let visible = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        *cached = Some((schema.clone(), visible.clone()));
        visible
    })
}

/// Applies `f` to `batch`'s visible columns and puts the positions back on its output.
pub fn around(
    batch: RecordBatch,
    f: impl FnOnce(RecordBatch) -> Result<RecordBatch>,
) -> Result<RecordBatch> {
    match detach(batch) {
        (batch, Some(positions)) => attach(f(batch)?, positions),
        (batch, None) => f(batch),
    }
}

/// A set of positions as sorted, disjoint, non-adjacent half-open ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowSet {
    /// start -> end
    ranges: BTreeMap<u64, u64>,
}

impl RowSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_ranges(ranges: impl IntoIterator<Item = Range<u64>>) -> Self {
        let mut set = Self::new();
        for r in ranges {
            set.insert(r);
        }
        set
    }

    pub fn insert(&mut self, range: Range<u64>) {
        if range.start >= range.end {
            return;
        }
        let (mut start, mut end) = (range.start, range.end);
        // Merge with a range that starts at or before `start` and reaches it.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.ranges.remove(&s);
        }
        // Absorb every range that starts inside [start, end].
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            end = end.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(start, end);
    }

    /// Adds each position of `positions` (runs of consecutive ones at a time).
    pub fn insert_all(&mut self, positions: &[u64]) {
        let mut i = 0;
        while i < positions.len() {
            let start = positions[i];
            let mut end = start + 1;
            i += 1;
            while i < positions.len() && positions[i] == end {
                end += 1;
                i += 1;
            }
            self.insert(start..end);
        }
    }

    pub fn contains(&self, position: u64) -> bool {
        self.ranges
            .range(..=position)
            .next_back()
            .is_some_and(|(_, &e)| position < e)
    }

    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn union(&mut self, other: &RowSet) {
        for r in other.iter() {
            self.insert(r);
        }
    }

    /// The positions of `self` that are not in `other`.
    pub fn difference(&self, other: &RowSet) -> RowSet {
        let mut out = RowSet::new();
        for r in self.iter() {
            let mut at = r.start;
            for (&s, &e) in other.ranges.range(..r.end) {
                if e <= at {
                    continue;
                }
                if s > at {
                    out.insert(at..s.min(r.end));
                }
                at = at.max(e);
                if at >= r.end {
                    break;
                }
            }
            if at < r.end {
                out.insert(at..r.end);
            }
        }
        out
    }

    /// Whether it holds places in a dealt stream ([`dealt_positions`]): the rows left
    /// of an epoch that was dealt.
    pub fn holds_dealt(&self) -> bool {
        let dealt = dealt_positions();
        self.ranges
            .range(..dealt.end)
            .next_back()
            .is_some_and(|(_, &end)| end > dealt.start)
    }

    /// The positions within `bounds`.
    pub fn within(&self, bounds: Range<u64>) -> RowSet {
        RowSet::from_ranges(
            self.iter()
                .map(|r| r.start.max(bounds.start)..r.end.min(bounds.end))
                .filter(|r| r.start < r.end),
        )
    }

    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.ranges.iter().map(|(&s, &e)| s..e)
    }

    /// `[start0, end0, start1, end1, ...]`: the form a state dict carries.
    pub fn to_flat(&self) -> Vec<u64> {
        self.iter().flat_map(|r| [r.start, r.end]).collect()
    }

    pub fn from_flat(flat: &[u64]) -> Result<RowSet> {
        if flat.len() % 2 != 0 || flat.chunks(2).any(|p| p[0] > p[1]) {
            return Err(Error::invalid_argument(
                "a row set in a state is a flat list of [start, end) pairs",
            ));
        }
        Ok(RowSet::from_ranges(flat.chunks(2).map(|p| p[0]..p[1])))
    }
}

/// The rows a loader has delivered, recorded batch by batch. Positions are kept as they
/// come and merged into ranges a chunk at a time: a shuffled batch's positions are
/// scattered, but a chunk of many batches' positions mostly joins up.
#[derive(Debug, Clone, Default)]
pub struct Delivered {
    merged: RowSet,
    pending: Vec<u64>,
}

/// Positions collected before they are merged.
const MERGE_EVERY: usize = 1 << 16;
/// Positions spread over at most this many rows each are merged through a bitmap.
const DENSE_SPAN: u64 = 16;

impl Delivered {
    pub fn new(set: RowSet) -> Self {
        Self {
            merged: set,
            pending: Vec::new(),
        }
    }

    pub fn add(&mut self, positions: &[u64]) {
        self.pending.extend_from_slice(positions);
        if self.pending.len() >= MERGE_EVERY {
            self.merge();
        }
    }

    /// Runs on the consumer's thread (the serial path), once per `MERGE_EVERY` positions.
    fn merge(&mut self) {
        let (Some(&lo), Some(&hi)) = (self.pending.iter().min(), self.pending.iter().max()) else {
            return;
        };
        let span = hi - lo + 1;
        if span / DENSE_SPAN <= self.pending.len() as u64 {
            // Dense, as a streaming shuffle's window or an unshuffled stream is: a bitmap
            // of the span and its runs, a tenth of the time of sorting the positions.
            let mut bits = vec![0u64; span.div_ceil(64) as usize];
            for &p in &self.pending {
                let at = p - lo;
                bits[(at / 64) as usize] |= 1 << (at % 64);
            }
            let mut run: Option<u64> = None;
            for (word, &set) in (0u64..).zip(&bits) {
                let base = lo + 64 * word;
                match set {
                    u64::MAX => {
                        run.get_or_insert(base);
                    }
                    0 => {
                        if let Some(start) = run.take() {
                            self.merged.insert(start..base);
                        }
                    }
                    _ => {
                        for bit in 0..64 {
                            match (set >> bit & 1 == 1, run) {
                                (true, None) => run = Some(base + bit),
                                (false, Some(start)) => {
                                    self.merged.insert(start..base + bit);
                                    run = None;
                                }
                                _ => {}
                            }
                        }
                    }
                }
            }
            if let Some(start) = run {
                self.merged.insert(start..hi + 1);
            }
        } else {
            self.pending.sort_unstable();
            self.pending.dedup();
            self.merged.insert_all(&self.pending);
        }
        self.pending.clear();
    }

    pub fn into_set(mut self) -> RowSet {
        self.merge();
        self.merged
    }
}

/// Rows in a reading order: ranges read one after another.
pub type RowList = Vec<Range<u64>>;

pub fn list_len(list: &[Range<u64>]) -> u64 {
    list.iter().map(|r| r.end - r.start).sum()
}

/// Rows `[from, to)` of `list`, counted in its order.
pub fn sublist(list: &[Range<u64>], from: u64, to: u64) -> RowList {
    let mut out = Vec::new();
    let mut at = 0;
    for r in list {
        let n = r.end - r.start;
        let (lo, hi) = (from.max(at), to.min(at + n));
        if hi > lo {
            out.push(r.start + (lo - at)..r.start + (hi - at));
        }
        at += n;
        if at >= to {
            break;
        }
    }
    out
}

/// Rows `[start, end)` of `total` that piece `piece` of `pieces` gets when `total` rows
/// are cut into contiguous pieces in order, each `total / pieces` rows, and the
/// `total % pieces` rows left over go one each to the pieces from `first` on
/// (cyclically). A combined dataset's parts start where the previous part's left-overs
/// stopped, so that across its parts every piece gets as many rows, give or take one.
pub fn cut(total: u64, pieces: u64, piece: u64, first: u64) -> (u64, u64) {
    let pieces = pieces.max(1);
    let (each, extra) = (total / pieces, total % pieces);
    let first = first % pieces;
    // Pieces before `piece` that get an extra row: those of [first, first + extra) and,
    // past the end, of [0, first + extra - pieces).
    let extras_before = piece.min(first + extra).saturating_sub(first)
        + piece.min((first + extra).saturating_sub(pieces));
    let start = piece * each + extras_before;
    let gets_extra = (piece + pieces - first) % pieces < extra;
    (start, start + each + u64::from(gets_extra))
}

/// How many rows piece `piece` of `pieces` gets by [`cut`].
pub fn cut_len(total: u64, pieces: u64, piece: u64, first: u64) -> u64 {
    let (start, end) = cut(total, pieces, piece, first);
    end - start
}

/// How an epoch's rows are dealt to its parts: `parts` readers, grouped in ranks of
/// `workers` consecutive parts (part = rank x workers + worker). Each rank gets a
/// contiguous share of the rows in order (see [`cut`]); `even` makes the ranks' shares
/// equal by leaving out the remainder, `pad` by repeating the first rows in the shorter
/// ones (as `DistributedSampler(drop_last=False)` does). A rank's rows, padding
/// included, are then cut between its workers, never padded or trimmed: the workers of
/// one rank read every row of it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub part: usize,
    pub parts: usize,
    pub workers: usize,
    pub even: bool,
    pub pad: bool,
    /// Where the left-over rows start, between ranks and between a rank's workers (see
    /// [`cut`]): a part of a combined dataset carries on from the parts before it.
    pub first: (u64, u64),
}

impl Share {
    pub const WHOLE: Share = Share {
        part: 0,
        parts: 1,
        workers: 1,
        even: false,
        pad: false,
        first: (0, 0),
    };

    pub fn ranks(&self) -> u64 {
        (self.parts.max(1) / self.workers.max(1)).max(1) as u64
    }

    pub fn rank(&self) -> u64 {
        (self.part / self.workers.max(1)) as u64
    }

    pub fn worker(&self) -> u64 {
        (self.part % self.workers.max(1)) as u64
    }

    pub fn workers(&self) -> u64 {
        self.workers.max(1) as u64
    }

    /// Rows `[start, end)` of `total` that this part's rank reads (before any padding).
    pub fn rank_range(&self, total: u64) -> (u64, u64) {
        let (rank, ranks) = (self.rank(), self.ranks());
        if self.even {
            let each = total / ranks;
            (rank * each, (rank + 1) * each)
        } else {
            cut(total, ranks, rank, self.first.0)
        }
    }

    /// Rows this part's rank reads of `total`, padding included.
    pub fn rank_rows(&self, total: u64) -> u64 {
        let (start, end) = self.rank_range(total);
        if self.pad && !self.even && total > 0 {
            total.div_ceil(self.ranks())
        } else {
            end - start
        }
    }

    /// This part's rows of `list`: its worker's cut of its rank's share followed by the
    /// rank's padding (the first rows of the list again, until the rank has as many as
    /// the largest share). The second element is the padding.
    pub fn of(&self, list: &[Range<u64>]) -> (RowList, RowList) {
        let total = list_len(list);
        let (start, end) = self.rank_range(total);
        let mut rank_rows = sublist(list, start, end);
        let share = end - start;
        let mut missing = self.rank_rows(total) - share;
        // A dataset smaller than the number of ranks wraps around more than once.
        while missing > 0 {
            let n = missing.min(total);
            rank_rows.extend(sublist(list, 0, n));
            missing -= n;
        }
        let (from, to) = cut(
            list_len(&rank_rows),
            self.workers(),
            self.worker(),
            self.first.1,
        );
        (
            sublist(&rank_rows, from, to.min(share)),
            sublist(&rank_rows, from.max(share), to.max(share)),
        )
    }

    /// Rows this part reads of `total`, padding included.
    pub fn rows(&self, total: u64) -> u64 {
        cut_len(
            self.rank_rows(total),
            self.workers(),
            self.worker(),
            self.first.1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_positions_merge_to_the_set_of_them_dense_or_sparse() {
        use std::collections::BTreeSet;
        let mut rng = crate::pipeline::rng::Rng::new(3, 0, 0);
        // Spans per position from 1 (every row) to far past the bitmap's bound, with
        // repeats, runs across 64-bit words and a merge of a few positions.
        for (count, span) in [
            (5_000, 5_000),
            (MERGE_EVERY, 70_000),
            (MERGE_EVERY + 7, 1usize << 40),
            (3, 200),
            (4_096, 128),
            (200, 192),
            (130, 130),
        ] {
            let mut delivered = Delivered::new(RowSet::from_flat(&[0, 2]).unwrap());
            let mut model: BTreeSet<u64> = [0, 1].into();
            for batch in 0..count.div_ceil(256) {
                let n = 256.min(count - batch * 256);
                let positions: Vec<u64> =
                    (0..n).map(|_| 1_000 + (rng.below(span) as u64)).collect();
                model.extend(&positions);
                delivered.add(&positions);
            }
            let got = delivered.into_set();
            let want = RowSet::from_ranges(model.iter().map(|&p| p..p + 1));
            assert_eq!(
                got.to_flat(),
                want.to_flat(),
                "{count} positions over {span}"
            );
        }
    }

    #[test]
    fn insert_merges_overlapping_and_adjacent_ranges() {
        let mut s = RowSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25);
        s.insert(5..8);
        assert_eq!(s.to_flat(), vec![5, 8, 10, 25, 30, 40]);
        s.insert(7..31);
        assert_eq!(s.to_flat(), vec![5, 40]);
        s.insert_all(&[50, 51, 52, 60, 41, 40]);
        assert_eq!(s.to_flat(), vec![5, 42, 50, 53, 60, 61]);
        assert!(s.contains(41) && !s.contains(42) && s.contains(60) && !s.contains(4));
        assert_eq!(s.len(), 37 + 3 + 1);
    }

    #[test]
    fn difference_and_within() {
        let all = RowSet::from_ranges([0..100, 200..300]);
        let used = RowSet::from_ranges([0..10, 50..60, 95..210, 250..251]);
        let left = all.difference(&used);
        assert_eq!(left.to_flat(), vec![10, 50, 60, 95, 210, 250, 251, 300]);
        assert_eq!(
            left.len() + all.within(0..1000).difference(&left).len(),
            all.len()
        );
        assert_eq!(
            left.within(40..220).to_flat(),
            vec![40, 50, 60, 95, 210, 220]
        );
        assert_eq!(RowSet::from_flat(&left.to_flat()).unwrap(), left);
        assert!(RowSet::from_flat(&[1, 2, 3]).is_err());
    }

    #[test]
    fn cut_gives_left_overs_cyclically_from_first() {
        for total in 0..30u64 {
            for pieces in 1..7u64 {
                for first in 0..pieces {
                    let mut at = 0;
                    for piece in 0..pieces {
                        let (start, end) = cut(total, pieces, piece, first);
                        assert_eq!(start, at, "{total} {pieces} {piece} {first}");
                        let extra = (piece + pieces - first) % pieces < total % pieces;
                        assert_eq!(end - start, total / pieces + u64::from(extra));
                        at = end;
                    }
                    assert_eq!(at, total);
                }
            }
        }
        // Parts of a combination carry the left-overs on: 4 parts of 3 rows on 2 ranks.
        let mut per_rank = [0u64; 2];
        let mut first = 0;
        for _ in 0..4 {
            for (rank, rows) in per_rank.iter_mut().enumerate() {
                *rows += cut_len(3, 2, rank as u64, first);
            }
            first = (first + 3) % 2;
        }
        assert_eq!(per_rank, [6, 6]);
    }

    #[test]
    fn shares_cover_every_row_once_or_pad_ranks_evenly() {
        let list: RowList = vec![100..110, 0..3, 50..55];
        let expected: Vec<u64> = list.iter().cloned().flatten().collect();
        for ranks in 1..6usize {
            for workers in 1..4usize {
                let share = |part, even, pad| Share {
                    part,
                    parts: ranks * workers,
                    workers,
                    even,
                    pad,
                    first: (0, 0),
                };
                let mut seen = Vec::new();
                for part in 0..ranks * workers {
                    let (rows, pad) = share(part, false, false).of(&list);
                    assert!(pad.is_empty());
                    assert_eq!(list_len(&rows), share(part, false, false).rows(18));
                    seen.extend(rows.into_iter().flatten());
                }
                assert_eq!(seen, expected, "{ranks} x {workers}");
                for rank in 0..ranks {
                    // A rank's workers read its padded or even share between them.
                    let of_rank = |even, pad| -> (u64, u64) {
                        (0..workers)
                            .map(|w| {
                                let (rows, padding) =
                                    share(rank * workers + w, even, pad).of(&list);
                                (list_len(&rows), list_len(&padding))
                            })
                            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
                    };
                    let (rows, padding) = of_rank(false, true);
                    assert_eq!(rows + padding, 18u64.div_ceil(ranks as u64));
                    assert!(padding <= 1);
                    assert_eq!(of_rank(true, false), (18 / ranks as u64, 0));
                }
            }
        }
        // More ranks than rows: padding wraps around.
        let tiny: RowList = vec![0..2];
        let share = Share {
            part: 4,
            parts: 5,
            workers: 1,
            even: false,
            pad: true,
            first: (0, 0),
        };
        let (rows, pad) = share.of(&tiny);
        assert_eq!(list_len(&rows) + list_len(&pad), 1);
    }

    #[test]
    fn positions_ride_along_and_come_off() {
        let batch = RecordBatch::try_from_iter([(
            "x",
            Arc::new(arrow_array::Int32Array::from(vec![1, 2, 3])) as ArrayRef,
        )])
        .unwrap();
        let tagged = attach_run(batch.clone(), tag(2, 7)).unwrap();
        assert_eq!(tagged.num_columns(), 2);
        let (plain, positions) = detach(tagged);
        assert_eq!(plain, batch);
        assert_eq!(
            positions.unwrap().values().to_vec(),
            vec![tag(2, 7), tag(2, 8), tag(2, 9)]
        );
        assert!(detach(batch).1.is_none());
    }
}
