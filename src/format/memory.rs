//! Records already in memory (`shardflow.from_arrow` / `from_dict` / `from_list`): each
//! record batch is one work unit with its row count known, so every verb, split and
//! index works as for files.
//!
//! A unit hands out a copy of its batch, never the batch itself: the user's table (and
//! this dataset) outlive every batch read from it, so a consumer writing into a batch's
//! numpy views in place (`x /= 255`) must not change the table or what later reads see.

use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use sha2::{Digest, Sha256};

use super::{
    Decoded, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit, column_indices,
    field_names, task,
};
use crate::error::{Error, Result};
use crate::source::{Io, ShardMeta};

const FORMAT: &str = "in-memory";

pub struct InMemory {
    schema: SchemaRef,
    batches: Arc<Vec<RecordBatch>>,
}

impl InMemory {
    /// The format, and one pseudo-shard per batch whose ETag is a digest of the batch's
    /// values (so a saved state never resumes over other data).
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> (Self, Vec<ShardMeta>) {
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let shards = batches
            .iter()
            .enumerate()
            .map(|(i, batch)| ShardMeta {
                url: format!("memory:batch-{i}"),
                size: Some(crate::batch_bytes::batch_bytes(batch)),
                etag: Some(digest(batch)),
                rows: None,
            })
            .collect();
        let format = Self {
            schema,
            batches: Arc::new(batches),
        };
        (format, shards)
    }
}

fn digest(batch: &RecordBatch) -> String {
    use arrow_array::Array;
    fn feed(hash: &mut Sha256, data: &arrow_data::ArrayData) {
        hash.update(format!(
            "{}:{}:{}",
            data.data_type(),
            data.offset(),
            data.len()
        ));
        for buffer in data.buffers() {
            hash.update(buffer.as_slice());
        }
        if let Some(nulls) = data.nulls() {
            hash.update(nulls.validity());
        }
        for child in data.child_data() {
            feed(hash, child);
        }
    }
    let mut hash = Sha256::new();
    for column in batch.columns() {
        feed(&mut hash, &column.to_data());
    }
    hash.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Format for InMemory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        _io: &Io,
    ) -> Result<PreparedShards> {
        let columns = match &options.columns {
            None => (0..self.schema.fields().len()).collect(),
            Some(names) => column_indices(&field_names(&self.schema), names, FORMAT)?,
        };
        let schema = Arc::new(
            self.schema
                .project(&columns)
                .map_err(|e| Error::invalid_argument(e.to_string()))?,
        );
        let units = self
            .batches
            .iter()
            .enumerate()
            .map(|(shard, batch)| WorkUnit {
                shard,
                part: 0,
                rows: Some(batch.num_rows() as u64),
            })
            .collect();
        let jobs = Jobs {
            batches: self.batches.clone(),
            schema: schema.clone(),
            columns,
        };
        Ok(PreparedShards::new(FORMAT, schema, shards, units, jobs))
    }
}

struct Jobs {
    batches: Arc<Vec<RecordBatch>>,
    schema: SchemaRef,
    columns: Vec<usize>,
}

impl UnitJobs for Jobs {
    fn job(&self, unit: &WorkUnit, _shard: &ShardMeta) -> UnitJob {
        let (batches, schema, columns) = (
            self.batches.clone(),
            self.schema.clone(),
            self.columns.clone(),
        );
        let index = unit.shard;
        UnitJob::Ready(task(move || {
            let batch = batches
                .get(index)
                .ok_or_else(|| Error::Internal(format!("no in-memory batch {index}")))?;
            let all = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
            let copy = batch
                .project(&columns)
                .and_then(|b| arrow_select::take::take_record_batch(&b, &all))
                .and_then(|b| RecordBatch::try_new(schema, b.columns().to_vec()))
                .map_err(|e| Error::Internal(format!("cannot copy an in-memory batch: {e}")))?;
            Ok(Decoded {
                batches: vec![copy],
                skipped: Vec::new(),
            })
        }))
    }
}
