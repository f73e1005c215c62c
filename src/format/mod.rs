//! HOW bytes become records. Each format turns a shard into Arrow `RecordBatch`es; the
//! pipeline only sees the [`Format`] / [`PreparedShards`] traits below.
//!
//! Adding a format: one file in this folder and one line in `REGISTRY`.

pub mod arrow_ipc;
mod blocks;
pub mod compression;
pub mod csv;
pub mod example;
pub mod hdf5;
pub mod image;
pub mod index;
mod json_infer;
pub mod jsonl;
pub mod memory;
pub mod npy;
pub mod npz;
pub mod parquet;
mod parquet_dictionary;
pub mod raw;
pub mod tfrecord;
pub mod webdataset;

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, SchemaRef};

use crate::error::{Error, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta};

/// What to do with data that cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    #[default]
    Raise,
    /// Skip the bad record (or, where records cannot be told apart, the bad unit or
    /// file) and count it in the stats.
    Skip,
}

impl OnError {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "raise" => Ok(OnError::Raise),
            "skip" => Ok(OnError::Skip),
            other => Err(Error::invalid_argument(format!(
                "on_error must be \"raise\" or \"skip\", not {other:?}"
            ))),
        }
    }
}

/// Options for reading a dataset. Formats reject the ones they cannot use.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Column projection, in the order the user wants them.
    pub columns: Option<Vec<String>>,
    /// A schema given by the user instead of one inferred from the data.
    pub schema: Option<SchemaRef>,
    /// A `tf.io.parse_example`-style spec for TFRecord Examples.
    pub features: Option<Vec<example::FeatureSpec>>,
    /// Format-specific settings.
    pub format_options: crate::options::Options,
    pub on_error: OnError,
    /// Image columns to decode, taken out of `format_options` (see [`image`]).
    pub images: Option<image::ImageSpec>,
}

/// Resolves `columns=` against the names a shard offers: their indices, in the order
/// asked. Every format's projection goes through here, so all of them refuse an empty
/// list, a name given twice and a name the data lacks, in the same words.
pub fn column_indices(available: &[&str], columns: &[String], url: &str) -> Result<Vec<usize>> {
    if columns.is_empty() {
        return Err(Error::invalid_argument(
            "columns= must name at least one column",
        ));
    }
    let mut indices = Vec::with_capacity(columns.len());
    for name in columns {
        let Some(index) = available.iter().position(|a| a == name) else {
            return Err(Error::Schema {
                url: url.to_string(),
                message: format!("no column {name:?}; the columns are {available:?}"),
            });
        };
        if indices.contains(&index) {
            return Err(Error::invalid_argument(format!(
                "column {name:?} is listed twice in columns="
            )));
        }
        indices.push(index);
    }
    Ok(indices)
}

/// The names of a schema's fields, for [`column_indices`].
pub fn field_names(schema: &arrow_schema::Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}

/// One work unit per file, for formats read front to back; its rows are known where a
/// manifest gives them.
pub fn whole_files(shards: &[ShardMeta]) -> Vec<WorkUnit> {
    shards
        .iter()
        .enumerate()
        .map(|(shard, meta)| WorkUnit {
            shard,
            part: 0,
            rows: meta.rows,
        })
        .collect()
}

/// Shards whose headers are read at once while preparing.
const HEADER_CONCURRENCY: usize = 32;

/// Runs `read(source, size)` for every shard on the I/O runtime, many at once, and
/// returns each shard's outcome in order. A panic inside `read` (a parser choking on
/// corrupt bytes) becomes that shard's decode error.
pub fn per_shard<T, F>(
    shards: &[ShardMeta],
    io: &Io,
    format: &'static str,
    read: F,
) -> Result<Vec<Result<T>>>
where
    T: Send + 'static,
    F: Fn(Arc<dyn crate::source::Source>, u64) -> crate::source::BoxFuture<'static, Result<T>>
        + Send
        + Sync
        + 'static,
{
    let rt = crate::source::runtime()?;
    let read = Arc::new(read);
    let limit = Arc::new(tokio::sync::Semaphore::new(HEADER_CONCURRENCY));
    let tasks: Vec<_> = shards
        .iter()
        .map(|shard| {
            let (shard, io, limit, read) = (shard.clone(), io.clone(), limit.clone(), read.clone());
            rt.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let source = io.open(&shard)?;
                let size = match shard.size {
                    Some(size) => size,
                    None => source.size().await?,
                };
                read(source, size).await
            })
        })
        .collect();
    rt.block_on(async {
        let mut out = Vec::with_capacity(tasks.len());
        for (shard, task) in shards.iter().zip(tasks) {
            out.push(task.await.unwrap_or_else(|e| {
                Err(crate::error::Error::decode(
                    &shard.url,
                    format,
                    crate::error::Position::Unknown,
                    format!("the header parser failed: {e}"),
                ))
            }));
        }
        Ok(out)
    })
}

/// A unit that reads its whole file, then decodes it: one range read when the size is
/// known (for remote objects, many such reads go on at once), else a stream.
pub fn whole_file_job(
    shard: &ShardMeta,
    decode: impl FnOnce(bytes::Bytes) -> Result<Decoded> + Send + 'static,
) -> UnitJob {
    if let Some(size) = shard.size {
        return UnitJob::Ranges {
            ranges: std::iter::once(0..size).collect(),
            decode: Box::new(move |fetched: RangeSet, _: &mut BatchSink| {
                decode(fetched.get(0, size).unwrap_or_default())
            }),
        };
    }
    let url = shard.url.clone();
    UnitJob::Stream(Box::new(move |mut reader, emit: &mut EmitTask| {
        let mut data = Vec::new();
        reader
            .read_to_end(&mut data)
            .map_err(|e| crate::error::Error::io(url, crate::error::Position::Unknown, e))?;
        let data = bytes::Bytes::from(data);
        emit(task(move || decode(data)));
        Ok(())
    }))
}

/// `start` times the product of `dims`; `None` on overflow. Zero when any dimension is
/// zero, whatever the others: a `(2^60, 2^60, 0)` array holds nothing, and must not be
/// taken for one too large to count.
pub fn shape_product(start: usize, dims: &[usize]) -> Option<usize> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter().try_fold(start, |acc, &d| acc.checked_mul(d))
}

/// Field metadata of Arrow's canonical fixed-shape tensor extension type.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
pub const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";
pub const TENSOR_EXTENSION: &str = "arrow.fixed_shape_tensor";
/// Arrow's canonical extension for tensors of one dtype and rank but their own shapes.
pub const VARIABLE_TENSOR_EXTENSION: &str = "arrow.variable_shape_tensor";

/// A fixed-shape tensor column: `FixedSizeList<leaf>(prod(shape))` tagged with its shape,
/// so consumers (our numpy conversion, pyarrow) see `(rows, *shape)`.
pub fn tensor_field(name: &str, leaf: DataType, shape: &[usize], nullable: bool) -> Field {
    // Callers have checked that the width fits (`npy::Header::check`, Example specs).
    let width = shape_product(1, shape).map_or(0, |w| w as i32);
    let storage = DataType::FixedSizeList(Arc::new(Field::new_list_field(leaf, false)), width);
    let shape_json = format!(
        "{{\"shape\":[{}]}}",
        shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    Field::new(name, storage, nullable).with_metadata([
        (EXTENSION_NAME_KEY.to_string(), TENSOR_EXTENSION.to_string()),
        (EXTENSION_METADATA_KEY.to_string(), shape_json),
    ])
}

/// A column of `ndim`-dimensional tensors of `leaf`, each of its own shape: Arrow's
/// canonical variable-shape tensor, a struct of `data` (each tensor's values, row-major)
/// and `shape`. `uniform` gives the dimensions every tensor shares (`None`: varies).
pub fn variable_tensor_field(name: &str, leaf: DataType, uniform: &[Option<usize>]) -> Field {
    let ndim = uniform.len() as i32;
    let storage = DataType::Struct(
        vec![
            Field::new(
                "data",
                DataType::LargeList(Arc::new(Field::new_list_field(leaf, false))),
                false,
            ),
            Field::new(
                "shape",
                DataType::FixedSizeList(
                    Arc::new(Field::new_list_field(DataType::Int32, false)),
                    ndim,
                ),
                false,
            ),
        ]
        .into(),
    );
    let uniform = serde_json::to_string(uniform).unwrap_or_else(|_| "null".into());
    Field::new(name, storage, true).with_metadata([
        (
            EXTENSION_NAME_KEY.to_string(),
            VARIABLE_TENSOR_EXTENSION.to_string(),
        ),
        (
            EXTENSION_METADATA_KEY.to_string(),
            format!("{{\"uniform_shape\":{uniform}}}"),
        ),
    ])
}

/// Whether `field` holds variable-shape tensors (see [`variable_tensor_field`]).
pub fn is_variable_tensor(field: &Field) -> bool {
    field.metadata().get(EXTENSION_NAME_KEY).map(String::as_str) == Some(VARIABLE_TENSOR_EXTENSION)
}

/// The shape a field declares through the tensor extension type.
pub fn tensor_shape(field: &Field) -> Option<Vec<usize>> {
    let metadata = field.metadata();
    if metadata.get(EXTENSION_NAME_KEY).map(String::as_str) != Some(TENSOR_EXTENSION) {
        return None;
    }
    let parsed: serde_json::Value =
        serde_json::from_str(metadata.get(EXTENSION_METADATA_KEY)?).ok()?;
    parsed
        .get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect()
}

/// A part of one shard that is fetched and decoded on its own: the unit of parallel
/// work and of shuffled shard order (a Parquet row group, a whole JSONL file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkUnit {
    /// Index into [`PreparedShards::shards`].
    pub shard: usize,
    /// Format-specific part number (row group index for Parquet, 0 for whole files).
    pub part: usize,
    /// Rows in the unit, where the format's metadata says so.
    pub rows: Option<u64>,
}

/// The output of one decode task: what it did not already hand to its [`BatchSink`].
#[derive(Debug, Default)]
pub struct Decoded {
    pub batches: Vec<RecordBatch>,
    /// Records dropped under `OnError::Skip`.
    pub skipped: u64,
}

/// Takes batches from a decode task while it runs. A task that makes many batches (a
/// Parquet row group) hands each over as it is made, so that the unit's first rows reach
/// the consumer without waiting for its last; they come before the task's [`Decoded`].
pub type BatchSink<'a> = dyn FnMut(RecordBatch) + 'a;

/// CPU work that turns fetched bytes into batches; runs on the decode thread pool.
pub type DecodeTask = Box<dyn FnOnce(&mut BatchSink) -> Result<Decoded> + Send>;

/// A decode task that returns all of its batches at its end.
pub fn task(decode: impl FnOnce() -> Result<Decoded> + Send + 'static) -> DecodeTask {
    Box::new(move |_: &mut BatchSink| decode())
}

/// Decodes the fetched ranges of one unit (see [`BatchSink`]).
pub type DecodeRanges = Box<dyn FnOnce(RangeSet, &mut BatchSink) -> Result<Decoded> + Send>;

/// Emits a decode task; returns false once the consumer has gone away.
pub type EmitTask<'a> = dyn FnMut(DecodeTask) -> bool + 'a;

/// Reads a shard's stream to its end, emitting decode tasks as it goes.
pub type StreamJob = Box<dyn FnOnce(Box<dyn Read + Send>, &mut EmitTask) -> Result<()> + Send>;

/// How the pipeline should fetch one unit's bytes.
pub enum UnitJob {
    /// Random access: fetch these byte ranges (concurrently), then decode them.
    Ranges {
        ranges: Vec<Range<u64>>,
        decode: DecodeRanges,
    },
    /// Sequential: read the shard front to back on a blocking thread, cutting it into
    /// decode tasks as it goes (so a large file is decoded in parallel, in bounded memory).
    Stream(StreamJob),
    /// Nothing to fetch (records already in memory): just this task.
    Ready(DecodeTask),
}

/// Makes each work unit's job for one prepared dataset: the format-specific part.
pub trait UnitJobs: Send + Sync {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob;
    /// A job that decodes only the unit's rows at `rows` (ascending, distinct offsets in
    /// the unit), in that order, where the format can pass over the rest without
    /// decoding it (Parquet skips the pages that hold none of them); `None` where it
    /// cannot, and the whole unit is decoded. Reads it makes itself go through `io`.
    fn rows_job(
        &self,
        _unit: &WorkUnit,
        _shard: &ShardMeta,
        _rows: &[u64],
        _io: &Io,
    ) -> Option<UnitJob> {
        None
    }
    /// Whether a job for some of the unit's rows (`rows_job`) reads about those rows'
    /// bytes, not the whole unit's: a random-access reader then asks for a unit's rows as
    /// they are wanted, never for the whole unit, and does not read ahead.
    fn reads_rows_alone(&self, _unit: &WorkUnit, _shard: &ShardMeta, _io: &Io) -> Result<bool> {
        Ok(false)
    }
    /// How a stream format finds and decodes single records, for its record index.
    fn record_codec(&self) -> Option<Arc<dyn index::RecordCodec>> {
        None
    }
    /// Per-record reads, once the dataset is indexed.
    fn record_access(&self) -> Option<index::RecordAccess> {
        None
    }
}

/// Shards a format has looked at (footers read, schema known), ready to be read.
pub struct PreparedShards {
    /// The format's name as shown in errors ("Parquet", "JSON").
    pub format: &'static str,
    /// The schema of every batch (after projection).
    pub schema: SchemaRef,
    /// The shards that are read; units refer to them by index.
    pub shards: Vec<ShardMeta>,
    pub units: Vec<WorkUnit>,
    /// Shards dropped while preparing because they were unreadable and `on_error="skip"`.
    pub skipped_shards: u64,
    jobs: Box<dyn UnitJobs>,
}

impl PreparedShards {
    pub fn new(
        format: &'static str,
        schema: SchemaRef,
        shards: Vec<ShardMeta>,
        units: Vec<WorkUnit>,
        jobs: impl UnitJobs + 'static,
    ) -> Self {
        Self {
            format,
            schema,
            shards,
            units,
            skipped_shards: 0,
            jobs: Box::new(jobs),
        }
    }

    pub fn with_skipped_shards(self, skipped_shards: u64) -> Self {
        Self {
            skipped_shards,
            ..self
        }
    }

    pub fn job(&self, unit: &WorkUnit) -> UnitJob {
        self.jobs.job(unit, &self.shards[unit.shard])
    }

    /// See [`UnitJobs::reads_rows_alone`].
    pub fn reads_rows_alone(&self, unit: &WorkUnit, io: &Io) -> Result<bool> {
        self.jobs
            .reads_rows_alone(unit, &self.shards[unit.shard], io)
    }

    /// See [`UnitJobs::rows_job`].
    pub fn rows_job(&self, unit: &WorkUnit, rows: &[u64], io: &Io) -> Option<UnitJob> {
        self.jobs.rows_job(unit, &self.shards[unit.shard], rows, io)
    }

    /// `plain` (format `format`) with the image columns `spec` names decoded (see
    /// [`image`]).
    pub fn with_images(
        plain: &Arc<Self>,
        spec: &image::ImageSpec,
        format: &'static str,
        on_error: OnError,
    ) -> Result<Self> {
        let images = Arc::new(spec.bind(format, &plain.schema, on_error)?);
        Ok(Self {
            format: plain.format,
            schema: images.schema.clone(),
            shards: plain.shards.clone(),
            units: plain.units.clone(),
            skipped_shards: plain.skipped_shards,
            jobs: Box::new(image::ImageJobs {
                inner: plain.clone(),
                images,
            }),
        })
    }

    pub fn record_codec(&self) -> Option<Arc<dyn index::RecordCodec>> {
        self.jobs.record_codec()
    }

    pub fn record_access(&self) -> Option<index::RecordAccess> {
        self.jobs.record_access()
    }
}

pub trait Format: Send + Sync {
    fn name(&self) -> &'static str;
    /// Reads what is needed up front (Parquet footers, a JSON schema sample) and splits
    /// the shards into work units.
    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards>;
}

struct Registration {
    name: &'static str,
    /// Extensions that select this format when `format=None`; `.gz` variants included.
    extensions: &'static [&'static str],
    make: fn() -> Arc<dyn Format>,
}

static REGISTRY: &[Registration] = &[
    Registration {
        name: "parquet",
        extensions: &[".parquet", ".pq"],
        make: || Arc::new(parquet::Parquet),
    },
    Registration {
        name: "jsonl",
        extensions: &[".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz"],
        make: || Arc::new(jsonl::JsonLines),
    },
    // `.json` files hold JSON Lines or one JSON array of records (`Dataset::open` reads
    // an array into memory; see `jsonl::json_arrays`), as `datasets`' json loader.
    Registration {
        name: "json",
        extensions: &[".json", ".json.gz"],
        make: || Arc::new(jsonl::JsonLines),
    },
    Registration {
        name: "npy",
        extensions: &[".npy"],
        make: || Arc::new(npy::Npy),
    },
    Registration {
        name: "npz",
        extensions: &[".npz"],
        make: || Arc::new(npz::Npz),
    },
    Registration {
        name: "arrow",
        extensions: &[".arrow", ".feather", ".arrows", ".ipc"],
        make: || Arc::new(arrow_ipc::ArrowIpc),
    },
    Registration {
        name: "csv",
        extensions: &[".csv", ".csv.gz"],
        make: || Arc::new(csv::Csv),
    },
    Registration {
        name: "raw",
        extensions: &[],
        make: || Arc::new(raw::Raw),
    },
    Registration {
        name: "webdataset",
        extensions: &[".tar", ".tar.gz", ".tgz"],
        make: || Arc::new(webdataset::WebDataset),
    },
    Registration {
        name: "hdf5",
        extensions: &[".h5", ".hdf5"],
        make: || Arc::new(self::hdf5::Hdf5),
    },
    Registration {
        name: "tfrecord",
        extensions: &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz"],
        make: || Arc::new(tfrecord::TfRecord),
    },
];

/// Looks a format up by the name users pass as `format=`.
pub fn by_name(name: &str) -> Result<Arc<dyn Format>> {
    registered(name).map(|r| (r.make)())
}

/// The registration of the format `format=` names (a reader may serve several names:
/// `json` reads with the JSON Lines reader, arrays aside).
fn registered(name: &str) -> Result<&'static Registration> {
    REGISTRY.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<_> = REGISTRY.iter().map(|r| r.name).collect();
        Error::invalid_argument(format!(
            "unknown format {name:?}; known formats: {}",
            known.join(", ")
        ))
    })
}

/// The format name implied by a file name's extension.
pub fn name_for_path(url: &str) -> Option<&'static str> {
    let lower = url.to_ascii_lowercase();
    REGISTRY
        .iter()
        .find(|r| r.extensions.iter().any(|ext| lower.ends_with(ext)))
        .map(|r| r.name)
}

/// Picks the format of a shard list and keeps the shards to read as that format.
///
/// `named(url)` says whether the user named the file itself, rather than it being found
/// by listing a directory, a prefix or a glob. A named file is always read, and without
/// `format=` its extension must name the format. A listing is read as a repository
/// holds data: its files of the format are kept and the rest (a README.md, a LICENSE, a
/// `.gitattributes`) are left out, as `datasets` leaves them out. A listing that holds
/// two data formats is still an error, and so is a format given whose extension no
/// listed file has — unless it has none (`raw`), or no listed file names a format
/// (Spark's `part-00000` files read with `format="parquet"`).
pub fn choose(
    shards: Vec<ShardMeta>,
    format: Option<&str>,
    named: impl Fn(&str) -> bool,
) -> Result<(&'static str, Vec<ShardMeta>)> {
    let mut found: Option<(&'static str, &str)> = None;
    for shard in &shards {
        let implied = name_for_path(&shard.url);
        let Some(name) = implied else {
            if named(&shard.url) && format.is_none() {
                return Err(Error::invalid_argument(format!(
                    "{}: cannot infer the format from the file name; pass format=",
                    shard.url
                )));
            }
            continue;
        };
        match found {
            Some((previous, example)) if previous != name && format.is_none() => {
                return Err(Error::invalid_argument(format!(
                    "the sources mix formats ({previous}, e.g. {example}, and {name}, e.g. {}); pass format= or narrow the pattern",
                    shard.url
                )));
            }
            None => found = Some((name, &shard.url)),
            _ => {}
        }
    }
    let name = match (format, found) {
        (Some(given), _) => registered(given)?.name,
        (None, Some((name, _))) => name,
        (None, None) => {
            return Err(match shards.first() {
                Some(shard) => Error::invalid_argument(format!(
                    "{}: cannot infer the format from the file names; pass format=",
                    shard.url
                )),
                None => Error::invalid_argument("no source given"),
            });
        }
    };
    // A file is of the format when its extension names it, or names another format of
    // the same reader (`.jsonl` files are read by format="json" too).
    let reader = by_name(name)?.name();
    let of_format = |url: &str| {
        name_for_path(url)
            .is_some_and(|n| n == name || by_name(n).is_ok_and(|f| f.name() == reader))
    };
    let any_of_format = shards.iter().any(|s| of_format(&s.url));
    let kept: Vec<ShardMeta> = shards
        .into_iter()
        .filter(|s| named(&s.url) || of_format(&s.url) || !any_of_format)
        .collect();
    if kept.is_empty() {
        return Err(Error::invalid_argument("no source given"));
    }
    Ok((name, kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infer(shards: &[ShardMeta]) -> Result<&'static str> {
        choose(shards.to_vec(), None, |_| true).map(|(name, _)| name)
    }

    fn shard(url: &str) -> ShardMeta {
        ShardMeta {
            url: url.into(),
            size: None,
            etag: None,
            rows: None,
        }
    }

    #[test]
    fn format_inferred_from_extension() {
        assert_eq!(infer(&[shard("a/b.parquet")]).unwrap(), "parquet");
        assert_eq!(
            infer(&[shard("x.JSONL.GZ"), shard("y.ndjson")]).unwrap(),
            "jsonl"
        );
        let listed = |_: &str| false;
        assert!(infer(&[shard("a.parquet"), shard("b.jsonl")]).is_err());
        assert!(infer(&[shard("a.bin")]).is_err());
        // A listing's README is left out; a named one is not.
        let (name, kept) = choose(
            vec![shard("d/README.md"), shard("d/a.parquet")],
            None,
            listed,
        )
        .unwrap();
        assert_eq!((name, kept), ("parquet", vec![shard("d/a.parquet")]));
        assert!(choose(vec![shard("README.md"), shard("a.parquet")], None, |_| true).is_err());
        // format= given: a listing's other files are left out, unless none has its extension.
        let (_, kept) = choose(
            vec![shard("d/README.md"), shard("d/b.csv")],
            Some("csv"),
            listed,
        )
        .unwrap();
        assert_eq!(kept, vec![shard("d/b.csv")]);
        // The name given is kept, not its reader's (json reads with the JSON Lines one),
        // and a listing's files of that reader are its files.
        assert_eq!(
            choose(vec![shard("a.json")], Some("json"), listed)
                .unwrap()
                .0,
            "json"
        );
        let listing = vec![shard("d/LICENSE"), shard("d/c.jsonl")];
        let (_, kept) = choose(listing, Some("json"), listed).unwrap();
        assert_eq!(kept, vec![shard("d/c.jsonl")]);
        let spark = vec![shard("d/part-00000"), shard("d/part-00001")];
        assert_eq!(
            choose(spark.clone(), Some("parquet"), listed).unwrap().1,
            spark
        );
        assert!(by_name("nope").is_err());
        assert_eq!(by_name("jsonl").unwrap().name(), "jsonl");
    }

    #[test]
    fn columns_resolve_in_the_order_asked() {
        let names = ["a", "b", "c"];
        let cols = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            column_indices(&names, &cols(&["c", "a"]), "u").unwrap(),
            vec![2, 0]
        );
        let missing = column_indices(&names, &cols(&["z"]), "f.csv").unwrap_err();
        assert!(matches!(missing, Error::Schema { .. }));
        assert!(
            missing.to_string().contains(r#"no column "z""#),
            "{missing}"
        );
        assert!(matches!(
            column_indices(&names, &cols(&["a", "a"]), "u"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(column_indices(&names, &[], "u").is_err());
    }
}
