//! WRITE: a dataset's rows, in their order, into shard files of one format, with a
//! manifest (see [`crate::source::manifest`]). The pipeline reads and decodes as for any
//! pass; this thread cuts its batches into shards by rows and bytes and hands them on,
//! as they come, to writer threads that encode shards as streams, several at once, in
//! bounded memory (see [`write`]). Shards are named `part-00000<ext>` in row order,
//! so the same dataset (and seed) writes the same files.

mod dest;
mod encode;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

pub use encode::ShardFormat;

use crate::batch_bytes::batch_bytes;
use crate::error::{Error, Result};
use crate::pipeline::{Dataset, RunOptions, Stats, Tuning};
use crate::source::Storage;
use crate::source::manifest::{MANIFEST_NAME, Manifest, ManifestShard};
use dest::{Destination, Sink, SinkFailure};
use encode::ShardEncoder;

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
    /// Bytes of rows the write holds at most, whatever the shards' size: half for the
    /// pipeline reading ahead, half for rows handed to writer threads and not yet
    /// encoded (see [`write`] for what the encoders add).
    pub memory_limit: u64,
    /// The features (`datasets`' JSON) to store in a Parquet shard's `huggingface`
    /// metadata key, so that `datasets` reads the shards with them.
    pub huggingface: Option<String>,
}

impl WriteOptions {
    /// Bytes of rows the writer threads may hold, together.
    fn writer_bytes(&self) -> u64 {
        (self.memory_limit / 2).max(1)
    }

    fn limits(&self) -> (u64, u64) {
        let rows = self.max_rows_per_shard.unwrap_or(u64::MAX);
        let mut bytes = match (self.max_bytes_per_shard, self.max_rows_per_shard) {
            (Some(bytes), _) => bytes,
            (None, Some(_)) => u64::MAX,
            (None, None) => DEFAULT_SHARD_BYTES,
        };
        // A format that keeps a shard's rows until it ends (NPZ) gets shards that fit.
        if self.format.holds_whole_shards() {
            bytes = bytes.min(self.writer_bytes() / self.threads.max(1) as u64);
        }
        (rows.max(1), bytes.max(1))
    }
}

/// Rows for a writer thread: the next rows of shard `shard`, or its end.
enum Piece {
    Rows {
        shard: usize,
        /// The shard's first row in the dataset's order.
        first_row: u64,
        batch: RecordBatch,
        /// `batch`'s share of the writer threads' memory budget.
        bytes: u64,
    },
    End {
        shard: usize,
        rows: u64,
    },
}

impl Piece {
    fn shard(&self) -> usize {
        match self {
            Piece::Rows { shard, .. } | Piece::End { shard, .. } => *shard,
        }
    }
}

/// A stored shard, or why it could not be stored.
type Stored = Result<(usize, ManifestShard)>;

/// Bytes of rows handed to the writer threads and not yet encoded: the feeding thread
/// waits while they are at the limit, and a writer gives a batch's bytes back once it
/// has encoded it. Writers never wait on the feeder, so the wait always ends.
struct Budget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    fn take(&self, bytes: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        // With nothing held, any batch goes, however large: its rows must be written.
        while *used > 0 && used.saturating_add(bytes) > self.limit {
            used = self
                .freed
                .wait(used)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *used += bytes;
    }

    fn give_back(&self, bytes: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = used.saturating_sub(bytes);
        self.freed.notify_all();
    }
}

/// Writes every row of `dataset` (epoch `epoch` of its order) to `dest`, then the
/// manifest, which it returns. `progress(rows, bytes)` is called as rows are handed to
/// the writers and as shards are stored (rows handed over, bytes stored); an error it
/// returns stops the write.
///
/// Shards are encoded as streams, each on one writer thread (shard `i` on thread
/// `i % threads`), so memory does not grow with the shard size: besides
/// `memory_limit` of rows, each writer thread holds its encoder's state (a Parquet row
/// group's encoded pages, at most 32 MiB) and its sink's (a 1 MiB file buffer, or on S3
/// the part being filled and the parts being sent, 16 MiB each, 5 at most). NPZ is the
/// exception: its members are whole columns, so it keeps a shard's rows, and its shards
/// are cut to fit the writers' half of `memory_limit`.
pub fn write(
    dataset: &Dataset,
    epoch: u64,
    dest: &str,
    storage: &Arc<Storage>,
    options: &WriteOptions,
    progress: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<Manifest> {
    let format = options.format;
    let mut schema = dataset.schema()?;
    format.check_schema(&schema)?;
    if let Some(features) = &options.huggingface {
        let mut metadata = schema.metadata().clone();
        metadata.insert(crate::format::HUGGINGFACE_KEY.to_string(), features.clone());
        schema = Arc::new(schema.as_ref().clone().with_metadata(metadata));
    }
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
    let made_here = !destination.exists();
    let existing = destination.prepare(options.overwrite)?;
    let run = RunOptions {
        epoch,
        tuning: Arc::new(Tuning::new(
            None,
            None,
            None,
            Some((options.memory_limit / 2).max(1)),
        )?),
        ..RunOptions::default()
    };
    let mut receiver = dataset.start(run, Arc::new(Stats::default()))?;

    let threads = options.threads.max(1);
    let budget = Budget::new(options.writer_bytes());
    let (done_tx, done_rx) = mpsc::channel::<Stored>();
    let failed = AtomicBool::new(false);
    let shard_name = |index: usize| format!("part-{index:05}{}", format.extension());

    // One writer thread: the pieces of its shards, in order, each shard encoded straight
    // into its sink and committed at its end.
    let writer = |pieces: mpsc::Receiver<Piece>, done: mpsc::Sender<Stored>| {
        let mut open: Option<(ShardEncoder<Sink>, SinkFailure)> = None;
        for piece in pieces {
            match piece {
                Piece::Rows {
                    shard,
                    first_row,
                    batch,
                    bytes,
                } => {
                    // After a failure the rest is drained unwritten.
                    if !failed.load(Ordering::Relaxed) {
                        let appended = (|| -> Result<()> {
                            let (encoder, failure) = match &mut open {
                                Some(open) => open,
                                None => {
                                    let sink = destination.create(&shard_name(shard))?;
                                    let failure = sink.failure();
                                    open.insert((format.start(&schema, first_row, sink)?, failure))
                                }
                            };
                            encoder.append(&batch).map_err(|e| failure.or(e))
                        })();
                        if let Err(error) = appended {
                            failed.store(true, Ordering::Relaxed);
                            open = None;
                            let _ = done.send(Err(error));
                        }
                    }
                    drop(batch);
                    budget.give_back(bytes);
                }
                Piece::End { shard, rows } => {
                    let Some((encoder, failure)) = open.take() else {
                        continue;
                    };
                    if failed.load(Ordering::Relaxed) {
                        continue;
                    }
                    let stored = encoder
                        .finish()
                        .and_then(Sink::commit)
                        .map_err(|e| failure.or(e))
                        .map(|bytes| {
                            let path = shard_name(shard);
                            (shard, ManifestShard { path, rows, bytes })
                        });
                    if stored.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    let _ = done.send(stored);
                }
            }
        }
    };

    let mut shards = Vec::new();
    let outcome = std::thread::scope(|scope| {
        let mut senders = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::channel::<Piece>();
            let (writer, done) = (&writer, done_tx.clone());
            std::thread::Builder::new()
                .name(format!("shardflow-write-{i}"))
                .spawn_scoped(scope, move || writer(rx, done))
                .map_err(|e| Error::Internal(format!("cannot start a writer thread: {e}")))?;
            senders.push(tx);
        }
        drop(done_tx);
        let send = |piece: Piece| -> Result<()> {
            if let Piece::Rows { bytes, .. } = &piece {
                budget.take(*bytes);
            }
            senders[piece.shard() % threads]
                .send(piece)
                .map_err(|_| Error::Internal("a writer thread stopped".into()))
        };
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
                for piece in cutter.push(batch) {
                    send(piece)?;
                }
                take_done(&mut shards, false)?;
                progress(cutter.rows_handed, stored_bytes.get())?;
                if failed.load(Ordering::Relaxed) {
                    // The writer's error is on its way to `take_done`.
                    return Ok(());
                }
            }
            cutter.finish().map_or(Ok(()), send)
        })();
        drop(senders);
        if fed.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let stored = take_done(&mut shards, true);
        fed.and(stored)?;
        progress(cutter.rows_handed, stored_bytes.get())
    });
    receiver.close();
    if outcome.is_err() && made_here {
        // A write refused part-way (a value its format cannot hold) leaves no trace.
        destination.remove_if_empty();
    }
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
    destination.put(MANIFEST_NAME, &text)?;
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
    /// The shard being filled: its index, rows and bytes so far.
    index: usize,
    rows: u64,
    bytes: u64,
    /// Rows handed to writers so far (the shard being filled starts at
    /// `rows_handed - rows`).
    rows_handed: u64,
}

impl Cutter {
    fn new((max_rows, max_bytes): (u64, u64)) -> Self {
        Self {
            max_rows,
            max_bytes,
            index: 0,
            rows: 0,
            bytes: 0,
            rows_handed: 0,
        }
    }

    /// Takes a batch; returns its rows as pieces of shards, with the ends of the shards
    /// it completes.
    fn push(&mut self, mut batch: RecordBatch) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let per_row = match batch.num_rows() as u64 {
            0 => return pieces,
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
                pieces.push(Piece::Rows {
                    shard: self.index,
                    first_row: self.rows_handed - self.rows,
                    batch: batch.slice(0, take as usize),
                    bytes: take * per_row,
                });
                batch = batch.slice(take as usize, (left - take) as usize);
                self.rows += take;
                self.bytes += take * per_row;
                self.rows_handed += take;
            }
            if self.rows >= self.max_rows || self.bytes.saturating_add(per_row) > self.max_bytes {
                pieces.extend(self.finish());
            }
        }
        pieces
    }

    /// The end of the shard being filled, if it holds any rows.
    fn finish(&mut self) -> Option<Piece> {
        if self.rows == 0 {
            return None;
        }
        let end = Piece::End {
            shard: self.index,
            rows: self.rows,
        };
        self.index += 1;
        self.rows = 0;
        self.bytes = 0;
        Some(end)
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

    /// Each shard's (first row, rows, pieces), from the pieces in order.
    fn shards(pieces: &[Piece]) -> Vec<(u64, u64, usize)> {
        let mut shards = Vec::new();
        let (mut first, mut count) = (None, 0);
        for piece in pieces {
            match piece {
                Piece::Rows {
                    shard, first_row, ..
                } => {
                    assert_eq!(*shard, shards.len());
                    assert_eq!(*first.get_or_insert(*first_row), *first_row);
                    count += 1;
                }
                Piece::End { shard, rows } => {
                    assert_eq!(*shard, shards.len());
                    shards.push((first.take().unwrap(), *rows, count));
                    count = 0;
                }
            }
        }
        assert_eq!(count, 0, "rows after the last shard's end");
        shards
    }

    #[test]
    fn cuts_by_rows_and_bytes_across_batches() {
        let mut cutter = Cutter::new((4, u64::MAX));
        let mut pieces = cutter.push(batch(3));
        pieces.extend(cutter.push(batch(7)));
        pieces.extend(cutter.finish());
        assert_eq!(shards(&pieces), [(0, 4, 2), (4, 4, 1), (8, 2, 1)]);

        // 8 bytes a row: 20 bytes hold 2 rows.
        let mut cutter = Cutter::new((u64::MAX, 20));
        let mut pieces = cutter.push(batch(5));
        pieces.extend(cutter.finish());
        assert_eq!(shards(&pieces), [(0, 2, 1), (2, 2, 1), (4, 1, 1)]);

        // A limit below one row: a row a shard.
        let mut cutter = Cutter::new((u64::MAX, 1));
        let mut pieces = cutter.push(batch(3));
        pieces.extend(cutter.finish());
        assert_eq!(shards(&pieces), [(0, 1, 1), (1, 1, 1), (2, 1, 1)]);
        assert!(cutter.finish().is_none());
    }

    #[test]
    fn the_budget_lets_one_batch_through_and_waits_for_room() {
        let budget = Arc::new(Budget::new(10));
        budget.take(25); // nothing held: a batch larger than the budget still goes
        let waiting = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.take(5))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiting.is_finished(), "took bytes past the limit");
        budget.give_back(25);
        waiting.join().unwrap();
        assert_eq!(*budget.used.lock().unwrap(), 5);
    }
}
