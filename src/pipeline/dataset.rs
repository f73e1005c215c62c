//! What a dataset is: its rows' origin (shards read in a format, or datasets combined)
//! and the ops chained onto them, the verbs that build one (`open`, `from_batches`,
//! `combine`, `with_op`), and what it says of itself without reading rows (shards,
//! format, fingerprint, prepared footers and record indexes, the source schema). How an
//! epoch divides it is `plan`'s; reading it, `run`'s; combinations, `combine`'s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::ops::{Draws, Op};
use super::stream::unify_schemas;
use crate::error::{Error, Result};
use crate::format::{self, Format, PreparedShards, ReadOptions};
use crate::source::{self, Io, IoCounters, ShardMeta, Storage};

/// Shards plus how to read them; prepared (footers read, schema known) on first use and
/// shared by every dataset derived from it.
pub struct DataSource {
    pub(super) shards: Vec<ShardMeta>,
    pub(super) format: Arc<dyn Format>,
    pub(super) options: ReadOptions,
    pub(super) prepared: Mutex<Option<(Arc<PreparedShards>, Arc<PreparedShards>)>>,
    /// The same with every shard's record index, built when first needed.
    pub(super) indexed: Mutex<Option<Arc<PreparedShards>>>,
    /// Where remote shards are read from, shared by every loader of the dataset.
    pub(super) storage: Arc<Storage>,
    /// I/O done while preparing (not part of any loader's stats).
    pub(super) counters: Arc<IoCounters>,
}

impl DataSource {
    /// The same files read with other `options` (nothing prepared yet).
    pub(super) fn reading_with(&self, options: ReadOptions) -> Arc<Self> {
        Self::new(
            self.shards.clone(),
            self.format.clone(),
            options,
            self.storage.clone(),
        )
    }

    pub(super) fn new(
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

    pub(super) fn io(&self) -> Io {
        Io {
            storage: self.storage.clone(),
            counters: self.counters.clone(),
        }
    }
}

/// Datasets read one after another (`concatenate`) or mixed row by row (`interleave`),
/// as one schema.
pub struct Combined {
    pub(super) parts: Vec<Dataset>,
    pub(super) schema: SchemaRef,
    /// For `interleave`: how rows are drawn from the parts.
    pub(super) mix: Option<Mix>,
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
pub(super) enum Origin {
    Files(Arc<DataSource>),
    Combined(Arc<Combined>),
}

/// An immutable description of a dataset: where its rows come from and the ops chained
/// onto them.
#[derive(Clone)]
pub struct Dataset {
    pub(super) origin: Origin,
    pub(super) ops: Vec<Op>,
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
            format::image_spec::ImageSpec::take(format.name(), &mut options.format_options)?;
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
            origin: Origin::Files(source.reading_with(options)),
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
                // Where decoded units are kept changes no record: a state saved without
                // the cache resumes with it.
                let options = ReadOptions {
                    decoded_cache: None,
                    ..source.options.clone()
                };
                hash.update(format!("\0{options:?}"));
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

    pub(super) fn files(&self) -> Result<&Arc<DataSource>> {
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
    pub(super) fn prepared_pair(&self) -> Result<(Arc<PreparedShards>, Arc<PreparedShards>)> {
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

    /// The format's shards as they are read: with image and audio columns decoded, where
    /// the files' features (`datasets`') or a cast say a column is an `Image` or
    /// `Audio`, and image columns where `decode_images` asks.
    pub(super) fn as_read(&self, plain: Arc<PreparedShards>) -> Result<Arc<PreparedShards>> {
        let source = self.files()?;
        let features =
            format::media_features(plain.huggingface.as_deref(), &source.options.media_features);
        let images = match &source.options.images {
            Some(spec) => Some(spec.clone()),
            None => features
                .as_deref()
                .and_then(|json| format::image_spec::ImageSpec::from_features(json, &plain.schema)),
        };
        let mut read = plain;
        if let Some(spec) = images.filter(|spec| !spec.decodes_nothing()) {
            let decoder = spec.bind(source.format.name(), &read.schema, source.options.on_error)?;
            read = Arc::new(PreparedShards::with_cells(&read, Arc::new(decoder)));
        }
        let audio = features
            .as_deref()
            .and_then(|json| format::audio::AudioSpec::from_features(json, &read.schema));
        if let Some(spec) = audio {
            let decoder = spec.bind(&read.schema, source.options.on_error)?;
            read = Arc::new(PreparedShards::with_cells(&read, Arc::new(decoder)));
        }
        if let Some(dir) = &source.options.decoded_cache {
            let cache = format::decoded_cache::DecodedCache::open(
                dir.clone(),
                source.format.name(),
                &source.options,
                &read.schema,
            );
            read = Arc::new(PreparedShards::with_decoded_cache(&read, Arc::new(cache)));
        }
        Ok(read)
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
    /// The features (JSON) `datasets` wrote this dataset's files with, where it did
    /// (a combination's are its parts').
    pub fn stored_features(&self) -> Result<Option<String>> {
        match &self.origin {
            Origin::Files(_) => Ok(self.prepared()?.huggingface.clone()),
            Origin::Combined(_) => Ok(None),
        }
    }

    /// This dataset with `features` (`datasets`' JSON of an `Image` or `Audio` feature,
    /// by column, as the files name them) setting how those columns decode where they
    /// are read (see `ReadOptions::media_features`): a cast to a media feature.
    pub fn with_media_features(
        &self,
        features: BTreeMap<String, serde_json::Value>,
    ) -> Result<Dataset> {
        let Origin::Files(source) = &self.origin else {
            return Err(Error::invalid_argument(
                "a cast to Image or Audio sets how the files' columns decode: cast each dataset before combining them",
            ));
        };
        let plain = self.prepared_pair()?.0;
        if let Some(missing) = features.keys().find(|c| plain.schema.index_of(c).is_err()) {
            return Err(Error::invalid_argument(format!(
                "a cast to Image or Audio decodes a column the files have; {missing:?} is not one (columns: {:?})",
                plain
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            )));
        }
        let mut options = source.options.clone();
        options.media_features.extend(features);
        Ok(Dataset {
            origin: Origin::Files(source.reading_with(options)),
            ops: self.ops.clone(),
        })
    }

    pub fn source_schema(&self) -> Result<SchemaRef> {
        match &self.origin {
            Origin::Files(_) => Ok(self.prepared()?.schema.clone()),
            Origin::Combined(c) => Ok(c.schema.clone()),
        }
    }

    /// Which epoch each of this dataset's seeded draws follows in epoch `epoch`.
    pub(super) fn draws(&self, epoch: u64) -> Draws {
        Draws::new(&self.ops, epoch)
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

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
