//! The row shuffle buffer: holds up to a number of rows and of bytes (whichever bound
//! is reached first), hands out a random sample of them, refills from upstream. Rows
//! are referenced, not copied, until they are emitted (one vectorised gather per output
//! batch). In a loader the draws run on a thread of their own and the gathers on the
//! run's batch threads (see `own_thread`); the rows each takes are drawn here, in
//! order, so the stream depends only on the seed.

use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::RecordBatch;

use super::assemble::Step;
use super::rng::Rng;
use super::stats::Stats;
use super::stream::BatchIter;
use crate::batch_bytes::batch_bytes;
use crate::error::{Error, Result};

/// How much the buffer holds at most: rows, and bytes of those rows' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferBounds {
    pub rows: usize,
    pub bytes: u64,
}

/// The shuffle buffer when the user gives no `buffer_size` / `buffer_bytes`: 10,000
/// rows, or 128 MiB of them, whichever is fewer. The rows it holds keep their decoded
/// batches alive (up to about twice their bytes before the buffer compacts), so this
/// keeps a plain `DataLoader(ds.shuffle())` over large rows such as images under 1 GiB.
pub const DEFAULT_SHUFFLE_BUFFER: BufferBounds = BufferBounds {
    rows: 10_000,
    bytes: 128 << 20,
};

/// Bytes per row of `batch`'s values.
fn row_bytes(batch: &RecordBatch) -> u64 {
    (batch_bytes(batch) / batch.num_rows().max(1) as u64).max(1)
}

/// A batch with rows in the buffer: its rows, how many are still buffered, and the
/// bytes each stands for.
struct Slot {
    batch: Held,
    rows: usize,
    left: usize,
    row_bytes: u64,
}

/// A held batch: one from upstream, or the rows left in sparse ones, copied together
/// (see `compact_if_sparse`) by the first gather that needs them. In a loader that is a
/// batch thread, so the copy is off the pipeline thread too.
#[derive(Clone)]
enum Held {
    Batch(RecordBatch),
    Compacted(Arc<Compaction>),
}

struct Compaction {
    made: OnceLock<std::result::Result<RecordBatch, String>>,
    /// The copy to make, until it is made (then the batches it copies from go).
    gather: Mutex<Option<Gather>>,
}

impl Held {
    fn batch(&self) -> Result<RecordBatch> {
        let compaction = match self {
            Held::Batch(batch) => return Ok(batch.clone()),
            Held::Compacted(compaction) => compaction,
        };
        compaction
            .made
            .get_or_init(|| {
                let gather = compaction
                    .gather
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                match gather {
                    Some(gather) => gather.run().map_err(|e| e.to_string()),
                    None => Err("shuffle buffer lost a compaction".into()),
                }
            })
            .clone()
            .map_err(Error::Internal)
    }
}

/// Rows emitted per output batch, as a fraction of the buffer: small enough that the
/// buffer stays nearly full, large enough to amortise the gather.
const CHUNK_DIVISOR: usize = 16;
const MAX_CHUNK: usize = 4096;

/// How many draws ahead a buffered row is fetched: enough to cover a read from memory
/// (about 100 ns) with the draws between.
const FETCH_AHEAD: usize = 64;

/// Asks the CPU to bring `value` into its cache, without waiting for it.
#[inline]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it changes no memory, and the address is a live reference.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

pub struct ShuffleBuffer {
    upstream: BatchIter,
    upstream_done: bool,
    /// The part of an upstream batch that did not fit into the buffer yet.
    pending: Option<RecordBatch>,
    rng: Rng,
    capacity: usize,
    capacity_bytes: u64,
    /// Bytes of the buffered rows (by each batch's bytes per row).
    buffered_bytes: u64,
    /// The rows the byte bound lets the buffer hold, by the size of the last rows seen
    /// (`usize::MAX` before any).
    rows_by_bytes: usize,
    stats: Arc<Stats>,
    /// Batches with rows still buffered.
    slots: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    /// Buffered rows as (slot, row in that batch).
    rows: Vec<(usize, usize)>,
    /// Rows of all batches held in slots; much more than `rows.len()` means memory is
    /// held by a few leftover rows, and the buffer is compacted.
    held_rows: usize,
    /// Rows handed out so far (see `fill_target`).
    emitted: usize,
}

impl ShuffleBuffer {
    pub fn new(upstream: BatchIter, rng: Rng, bounds: BufferBounds, stats: Arc<Stats>) -> Self {
        let capacity = bounds.rows.max(1);
        Self {
            upstream,
            upstream_done: false,
            pending: None,
            rng,
            capacity,
            capacity_bytes: bounds.bytes.max(1),
            buffered_bytes: 0,
            rows_by_bytes: usize::MAX,
            stats,
            slots: Vec::new(),
            free_slots: Vec::new(),
            rows: Vec::with_capacity(capacity),
            held_rows: 0,
            emitted: 0,
        }
    }

    /// Rows to hold before the next output. The buffer fills as it goes: two output
    /// chunks at first, then twice the rows handed out so far, up to its capacity (after
    /// about 7 chunks). The first batch then waits for an eighth of the buffer rather
    /// than all of it, and the sequence still depends only on the seed and the data.
    fn fill_target(&self) -> usize {
        self.chunk()
            .saturating_add(self.emitted)
            .saturating_mul(2)
            .min(self.capacity)
    }

    /// Rows per output: a share of the rows the buffer can hold, by whichever bound
    /// governs. (Of `buffer_size` alone, a byte bound that held 511 rows of 256 KiB still
    /// let outputs of 625 rows: each emptied the buffer, which then mixed nothing, and a
    /// whole buffer's bytes waited downstream while it filled again.)
    fn chunk(&self) -> usize {
        (self.capacity.min(self.rows_by_bytes) / CHUNK_DIVISOR).clamp(1, MAX_CHUNK)
    }

    fn admit(&mut self, batch: RecordBatch, row_bytes: u64) {
        self.rows_by_bytes =
            usize::try_from((self.capacity_bytes / row_bytes.max(1)).max(1)).unwrap_or(usize::MAX);
        let n = batch.num_rows();
        let slot = self.place(Held::Batch(batch), n, row_bytes);
        self.rows.extend((0..n).map(|row| (slot, row)));
    }

    /// Holds `batch` of `n` rows, all buffered, in a slot; returns the slot.
    fn place(&mut self, batch: Held, n: usize, row_bytes: u64) -> usize {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some(Slot {
            batch,
            rows: n,
            left: n,
            row_bytes,
        });
        self.held_rows += n;
        self.buffered_bytes += row_bytes * n as u64;
        slot
    }

    fn fill(&mut self) -> Result<()> {
        let mut bytes_bound = false;
        let target = self.fill_target();
        while self.rows.len() < target && self.buffered_bytes < self.capacity_bytes {
            let batch = match self.pending.take() {
                Some(batch) => batch,
                None if self.upstream_done => break,
                None => match self.upstream.next() {
                    Some(Ok(batch)) => batch,
                    Some(Err(e)) => return Err(e),
                    None => {
                        self.upstream_done = true;
                        break;
                    }
                },
            };
            if batch.num_rows() == 0 {
                continue;
            }
            let row_bytes = row_bytes(&batch);
            let room_rows = target - self.rows.len();
            // At least one row, so that rows larger than the whole bound still flow.
            let room_bytes = ((self.capacity_bytes - self.buffered_bytes) / row_bytes)
                .max(u64::from(self.rows.is_empty()));
            let room = room_rows.min(usize::try_from(room_bytes).unwrap_or(usize::MAX));
            bytes_bound |= room < room_rows && room < batch.num_rows();
            if room == 0 {
                self.pending = Some(batch);
                break;
            }
            if batch.num_rows() > room {
                self.pending = Some(batch.slice(room, batch.num_rows() - room));
                self.admit(batch.slice(0, room), row_bytes);
            } else {
                self.admit(batch, row_bytes);
            }
        }
        if bytes_bound {
            self.stats.shuffle_bounded_by_bytes(self.rows.len() as u64);
        }
        Ok(())
    }

    /// The batches holding the given rows and each row's place among them; releases
    /// batches left with no rows.
    fn take(&mut self, picks: &[(usize, usize)]) -> Result<Gather> {
        let mut used: Vec<usize> = Vec::new();
        // Each slot's place in `used` (by slot: a search of `used` per pick cost the
        // pipeline thread more than the draws).
        let mut place = vec![usize::MAX; self.slots.len()];
        let mut indices = Vec::with_capacity(picks.len());
        for &(slot, row) in picks {
            if place[slot] == usize::MAX {
                place[slot] = used.len();
                used.push(slot);
            }
            indices.push((place[slot], row));
        }
        let batches: Vec<Held> = used
            .iter()
            .filter_map(|&slot| self.slots[slot].as_ref().map(|s| s.batch.clone()))
            .collect();
        if batches.len() != used.len() {
            return Err(Error::Internal("shuffle buffer lost a batch".into()));
        }
        for &(slot, _) in picks {
            let Some(entry) = self.slots[slot].as_mut() else {
                return Err(Error::Internal("shuffle buffer lost a batch".into()));
            };
            entry.left -= 1;
            self.buffered_bytes = self.buffered_bytes.saturating_sub(entry.row_bytes);
            if entry.left == 0 {
                self.held_rows -= entry.rows;
                self.slots[slot] = None;
                self.free_slots.push(slot);
            }
        }
        Ok(Gather { batches, indices })
    }

    /// When the held batches are mostly rows already handed out (they hold over twice
    /// the rows buffered), copies the rows left in the sparsest of them into one batch,
    /// which takes their places in the buffer: each place keeps its row's values, so the
    /// draws, and the stream, are those without the copy. The sparsest go first (the
    /// fewest rows copied for the rows freed), those over half handed out, until the
    /// held rows are down to one and a half times the buffered ones: copying every batch
    /// over half handed out copied 60% of a chat stream's rows a second time (its units
    /// of 6,700 rows, in a buffer of 10,000), sparsest first 45%. The copy is made by the
    /// first gather that needs it (see `Held`).
    fn compact_if_sparse(&mut self) -> Result<()> {
        let buffered = self.rows.len().max(self.chunk());
        if self.rows.is_empty() || self.held_rows <= 2 * buffered {
            return Ok(());
        }
        let mut sparsest: Vec<(usize, usize, usize)> = (self.slots.iter().enumerate())
            .filter_map(|(slot, s)| s.as_ref().map(|s| (slot, s.left, s.rows)))
            .filter(|&(_, left, rows)| 2 * left < rows)
            .collect();
        // By the share left, left / rows, compared as left * other's rows; stable, so
        // ties go by slot and the choice depends only on the draws.
        sparsest.sort_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)));
        let mut sparse = vec![false; self.slots.len()];
        let mut held = self.held_rows;
        for (slot, left, rows) in sparsest {
            if 2 * held <= 3 * buffered {
                break;
            }
            sparse[slot] = true;
            held = held - rows + left;
        }
        let places: Vec<usize> = (0..self.rows.len())
            .filter(|&i| sparse[self.rows[i].0])
            .collect();
        if places.is_empty() {
            return Ok(());
        }
        let picks: Vec<(usize, usize)> = places.iter().map(|&i| self.rows[i]).collect();
        let bytes: u64 = picks
            .iter()
            .filter_map(|&(slot, _)| self.slots[slot].as_ref().map(|s| s.row_bytes))
            .sum();
        // Every row left in those batches is taken: they are released.
        let compaction = Compaction {
            made: OnceLock::new(),
            gather: Mutex::new(Some(self.take(&picks)?)),
        };
        let slot = self.place(
            Held::Compacted(Arc::new(compaction)),
            picks.len(),
            (bytes / picks.len() as u64).max(1),
        );
        for (row, &i) in places.iter().enumerate() {
            self.rows[i] = (slot, row);
        }
        Ok(())
    }

    /// The next output's rows, drawn and taken out of the buffer; `None` at the end.
    fn next_gather(&mut self) -> Result<Option<Gather>> {
        self.fill()?;
        if self.rows.is_empty() {
            return Ok(None);
        }
        let (n, k) = (self.rows.len(), self.chunk().min(self.rows.len()));
        // The places drawn depend on the generator and the count of rows left, not on the
        // rows, so the chunk's are drawn first and each row is fetched from memory a few
        // draws before its turn. Each draw is a random read of the buffer, which the
        // decode threads' streaming evicts between chunks: waiting for those reads one at
        // a time was over half of the shuffle thread's CPU.
        let places: Vec<usize> = (0..k).map(|j| self.rng.below(n - j)).collect();
        let mut picks = Vec::with_capacity(k);
        for (j, &i) in places.iter().enumerate() {
            // Below the count left now (`n - j`), as it was drawn below an even smaller one.
            if let Some(&ahead) = places.get(j + FETCH_AHEAD) {
                prefetch(&self.rows[ahead]);
            }
            picks.push(self.rows.swap_remove(i));
        }
        let gather = self.take(&picks)?;
        self.emitted += k;
        self.compact_if_sparse()?;
        Ok(Some(gather))
    }

    /// The next output as a copy to make (on a loader's batch threads: see
    /// `OwnThread`); `None` at the end.
    pub fn next_step(&mut self) -> Option<Result<Step>> {
        self.next_gather()
            .transpose()
            .map(|g| g.map(|g| Step::Make(Box::new(move || g.run()))))
    }
}

/// Rows to copy into one batch: `indices` are (batch, row) pairs into `batches`.
struct Gather {
    batches: Vec<Held>,
    indices: Vec<(usize, usize)>,
}

impl Gather {
    fn run(self) -> Result<RecordBatch> {
        let batches = self
            .batches
            .iter()
            .map(Held::batch)
            .collect::<Result<Vec<_>>>()?;
        let batches: Vec<&RecordBatch> = batches.iter().collect();
        super::stream::interleave_rows(&batches, &self.indices)
            .map_err(|e| Error::Internal(format!("shuffle gather failed: {e}")))
    }
}

/// Outputs gathered on the calling thread, one at a time: the reference the tests hold
/// the threaded stage (`OwnThread` over `next_step`) to.
#[cfg(test)]
impl Iterator for ShuffleBuffer {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_gather()
            .and_then(|g| g.map(Gather::run).transpose())
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::super::assemble::BatchThreads;
    use super::super::own_thread::OwnThread;
    use super::*;
    use arrow_array::Int64Array;

    fn source(n: i64, batch: i64) -> BatchIter {
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "x",
            arrow_schema::DataType::Int64,
            false,
        )]));
        let batches: Vec<Result<RecordBatch>> = (0..n)
            .step_by(batch as usize)
            .map(|start| {
                let col = Int64Array::from_iter_values(start..(start + batch).min(n));
                Ok(RecordBatch::try_new(schema.clone(), vec![Arc::new(col)]).unwrap())
            })
            .collect();
        Box::new(batches.into_iter())
    }

    fn rows(n: usize) -> BufferBounds {
        BufferBounds {
            rows: n,
            bytes: u64::MAX,
        }
    }

    fn values(it: impl Iterator<Item = Result<RecordBatch>>) -> Vec<i64> {
        it.flat_map(|b| {
            let b = b.unwrap();
            let col = b
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone();
            (0..col.len())
                .map(move |i| col.value(i))
                .collect::<Vec<_>>()
        })
        .collect()
    }

    #[test]
    fn every_row_once_in_a_seeded_order() {
        for (capacity, batch) in [(1, 7), (10, 3), (100, 1000), (5000, 64)] {
            let shuffled = |seed| {
                values(ShuffleBuffer::new(
                    source(2000, batch),
                    Rng::new(seed, 0, 0),
                    rows(capacity),
                    Arc::default(),
                ))
            };
            let (a, b) = (shuffled(1), shuffled(1));
            assert_eq!(a, b);
            let mut sorted = a.clone();
            sorted.sort();
            assert_eq!(sorted, (0..2000).collect::<Vec<_>>());
            if capacity > 1 {
                assert_ne!(a, (0..2000).collect::<Vec<_>>());
                assert_ne!(a, shuffled(2));
            }
        }
    }

    #[test]
    fn compaction_and_batch_threads_leave_the_order_as_it_was() {
        // Batches of one row are never compacted (each goes with its row); batches of
        // 1,000 in a buffer of 3,000 are, often.
        let shuffled = |batch: i64, threads: Option<usize>| {
            let mut buffer = ShuffleBuffer::new(
                source(20_000, batch),
                Rng::new(5, 0, 0),
                rows(3000),
                Arc::default(),
            );
            match threads {
                Some(n) => values(OwnThread::spawn(
                    "test-shuffle",
                    move || buffer.next_step(),
                    BatchThreads::new(n, Arc::default(), Arc::default()),
                    Arc::default(),
                    |stats| &stats.shuffle_cpu_ns,
                    Arc::default(),
                )),
                None => values(buffer),
            }
        };
        let reference = shuffled(1, None);
        assert_eq!(shuffled(1000, None), reference);
        assert_eq!(shuffled(1000, Some(2)), reference);
        assert_eq!(shuffled(7, Some(1)), reference);
    }

    #[test]
    fn compaction_keeps_the_held_rows_near_the_buffered_ones() {
        // Batches of 1,000 rows in a buffer of 3,000: each batch lingers until its last
        // row is drawn, so without compaction the buffer would hold many times its rows.
        let mut buffer = ShuffleBuffer::new(
            source(50_000, 1000),
            Rng::new(9, 0, 0),
            rows(3000),
            Arc::default(),
        );
        let (mut emitted, mut compacted) = (0, 0);
        while let Some(gather) = buffer.next_gather().unwrap() {
            emitted += gather.indices.len();
            let buffered = buffer.rows.len().max(buffer.chunk());
            let sparse_left = (buffer.slots.iter().flatten()).any(|s| 2 * s.left < s.rows);
            // Past twice the buffered rows, compaction brings them down to 1.5 times, or
            // as far as batches over half handed out allow.
            assert!(
                buffer.held_rows <= 2 * buffered || !sparse_left,
                "{} rows held for {} buffered",
                buffer.held_rows,
                buffer.rows.len()
            );
            compacted += (buffer.slots.iter().flatten())
                .filter(|s| matches!(s.batch, Held::Compacted(_)))
                .count();
        }
        assert_eq!(emitted, 50_000);
        assert!(compacted > 0);
    }

    #[test]
    fn buffer_bounds_how_far_rows_move_forward() {
        // A row can come out no earlier than `capacity` positions before its input position.
        let out = values(ShuffleBuffer::new(
            source(5000, 100),
            Rng::new(3, 0, 0),
            rows(50),
            Arc::default(),
        ));
        for (pos, &v) in out.iter().enumerate() {
            assert!(v < pos as i64 + 50, "row {v} came out at {pos}");
        }
    }

    #[test]
    fn the_byte_bound_applies_first_and_is_reported() {
        // 8-byte rows: 400 bytes hold 50 rows, well below the 1000-row bound.
        let stats = Arc::new(Stats::default());
        let bounds = BufferBounds {
            rows: 1000,
            bytes: 400,
        };
        let out = values(ShuffleBuffer::new(
            source(5000, 100),
            Rng::new(3, 0, 0),
            bounds,
            stats.clone(),
        ));
        let mut sorted = out.clone();
        sorted.sort();
        assert_eq!(sorted, (0..5000).collect::<Vec<_>>());
        for (pos, &v) in out.iter().enumerate() {
            assert!(v < pos as i64 + 50, "row {v} came out at {pos}");
        }
        assert_eq!(stats.snapshot().shuffle_buffer_rows, 50);
        // Rows bigger than the whole bound still come out, one at a time.
        let tiny = BufferBounds { rows: 10, bytes: 1 };
        assert_eq!(
            values(ShuffleBuffer::new(
                source(30, 7),
                Rng::new(1, 0, 0),
                tiny,
                Arc::default()
            )),
            (0..30).collect::<Vec<_>>()
        );
    }
}
