//! WHAT order and shape records arrive in: the dataset description (shards, format,
//! chained ops), the epoch plan, and the stages that run on the pipeline thread.

mod assemble;
mod autotune;
mod batch;
mod combine;
mod decode;
pub mod ops;
mod own_thread;
mod prefetch;
mod random_access;
pub mod rng;
pub mod rows;
mod shuffle;
pub mod stats;

use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::format::{self, Format, PreparedShards, ReadOptions};
use crate::source::{self, Io, IoCounters, ShardMeta, Storage};
pub use autotune::{DEFAULT_MEMORY_LIMIT, Tuning};
pub use batch::Rebatch;
use decode::UnitSlice;
pub use ops::{BatchTransform, Batches, BufferBounds, Columns, Draws, Indices, Op, Weights};
pub use prefetch::{BatchReceiver, Received};
pub use random_access::RandomAccess;
use rng::Rng;
pub use rows::{RowList, RowSet, Share};
pub use stats::{Stats, StatsSnapshot};

pub type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

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
    prepared: Mutex<Option<(Arc<PreparedShards>, Arc<PreparedShards>)>>,
    /// The same with every shard's record index, built when first needed.
    indexed: Mutex<Option<Arc<PreparedShards>>>,
    /// Where remote shards are read from, shared by every loader of the dataset.
    storage: Arc<Storage>,
    /// I/O done while preparing (not part of any loader's stats).
    counters: Arc<IoCounters>,
}

impl DataSource {
    fn new(
        shards: Vec<ShardMeta>,
        format: Arc<dyn Format>,
        options: ReadOptions,
        storage: Arc<Storage>,
    ) -> Arc<Self> {
        Arc::new(Self {
            shards,
            format,
            options,
            prepared: Mutex::new(None),
            indexed: Mutex::new(None),
            storage,
            counters: Arc::default(),
        })
    }

    fn io(&self) -> Io {
        Io {
            storage: self.storage.clone(),
            counters: self.counters.clone(),
        }
    }
}

/// Datasets read one after another (`concatenate`) or mixed row by row (`interleave`),
/// as one schema.
pub struct Combined {
    parts: Vec<Dataset>,
    schema: SchemaRef,
    /// For `interleave`: how rows are drawn from the parts.
    mix: Option<Mix>,
}

#[derive(Debug, Clone)]
pub struct Mix {
    /// Relative weights of the parts; `None` takes one row from each in turn.
    pub weights: Option<Vec<f64>>,
    pub seed: u64,
    pub stopping: Stopping,
}

/// When an interleaving ends (the names are Hugging Face `datasets`').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopping {
    /// When the first part runs out.
    FirstExhausted,
    /// When every part has run out once; parts that end early start over.
    AllExhausted,
    /// When every part has run out; a part that ends is no longer drawn, so every row
    /// of every part comes exactly once.
    AllWithoutReplacement,
}

/// Where a dataset's rows come from before its own ops.
#[derive(Clone)]
enum Origin {
    Files(Arc<DataSource>),
    Combined(Arc<Combined>),
}

/// An immutable description of a dataset: where its rows come from and the ops chained
/// onto them.
#[derive(Clone)]
pub struct Dataset {
    origin: Origin,
    ops: Vec<Op>,
}

/// Where an epoch's rows start: the source's units, or (for `select` and a
/// full-permutation `shuffle`) rows fetched by index; `rest` is where the ops run as a
/// stream begin.
struct Head {
    kind: HeadKind,
    rows: Option<u64>,
    rest: usize,
}

enum HeadKind {
    Units(Arc<PreparedShards>),
    Indexed(Arc<RandomAccess>),
    Combined(Arc<Combined>),
}

/// How one reader reads a combined dataset in an epoch (see [`Combined::plan`]).
struct Plan {
    /// The reader's share of each part.
    shares: Vec<Share>,
    /// Rows the reader reads from the parts, and rows it delivers after its stream is
    /// cut or padded to what every reader delivers; `None` when a part's rows are not
    /// known.
    rows: Option<(u64, u64)>,
}

impl Combined {
    /// How part `i` is read within `run` of the combination, whose ops draw as `outer`:
    /// as `share` of it, its positions numbered from its first leaf, not batched, in the
    /// epoch the combination's origin draws for.
    fn part_run(&self, i: usize, run: &RunOptions, outer: Draws, share: Share) -> RunOptions {
        let leaf = run.leaf + self.parts[..i].iter().map(Dataset::leaves).sum::<u64>();
        RunOptions {
            leaf,
            epoch: outer.origin(),
            batch_rows: None,
            skip_rows: 0,
            part: share.part,
            parts: share.parts,
            workers: share.workers,
            drop_last: share.even,
            pad: share.pad,
            first: share.first,
            ..run.clone()
        }
    }

    /// Every part's rows in `run`'s epoch (all readers' together), when known.
    fn part_counts(&self, run: &RunOptions, outer: Draws) -> Result<Option<Vec<u64>>> {
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
    fn plan(&self, run: &RunOptions, outer: Draws, mixed_lengths: bool) -> Result<Plan> {
        let share = run.share();
        let Some(counts) = self.part_counts(run, outer)? else {
            // Rows unknown: every row once, but readers' counts may differ.
            let plain = Share {
                pad: false,
                even: false,
                ..share
            };
            return Ok(Plan {
                shares: vec![plain; self.parts.len()],
                rows: None,
            });
        };
        let shares = part_shares(share, &counts);
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
                        Ok((combine::mixed_rows(&held, mix, rng)?, held))
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
        Ok(Plan { shares, rows })
    }

    /// The combination's rows for `run`'s reader (see [`Combined::plan`]).
    fn stream(
        self: &Arc<Self>,
        run: &RunOptions,
        outer: Draws,
        stats: &Arc<Stats>,
    ) -> Result<BatchIter> {
        // A single reader's mixing ends as its strategy says: no length to share.
        let plan = self.plan(run, outer, run.parts > 1)?;
        let open: combine::Open = {
            let (c, stats, run, shares) = (
                self.clone(),
                stats.clone(),
                run.clone(),
                plan.shares.clone(),
            );
            Box::new(move |i| {
                let stream =
                    c.parts[i].stream(&c.part_run(i, &run, outer, shares[i]), stats.clone())?;
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
            None => Box::new(combine::Chain::new(open, self.parts.len())),
            Some(mix) => {
                // One reader's mixing ends as its strategy says; several share a length.
                let replaces = mix.stopping != Stopping::AllWithoutReplacement;
                let target = plan
                    .rows
                    .filter(|_| replaces && run.parts > 1)
                    .map(|(_, target)| target);
                let mixer = combine::Mixer::new(
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
    fn planned_rows(&self, run: &RunOptions, outer: Draws) -> Result<RowList> {
        let plan = self.plan(run, outer, false)?;
        let mut all = Vec::new();
        for i in 0..self.parts.len() {
            all.extend(self.parts[i].planned_rows(&self.part_run(
                i,
                run,
                outer,
                plan.shares[i],
            ))?);
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

/// `share` of each of the parts of a combination holding `counts` rows: each part's
/// left-over rows go to the ranks (and workers) after the previous part's.
/// Reads shards as `write` made them: with the manifest's format options, which say what
/// the data means (NPZ's `mode`), beside the user's (a user value that contradicts one
/// is an error, not a different dataset); and, where the format infers its columns (JSON
/// Lines, TFRecord, WebDataset), with the written columns, so a column null in the first
/// lines (or in every sample), a one-value list or the order of the columns comes back
/// as written.
fn read_as_written(manifest: &source::manifest::Manifest, options: &mut ReadOptions) -> Result<()> {
    let written = crate::options::Options::from_json(&manifest.format_options)?;
    for (key, value) in written.0 {
        match options.format_options.0.get(&key) {
            Some(given) if *given != value => {
                return Err(Error::invalid_argument(format!(
                    "format_options[{key:?}] is {}, but these shards were written to be read with \
                     {key} = {} (see their {})",
                    given,
                    value,
                    source::manifest::MANIFEST_NAME
                )));
            }
            _ => {
                options.format_options.0.insert(key, value);
            }
        }
    }
    if manifest.columns.is_empty() || options.schema.is_some() || options.features.is_some() {
        return Ok(());
    }
    let columns = manifest
        .columns
        .iter()
        .map(|(name, type_name)| {
            let data_type = type_name.parse::<arrow_schema::DataType>().map_err(|e| {
                Error::invalid_argument(format!(
                    "{}: column {name:?} has type {type_name:?}, which this build cannot parse: {e}",
                    source::manifest::MANIFEST_NAME
                ))
            })?;
            Ok((name.as_str(), data_type))
        })
        .collect::<Result<Vec<_>>>()?;
    match manifest.format.as_str() {
        "jsonl" => {
            let fields: Vec<_> = columns
                .into_iter()
                .map(|(name, data_type)| arrow_schema::Field::new(name, data_type, true))
                .collect();
            options.schema = Some(Arc::new(arrow_schema::Schema::new(fields)));
        }
        // A field null in every sample of the shards read has no member to find it by.
        "webdataset" if options.columns.is_none() => {
            let mut names = vec!["__key__".to_string(), "__url__".to_string()];
            for (name, _) in columns {
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
            options.columns = Some(names);
        }
        // An Example keeps no column order and cannot tell a one-value list from a
        // scalar: the written types say both.
        "tfrecord" => {
            options.features = columns
                .into_iter()
                .map(|(name, data_type)| written_feature(name, &data_type))
                .collect();
        }
        _ => {}
    }
    Ok(())
}

/// How a column written to TFRecord as `data_type` reads back (`None`: a type the writer
/// would not have taken).
fn written_feature(
    name: &str,
    data_type: &arrow_schema::DataType,
) -> Option<format::example::FeatureSpec> {
    use arrow_schema::DataType as T;
    use format::example::{FeatureSpec, Kind, Missing, Shape};
    let kind = |t: &T| match t {
        T::Boolean | T::Int8 | T::Int16 | T::Int32 | T::Int64 => Some(Kind::Int64),
        T::UInt8 | T::UInt16 | T::UInt32 | T::UInt64 => Some(Kind::Int64),
        T::Float16 | T::Float32 | T::Float64 => Some(Kind::Float),
        T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_) => Some(Kind::Bytes),
        T::Utf8 | T::LargeUtf8 | T::Utf8View => Some(Kind::Bytes),
        _ => None,
    };
    let (kind, shape) = match data_type {
        T::List(item) | T::LargeList(item) => (kind(item.data_type())?, Shape::Var),
        T::FixedSizeList(item, n) => (kind(item.data_type())?, Shape::Fixed(vec![*n as usize])),
        scalar => (kind(scalar)?, Shape::Fixed(vec![])),
    };
    Some(FeatureSpec {
        name: name.to_string(),
        kind,
        shape,
        // The writer leaves a null out of its Example.
        missing: Missing::Null,
    })
}

/// The files the user named (brace ranges expanded), as a listing reports them: a shard
/// whose URL is not among them was found by listing a directory, a prefix or a glob.
fn named_files(specs: &[String]) -> Result<std::collections::HashSet<String>> {
    let mut named = std::collections::HashSet::new();
    for spec in specs {
        for expanded in source::pattern::expand_braces(spec.trim())? {
            named.insert(
                source::local_path(&expanded)
                    .unwrap_or(&expanded)
                    .to_string(),
            );
        }
    }
    Ok(named)
}

fn part_shares(share: Share, counts: &[u64]) -> Vec<Share> {
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

impl Dataset {
    /// Resolves the shard list now, so a missing file or an empty glob fails here. A
    /// directory or prefix that `write` made is listed from its manifest (see
    /// [`source::manifest`]).
    pub fn open(
        specs: &[String],
        format: Option<&str>,
        options: ReadOptions,
        storage: Arc<Storage>,
    ) -> Result<Self> {
        Self::open_listed(specs, None, format, options, storage)
    }

    /// [`Dataset::open`], where `listing` (if any) is the shard list made earlier from
    /// `specs` (by another process: a pickled dataset's), used instead of listing again.
    pub fn open_listed(
        specs: &[String],
        listing: Option<Vec<ShardMeta>>,
        format: Option<&str>,
        mut options: ReadOptions,
        storage: Arc<Storage>,
    ) -> Result<Self> {
        let manifest = match (specs, &listing) {
            ([spec], None) => source::manifest::find(spec, &storage)?,
            _ => None,
        };
        let mut shards = match (&manifest, listing) {
            (Some(m), _) => source::manifest::shards(&specs[0], m, &storage)?,
            (None, Some(listing)) => listing,
            (None, None) => source::resolve(specs, &storage)?,
        };
        let name = match &manifest {
            Some(m) => format.unwrap_or(&m.format),
            None => {
                let named = named_files(specs)?;
                let (name, kept) = format::choose(shards, format, |url| named.contains(url))?;
                shards = kept;
                name
            }
        };
        if name == "json" {
            let io = Io {
                storage: storage.clone(),
                counters: Default::default(),
            };
            if let Some((schema, batches)) = format::jsonl::json_arrays(&shards, &options, &io)? {
                return Ok(Dataset::from_batches(schema, batches, options.columns));
            }
        }
        let format = format::by_name(name)?;
        options.images =
            format::image::ImageSpec::take(format.name(), &mut options.format_options)?;
        if let Some(m) = &manifest {
            if format.name() == m.format {
                read_as_written(m, &mut options)?;
            } else {
                // Read as another format: the manifest's row counts do not hold.
                shards.iter_mut().for_each(|s| s.rows = None);
            }
        }
        Ok(Self {
            origin: Origin::Files(DataSource::new(shards, format, options, storage)),
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
        let options = ReadOptions {
            columns,
            ..ReadOptions::default()
        };
        Self {
            origin: Origin::Files(DataSource::new(
                shards,
                Arc::new(format),
                options,
                Storage::local_only(),
            )),
            ops: Vec::new(),
        }
    }

    /// The rows of `parts` one after another (`mix: None`), or drawn from them row by
    /// row. Their schemas must be equal or unify (see [`unify_schemas`]).
    pub fn combine(parts: Vec<Dataset>, mix: Option<Mix>) -> Result<Self> {
        if parts.is_empty() {
            return Err(Error::invalid_argument("no datasets given"));
        }
        if let Some(Some(weights)) = mix.as_ref().map(|m| &m.weights) {
            if weights.len() != parts.len() {
                return Err(Error::invalid_argument(format!(
                    "{} probabilities for {} datasets",
                    weights.len(),
                    parts.len()
                )));
            }
            if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
                return Err(Error::invalid_argument(
                    "probabilities must be non-negative numbers",
                ));
            }
            // As `datasets` (numpy's `choice`) checks them: never normalised silently.
            let sum: f64 = weights.iter().sum();
            if (sum - 1.0).abs() > 1e-6 {
                return Err(Error::invalid_argument(format!(
                    "probabilities must sum to 1, not {sum}"
                )));
            }
        }
        if let Some(mix) = mix
            .as_ref()
            .filter(|m| m.stopping != Stopping::FirstExhausted)
        {
            // Under these strategies every dataset must run out for the mixing to end:
            // one that is never drawn would make it endless (all_exhausted) or lose its
            // rows (without replacement). `datasets` refuses both.
            let strategy = match mix.stopping {
                Stopping::AllExhausted => "all_exhausted",
                _ => "all_exhausted_without_replacement",
            };
            if let Some(i) = mix
                .weights
                .as_ref()
                .and_then(|w| w.iter().position(|&w| w == 0.0))
            {
                return Err(Error::invalid_argument(format!(
                    "dataset {i} has probability 0, so stopping_strategy={strategy:?} would never \
                     draw it; remove it or give it a probability"
                )));
            }
            // Counted as `len()` counts them (a stream format's record index, which
            // dividing the epoch between ranks builds anyway).
            for (i, part) in parts.iter().enumerate() {
                if part.len()? == Some(0) {
                    return Err(Error::invalid_argument(format!(
                        "dataset {i} is empty, so stopping_strategy={strategy:?} cannot run it out; \
                         leave it out"
                    )));
                }
            }
        }
        let schemas = parts
            .iter()
            .map(Dataset::schema)
            .collect::<Result<Vec<_>>>()?;
        let schema = unify_schemas(&schemas)?;
        Ok(Self {
            origin: Origin::Combined(Arc::new(Combined { parts, schema, mix })),
            ops: Vec::new(),
        })
    }

    /// The format's name; for combined datasets, their parts' if they share one.
    pub fn format_name(&self) -> &'static str {
        match &self.origin {
            Origin::Files(source) => source.format.name(),
            Origin::Combined(c) => {
                let first = c.parts[0].format_name();
                if c.parts.iter().all(|p| p.format_name() == first) {
                    first
                } else {
                    "mixed"
                }
            }
        }
    }

    pub fn shards(&self) -> Vec<ShardMeta> {
        match &self.origin {
            Origin::Files(source) => source.shards.clone(),
            Origin::Combined(c) => c.parts.iter().flat_map(Dataset::shards).collect(),
        }
    }

    /// Rows in each shard of [`Dataset::shards`], where metadata or a manifest tells
    /// them without reading the data (a shard's units all know theirs).
    pub fn shard_rows(&self) -> Result<Vec<Option<u64>>> {
        match &self.origin {
            Origin::Files(_) => {
                let prepared = self.prepared()?;
                let mut rows = vec![Some(0u64); prepared.shards.len()];
                for unit in &prepared.units {
                    rows[unit.shard] = rows[unit.shard].zip(unit.rows).map(|(a, b)| a + b);
                }
                // Shards that preparing skipped as unreadable are not in `prepared`.
                Ok(self
                    .shards()
                    .iter()
                    .map(|s| {
                        let i = prepared.shards.iter().position(|p| p.url == s.url)?;
                        rows[i]
                    })
                    .collect())
            }
            Origin::Combined(c) => Ok(c
                .parts
                .iter()
                .map(Dataset::shard_rows)
                .collect::<Result<Vec<_>>>()?
                .concat()),
        }
    }

    /// Where the dataset's files are read from; `None` for combined datasets.
    pub fn storage(&self) -> Option<Arc<Storage>> {
        match &self.origin {
            Origin::Files(source) => Some(source.storage.clone()),
            Origin::Combined(_) => None,
        }
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Whether reading it runs Python code: a `map`, `filter` or `flat_map` here or in a
    /// dataset it combines.
    pub fn runs_python(&self) -> bool {
        let here = self.ops.iter().any(|op| match op {
            Op::Transform(t) => t.runs_python(),
            _ => false,
        });
        here || match &self.origin {
            Origin::Files(_) => false,
            Origin::Combined(c) => c.parts.iter().any(Dataset::runs_python),
        }
    }

    pub fn with_op(&self, op: Op) -> Self {
        let mut ds = self.clone();
        ds.ops.push(op);
        ds
    }

    /// The same files read with `columns=` (only the named columns decoded), when this
    /// dataset is a plain file source whose format projects: `select_columns` pushed down.
    pub fn with_columns(&self, columns: &[String]) -> Option<Self> {
        let Origin::Files(source) = &self.origin else {
            return None;
        };
        let projects = matches!(source.format.name(), "parquet" | "arrow" | "jsonl" | "csv");
        if !self.ops.is_empty() || !projects || source.options.schema.is_some() {
            return None;
        }
        if let Some(current) = &source.options.columns
            && !columns.iter().all(|c| current.contains(c))
        {
            return None;
        }
        let options = ReadOptions {
            columns: Some(columns.to_vec()),
            ..source.options.clone()
        };
        Some(Self {
            origin: Origin::Files(DataSource::new(
                source.shards.clone(),
                source.format.clone(),
                options,
                source.storage.clone(),
            )),
            ops: Vec::new(),
        })
    }

    /// A digest of what the dataset's records are: the shards (URL, size, ETag), the
    /// format and its options, and the ops with their seeds. A saved loader state names
    /// it, so that it is never resumed over other data.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        match &self.origin {
            Origin::Files(source) => {
                hash.update(source.format.name());
                for shard in &source.shards {
                    hash.update(format!(
                        "\0{}\0{:?}\0{:?}",
                        shard.url, shard.size, shard.etag
                    ));
                }
                hash.update(format!("\0{:?}", source.options));
            }
            Origin::Combined(c) => {
                hash.update(format!("combined {:?}", c.mix));
                for part in &c.parts {
                    hash.update(format!("\0{}", part.fingerprint()));
                }
            }
        }
        for op in &self.ops {
            hash.update(format!("\0{op:?}"));
        }
        let digest = hash.finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn files(&self) -> Result<&Arc<DataSource>> {
        match &self.origin {
            Origin::Files(source) => Ok(source),
            Origin::Combined(_) => Err(Error::invalid_argument(
                "a concatenated or interleaved dataset has no single source",
            )),
        }
    }

    /// Reads footers / infers the schema once; a failure is returned and retried next
    /// time. The lock is not held while preparing: that is network I/O for remote data,
    /// and a `fork()` meanwhile would leave the child a lock nobody releases. Callers that
    /// race each prepare, and all keep the first result stored.
    pub fn prepared(&self) -> Result<Arc<PreparedShards>> {
        Ok(self.prepared_pair()?.1)
    }

    /// The format's own prepared shards (`plain`, which record indexes are built from)
    /// and the same as read (with image columns decoded, when asked), prepared once.
    fn prepared_pair(&self) -> Result<(Arc<PreparedShards>, Arc<PreparedShards>)> {
        let source = self.files()?;
        if let Some(pair) = lock(&source.prepared).as_ref() {
            return Ok(pair.clone());
        }
        // Footers, headers and schema inference parse untrusted bytes: a panic there is
        // a bug, reported as an error rather than unwinding into Python.
        let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            source
                .format
                .prepare(source.shards.clone(), &source.options, &source.io())
        }))
        .map_err(|panic| {
            Error::Internal(format!(
                "preparing the {} shards failed: {}",
                source.format.name(),
                crate::error::panic_message(&*panic)
            ))
        })??;
        let prepared = Arc::new(prepared);
        let read = self.as_read(prepared.clone())?;
        Ok(lock(&source.prepared)
            .get_or_insert((prepared, read))
            .clone())
    }

    /// The format's shards as they are read: with image columns decoded, when asked.
    fn as_read(&self, plain: Arc<PreparedShards>) -> Result<Arc<PreparedShards>> {
        let source = self.files()?;
        match &source.options.images {
            None => Ok(plain),
            Some(spec) => Ok(Arc::new(PreparedShards::with_images(
                &plain,
                spec,
                source.format.name(),
                source.options.on_error,
            )?)),
        }
    }

    /// The prepared shards with every row counted: stream formats' record indexes are
    /// built (or loaded) here, as for `prepared`, once.
    pub fn indexed(&self) -> Result<Arc<PreparedShards>> {
        let source = self.files()?;
        if let Some(indexed) = lock(&source.indexed).as_ref() {
            return Ok(indexed.clone());
        }
        let (plain, _) = self.prepared_pair()?;
        let indexed = format::index::index_shards(plain, &source.io(), source.options.on_error)?;
        let indexed = self.as_read(indexed)?;
        Ok(lock(&source.indexed).get_or_insert(indexed).clone())
    }

    /// Builds every record index this dataset reads through, and returns its rows.
    pub fn index(&self) -> Result<u64> {
        match &self.origin {
            Origin::Files(_) => {
                self.indexed()?;
            }
            Origin::Combined(c) => {
                for part in &c.parts {
                    part.index()?;
                }
            }
        }
        self.len()?.ok_or_else(|| {
            Error::invalid_argument(
                "the rows of this dataset are not known without reading it (a filter or flat_map decides them)",
            )
        })
    }

    /// The schema of the records before this dataset's ops.
    pub fn source_schema(&self) -> Result<SchemaRef> {
        match &self.origin {
            Origin::Files(_) => Ok(self.prepared()?.schema.clone()),
            Origin::Combined(c) => Ok(c.schema.clone()),
        }
    }

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

    fn first_batch_schema(&self) -> Result<SchemaRef> {
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

    /// Which epoch each of this dataset's seeded draws follows in epoch `epoch`.
    fn draws(&self, epoch: u64) -> Draws {
        Draws::new(&self.ops, epoch)
    }

    /// Map-style access by row index, as in epoch `epoch` (see `RandomAccess`).
    pub fn random_access(&self, epoch: u64) -> Result<RandomAccess> {
        self.random_access_with(self.draws(epoch))
    }

    /// Map-style access with each op drawing for the epoch `draws` gives it: a prefix
    /// of the ops draws as the whole chain would (see [`Draws`]).
    fn random_access_with(&self, draws: Draws) -> Result<RandomAccess> {
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
    fn materialized(&self, through: Option<usize>, draws: Draws) -> Result<Dataset> {
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
        let mut key = format!("{}@{epoch}{}", prefix.fingerprint(), origin.address());
        for f in &functions {
            key.push_str(&format!("#{:p}", Arc::as_ptr(f)));
        }
        if let Some(read) = materialized::get(&key) {
            return Ok(read);
        }
        let run = RunOptions {
            epoch,
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

    /// Whether rows can be addressed by index through every op: what `select` and a
    /// full-permutation `shuffle` need. A filter's rows can (random access runs it once
    /// over the rows before it, as `datasets` runs a filter).
    pub fn addressable(&self) -> bool {
        let origin = match &self.origin {
            Origin::Files(_) => true,
            Origin::Combined(c) => c.mix.is_none() && c.parts.iter().all(Dataset::addressable),
        };
        origin && self.ops.iter().all(Op::keeps_rows_addressable)
    }

    /// Whether no user function changes the records' columns.
    pub fn keeps_source_schema(&self) -> bool {
        !self.ops.iter().any(|op| matches!(op, Op::Transform(_)))
    }

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
    fn head(&self, epoch: u64, counted: bool) -> Result<Head> {
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

    /// Leaves of this dataset: the datasets whose rows carry positions of their own
    /// (one, unless its rows come from combined parts read as a stream).
    pub fn leaves(&self) -> u64 {
        if self.ops.iter().any(Op::needs_index) {
            return 1;
        }
        match &self.origin {
            Origin::Files(_) => 1,
            Origin::Combined(c) => c.parts.iter().map(Dataset::leaves).sum(),
        }
    }

    /// Rows one part of an epoch delivers after the ops, when that is known.
    pub fn rows_of_part(&self, share: Share, count_rows: bool) -> Result<Option<u64>> {
        let run = RunOptions {
            part: share.part,
            parts: share.parts,
            workers: share.workers,
            drop_last: share.even,
            pad: share.pad,
            first: share.first,
            count_rows,
            ..RunOptions::default()
        };
        self.rows_of_run(&run)
    }

    /// Rows part `run.part` delivers after the ops in `run`'s epoch, when known.
    pub fn rows_of_run(&self, run: &RunOptions) -> Result<Option<u64>> {
        let head = self.head(run.epoch, run.count_rows)?;
        let ops = &self.ops[head.rest..];
        let split = split(&head, ops);
        let (rows, rest) = match &split {
            Split::Rows { after } => {
                let global = rows_through(head.rows, &ops[..*after]);
                (global.map(|t| run.share().rows(t)), *after)
            }
            Split::Units | Split::Window { .. } => {
                let rest = match split {
                    Split::Window { after, .. } => after,
                    _ => 0,
                };
                let rows = match &head.kind {
                    HeadKind::Combined(c) => c
                        .plan(run, self.draws(run.epoch), true)?
                        .rows
                        .map(|(_, rows)| rows),
                    _ => self
                        .part_rows(&head, &split, run)
                        .map(|(rows, padding)| rows::list_len(&rows) + rows::list_len(&padding)),
                };
                (rows, rest)
            }
        };
        Ok(rows_through(rows, &ops[rest..]))
    }

    /// The rows of this dataset's head that part `run.part` reads this epoch, in order,
    /// as head positions (untagged), and the padding that follows them; `None` when the
    /// rows are not known. The epoch's rows are the window of a global take/skip, or all
    /// of them, or (resuming on another number of parts) this leaf's rows still to read.
    fn part_rows(
        &self,
        head: &Head,
        split: &Split,
        run: &RunOptions,
    ) -> Option<(RowList, RowList)> {
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
            (None, _) => vec![0..head.rows?],
        };
        Some(run.share().of(&all))
    }

    /// The units in this epoch's order: permuted when a shuffle comes first.
    fn unit_order(&self, prepared: &PreparedShards, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..prepared.units.len()).collect();
        if let Some((stage, seed)) = unit_shuffle_seed(&self.ops) {
            let epoch = self.draws(epoch).stage(stage);
            Rng::new(seed, epoch, 0).shuffle(&mut order);
        }
        order
    }

    /// The head's rows for part `run.part` of `run.parts`.
    /// `batch_rows`: the rows of the loader's batches, when the head's batches go to its
    /// re-batching unchanged (the decode tasks then cut them at its boundaries).
    fn head_stream(
        &self,
        head: &Head,
        split: &Split,
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
                let planned = self
                    .part_rows(head, split, run)
                    .and_then(|(rows, padding)| {
                        let share = rows::list_len(&rows);
                        let all: RowList = rows.into_iter().chain(padding).collect();
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
                let (rows, padding) = self
                    .part_rows(head, split, run)
                    .ok_or_else(|| Error::Internal("an indexed head knows its rows".into()))?;
                let share = rows::list_len(&rows);
                let all = rows.into_iter().chain(padding).collect();
                access.bound_memory(run.tuning.memory_limit);
                let stream = random_access::IndexStream::new(
                    access.clone(),
                    all,
                    leaf,
                    run.tuning.memory_limit,
                    stats.io.clone(),
                );
                Box::new(ops::Padding::new(Box::new(stream), share, stats.clone()))
            }
            HeadKind::Combined(c) => c.stream(run, self.draws(run.epoch), stats)?,
        })
    }

    /// Builds this epoch's stream of batches. Runs on the pipeline thread.
    pub fn stream(&self, run: &RunOptions, stats: Arc<Stats>) -> Result<BatchIter> {
        // A function taking row indices learns them from the rows' positions.
        let indexed = self
            .ops
            .iter()
            .any(|op| matches!(op, Op::Transform(t) if t.wants_indices()));
        if indexed && !run.track {
            let tracked = RunOptions {
                track: true,
                ..run.clone()
            };
            let stream = self.stream(&tracked, stats)?;
            return Ok(Box::new(stream.map(|b| b.map(|b| rows::detach(b).0))));
        }
        let head = self.head(run.epoch, run.count_rows)?;
        let draws = self.draws(run.epoch);
        let ops = &self.ops[head.rest..];
        let split = split(&head, ops);
        let mut stream = match &split {
            Split::Rows { .. } => {
                if run.remaining.is_some() {
                    return Err(Error::invalid_argument(ROWS_SPLIT_NOT_ELASTIC));
                }
                // Every part reads the whole epoch up to the last take/skip, then keeps
                // its own rows of it (so positions of the head mean nothing after, but
                // to a function taking row indices).
                let whole = RunOptions {
                    track: indexed,
                    ..run.whole()
                };
                self.head_stream(&head, &split, &whole, &stats, None)?
            }
            Split::Units | Split::Window { .. } => {
                // The head's batches go straight to re-batching when every op after the
                // head is a take/skip that the head's plan already applied.
                let direct = run.skip_rows == 0
                    && ops.iter().enumerate().all(|(i, op)| split.applies(i, op));
                let batch_rows = run.batch_rows.filter(|_| direct);
                self.head_stream(&head, &split, run, &stats, batch_rows)?
            }
        };
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
                        Rng::new(*seed, draws.stage(stage), 1 + stage as u64),
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
                Op::Transform(t) => Box::new(ops::Transformed::new(stream, t.clone())),
                Op::Permute { .. } | Op::Select(_) | Op::Sample { .. } => {
                    return Err(Error::Internal(format!("{op:?} after the indexed head")));
                }
            };
            if let Split::Rows { after } = split
                && i + 1 == after
                && run.parts > 1
            {
                let (global, share) = (rows_through(head.rows, &ops[..after]), run.share());
                let mut deal = ops::Deal::new(stream, share);
                if run.drop_last {
                    deal = deal.whole_rounds(global);
                } else if run.pad {
                    deal = deal.padded_to(global.map(|rows| share.rank_rows(rows)), stats.clone());
                }
                stream = Box::new(deal);
            }
        }
        if run.skip_rows > 0 {
            stream = Box::new(ops::Skip::new(stream, run.skip_rows));
        }
        if let Some(rows) = run.batch_rows {
            stream = Box::new(Rebatch::new(stream, rows, run.drop_last).joining_on(batch_threads));
        }
        Ok(stream)
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
                    self.part_rows(&head, &split, &run).and_then(|(r, _)| {
                        unit_slices(prepared, order, &r, None)
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
                Op::Transform(t) => t.preserves_rows(),
                Op::Shuffle { .. } | Op::Permute { .. } | Op::Select(_) | Op::Sample { .. } => {
                    false
                }
            }))
    }

    /// The rows (tagged positions) part `run.part` reads this epoch, padding included,
    /// in order: what an epoch's rows are made of, for elastic resume.
    pub fn planned_rows(&self, run: &RunOptions) -> Result<RowList> {
        let head = self.head(run.epoch, run.count_rows)?;
        let ops = &self.ops[head.rest..];
        let split = split(&head, ops);
        if matches!(split, Split::Rows { .. }) {
            return Err(Error::invalid_argument(ROWS_SPLIT_NOT_ELASTIC));
        }
        if let HeadKind::Combined(c) = &head.kind {
            return c.planned_rows(run, self.draws(run.epoch));
        }
        let (rows, padding) = self.part_rows(&head, &split, run).ok_or_else(|| {
            Error::invalid_argument(
                "the rows of this dataset are not known, so its epoch cannot be divided anew",
            )
        })?;
        let base = rows::tag(run.leaf, 0);
        Ok(rows
            .into_iter()
            .chain(padding)
            .map(|r| base + r.start..base + r.end)
            .collect())
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stage and seed of the shuffle that permutes unit order: the first shuffle's, unless
/// a take/skip comes before it (then *which* rows are taken must not depend on the seed).
fn unit_shuffle_seed(ops: &[Op]) -> Option<(usize, u64)> {
    for (stage, op) in ops.iter().enumerate() {
        match op {
            Op::Shuffle { seed, .. } => return Some((stage, *seed)),
            Op::Take(_) | Op::Skip(_) | Op::Select(_) | Op::Permute { .. } | Op::Sample { .. } => {
                return None;
            }
            Op::Transform(_) => {}
        }
    }
    None
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

/// Where the epoch is split between parts (see [`Split`]), for `ops` run as a stream
/// after `head`.
fn split(head: &Head, ops: &[Op]) -> Split {
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

/// Rows picked from `batches` as `(batch, row)` pairs, as one batch. Unlike
/// `interleave_record_batch` alone, this also takes batches with no columns (JSON lines
/// of `{}`), which have rows but nothing to count them by.
pub fn interleave_rows(
    batches: &[&RecordBatch],
    picks: &[(usize, usize)],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    match batches.first() {
        Some(first) if first.num_columns() == 0 => RecordBatch::try_new_with_options(
            first.schema(),
            Vec::new(),
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(picks.len())),
        ),
        _ => arrow_select::interleave::interleave_record_batch(batches, picks),
    }
}

/// `batch` as `schema`: columns matched by name, in the schema's order, cast to its
/// types; what `concatenate` and `interleave` do to each part's batches.
pub fn conform(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema() == *schema {
        return Ok(batch);
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let column = batch
            .column_by_name(field.name())
            .ok_or_else(|| Error::Schema {
                url: String::new(),
                message: format!("a batch has no column {:?}", field.name()),
            })?;
        let column = if column.data_type() == field.data_type() {
            column.clone()
        } else {
            arrow_cast::cast(column, field.data_type()).map_err(|e| Error::Schema {
                url: String::new(),
                message: format!(
                    "column {:?}: cannot read {} as {}: {e}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                ),
            })?
        };
        columns.push(column);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options)
        .map_err(|e| Error::Internal(format!("conforming a batch: {e}")))
}

/// The type that values of types `a` and `b` can both be read as, if any: null widens
/// to anything, narrower to wider integers, integers to floats, text to large text. A
/// list is one logical type whatever its offsets or item name: `List` and `LargeList`
/// of any item name unify to `List<item>` (as pyarrow and `datasets` write lists), their
/// items unified in turn; structs with the same fields in the same order unify field by
/// field.
fn wider(a: &arrow_schema::DataType, b: &arrow_schema::DataType) -> Option<arrow_schema::DataType> {
    use arrow_schema::{DataType as T, Field};
    if a == b {
        return Some(a.clone());
    }
    let rank = |t: &T| match t {
        T::Int8 => Some(1),
        T::Int16 => Some(2),
        T::Int32 => Some(3),
        T::Int64 => Some(4),
        T::Float32 => Some(5),
        T::Float64 => Some(6),
        _ => None,
    };
    match (a, b) {
        (T::Null, other) | (other, T::Null) => Some(other.clone()),
        (T::Utf8 | T::LargeUtf8, T::Utf8 | T::LargeUtf8) => Some(T::LargeUtf8),
        (T::Binary | T::LargeBinary, T::Binary | T::LargeBinary) => Some(T::LargeBinary),
        (T::List(x) | T::LargeList(x), T::List(y) | T::LargeList(y)) => {
            let item = wider(x.data_type(), y.data_type())?;
            Some(T::List(Arc::new(Field::new(
                "item",
                item,
                x.is_nullable() || y.is_nullable(),
            ))))
        }
        (T::Struct(x), T::Struct(y))
            if x.len() == y.len() && x.iter().zip(y.iter()).all(|(f, g)| f.name() == g.name()) =>
        {
            let fields = x
                .iter()
                .zip(y.iter())
                .map(|(f, g)| {
                    wider(f.data_type(), g.data_type())
                        .map(|t| Field::new(f.name(), t, f.is_nullable() || g.is_nullable()))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(T::Struct(fields.into()))
        }
        _ => match (rank(a), rank(b)) {
            (Some(x), Some(y)) => {
                let wide = if x >= y { a } else { b };
                // An int64 meeting a float32 needs a float64 to keep its values.
                Some(if x.max(y) == 5 && x.min(y) == 4 {
                    T::Float64
                } else {
                    wide.clone()
                })
            }
            _ => None,
        },
    }
}

/// The one schema that batches of every schema in `schemas` can be read as: the same
/// column names (any order; the first schema's order is kept), each column's types equal
/// or one widening to the other (see `wider`). Anything else is a `SchemaError` naming
/// the column.
pub fn unify_schemas(schemas: &[SchemaRef]) -> Result<SchemaRef> {
    use arrow_schema::{Field, Schema};
    let first = &schemas[0];
    let mismatch = |message: String| Error::Schema {
        url: String::new(),
        message,
    };
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    for (n, schema) in schemas.iter().enumerate().skip(1) {
        for field in schema.fields() {
            if first.index_of(field.name()).is_err() {
                return Err(mismatch(format!(
                    "column {:?} is in dataset {n} but not in dataset 0 (whose columns are {:?})",
                    field.name(),
                    format::field_names(first)
                )));
            }
        }
        for out in fields.iter_mut() {
            let Ok(theirs) = schema.field_with_name(out.name()) else {
                return Err(mismatch(format!(
                    "column {:?} is in dataset 0 but not in dataset {n} (whose columns are {:?})",
                    out.name(),
                    format::field_names(schema)
                )));
            };
            let Some(unified) = wider(out.data_type(), theirs.data_type()) else {
                return Err(mismatch(format!(
                    "column {:?} is {} in dataset 0 but {} in dataset {n}, and neither widens to the other",
                    out.name(),
                    out.data_type(),
                    theirs.data_type()
                )));
            };
            *out = Field::new(
                out.name(),
                unified,
                out.is_nullable() || theirs.is_nullable(),
            )
            .with_metadata(out.metadata().clone());
        }
    }
    Ok(Arc::new(Schema::new(fields)))
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

impl Split {
    /// Whether the `i`-th op after the head is applied by the parts' plan (a take/skip
    /// within the window), not run on the stream.
    fn applies(&self, i: usize, op: &Op) -> bool {
        matches!(self, Split::Window { after, .. } if i < *after)
            && matches!(op, Op::Take(_) | Op::Skip(_))
    }
}

/// Rows left after `ops`, from `rows` in, where that can be known.
fn rows_through(mut rows: Option<u64>, ops: &[Op]) -> Option<u64> {
    for op in ops {
        rows = match op {
            Op::Shuffle { .. } | Op::Permute { .. } => rows,
            Op::Select(indices) => Some(indices.len()),
            Op::Sample { num_samples, .. } => num_samples.or(rows),
            Op::Take(n) => rows.map(|r| r.min(*n)),
            Op::Skip(n) => rows.map(|r| r.saturating_sub(*n)),
            Op::Transform(t) if t.preserves_rows() => rows,
            Op::Transform(_) => None,
        };
    }
    rows
}

/// The slices of units (taken in `order`) that hold `rows` (head positions), in the
/// order of `rows`, each numbered with its position under `leaf` when given; `None`
/// when some unit's rows are not known.
fn unit_slices(
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

/// Why a pipeline whose take/skip come after a shuffle buffer, filter or flat_map can
/// only resume on the world size that saved it.
const ROWS_SPLIT_NOT_ELASTIC: &str = "this pipeline has a take/skip after a shuffle buffer, \
    filter or flat_map, so every rank reads the whole stream and keeps its own rows of it; \
    such an epoch can resume only on the same number of ranks and workers (put take/skip \
    first, or use a full shuffle, to resume on another)";

/// Bytes of `batch`'s values: the slices it covers, not the whole buffers it may share
/// with other batches (arrow's `get_slice_memory_size`).
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| column_bytes(c.as_ref()))
        .sum()
}

/// One column's `get_slice_memory_size`, read off the array itself for the common types.
/// `to_data` builds an `ArrayData` (with its buffer list) only to be measured: for every
/// batch, on the pipeline thread, that was allocations the consumer's thread then freed.
fn column_bytes(column: &dyn arrow_array::Array) -> u64 {
    use arrow_array::cast::AsArray;
    use arrow_schema::DataType;
    let rows = column.len();
    // As `ArrayData`, which drops a null buffer without nulls (a slice's may have none).
    let nulls = if column.null_count() > 0 {
        rows.div_ceil(8)
    } else {
        0
    };
    let values = match column.data_type() {
        DataType::Binary => Some(byte_span(column.as_binary::<i32>().value_offsets())),
        DataType::Utf8 => Some(byte_span(column.as_string::<i32>().value_offsets())),
        DataType::LargeBinary => Some(byte_span(column.as_binary::<i64>().value_offsets())),
        DataType::LargeUtf8 => Some(byte_span(column.as_string::<i64>().value_offsets())),
        DataType::FixedSizeList(_, _) => {
            let values = column.as_fixed_size_list().values();
            (values.data_type().primitive_width().is_some())
                .then(|| column_bytes(values.as_ref()) as usize)
        }
        other => other.primitive_width().map(|width| rows * width),
    };
    match values {
        Some(values) => (values + nulls) as u64,
        None => {
            let data = column.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| data.get_buffer_memory_size()) as u64
        }
    }
}

/// A byte array's offsets and the values they span.
fn byte_span<O: arrow_buffer::ArrowNativeType>(offsets: &[O]) -> usize {
    let span = match (offsets.first(), offsets.last()) {
        (Some(first), Some(last)) => last.as_usize() - first.as_usize(),
        _ => 0,
    };
    std::mem::size_of_val(offsets) + span
}

/// One reader's part of an epoch (see [`Dataset::read_plan`]).
#[derive(Debug, Clone)]
pub struct PartPlan {
    pub rows: Option<u64>,
    pub files: Vec<String>,
    pub bytes: Option<u64>,
}

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
        }
    }
}

/// Default decode threads: one per core, but two cores left on machines of more than
/// four (at least four threads), for the threads one loader has besides them (the
/// pipeline thread, your loop converting batches, the batch threads' copies) and your
/// training step. On 16 cores (`benches/results/16-cores.md`) 14 threads read within 3%
/// of 16 on Parquet, photos and chat JSONL, and TFRecord 6% faster.
pub fn default_num_threads() -> usize {
    threads_for_cores(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    )
}

fn threads_for_cores(cores: usize) -> usize {
    cores.saturating_sub(2).max(cores.min(4))
}

#[cfg(test)]
mod tests {
    #[test]
    fn batch_bytes_is_arrows_slice_size_for_every_type() {
        use arrow_array::builder::{ListBuilder, StringBuilder};
        use arrow_array::{
            Array, ArrayRef, BinaryArray, BooleanArray, FixedSizeListArray, Float32Array,
            Int64Array, LargeStringArray, RecordBatch,
        };
        use std::sync::Arc;
        let rows = 300;
        let mut lists = ListBuilder::new(StringBuilder::new());
        for i in 0..rows {
            lists.values().append_value(format!("{i}"));
            lists.append(i % 3 != 0);
        }
        let pixels = Float32Array::from_iter_values((0..rows * 4).map(|v| v as f32));
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "int",
                Arc::new(Int64Array::from_iter(
                    (0..rows).map(|i| (i % 5 != 0).then_some(i as i64)),
                )),
            ),
            (
                "bytes",
                Arc::new(BinaryArray::from_iter_values(
                    (0..rows).map(|i| vec![1u8; i % 7]),
                )),
            ),
            (
                "text",
                Arc::new(LargeStringArray::from_iter(
                    (0..rows).map(|i| (i % 4 != 0).then(|| "x".repeat(i % 9))),
                )),
            ),
            (
                "flag",
                Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(i % 2 == 0)))),
            ),
            (
                "pixels",
                Arc::new(
                    FixedSizeListArray::try_new(
                        Arc::new(arrow_schema::Field::new(
                            "item",
                            arrow_schema::DataType::Float32,
                            false,
                        )),
                        4,
                        Arc::new(pixels),
                        None,
                    )
                    .unwrap(),
                ),
            ),
            ("list", Arc::new(lists.finish())),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        for (offset, len) in [(0, rows), (17, 100), (299, 1), (50, 0)] {
            let slice = batch.slice(offset, len);
            for column in slice.columns() {
                let data = column.to_data();
                assert_eq!(
                    super::column_bytes(column.as_ref()),
                    data.get_slice_memory_size().unwrap() as u64,
                    "{} at {offset}+{len}",
                    column.data_type()
                );
            }
        }
    }

    #[test]
    fn the_default_leaves_two_cores_on_machines_of_more_than_four() {
        let threads: Vec<usize> = [1, 2, 4, 5, 6, 8, 16, 64]
            .into_iter()
            .map(super::threads_for_cores)
            .collect();
        assert_eq!(threads, [1, 2, 4, 4, 4, 6, 14, 62]);
    }
}
