//! Reading a dataset: an epoch's stream of batches for one part, as `plan` divides it
//! (the head's decode tasks or index reads, then each op as a stage, then re-batching),
//! started on a pipeline thread; the schema seen on the first batch where the ops do not
//! declare it; and random access, with the ops that cannot be addressed read into memory
//! once.

use std::sync::Arc;

use arrow_schema::SchemaRef;

use super::batch::Rebatch;
use super::dataset::{Combined, DataSource, Dataset, Origin};
use super::decode::{self, UnitSlice};
use super::ops::{self, BatchTransform, Draws, Op};
use super::plan::{
    Head, HeadKind, PartRows, ROWS_SPLIT_NOT_ELASTIC, RunOptions, Split, rows_through, split_for,
    unit_slices,
};
use super::prefetch::{self, BatchReceiver};
use super::random_access::RandomAccess;
use super::rows::{self, RowList};
use super::stats::Stats;
use super::stream::{BatchIter, conform};
use super::{assemble, index_stream, own_thread, shuffle};
use crate::error::{Error, Result};
use crate::source::Io;

impl Dataset {
    /// The schema of the records this dataset yields: known from the ops where they
    /// declare it, otherwise seen on the first batch.
    pub fn schema(&self) -> Result<SchemaRef> {
        let mut schema = self.source_schema()?;
        for op in &self.ops {
            if let Op::Transform(t) = op {
                match t.output_schema(&schema) {
                    Some(next) => schema = next,
                    None => return self.first_batch_schema(),
                }
            }
        }
        Ok(schema)
    }

    pub(super) fn first_batch_schema(&self) -> Result<SchemaRef> {
        let first = |ds: &Dataset| -> Result<Option<SchemaRef>> {
            let mut stream = ds.stream(&RunOptions::default(), Arc::new(Stats::default()))?;
            stream.next().map(|b| b.map(|b| b.schema())).transpose()
        };
        if let Some(schema) = first(self)? {
            return Ok(schema);
        }
        // No rows reached the end. Only functions change columns: learn each one's
        // from the rows coming out of it; where none do, the function was never called
        // and the columns going in stay (as `datasets` keeps them for a map over no
        // rows).
        let mut schema = self.source_schema()?;
        for (i, op) in self.ops.iter().enumerate() {
            let Op::Transform(t) = op else { continue };
            if let Some(next) = t.output_schema(&schema) {
                schema = next;
                continue;
            }
            let through = Dataset {
                origin: self.origin.clone(),
                ops: self.ops[..=i].to_vec(),
            };
            if let Some(next) = first(&through)? {
                schema = next;
            }
        }
        Ok(schema)
    }

    /// Map-style access by row index, as in epoch `epoch` (see `RandomAccess`).
    pub fn random_access(&self, epoch: u64) -> Result<RandomAccess> {
        self.random_access_with(self.draws(epoch))
    }

    /// Map-style access with each op drawing for the epoch `draws` gives it: a prefix
    /// of the ops draws as the whole chain would (see [`Draws`]).
    pub(super) fn random_access_with(&self, draws: Draws) -> Result<RandomAccess> {
        // What random access cannot pass through (a flat_map or a batched map, which may
        // change the rows' number; a shuffle buffer; an interleave's draws) is read
        // into memory once per process, as `datasets` writes its result, and random
        // access goes on from there.
        if let Some(at) = self.ops.iter().position(|op| !op.keeps_rows_addressable()) {
            let read = self.materialized(Some(at), draws)?;
            let rest = Dataset {
                origin: read.origin,
                ops: self.ops[at + 1..].to_vec(),
            };
            return rest.random_access_with(draws.after(at + 1));
        }
        if matches!(&self.origin, Origin::Combined(c) if c.mix.is_some()) {
            let read = self.materialized(None, draws)?;
            return Dataset {
                origin: read.origin,
                ops: self.ops.clone(),
            }
            .random_access_with(draws);
        }
        let rows = match &self.origin {
            Origin::Files(source) => RandomAccess::files(self.indexed()?, source.io())?,
            Origin::Combined(c) if c.mix.is_none() => {
                let parts = c
                    .parts
                    .iter()
                    .map(|p| p.random_access(draws.origin()).map(Arc::new))
                    .collect::<Result<Vec<_>>>()?;
                RandomAccess::concat(parts, c.schema.clone())
            }
            Origin::Combined(_) => unreachable!("an interleave is read into memory above"),
        };
        let origin = Dataset {
            origin: self.origin.clone(),
            ops: Vec::new(),
        };
        rows.with_ops(&self.ops, draws, origin.fingerprint())
    }

    /// The rows of this dataset's origin and its ops up to `through` (none: the origin
    /// alone), read as one reader in the epoch `draws` gives them, as an in-memory
    /// dataset; kept for the process while the functions it ran live.
    pub(super) fn materialized(&self, through: Option<usize>, draws: Draws) -> Result<Dataset> {
        let ops = through.map_or(&[][..], |at| &self.ops[..=at]);
        let prefix = Dataset {
            origin: self.origin.clone(),
            ops: ops.to_vec(),
        };
        let epoch = through.map_or(draws.origin(), |at| draws.stage(at));
        let functions: Vec<Arc<dyn BatchTransform>> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Transform(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        // The origin and the functions by address too: in-memory data and functions
        // do not show in a fingerprint.
        let origin = materialized::Origin::of(&self.origin);
        let mut key = format!(
            "{}@{epoch}+{}{}",
            prefix.fingerprint(),
            draws.before(),
            origin.address()
        );
        for f in &functions {
            key.push_str(&format!("#{:p}", Arc::as_ptr(f)));
        }
        if let Some(read) = materialized::get(&key) {
            return Ok(read);
        }
        let run = RunOptions {
            epoch,
            stages_before: draws.before(),
            ..RunOptions::default()
        };
        let mut batches = Vec::new();
        for batch in prefix.stream(&run, Arc::new(Stats::default()))? {
            let (batch, _) = rows::detach(batch?);
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
        }
        let schema = match batches.first() {
            Some(first) => first.schema(),
            // No rows came out, so no function gave a schema: that of the rows going
            // in (as `datasets` keeps the features of a map over no rows).
            None => {
                let before = Dataset {
                    origin: self.origin.clone(),
                    ops: ops[..ops.len().saturating_sub(1)].to_vec(),
                };
                before
                    .schema()
                    .unwrap_or_else(|_| Arc::new(arrow_schema::Schema::empty()))
            }
        };
        let batches = batches
            .into_iter()
            .map(|b| conform(b, &schema))
            .collect::<Result<Vec<_>>>()?;
        let read = Dataset::from_batches(schema, batches, None);
        materialized::put(key, origin, &functions, read.clone());
        Ok(read)
    }

    /// The head's rows for part `run.part` of `run.parts`: `part`, the rows of the head it
    /// reads ([`Dataset::part_rows`], `None` where they are not known). `batch_rows`: the rows of the loader's batches, when the head's batches go to its
    /// re-batching unchanged (the decode tasks then cut them at its boundaries).
    pub(super) fn head_stream(
        &self,
        head: &Head,
        part: Option<PartRows>,
        run: &RunOptions,
        stats: &Arc<Stats>,
        batch_rows: Option<usize>,
    ) -> Result<BatchIter> {
        let leaf = run.track.then_some(run.leaf);
        Ok(match &head.kind {
            HeadKind::Units(prepared) => {
                stats.skipped_units.fetch_add(
                    prepared.skipped_shards,
                    std::sync::atomic::Ordering::Relaxed,
                );
                let order = self.unit_order(prepared, run.epoch);
                let planned = part.and_then(|part| {
                    // Behind a balanced filter, padding is counted where it is kept.
                    let share = match part.kept {
                        Some(_) => u64::MAX,
                        None => rows::list_len(&part.rows),
                    };
                    let all: RowList = part.rows.into_iter().chain(part.padding).collect();
                    Some((unit_slices(prepared, &order, &all, leaf)?, share))
                });
                let (slices, share) = match planned {
                    Some(planned) => planned,
                    // Rows unknown: whole units dealt round-robin, without positions.
                    None => {
                        if run.remaining.is_some() {
                            return Err(Error::Internal(
                                "resuming needs the rows of every unit".into(),
                            ));
                        }
                        let slices = order
                            .into_iter()
                            .enumerate()
                            .filter(|(i, _)| i % run.parts.max(1) == run.part)
                            .map(|(_, unit)| UnitSlice {
                                unit,
                                skip: 0,
                                take: None,
                                position: None,
                            })
                            .collect();
                        (slices, u64::MAX)
                    }
                };
                let source = self.files()?;
                let io = Io {
                    storage: source.storage.clone(),
                    counters: stats.io.clone(),
                };
                let decoder = decode::UnitDecoder::new(
                    prepared.clone(),
                    slices,
                    run.tuning.clone(),
                    source.options.on_error,
                    io,
                    stats.clone(),
                    run.cancel.clone(),
                )?
                .cutting_at(batch_rows);
                Box::new(ops::Padding::new(Box::new(decoder), share, stats.clone()))
            }
            HeadKind::Indexed(access) => {
                let part =
                    part.ok_or_else(|| Error::Internal("an indexed head knows its rows".into()))?;
                // Behind a balanced filter, padding is counted where it is kept.
                let share = match part.kept {
                    Some(_) => u64::MAX,
                    None => rows::list_len(&part.rows),
                };
                let all = part.rows.into_iter().chain(part.padding).collect();
                access.bound_memory(run.tuning.memory_limit);
                let stream = index_stream::IndexStream::new(
                    access.clone(),
                    all,
                    leaf,
                    &run.tuning,
                    batch_rows,
                    stats.clone(),
                )
                .viewing(run.byte_views);
                Box::new(ops::Padding::new(Box::new(stream), share, stats.clone()))
            }
            HeadKind::Combined(c) => c.stream(run, self.draws(run.epoch), stats)?,
        })
    }

    /// Builds this epoch's stream of batches. Runs on the pipeline thread.
    pub fn stream(&self, run: &RunOptions, stats: Arc<Stats>) -> Result<BatchIter> {
        // A function taking row indices learns them from the rows' positions.
        let indexed = self.takes_indices();
        if indexed && !run.track {
            let tracked = RunOptions {
                track: true,
                ..run.clone()
            };
            let stream = self.stream(&tracked, stats)?;
            return Ok(Box::new(stream.map(|b| b.map(|b| rows::detach(b).0))));
        }
        let head = self.head(run.epoch, run.count_rows)?;
        let draws = self.draws(run.epoch).placed_at(run.stages_before);
        let ops = &self.ops[head.rest..];
        // Binary values stay views of their sources only where no op after the head
        // looks into the rows.
        let without_views;
        let run = if run.byte_views && ops.iter().any(|op| matches!(op, Op::Transform(_))) {
            without_views = RunOptions {
                byte_views: false,
                ..run.clone()
            };
            &without_views
        } else {
            run
        };
        let split = split_for(self, &head, run)?;
        // The rows of the head a reader of `run` reads (a combination plans its own).
        let part_of = |run: &RunOptions| -> Result<Option<PartRows>> {
            match head.kind {
                HeadKind::Combined(_) => Ok(None),
                _ => self.part_rows(&head, &split, run),
            }
        };
        // Rows of this part's stream to pass over (resuming), where the head does not.
        let mut skip_rows = run.skip_rows;
        // Behind a filter balanced by its pass, the rows it keeps past the part's share
        // are its padding.
        let (mut stream, kept) = match &split {
            Split::Rows { .. } => {
                if run.remaining.is_some() && indexed {
                    return Err(Error::invalid_argument(ROWS_SPLIT_NOT_ELASTIC));
                }
                // Every part reads the whole epoch up to the last take/skip, then keeps
                // its own rows of it (so positions of the head mean nothing after, but
                // to a function taking row indices: the dealing numbers the rows anew).
                let whole = RunOptions {
                    track: indexed,
                    remaining: None,
                    ..run.whole()
                };
                let window = window_after(ops, |_, _| false);
                (
                    self.head_stream(&head, part_of(&whole)?, &whole, &stats, window)?,
                    None,
                )
            }
            Split::Units | Split::Window { .. } => {
                // The head's batches go straight to re-batching when every op after the
                // head is a take/skip that the head's plan already applied.
                let applied = ops.iter().enumerate().all(|(i, op)| split.applies(i, op));
                let mut part = part_of(run)?;
                // Resuming, an indexed head whose rows are the part's, one for one, leaves
                // out the rows delivered before rather than reading them to pass over (a
                // spill then writes only the rest).
                if let (true, HeadKind::Indexed(_), Some(part)) = (applied, &head.kind, &mut part)
                    && part.kept.is_none()
                    && skip_rows > 0
                {
                    let rows = rows::list_len(&part.rows);
                    part.rows = rows::sublist(&part.rows, skip_rows, u64::MAX);
                    part.padding =
                        rows::sublist(&part.padding, skip_rows.saturating_sub(rows), u64::MAX);
                    skip_rows = 0;
                }
                let batch_rows = match applied && skip_rows == 0 {
                    true => run.batch_rows,
                    false => window_after(ops, |i, op| split.applies(i, op)),
                };
                let kept = part.as_ref().and_then(|part| part.kept);
                (
                    self.head_stream(&head, part, run, &stats, batch_rows)?,
                    kept,
                )
            }
        };
        // This part's rows of the whole stream so far (`Split::Rows`), of `global` rows
        // where known.
        // Rows dealt are numbered by their place in the whole stream, so that a state
        // says which it delivered (a function taking row indices keeps the head's).
        let positioned = (run.track || run.remaining.is_some()) && !indexed;
        let dealt = |stream: BatchIter, global: Option<u64>| -> BatchIter {
            if run.parts <= 1 && !positioned {
                return stream;
            }
            let share = run.share();
            let mut deal = ops::Deal::new(stream, share);
            // Of the rows still to read, how many is known only once they are dealt.
            let global = global.filter(|_| run.remaining.is_none());
            if positioned {
                deal = deal.tracking(run.remaining.clone());
            }
            if run.drop_last {
                deal = deal.whole_rounds(global);
            } else if run.pad {
                deal = deal.padded_to(global.map(|rows| share.rank_rows(rows)), stats.clone());
            }
            Box::new(deal)
        };
        if let Split::Rows { after: 0 } = split {
            stream = dealt(stream, head.rows);
        }
        let batch_threads =
            assemble::BatchThreads::new(run.tuning.threads, stats.clone(), run.cancel.clone());
        for (i, op) in ops.iter().enumerate() {
            let stage = head.rest + i;
            if split.applies(i, op) {
                continue;
            }
            stream = match op {
                Op::Shuffle { seed, buffer } => {
                    let mut shuffle = shuffle::ShuffleBuffer::new(
                        stream,
                        draws.rng(*seed, stage),
                        *buffer,
                        stats.clone(),
                    );
                    Box::new(own_thread::OwnThread::spawn(
                        "shardflow-shuffle",
                        move || shuffle.next_step(),
                        batch_threads.clone(),
                        stats.clone(),
                        |stats| &stats.shuffle_cpu_ns,
                        run.cancel.clone(),
                    ))
                }
                Op::Take(n) => Box::new(ops::Take::new(stream, *n)),
                Op::Skip(n) => Box::new(ops::Skip::new(stream, *n)),
                Op::Transform(t) if t.parallel() => Box::new(ops::TransformedOnThreads::new(
                    stream,
                    t.clone(),
                    batch_threads.clone(),
                    stats.clone(),
                )),
                Op::Transform(t) => {
                    Box::new(ops::Transformed::new(stream, t.clone(), stats.clone()))
                }
                Op::Permute { .. } | Op::Select(_) | Op::Sample { .. } => {
                    return Err(Error::Internal(format!("{op:?} after the indexed head")));
                }
            };
            if let Some(kept) = kept
                && i == kept.after
            {
                stream = Box::new(ops::Padding::new(stream, kept.share, stats.clone()));
            }
            if let Split::Rows { after } = split
                && i + 1 == after
            {
                stream = dealt(stream, rows_through(head.rows, &ops[..after]));
            }
        }
        if skip_rows > 0 {
            stream = Box::new(ops::Skip::new(stream, skip_rows));
        }
        if let Some(rows) = run.batch_rows {
            stream = Box::new(Rebatch::new(stream, rows, run.drop_last).joining_on(batch_threads));
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
        let ds = self.clone();
        let cancel = run.cancel.clone();
        prefetch::spawn(run.tuning.clone(), stats.clone(), cancel, move || {
            ds.stream(&run, stats)
        })
    }
}

/// Datasets read into memory for random access (see `Dataset::materialized`), by what
/// they were read from; an entry counts only while the functions it ran live (the key
/// names them by address).
mod materialized {
    use std::sync::{Arc, Mutex, Weak};

    use super::{BatchTransform, Combined, DataSource, Dataset};

    /// Datasets kept, the latest last: each holds its rows in memory.
    const KEPT: usize = 8;

    /// What a dataset was read from, held weakly: an entry counts while it lives.
    pub enum Origin {
        Files(Weak<DataSource>),
        Combined(Weak<Combined>),
    }

    impl Origin {
        pub fn of(origin: &super::Origin) -> Self {
            match origin {
                super::Origin::Files(f) => Origin::Files(Arc::downgrade(f)),
                super::Origin::Combined(c) => Origin::Combined(Arc::downgrade(c)),
            }
        }

        pub fn address(&self) -> String {
            match self {
                Origin::Files(f) => format!("@{:p}", f.as_ptr()),
                Origin::Combined(c) => format!("@{:p}", c.as_ptr()),
            }
        }

        fn lives(&self) -> bool {
            match self {
                Origin::Files(f) => f.strong_count() > 0,
                Origin::Combined(c) => c.strong_count() > 0,
            }
        }
    }

    type Entry = (String, Origin, Vec<Weak<dyn BatchTransform>>, Dataset);

    static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    pub fn get(key: &str) -> Option<Dataset> {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(_, origin, functions, _)| {
            origin.lives() && functions.iter().all(|f| f.strong_count() > 0)
        });
        let at = cache.iter().position(|(k, ..)| k == key)?;
        let entry = cache.remove(at);
        let read = entry.3.clone();
        cache.push(entry);
        Some(read)
    }

    pub fn put(key: String, origin: Origin, functions: &[Arc<dyn BatchTransform>], read: Dataset) {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= KEPT {
            cache.remove(0);
        }
        cache.push((
            key,
            origin,
            functions.iter().map(Arc::downgrade).collect(),
            read,
        ));
    }
}

/// The rows of the windows that the first of `ops` not `applied` by the head's plan
/// re-batches the head's batches into (a pack's, a batched map's), where it is such an op.
fn window_after(ops: &[Op], applied: impl Fn(usize, &Op) -> bool) -> Option<usize> {
    match ops.iter().enumerate().find(|(i, op)| !applied(*i, op))? {
        (_, Op::Transform(t)) => t.batch_rows(),
        _ => None,
    }
}
