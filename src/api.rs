//! The Rust API: open a dataset, chain what to read, iterate Arrow record batches, write
//! shards. The Python package is a thin layer over the same core; these types are its
//! Rust face, with the same defaults and the same guarantees (every row once per epoch,
//! the same order for the same seed and epoch, equal shares across ranks).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::format::{OnError, ReadOptions};
use crate::options::{OptionValue, Options};
use crate::pipeline::{self, BatchReceiver, Op, RunOptions, Stats, StatsSnapshot, Tuning};
use crate::source::manifest::Manifest;
use crate::source::{Storage, StorageOptions};
use crate::write::{ShardFormat, WriteOptions};

/// Shards and the operations chained onto them; cheap to clone, immutable.
///
/// ```no_run
/// # fn main() -> shardflow::Result<()> {
/// let ds = shardflow::Dataset::open("data/train-*.parquet")?.shuffle(0).take(10_000);
/// for batch in ds.loader(256).epoch(0)? {
///     let batch = batch?; // an arrow RecordBatch of 256 rows
///     println!("{} rows", batch.num_rows());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Dataset {
    inner: pipeline::Dataset,
}

/// How to open a dataset: the format, columns and options; see [`Dataset::builder`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    sources: Vec<String>,
    format: Option<String>,
    read: ReadOptions,
    storage: Options,
}

impl Dataset {
    /// Opens a path, glob (`data/*.parquet`), brace range (`shard-{000..099}.tar`),
    /// directory, `s3://`/`gs://`/`az://` prefix or `http(s)://` URL, with the format taken from the file
    /// extensions. The shards are listed now, so a missing file fails here.
    pub fn open(source: impl Into<String>) -> Result<Self> {
        Self::builder(source).open()
    }

    /// Starts opening `source` with options; more sources may be added.
    pub fn builder(source: impl Into<String>) -> OpenOptions {
        OpenOptions {
            sources: vec![source.into()],
            format: None,
            read: ReadOptions::default(),
            storage: Options::default(),
        }
    }

    /// Records already in memory.
    pub fn from_batches(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            inner: pipeline::Dataset::from_batches(schema, batches, None),
        }
    }

    /// The format's name (`"parquet"`, `"webdataset"`, ...).
    pub fn format(&self) -> &'static str {
        self.inner.format_name()
    }

    /// The shard URLs, in their order before any shuffle.
    pub fn shards(&self) -> Vec<String> {
        self.inner.shards().into_iter().map(|s| s.url).collect()
    }

    /// The schema of the records as iterated.
    pub fn schema(&self) -> Result<SchemaRef> {
        self.inner.schema()
    }

    /// The number of rows, from metadata (Parquet footers, a write manifest) or by
    /// indexing stream formats once; `None` when a filter decides it.
    pub fn len(&self) -> Result<Option<u64>> {
        self.inner.len()
    }

    /// Whether the dataset has no rows (`Some(true)`), when that is known.
    pub fn is_empty(&self) -> Result<Option<bool>> {
        Ok(self.len()?.map(|n| n == 0))
    }

    /// Shuffles with `seed`: shard order plus a bounded row buffer (10,000 rows or
    /// 128 MiB), new each epoch, the same for the same `(seed, epoch)`.
    pub fn shuffle(&self, seed: u64) -> Self {
        self.with(Op::Shuffle {
            seed,
            buffer: pipeline::DEFAULT_SHUFFLE_BUFFER,
        })
    }

    /// The first `n` rows of the whole dataset, before any split across ranks.
    pub fn take(&self, n: u64) -> Self {
        self.with(Op::Take(n))
    }

    /// All rows but the first `n`.
    pub fn skip(&self, n: u64) -> Self {
        self.with(Op::Skip(n))
    }

    fn with(&self, op: Op) -> Self {
        Self {
            inner: self.inner.with_op(op),
        }
    }

    /// A loader of batches of `batch_size` rows; see [`Loader`].
    pub fn loader(&self, batch_size: usize) -> Loader {
        Loader {
            dataset: self.clone(),
            batch_size: batch_size.max(1),
            shuffle: None,
            drop_last: false,
            rank: 0,
            world_size: 1,
            tuning: Arc::default(),
            stats: Arc::default(),
        }
    }

    /// Starts a write of this dataset's rows, in its order, to `dest` (a directory or
    /// an `s3://`, `gs://` or `az://` prefix) as `format` shards (`"parquet"`, `"jsonl"`, `"webdataset"`,
    /// `"tfrecord"` or `"npz"`); see [`Writer`].
    pub fn write(&self, dest: impl Into<String>, format: impl Into<String>) -> Writer {
        Writer {
            dataset: self.clone(),
            dest: dest.into(),
            format: format.into(),
            compression: None,
            max_rows_per_shard: None,
            max_bytes_per_shard: None,
            overwrite: false,
            threads: pipeline::default_num_threads(),
            memory_limit: pipeline::DEFAULT_MEMORY_LIMIT,
            storage: Options::default(),
        }
    }

    /// The pipeline-level dataset, for the crate's own benches and tests.
    #[doc(hidden)]
    pub fn inner(&self) -> &pipeline::Dataset {
        &self.inner
    }
}

impl OpenOptions {
    /// Another source, read after the ones before.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.sources.push(source.into());
        self
    }

    /// The format, when the extensions do not tell it (`"raw"`, a `.bin` file).
    pub fn format(mut self, format: impl Into<String>) -> Self {
        self.format = Some(format.into());
        self
    }

    /// Reads only these columns, in this order.
    pub fn columns<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.read.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// A format option, as Python's `format_options={key: value}` (e.g. `"mode"`,
    /// `"rows"` for NPZ).
    pub fn format_option(mut self, key: &str, value: impl Into<OptionValue>) -> Self {
        self.read.format_options.0.insert(key.into(), value.into());
        self
    }

    /// A storage option, as Python's `storage_options={key: value}` (e.g.
    /// `"endpoint_url"`, `"anonymous"`, `"max_concurrency"`).
    pub fn storage_option(mut self, key: &str, value: impl Into<OptionValue>) -> Self {
        self.storage.0.insert(key.into(), value.into());
        self
    }

    /// Skips corrupt records and files (counted in the loader's stats) instead of
    /// failing on them.
    pub fn skip_errors(mut self) -> Self {
        self.read.on_error = OnError::Skip;
        self
    }

    /// Lists the shards and opens the dataset.
    pub fn open(self) -> Result<Dataset> {
        crate::allocator::keep_freed_memory();
        let storage = Storage::new(StorageOptions::parse(&self.storage)?)?;
        Ok(Dataset {
            inner: pipeline::Dataset::open(
                &self.sources,
                self.format.as_deref(),
                self.read,
                storage,
            )?,
        })
    }
}

/// Reads a dataset as batches of a fixed number of rows, epoch after epoch; what
/// Python's `shardflow.DataLoader` is. Decoding runs on a thread pool, ahead of the
/// consumer, with the depths autotuned within a memory limit.
pub struct Loader {
    dataset: Dataset,
    batch_size: usize,
    shuffle: Option<u64>,
    drop_last: bool,
    rank: usize,
    world_size: usize,
    tuning: Arc<Tuning>,
    stats: Arc<Stats>,
}

impl Loader {
    /// Shuffles each epoch with `seed` (as [`Dataset::shuffle`]).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = Some(seed);
        self
    }

    /// Leaves out the last short batch; across ranks, gives every rank as many rows.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Reads rank `rank`'s share of `world_size` equal, disjoint shares. Without
    /// `drop_last`, shorter shares are padded with the epoch's first rows, so every
    /// rank gets as many batches.
    pub fn rank(mut self, rank: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid_argument(format!(
                "rank {rank} of world_size {world_size}: need 0 <= rank < world_size"
            )));
        }
        self.rank = rank;
        self.world_size = world_size;
        Ok(self)
    }

    /// Sets the decode threads and the memory that prefetched batches and read-ahead
    /// may take. `None` keeps a default: one thread per core, 512 MiB. With the thread
    /// count left to the default, the read-ahead and prefetch depths adapt while the
    /// loader runs.
    pub fn tuning(mut self, num_threads: Option<usize>, memory_limit: Option<u64>) -> Result<Self> {
        self.tuning = Arc::new(Tuning::new(num_threads, None, None, memory_limit)?);
        Ok(self)
    }

    /// Iterates epoch `epoch`: its order depends only on the data, the seed, the epoch
    /// and the rank.
    pub fn epoch(&self, epoch: u64) -> Result<Batches> {
        let dataset = match self.shuffle {
            Some(seed) => self.dataset.shuffle(seed),
            None => self.dataset.clone(),
        };
        let run = RunOptions::loader(
            epoch,
            (self.rank, self.world_size, 1),
            self.batch_size,
            self.drop_last,
            // As Python's DataLoader (and DistributedSampler) by default.
            self.world_size > 1 && !self.drop_last,
            self.tuning.clone(),
        );
        let receiver = dataset.inner.start(run, self.stats.clone())?;
        Ok(Batches { receiver })
    }

    /// Counters summed over this loader's epochs: rows, bytes read, time waited and
    /// spent decoding, records skipped, requests and retries.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

/// One epoch's batches, in order. Dropping it stops the background work.
pub struct Batches {
    receiver: BatchReceiver,
}

impl Iterator for Batches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.receiver.recv().transpose()
    }
}

/// A write of a dataset's rows as shards plus a manifest; see [`Dataset::write`].
///
/// ```no_run
/// # fn main() -> shardflow::Result<()> {
/// let ds = shardflow::Dataset::open("raw/*.jsonl")?;
/// let manifest = ds.write("out/", "parquet").max_rows_per_shard(100_000).compression("zstd").run()?;
/// println!("{} shards, {} rows", manifest.shards.len(), manifest.rows());
/// # Ok(())
/// # }
/// ```
pub struct Writer {
    dataset: Dataset,
    dest: String,
    format: String,
    compression: Option<String>,
    max_rows_per_shard: Option<u64>,
    max_bytes_per_shard: Option<u64>,
    overwrite: bool,
    threads: usize,
    memory_limit: u64,
    storage: Options,
}

impl Writer {
    /// A storage option for the destination (by default, the dataset's own).
    pub fn storage_option(mut self, key: &str, value: impl Into<OptionValue>) -> Self {
        self.storage.0.insert(key.into(), value.into());
        self
    }

    /// The codec: for Parquet `"snappy"` (default), `"zstd"`, `"gzip"`, `"lz4"`,
    /// `"brotli"` or `"none"`; `"gzip"` for JSON Lines, WebDataset and TFRecord;
    /// `"deflate"` for NPZ.
    pub fn compression(mut self, compression: impl Into<String>) -> Self {
        self.compression = Some(compression.into());
        self
    }

    /// Rows per shard at most.
    pub fn max_rows_per_shard(mut self, rows: u64) -> Self {
        self.max_rows_per_shard = Some(rows.max(1));
        self
    }

    /// Bytes per shard at most, counted as the rows' in-memory (Arrow) size.
    pub fn max_bytes_per_shard(mut self, bytes: u64) -> Self {
        self.max_bytes_per_shard = Some(bytes.max(1));
        self
    }

    /// Replaces what the destination holds instead of refusing to write there.
    pub fn overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// Shards encoded and stored at once.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Bytes of rows the write holds at most, however large its shards (by default the
    /// loader's, 512 MiB); see [`crate::write::write`] for what encoders add to it.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = bytes.max(1);
        self
    }

    /// Writes every shard, then the manifest, which it returns. The rows come in the
    /// dataset's order for epoch 0 (a shuffled dataset writes its first epoch's order).
    pub fn run(self) -> Result<Manifest> {
        let options = WriteOptions {
            format: ShardFormat::parse(&self.format, self.compression.as_deref())?,
            max_rows_per_shard: self.max_rows_per_shard,
            max_bytes_per_shard: self.max_bytes_per_shard,
            overwrite: self.overwrite,
            threads: self.threads,
            memory_limit: self.memory_limit,
            huggingface: None,
        };
        let storage = match self.dataset.inner.storage() {
            Some(storage) if self.storage.0.is_empty() => storage,
            _ => Storage::new(StorageOptions::parse(&self.storage)?)?,
        };
        crate::write::write(
            &self.dataset.inner,
            0,
            &self.dest,
            &storage,
            &options,
            &mut |_, _| Ok(()),
        )
    }
}
