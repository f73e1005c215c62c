//! Equal shares behind a filter or flat_map. A part that runs a filter on its own share
//! learns how many rows it keeps only as it runs, and the ranks of a DDP job must take
//! as many steps (a rank that runs out first leaves the others waiting for it). So where
//! a reading pads or trims its ranks to equal (`pad` or `drop_last`, on several ranks):
//! - **Filters** (and row-preserving maps before them) over files with known rows (read
//!   by units or by index) are run once over the rows, as random access after a filter runs them (once per process,
//!   then remembered for every epoch, loader and dataset made from the same filter). The
//!   epoch is then divided by the rows the filters keep: each rank's run of the epoch
//!   ends where its share of the kept rows does, so every rank keeps as many rows, give
//!   or take one, and padding and `drop_last` work on kept rows as on any other.
//!   Cost: one extra pass of the filter over the data in each process, and 8 bytes per
//!   kept row.
//! - **Anything else that changes the number of rows** (a flat_map, a batched map, a
//!   filter taking row indices, a filter over a combined dataset, a filter after a take/skip
//!   that follows one) is
//!   dealt: every part reads the epoch through that op and keeps every `parts`-th row of
//!   it, as after a take/skip behind a filter ([`Split::Rows`]). Cost: every part reads
//!   and runs the op over the whole epoch.

use std::ops::Range;

use super::dataset::{Dataset, Origin};
use super::ops::Op;
use super::plan::{Head, HeadKind, RunOptions, Split, split};
use super::rows::{self, RowList};
use crate::error::Result;
use crate::format::PreparedShards;

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
/// split. `None` when something else changes the rows' number, or nothing does.
fn filter_pass(ds: &Dataset, head: &Head, split: &Split) -> Option<Vec<Op>> {
    let (before, ops) = ds.ops.split_at(head.rest);
    let last = last_row_change(ops, split)?;
    // Rows numbered in the origin's order, the same in every epoch: files, or a
    // concatenation of datasets read by index (not a mix, which draws anew).
    let origin = match &ds.origin {
        Origin::Files(_) => true,
        Origin::Combined(c) => c.mix.is_none() && c.parts.iter().all(Dataset::addressable),
    };
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
    Some(pass)
}

/// Where `run`'s epoch is split between its parts (see [`split`]): where ranks must
/// stay equal, an op after the split that changes the rows' number and that no filter
/// pass can balance is dealt (the split moves to just after it).
pub(super) fn split_for(ds: &Dataset, head: &Head, run: &RunOptions) -> Split {
    let ops = &ds.ops[head.rest..];
    let split = split(head, ops);
    if !equalizes(run) {
        return split;
    }
    match last_row_change(ops, &split) {
        Some(last)
            if matches!(split, Split::Rows { .. }) || filter_pass(ds, head, &split).is_none() =>
        {
            Split::Rows { after: last + 1 }
        }
        _ => split,
    }
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
        let ops = &self.ops[head.rest..];
        if !equalizes(run) || matches!(split, Split::Rows { .. }) {
            return Ok(None);
        }
        let Some(pass) = filter_pass(self, head, split) else {
            return Ok(None);
        };
        let after = last_row_change(ops, split).expect("a filter pass has a last filter");
        let through = Dataset {
            origin: self.origin.clone(),
            ops: pass,
        };
        // The origin's rows the filters keep, ascending.
        let kept = through.random_access(0)?.source_rows();
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

#[cfg(test)]
mod tests {
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
