//! Autotune. With the defaults (`num_threads=None`, `prefetch=None`) a loader adapts,
//! while it runs, the three depths that decide whether its consumer waits:
//! - read-ahead: units fetched at once (so, for remote data, requests in flight);
//! - decode tasks queued or running at once on the decode threads;
//! - prefetch: batches ready and waiting for the consumer.
//!
//! Each starts small and grows only when the consumer is waiting for a batch and the
//! pipeline, at that moment, waits on the stage that depth feeds: bytes not fetched yet
//! (read-ahead), a decode not done (decode tasks); for prefetch, when the consumer finds
//! the queue empty after the first batch of its epoch. Growth is bounded by `memory_limit`:
//! half of it for batches waiting, half for units read ahead and not yet decoded. A
//! consumer slower than the pipeline never waits, so nothing grows and memory stays at
//! the starting depths. A value the user gives is kept as given.
//!
//! The chosen values carry over from one epoch to the next, and `stats()` reports them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use crate::error::{Error, Result};

/// Bytes a loader holds ahead of its consumer by default: batches waiting plus units
/// read ahead (the shuffle buffer has its own bound, `buffer_bytes`).
pub const DEFAULT_MEMORY_LIMIT: u64 = 512 << 20;

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

/// The most batches that may wait for the consumer when the depth adapts.
const MAX_PREFETCH: usize = 64;
/// Batches waiting at the start: enough to hide one slow batch.
const START_PREFETCH: usize = 2;
/// The most units read ahead when the depth adapts (bytes bound it first for all but
/// small objects: 512 objects of 100 KB are 50 MB).
const MAX_READ_AHEAD: usize = 512;
/// Units read ahead for remote data when the user fixed `num_threads`: enough for many
/// requests in flight when one object is one sample.
const FIXED_REMOTE_READ_AHEAD: usize = 128;

/// One adaptable depth.
#[derive(Debug)]
pub struct Knob {
    value: AtomicUsize,
    max: usize,
}

impl Knob {
    fn fixed(value: usize) -> Self {
        Self::adapting(value, value)
    }

    fn adapting(start: usize, max: usize) -> Self {
        Self {
            value: AtomicUsize::new(start.max(1)),
            max: max.max(start).max(1),
        }
    }

    pub fn get(&self) -> usize {
        self.value.load(Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Raises the value to `to` (at most the knob's maximum).
    fn raise(&self, to: usize) {
        self.value.fetch_max(to.min(self.max), Relaxed);
    }
}

/// Where a loader's external shuffle may spill (see `spill`), and how much.
#[derive(Debug, Clone, Default)]
pub struct SpillOptions {
    /// The directory bucket files go to (None: `spill` under the user's cache directory).
    pub dir: Option<std::path::PathBuf>,
    /// Bytes of rows one stream may spill at most (None: half the directory's free
    /// space; 0: never spill).
    pub bytes: Option<u64>,
}

impl SpillOptions {
    /// The directory bucket files go to.
    pub fn dir(&self) -> std::path::PathBuf {
        self.dir.clone().unwrap_or_else(|| {
            crate::format::index::user_cache_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("spill")
        })
    }
}

/// A loader's memory budget and its adaptable depths.
#[derive(Debug)]
pub struct Tuning {
    pub memory_limit: u64,
    /// Bytes of batches that may wait for the consumer.
    pub prefetch_bytes: u64,
    /// Bytes of units fetched and not yet decoded.
    pub read_ahead_bytes: u64,
    /// Decode threads: `num_threads`, or one per core.
    pub threads: usize,
    pub prefetch: Knob,
    pub read_ahead: Knob,
    pub decode_tasks: Knob,
    /// Whether `num_threads` was left to the loader (then remote read-ahead adapts
    /// from the local start; else it is fixed).
    read_ahead_adapts: bool,
    /// Whether the loader has read remote data (see `read_ahead_units`).
    remote: AtomicBool,
    /// Where and how much the external shuffle may spill (see `spill`).
    pub spill: SpillOptions,
}

impl Default for Tuning {
    fn default() -> Self {
        Self::build(None, None, None, None)
    }
}

impl Tuning {
    /// The loader's options; `None` is the default (adapting, for the depths).
    pub fn new(
        num_threads: Option<usize>,
        prefetch: Option<usize>,
        prefetch_bytes: Option<u64>,
        memory_limit: Option<u64>,
    ) -> Result<Self> {
        let positive = |name: &str, value: Option<u64>| match value {
            Some(0) => Err(Error::invalid_argument(format!(
                "{name} must be at least 1"
            ))),
            _ => Ok(()),
        };
        positive("num_threads", num_threads.map(|n| n as u64))?;
        positive("prefetch", prefetch.map(|n| n as u64))?;
        positive("prefetch_bytes", prefetch_bytes)?;
        positive("memory_limit", memory_limit)?;
        Ok(Self::build(
            num_threads,
            prefetch,
            prefetch_bytes,
            memory_limit,
        ))
    }

    /// `new` for values known to be valid.
    fn build(
        num_threads: Option<usize>,
        prefetch: Option<usize>,
        prefetch_bytes: Option<u64>,
        memory_limit: Option<u64>,
    ) -> Self {
        let memory_limit = memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT).max(1);
        let threads = num_threads.unwrap_or_else(default_num_threads).max(1);
        Self {
            memory_limit,
            prefetch_bytes: prefetch_bytes.unwrap_or((memory_limit / 2).max(1)),
            read_ahead_bytes: (memory_limit / 2).max(1),
            threads,
            prefetch: match prefetch {
                Some(n) => Knob::fixed(n),
                None => Knob::adapting(START_PREFETCH, MAX_PREFETCH),
            },
            read_ahead: match num_threads {
                Some(_) => Knob::fixed(2 * threads),
                None => Knob::adapting(2 * threads, MAX_READ_AHEAD),
            },
            decode_tasks: match num_threads {
                Some(_) => Knob::fixed(2 * threads),
                None => Knob::adapting(threads, 4 * threads),
            },
            read_ahead_adapts: num_threads.is_none(),
            remote: AtomicBool::new(false),
            spill: Default::default(),
        }
    }

    /// These options, spilling as `spill` says.
    pub fn spilling(self, spill: SpillOptions) -> Self {
        Self { spill, ..self }
    }

    /// Fixed depths for `threads` decode threads (for tests, benches and the fuzzer).
    pub fn fixed(threads: usize, prefetch: usize) -> Self {
        Self::build(Some(threads.max(1)), Some(prefetch.max(1)), None, None)
    }

    /// The loader reads remote data.
    pub fn reading_remote(&self) {
        self.remote.store(true, Relaxed);
    }

    /// Units to keep fetching at once.
    pub fn read_ahead_units(&self) -> usize {
        if self.remote.load(Relaxed) && !self.read_ahead_adapts {
            return FIXED_REMOTE_READ_AHEAD;
        }
        self.read_ahead.get()
    }

    /// The consumer found no batch ready (after the first of its epoch): one more may
    /// wait next time.
    pub fn consumer_waited(&self) {
        self.prefetch.raise(self.prefetch.get() + 1);
    }

    /// The pipeline waited for a unit's bytes while the consumer waited: fetch further
    /// ahead (doubling: latency is hidden only by requests in flight, and a start-up
    /// over a slow store should not take many steps).
    pub fn fetch_was_short(&self) {
        self.read_ahead.raise(2 * self.read_ahead.get());
    }

    /// The pipeline waited for a decode while the consumer waited: queue one more.
    pub fn decode_was_short(&self) {
        self.decode_tasks.raise(self.decode_tasks.get() + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_values_stay_and_defaults_grow_to_their_bounds() {
        let fixed = Tuning::new(Some(3), Some(5), None, Some(1000)).unwrap();
        fixed.consumer_waited();
        fixed.fetch_was_short();
        fixed.decode_was_short();
        assert_eq!(
            (
                fixed.prefetch.get(),
                fixed.read_ahead.get(),
                fixed.decode_tasks.get()
            ),
            (5, 6, 6)
        );
        assert_eq!(fixed.read_ahead_units(), 6);
        fixed.reading_remote();
        assert_eq!(fixed.read_ahead_units(), FIXED_REMOTE_READ_AHEAD);
        assert_eq!((fixed.prefetch_bytes, fixed.read_ahead_bytes), (500, 500));

        let auto = Tuning::new(None, None, Some(7), None).unwrap();
        assert_eq!(auto.prefetch_bytes, 7);
        assert_eq!(auto.prefetch.get(), START_PREFETCH);
        for _ in 0..100 {
            auto.consumer_waited();
            auto.fetch_was_short();
            auto.decode_was_short();
        }
        assert_eq!(auto.prefetch.get(), MAX_PREFETCH);
        auto.reading_remote();
        assert_eq!(auto.read_ahead_units(), MAX_READ_AHEAD);
        assert_eq!(auto.decode_tasks.get(), 4 * auto.threads);
        assert!(Tuning::new(None, Some(0), None, None).is_err());
        assert!(Tuning::new(None, None, None, Some(0)).is_err());
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
