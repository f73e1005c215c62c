//! WRITE: a dataset's rows, in their order, into shard files of one format, with a
//! manifest (see [`crate::source::manifest`]). The pipeline reads and decodes as for any
//! pass; this thread cuts its batches into shards by rows and bytes, and writer threads
//! encode and store shards in parallel. Shards are named `part-00000<ext>` in row order,
//! so the same dataset (and seed) writes the same files.

mod dest;
mod encode;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

pub use encode::ShardFormat;

use crate::error::{Error, Result};
use crate::pipeline::{Dataset, RunOptions, Stats, batch_bytes};
use crate::source::Storage;
use crate::source::manifest::{MANIFEST_NAME, Manifest, ManifestShard};
use dest::Destination;

/// The shard size when neither limit is given: the in-memory size of its rows, as
/// LitData's default chunk (large enough to read fast, small enough to spread).
pub const DEFAULT_SHARD_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub format: ShardFormat,
    /// Rows per shard at most.
    pub max_rows_per_shard: Option<u64>,
    /// Bytes per shard at most, counted as the rows' in-memory (Arrow) size before
    /// encoding and compression: a shard file is about this size or smaller. A single
    /// row larger than this gets a shard of its own.
    pub max_bytes_per_shard: Option<u64>,
    /// Replace what the destination holds instead of refusing to write there.
    pub overwrite: bool,
    /// Writer threads (shards encoded and stored at once).
    pub threads: usize,
}

impl WriteOptions {
    fn limits(&self) -> (u64, u64) {
        let rows = self.max_rows_per_shard.unwrap_or(u64::MAX);
        let bytes = match (self.max_bytes_per_shard, self.max_rows_per_shard) {
            (Some(bytes), _) => bytes,
            (None, Some(_)) => u64::MAX,
            (None, None) => DEFAULT_SHARD_BYTES,
        };
        (rows.max(1), bytes.max(1))
    }
}

/// A shard's rows on their way to a writer thread.
struct ShardJob {
    index: usize,
    first_row: u64,
    rows: u64,
    batches: Vec<RecordBatch>,
}

/// A stored shard, or why it could not be stored.
type Stored = Result<(usize, ManifestShard)>;

/// Writes every row of `dataset` (epoch `epoch` of its order) to `dest`, then the
/// manifest, which it returns. `progress(rows, bytes)` is called as rows are handed to
/// the writers and as shards are stored (rows handed over, bytes stored); an error it
/// returns stops the write.
pub fn write(
    dataset: &Dataset,
    epoch: u64,
    dest: &str,
    storage: &Arc<Storage>,
    options: &WriteOptions,
    progress: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<Manifest> {
    let format = options.format;
    let schema = dataset.schema()?;
    format.check_schema(&schema)?;
    let destination = Destination::new(dest, storage)?;
    // Overwriting shards while they are read would corrupt both.
    if let Some(shard) = dataset
        .shards()
        .iter()
        .find(|s| destination.contains(&s.url))
    {
        return Err(Error::invalid_argument(format!(
            "{}: the dataset reads {}, inside it; write somewhere else",
            destination.url(),
            shard.url
        )));
    }
    let existing = destination.prepare(options.overwrite)?;
    let run = RunOptions {
        epoch,
        ..RunOptions::default()
    };
    let mut receiver = dataset.start(run, Arc::new(Stats::default()))?;

    let threads = options.threads.max(1);
    let (job_tx, job_rx) = mpsc::sync_channel::<ShardJob>(threads);
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = mpsc::channel::<Stored>();
    let failed = AtomicBool::new(false);
    let store = |job: ShardJob| -> Stored {
        let path = format!("part-{:05}{}", job.index, format.extension());
        let bytes = format.encode(&schema, &job.batches, job.first_row)?;
        let size = bytes.len() as u64;
        destination.put(&path, bytes)?;
        Ok((
            job.index,
            ManifestShard {
                path,
                rows: job.rows,
                bytes: size,
            },
        ))
    };

    let mut shards = Vec::new();
    let outcome = std::thread::scope(|scope| {
        for i in 0..threads {
            let (job_rx, done_tx, failed, store) = (&job_rx, done_tx.clone(), &failed, &store);
            std::thread::Builder::new()
                .name(format!("shardflow-write-{i}"))
                .spawn_scoped(scope, move || {
                    loop {
                        let job = match job_rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        };
                        // After a failure the rest is drained unwritten.
                        if failed.load(Ordering::Relaxed) {
                            continue;
                        }
                        let stored = store(job);
                        if stored.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        if done_tx.send(stored).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Error::Internal(format!("cannot start a writer thread: {e}")))?;
        }
        drop(done_tx);
        let mut cutter = Cutter::new(options.limits());
        let stored_bytes = std::cell::Cell::new(0);
        let take_done = |shards: &mut Vec<(usize, ManifestShard)>, block: bool| -> Result<()> {
            loop {
                let next = if block {
                    done_rx.recv().ok()
                } else {
                    done_rx.try_recv().ok()
                };
                let Some(stored) = next else { return Ok(()) };
                let (index, shard) = stored?;
                stored_bytes.set(stored_bytes.get() + shard.bytes);
                shards.push((index, shard));
            }
        };
        let fed = (|| -> Result<()> {
            while let Some(batch) = receiver.recv()? {
                for job in cutter.push(batch) {
                    job_tx
                        .send(job)
                        .map_err(|_| Error::Internal("the writer threads stopped".into()))?;
                }
                take_done(&mut shards, false)?;
                progress(cutter.rows_handed, stored_bytes.get())?;
            }
            if let Some(job) = cutter.finish() {
                job_tx
                    .send(job)
                    .map_err(|_| Error::Internal("the writer threads stopped".into()))?;
            }
            Ok(())
        })();
        drop(job_tx);
        if fed.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let stored = take_done(&mut shards, true);
        fed.and(stored)?;
        progress(cutter.rows_handed, stored_bytes.get())
    });
    receiver.close();
    outcome?;

    shards.sort_by_key(|(index, _)| *index);
    let manifest = Manifest {
        format: format.name().to_string(),
        format_options: format.read_options(),
        compression: format.compression(),
        shards: shards.into_iter().map(|(_, shard)| shard).collect(),
        columns: describe_columns(&schema),
    };
    let text = serde_json::to_vec_pretty(&manifest.to_json())
        .map_err(|e| Error::Internal(format!("manifest: {e}")))?;
    destination.put(MANIFEST_NAME, text)?;
    let written: Vec<String> = manifest.shards.iter().map(|s| s.path.clone()).collect();
    destination.remove_stale(&existing, &written)?;
    Ok(manifest)
}

fn describe_columns(schema: &SchemaRef) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect()
}

/// Cuts a stream of batches into shards of at most `max_rows` rows and about
/// `max_bytes` bytes (each row weighs its batch's average), without copying rows.
struct Cutter {
    max_rows: u64,
    max_bytes: u64,
    batches: Vec<RecordBatch>,
    rows: u64,
    bytes: u64,
    next_index: usize,
    /// Rows handed to writers so far (the next shard's first row).
    rows_handed: u64,
}

impl Cutter {
    fn new((max_rows, max_bytes): (u64, u64)) -> Self {
        Self {
            max_rows,
            max_bytes,
            batches: Vec::new(),
            rows: 0,
            bytes: 0,
            next_index: 0,
            rows_handed: 0,
        }
    }

    /// Takes a batch; returns the shards it completes.
    fn push(&mut self, mut batch: RecordBatch) -> Vec<ShardJob> {
        let mut jobs = Vec::new();
        let per_row = match batch.num_rows() as u64 {
            0 => return jobs,
            n => (batch_bytes(&batch) / n).max(1),
        };
        while batch.num_rows() > 0 {
            let left = batch.num_rows() as u64;
            let room_rows = self.max_rows - self.rows;
            let room_bytes = self.max_bytes.saturating_sub(self.bytes) / per_row;
            // A row larger than the byte limit still goes somewhere: a shard of its own.
            let take = left
                .min(room_rows)
                .min(room_bytes)
                .max(u64::from(self.rows == 0));
            if take > 0 {
                self.batches.push(batch.slice(0, take as usize));
                batch = batch.slice(take as usize, (left - take) as usize);
                self.rows += take;
                self.bytes += take * per_row;
            }
            if self.rows >= self.max_rows || self.bytes.saturating_add(per_row) > self.max_bytes {
                jobs.extend(self.finish());
            }
        }
        jobs
    }

    /// The shard being filled, if it holds any rows.
    fn finish(&mut self) -> Option<ShardJob> {
        if self.rows == 0 {
            return None;
        }
        let job = ShardJob {
            index: self.next_index,
            first_row: self.rows_handed,
            rows: self.rows,
            batches: std::mem::take(&mut self.batches),
        };
        self.next_index += 1;
        self.rows_handed += self.rows;
        self.rows = 0;
        self.bytes = 0;
        Some(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};

    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .unwrap()
    }

    #[test]
    fn cuts_by_rows_and_bytes_across_batches() {
        let mut cutter = Cutter::new((4, u64::MAX));
        let mut jobs = cutter.push(batch(3));
        jobs.extend(cutter.push(batch(7)));
        jobs.extend(cutter.finish());
        let rows: Vec<u64> = jobs.iter().map(|j| j.rows).collect();
        assert_eq!(rows, [4, 4, 2]);
        let firsts: Vec<u64> = jobs.iter().map(|j| j.first_row).collect();
        assert_eq!(firsts, [0, 4, 8]);
        assert_eq!(jobs[0].batches.len(), 2);

        // 8 bytes a row: 20 bytes hold 2 rows.
        let mut cutter = Cutter::new((u64::MAX, 20));
        let mut jobs = cutter.push(batch(5));
        jobs.extend(cutter.finish());
        assert_eq!(jobs.iter().map(|j| j.rows).collect::<Vec<_>>(), [2, 2, 1]);

        // A limit below one row: a row a shard.
        let mut cutter = Cutter::new((u64::MAX, 1));
        let mut jobs = cutter.push(batch(3));
        jobs.extend(cutter.finish());
        assert_eq!(jobs.iter().map(|j| j.rows).collect::<Vec<_>>(), [1, 1, 1]);
        assert!(cutter.finish().is_none());
    }
}
