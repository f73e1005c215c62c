//! What every format implements ([`Format`]), the options a dataset is read with
//! ([`ReadOptions`]), and what preparing shards gives the pipeline ([`PreparedShards`]:
//! the schema, the work units and the jobs that decode them).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::SchemaRef;

use super::example::FeatureSpec;
use super::image_spec::ImageSpec;
use super::records::{RecordAccess, RecordCodec};
use super::unit::{OnError, UnitJob, WorkUnit};
use crate::error::Result;
use crate::source::{Io, ShardMeta};

/// Options for reading a dataset. Formats reject the ones they cannot use.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Column projection, in the order the user wants them.
    pub columns: Option<Vec<String>>,
    /// A schema given by the user instead of one inferred from the data.
    pub schema: Option<SchemaRef>,
    /// A `tf.io.parse_example`-style spec for TFRecord Examples.
    pub features: Option<Vec<FeatureSpec>>,
    /// Format-specific settings.
    pub format_options: crate::options::Options,
    pub on_error: OnError,
    /// Image columns to decode, taken out of `format_options` (see `image_spec`).
    pub images: Option<ImageSpec>,
    /// Features a cast gave media columns (`Image`, `Audio`: `datasets`' JSON of each,
    /// by column), over those the files were written with: they say how the columns
    /// decode as they are read.
    pub media_features: BTreeMap<String, serde_json::Value>,
    /// Where decoded units are kept for later reads (see [`super::decoded_cache`]).
    pub decoded_cache: Option<std::path::PathBuf>,
}

/// Makes each work unit's job for one prepared dataset: the format-specific part.
pub trait UnitJobs: Send + Sync {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob;
    /// Whether the unit is kept decoded (`decoded_cache=`), so that reading some of its
    /// rows touches only their bytes (see `rows_job`). Asked anew each time: a unit is
    /// kept once some read has decoded it.
    fn kept(&self, _unit: &WorkUnit, _shard: &ShardMeta) -> bool {
        false
    }
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
    /// A job that decodes the whole unit reading its bytes as the decoder asks for them,
    /// not fetched whole first, where the format can from this shard (a local Parquet
    /// file, page by page): a reader that hands each batch on as it comes then holds the
    /// page being decoded, not the unit (unless the unit is one page). `None` where it
    /// cannot (`job` fetches the unit).
    fn streamed_job(&self, _unit: &WorkUnit, _shard: &ShardMeta, _io: &Io) -> Option<UnitJob> {
        None
    }
    /// Whether a job for some of the unit's rows (`rows_job`) reads about those rows'
    /// bytes, not the whole unit's: a random-access reader then asks for a unit's rows as
    /// they are wanted, never for the whole unit, and does not read ahead.
    fn reads_rows_alone(&self, _unit: &WorkUnit, _shard: &ShardMeta, _io: &Io) -> Result<bool> {
        Ok(false)
    }
    /// What reading one row of the unit alone fetches, as a multiple of the bytes the row
    /// is stored in, where the format reads rows by page and knows its pages from the
    /// metadata read already (Parquet's offset index); `None` where it does not.
    fn row_read_share(&self, _unit: &WorkUnit, _shard: &ShardMeta) -> Option<f64> {
        None
    }
    /// How a stream format finds and decodes single records, for its record index.
    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        None
    }
    /// Per-record reads, once the dataset is indexed.
    fn record_access(&self) -> Option<RecordAccess> {
        None
    }
}

/// Shards a format has looked at (footers read, schema known), ready to be read.
/// The metadata key under which `datasets` stores a file's features.
pub const HUGGINGFACE_KEY: &str = "huggingface";

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
    /// The `huggingface` key of the files' metadata: the features (JSON) `datasets`
    /// wrote them with, where it did.
    pub huggingface: Option<String>,
    pub(super) jobs: Box<dyn UnitJobs>,
}

impl PreparedShards {
    pub fn new(
        format: &'static str,
        schema: SchemaRef,
        shards: Vec<ShardMeta>,
        units: Vec<WorkUnit>,
        jobs: impl UnitJobs + 'static,
    ) -> Self {
        // Formats whose schema keeps the file's metadata (Arrow IPC) carry the key in it.
        let huggingface = schema.metadata().get(HUGGINGFACE_KEY).cloned();
        Self {
            format,
            schema,
            shards,
            units,
            skipped_shards: 0,
            huggingface,
            jobs: Box::new(jobs),
        }
    }

    /// The features `datasets` wrote the files with (see [`Self::huggingface`]).
    pub fn with_huggingface(self, huggingface: Option<String>) -> Self {
        Self {
            huggingface: huggingface.or(self.huggingface),
            ..self
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

    /// See [`UnitJobs::streamed_job`]; `job`'s where the format has none.
    pub fn streamed_job(&self, unit: &WorkUnit, io: &Io) -> UnitJob {
        let shard = &self.shards[unit.shard];
        self.jobs
            .streamed_job(unit, shard, io)
            .unwrap_or_else(|| self.jobs.job(unit, shard))
    }

    /// See [`UnitJobs::reads_rows_alone`].
    pub fn reads_rows_alone(&self, unit: &WorkUnit, io: &Io) -> Result<bool> {
        self.jobs
            .reads_rows_alone(unit, &self.shards[unit.shard], io)
    }

    /// See [`UnitJobs::row_read_share`].
    pub fn row_read_share(&self, unit: &WorkUnit) -> Option<f64> {
        self.jobs.row_read_share(unit, &self.shards[unit.shard])
    }

    /// See [`UnitJobs::kept`].
    pub fn kept(&self, unit: &WorkUnit) -> bool {
        self.jobs.kept(unit, &self.shards[unit.shard])
    }

    /// See [`UnitJobs::rows_job`].
    pub fn rows_job(&self, unit: &WorkUnit, rows: &[u64], io: &Io) -> Option<UnitJob> {
        self.jobs.rows_job(unit, &self.shards[unit.shard], rows, io)
    }

    pub fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        self.jobs.record_codec()
    }

    pub fn record_access(&self) -> Option<RecordAccess> {
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
