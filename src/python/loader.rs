//! `shardflow.DataLoader`: batches of exactly `batch_size` rows, shuffled per epoch,
//! with stats and an exact resume point.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyList, PyModule, PyType};

use super::args::DEFAULT_SEED;
use super::arrow_ffi::stream_capsule;
use super::batch::PyRecordBatch;
use super::dataset::PyDataset;
use super::report::ReportWindow;
use super::to_python::batch_to_numpy;
use super::wait::next_batch;
use crate::pipeline::rows::Delivered;
use crate::pipeline::{self, BatchReceiver, Dataset, Op, RowSet, RunOptions, Stats, Tuning, rows};

/// Version tag of `state_dict()`'s layout.
const STATE_FORMAT: &str = "shardflow.DataLoader/3";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Numpy,
    Arrow,
    /// Tensors sharing memory with the numpy arrays; pinned when `pin` (and CUDA is there).
    Torch {
        pin: bool,
    },
}

/// Where the loader stands: the next batch it produces is batch `batches` of `epoch`.
#[derive(Debug, Clone, Default)]
struct Position {
    epoch: u64,
    batches: u64,
    /// The rows (positions) delivered so far this epoch; `None` once a row without a
    /// position has been delivered (a flat_map's, say).
    consumed: Option<Delivered>,
    /// The positions of the batch delivered last (shared with the batch, not copied).
    last_batch: Option<arrow_array::UInt64Array>,
    /// Where the epoch before stood when it ended (the position only, not its own).
    ended: Option<Box<Position>>,
}

impl Position {
    fn start(epoch: u64) -> Self {
        Self {
            epoch,
            batches: 0,
            consumed: Some(Delivered::default()),
            last_batch: None,
            ended: None,
        }
    }
}

/// Reads a dataset in batches, on the loader's own threads: shuffled or in order, one rank's
/// and worker's share of each epoch, as numpy, torch or Arrow batches. Iterating it again
/// runs the next epoch; `state_dict()` and `load_state_dict()` resume mid-epoch exactly;
/// `stats()` says where the time went.
#[pyclass(name = "DataLoader", module = "shardflow")]
pub struct PyDataLoader {
    dataset: Dataset,
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    /// This loader's share of the data: part `rank` of `world_size` readers, grouped in
    /// ranks of `workers` (see `Share`): padding and `drop_last` even out ranks, never
    /// the workers of one rank.
    rank: usize,
    world_size: usize,
    workers: usize,
    /// Decode threads, read-ahead and prefetch depths, memory limit: shared by the
    /// loader's epochs, so each starts from the depths the one before reached.
    tuning: Arc<Tuning>,
    output: Output,
    /// With `drop_last` off: repeat rows so every rank reads as many (see `Share`).
    pad: bool,
    /// Shared with the running iterator, which advances it batch by batch.
    position: Arc<Mutex<Position>>,
    /// Set by `load_state_dict`: the next iteration continues at `position` mid-epoch.
    resuming: bool,
    /// After loading the states of another number of ranks: the loaded epoch, and its
    /// rows still to read, divided between this loader's ranks.
    remaining: Option<(u64, Arc<RowSet>)>,
    stats: Arc<Stats>,
    /// Readings of the counters for `report()`, shared with the running iterator.
    report: Arc<Mutex<ReportWindow>>,
}

impl PyDataLoader {
    /// The state at `at`, as `state_dict()` describes it.
    fn state_of<'py>(&self, py: Python<'py>, at: Position) -> PyResult<Bound<'py, PyDict>> {
        let fingerprint = self.dataset.fingerprint();
        let state = PyDict::new(py);
        state.set_item("format", STATE_FORMAT)?;
        state.set_item("dataset", fingerprint)?;
        state.set_item("epoch", at.epoch)?;
        state.set_item("batches_done", at.batches)?;
        state.set_item("batch_size", self.batch_size)?;
        state.set_item("shuffle", self.shuffle)?;
        state.set_item("seed", self.seed)?;
        state.set_item("drop_last", self.drop_last)?;
        state.set_item("pad", self.pad)?;
        state.set_item("rank", self.rank)?;
        state.set_item("world_size", self.world_size)?;
        state.set_item("workers", self.workers)?;
        let remaining = self
            .remaining
            .as_ref()
            .filter(|(epoch, _)| *epoch == at.epoch)
            .map(|(_, rows)| rows.to_flat());
        state.set_item("remaining", remaining)?;
        state.set_item("consumed", at.consumed.map(|c| c.into_set().to_flat()))?;
        Ok(state)
    }

    fn position(&self) -> Position {
        self.with_position(Position::clone)
    }

    /// Reads the position under its lock without copying it (its delivered rows can be
    /// many).
    fn with_position<T>(&self, f: impl FnOnce(&Position) -> T) -> T {
        f(&self.position.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn set_position(&self, position: Position) {
        *self.position.lock().unwrap_or_else(|p| p.into_inner()) = position;
    }

    /// Starts the next epoch: the one the loader stands at, or the following one if
    /// that was left part-way; mid-epoch only right after `load_state_dict`.
    /// `iterated`: the batches go to `__next__` (else to an Arrow stream).
    fn start_epoch(
        &mut self,
        py: Python<'_>,
        iterated: bool,
    ) -> PyResult<(BatchReceiver, Position)> {
        let current = self.position();
        let at = if std::mem::take(&mut self.resuming) || current.batches == 0 {
            current
        } else {
            Position::start(current.epoch + 1)
        };
        if self
            .remaining
            .as_ref()
            .is_some_and(|(epoch, _)| *epoch != at.epoch)
        {
            // The resumed epoch is over; the next reads all its rows.
            self.remaining = None;
        }
        self.set_position(at.clone());
        let run = RunOptions {
            // This part's row stream for (seed, epoch) is deterministic and batching is
            // exact, so passing over whole batches' rows resumes where the state was taken.
            skip_rows: at.batches * self.batch_size as u64,
            track: iterated,
            // Numpy and torch batches make a `bytes` of each binary value, Arrow's not.
            byte_views: iterated && !matches!(self.output, Output::Arrow),
            ..self.run_options(at.epoch)
        };
        let (dataset, stats) = (self.dataset(), self.stats.clone());
        let receiver = py.detach(|| dataset.start(run, stats))?;
        lock(&self.report).epoch_started(&self.stats);
        Ok((receiver, at))
    }

    /// A loader of the same dataset and settings from this one's epoch, with counters of
    /// its own (its depths start where this one's are: they share the tuning).
    fn fresh(&self) -> Self {
        Self {
            dataset: self.dataset.clone(),
            tuning: self.tuning.clone(),
            position: Arc::new(Mutex::new(Position::start(self.with_position(|p| p.epoch)))),
            resuming: false,
            remaining: None,
            stats: Arc::default(),
            report: Arc::default(),
            ..*self
        }
    }

    /// The dataset as iterated: with the loader's shuffle added.
    fn dataset(&self) -> Dataset {
        if self.shuffle {
            self.dataset.with_op(Op::Shuffle {
                seed: self.seed,
                buffer: pipeline::DEFAULT_SHUFFLE_BUFFER,
            })
        } else {
            self.dataset.clone()
        }
    }

    /// How this loader reads epoch `epoch`, from its start.
    fn run_options(&self, epoch: u64) -> RunOptions {
        RunOptions {
            remaining: self
                .remaining
                .as_ref()
                .filter(|(e, _)| *e == epoch)
                .map(|(_, rows)| rows.clone()),
            ..RunOptions::loader(
                epoch,
                (self.rank, self.world_size, self.workers),
                self.batch_size,
                self.drop_last,
                self.pad,
                self.tuning.clone(),
            )
        }
    }

    /// What a saved state says, checked against this loader (`same_ranks`: its rank and
    /// world size too).
    fn saved(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<Saved> {
        let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
            state
                .get_item(key)?
                .ok_or_else(|| PyKeyError::new_err(format!("state_dict has no {key:?}")))
        };
        let format: String = get("format")?.extract()?;
        if format != STATE_FORMAT {
            return Err(PyValueError::new_err(format!(
                "state_dict is {format:?}, this loader reads {STATE_FORMAT:?}"
            )));
        }
        if let Some(differences) = self.state_mismatch(py, state, false)? {
            return Err(PyValueError::new_err(format!(
                "state_dict belongs to another loader: {differences}"
            )));
        }
        let rows = |key: &str| -> PyResult<Option<RowSet>> {
            let flat: Option<Vec<u64>> = get(key)?.extract()?;
            Ok(flat.map(|f| RowSet::from_flat(&f)).transpose()?)
        };
        let saved = Saved {
            epoch: get("epoch")?.extract()?,
            batches: get("batches_done")?.extract()?,
            rank: get("rank")?.extract()?,
            world_size: get("world_size")?.extract()?,
            remaining: rows("remaining")?,
            consumed: rows("consumed")?,
            pad: get("pad")?.extract()?,
            // States saved before workers were told apart from ranks divided by parts.
            workers: match state.get_item("workers")? {
                Some(workers) => workers.extract()?,
                None => 1,
            },
        };
        if saved.world_size == 0
            || saved.rank >= saved.world_size
            || saved.workers == 0
            || saved.world_size % saved.workers != 0
        {
            return Err(PyValueError::new_err(format!(
                "state_dict has rank {} of world_size {}",
                saved.rank, saved.world_size
            )));
        }
        Ok(saved)
    }

    /// Whether part `other` of this loader's division delivers as many rows as this
    /// one (known without reading: no filter or flat_map decides them).
    fn same_share(&self, other: usize) -> crate::error::Result<bool> {
        let dataset = self.dataset();
        let run = self.run_options(self.position().epoch);
        let theirs = dataset.rows_of_run(&RunOptions {
            part: other,
            ..run.clone()
        })?;
        Ok(theirs.is_some() && theirs == dataset.rows_of_run(&run)?)
    }

    /// The rows of the saved epoch that the saving ranks had not delivered: every
    /// rank's share (as the saving run divided the epoch) less what each delivered. That
    /// is read from each rank's `consumed`, or, given one state of a run whose ranks
    /// move in lockstep, worked out for every rank from its `batches_done`.
    fn remaining_after(&self, saved: Vec<Saved>) -> crate::error::Result<RowSet> {
        let world = saved[0].world_size;
        let dataset = self.dataset();
        // The epoch as the saving run divided it, padding included.
        let run = |part: usize| RunOptions {
            part,
            parts: world,
            workers: saved[0].workers,
            pad: saved[0].pad,
            remaining: saved[0].remaining.clone().map(Arc::new),
            ..self.run_options(saved[0].epoch)
        };
        let mut ranks: Vec<Option<&Saved>> = vec![None; world];
        for s in &saved {
            ranks[s.rank] = Some(s);
        }
        // One state stands for every rank only when their progress follows from it.
        let lockstep = saved.len() == 1 && dataset.lockstep(true)?;
        let mut epoch_rows = RowSet::new();
        let mut delivered = RowSet::new();
        for (part, state) in ranks.iter().enumerate() {
            let planned = dataset.planned_rows(&run(part))?;
            epoch_rows.union(&RowSet::from_ranges(planned.iter().cloned()));
            match state {
                Some(Saved {
                    consumed: Some(consumed),
                    ..
                }) => delivered.union(consumed),
                _ if lockstep => {
                    let done = saved[0].batches * self.batch_size as u64;
                    delivered.union(&RowSet::from_ranges(rows::sublist(&planned, 0, done)));
                }
                Some(_) => {
                    return Err(crate::error::Error::invalid_argument(
                        "a state does not say which rows it delivered (a flat_map or batched map changed the rows, or a take/skip follows a shuffle buffer or filter), so its epoch can resume only on the world size that saved it",
                    ));
                }
                None => {
                    return Err(crate::error::Error::invalid_argument(format!(
                        "resuming on world_size={} from world_size={world} needs every rank's state_dict() (saved at the same step) when ranks do not move in lockstep (a shuffle buffer, filter or interleave); rank {part}'s is missing",
                        self.world_size
                    )));
                }
            }
        }
        // A dealt epoch's positions are places in its whole stream: only a division that
        // deals that same stream can tell its rows by them. A division resuming them
        // deals them (see `split_for`), where its ops let it.
        let saving_deals = dataset.dealt_at(&run(0))?;
        let resuming = RunOptions {
            remaining: saving_deals
                .map(|_| Arc::new(RowSet::from_ranges([rows::dealt_positions()]))),
            ..self.run_options(saved[0].epoch)
        };
        if !delivered.is_empty() && saving_deals != dataset.dealt_at(&resuming)? {
            return Err(crate::error::Error::invalid_argument(
                pipeline::ROWS_SPLIT_NOT_ELASTIC,
            ));
        }
        if !delivered.is_empty() && dataset.remixes() {
            return Err(crate::error::Error::invalid_argument(
                "this pipeline has an interleave with stopping_strategy=\"first_exhausted\", whose mix ends where one dataset's rows run out, leaving the others' last rows out, so the rest of an epoch cannot be mixed anew from the rows left; such an epoch can resume only on the same number of ranks and workers (the all_exhausted strategies resume on another)",
            ));
        }
        Ok(epoch_rows.difference(&delivered))
    }

    /// Why `state` cannot be resumed by this loader, if it cannot.
    fn state_mismatch(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyDict>,
        same_ranks: bool,
    ) -> PyResult<Option<String>> {
        let fingerprint = self.dataset.fingerprint();
        let mut differences = Vec::new();
        let mut compare = |key: &str, ours: Bound<'_, PyAny>| -> PyResult<()> {
            let theirs = state
                .get_item(key)?
                .ok_or_else(|| PyKeyError::new_err(format!("state_dict has no {key:?}")))?;
            if !theirs.eq(&ours)? {
                differences.push(format!(
                    "{key}={} (this loader: {})",
                    theirs.repr()?,
                    ours.repr()?
                ));
            }
            Ok(())
        };
        compare("dataset", fingerprint.into_pyobject(py)?.into_any())?;
        compare("batch_size", self.batch_size.into_pyobject(py)?.into_any())?;
        compare(
            "shuffle",
            self.shuffle.into_pyobject(py)?.to_owned().into_any(),
        )?;
        compare(
            "drop_last",
            self.drop_last.into_pyobject(py)?.to_owned().into_any(),
        )?;
        if same_ranks {
            compare("rank", self.rank.into_pyobject(py)?.into_any())?;
            compare("world_size", self.world_size.into_pyobject(py)?.into_any())?;
        }
        Ok((!differences.is_empty()).then(|| differences.join(", ")))
    }
}

#[pymethods]
impl PyDataLoader {
    #[new]
    #[pyo3(signature = (dataset, batch_size=1, *, shuffle=false, seed=None, drop_last=false, pad=None, num_threads=None, prefetch=None, prefetch_bytes=None, memory_limit=None, spill_dir=None, spill_bytes=None, rank=None, world_size=None, worker=None, num_workers=None, output="numpy", pin_memory=false, trace=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, PyAny>,
        batch_size: usize,
        shuffle: bool,
        seed: Option<u64>,
        drop_last: bool,
        pad: Option<bool>,
        num_threads: Option<usize>,
        prefetch: Option<usize>,
        prefetch_bytes: Option<u64>,
        memory_limit: Option<u64>,
        spill_dir: Option<std::path::PathBuf>,
        spill_bytes: Option<u64>,
        rank: Option<usize>,
        world_size: Option<usize>,
        worker: Option<usize>,
        num_workers: Option<usize>,
        output: &str,
        pin_memory: bool,
        trace: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let dataset = dataset
            .cast::<PyDataset>()
            .map_err(|_| {
                PyTypeError::new_err("DataLoader needs a shardflow.Dataset (see shardflow.dataset)")
            })?
            .get()
            .inner
            .clone();
        if batch_size == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        if seed.is_some() && !shuffle {
            return Err(PyValueError::new_err(
                "seed= is only used with shuffle=True",
            ));
        }
        let tuning = Tuning::new(num_threads, prefetch, prefetch_bytes, memory_limit)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .spilling(crate::pipeline::SpillOptions {
                dir: spill_dir,
                bytes: spill_bytes,
            });
        let (rank, world_size) = match (rank, world_size) {
            (None, None) => (0, 1),
            (Some(rank), Some(world_size)) if world_size >= 1 && rank < world_size => {
                (rank, world_size)
            }
            (Some(rank), Some(world_size)) => {
                return Err(PyValueError::new_err(format!(
                    "rank must be in 0..world_size, got rank={rank}, world_size={world_size}"
                )));
            }
            _ => return Err(PyValueError::new_err("give rank= and world_size= together")),
        };
        // A rank's share read by several workers: each is one part, and the rank's
        // padding or trimming is cut between them.
        let (worker, workers) = match (worker, num_workers) {
            (None, None) => (0, 1),
            (Some(worker), Some(workers)) if workers >= 1 && worker < workers => (worker, workers),
            (Some(worker), Some(workers)) => {
                return Err(PyValueError::new_err(format!(
                    "worker must be in 0..num_workers, got worker={worker}, num_workers={workers}"
                )));
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give worker= and num_workers= together",
                ));
            }
        };
        let (rank, world_size) = (rank * workers + worker, world_size * workers);
        let output = match output {
            "numpy" => Output::Numpy,
            "arrow" => Output::Arrow,
            "torch" => Output::Torch {
                pin: pin_memory && cuda_available(py)?,
            },
            other => {
                return Err(PyValueError::new_err(format!(
                    "output must be \"numpy\", \"arrow\" or \"torch\", not {other:?}"
                )));
            }
        };
        if pin_memory && !matches!(output, Output::Torch { .. }) {
            return Err(PyValueError::new_err(
                "pin_memory=True needs output=\"torch\"",
            ));
        }
        Ok(Self {
            dataset,
            batch_size,
            shuffle,
            seed: seed.unwrap_or(DEFAULT_SEED),
            drop_last,
            rank,
            world_size,
            workers,
            tuning: Arc::new(tuning),
            output,
            // Several ranks must each take as many steps: pad unless told otherwise.
            pad: pad.unwrap_or(world_size > workers) && !drop_last,
            position: Arc::new(Mutex::new(Position::start(0))),
            resuming: false,
            remaining: None,
            stats: super::report::stats_with_trace(trace)?,
            report: Arc::default(),
        })
    }

    /// Iterates one epoch; the next iteration runs the following epoch.
    fn __iter__(&mut self, py: Python<'_>) -> PyResult<BatchIterator> {
        let (receiver, at) = self.start_epoch(py, true)?;
        Ok(BatchIterator {
            receiver: Some(receiver),
            output: self.output,
            position: self.position.clone(),
            epoch: at.epoch,
            calls: 0,
            report: self.report.clone(),
            stats: self.stats.clone(),
        })
    }

    /// Chooses the epoch the next iteration runs (its shuffle order). Right after
    /// `load_state_dict`, the loaded epoch keeps its loaded position (so a training loop
    /// that calls `set_epoch` each epoch resumes mid-epoch); another epoch starts fresh.
    fn set_epoch(&mut self, epoch: u64) {
        if self.resuming && self.with_position(|p| p.epoch) == epoch {
            return;
        }
        self.resuming = false;
        self.remaining = None;
        self.set_position(Position::start(epoch));
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.with_position(|p| p.epoch)
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Batches this rank reads in the coming epoch, where the dataset's length is known.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let (dataset, run) = (
            self.dataset(),
            self.run_options(self.with_position(|p| p.epoch)),
        );
        let rows = py.detach(|| dataset.rows_of_run(&run))?.ok_or_else(|| {
            PyTypeError::new_err("the number of batches is not known without reading the data")
        })? as usize;
        Ok(if self.drop_last {
            rows / self.batch_size
        } else {
            rows.div_ceil(self.batch_size)
        })
    }

    /// Where the loader stands, as plain JSON-serialisable data, with what it belongs
    /// to: the dataset's fingerprint (shards with sizes/ETags, format, options, ops and
    /// seeds), the rank and the batching. `consumed` lists the rows (positions) this
    /// rank has delivered in the epoch, as flat `[start, end)` pairs, and `remaining`
    /// the rows the epoch was divided from after a resume on another world size.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.state_of(py, self.position())
    }

    /// The state of the epoch that the last iteration finished, as it stood at its end
    /// (every row delivered), rather than at the start of the next: what the torch
    /// adapter saves for a worker whose pass has ended while the others' go on.
    fn _ended_state_dict<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.with_position(|p| p.ended.clone())
            .map(|ended| self.state_of(py, *ended))
            .transpose()
    }

    /// Resumes from `state_dict()`. Given this rank's own state (or the list of every
    /// rank's, saved at one checkpoint, on the same world size), the next iteration
    /// yields exactly the batches that were still to come. Given the states of another
    /// world size, the rows the saving ranks had not yet delivered are divided anew
    /// between this loader's ranks: the rest of the epoch comes exactly once across
    /// them. A single state is enough for that when every rank's progress follows from
    /// it (no shuffle buffer, filter or mixing); otherwise pass every rank's. A state of
    /// another dataset or batching is refused.
    fn load_state_dict(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let states: Vec<Bound<'_, PyDict>> = match state.cast::<PyDict>() {
            Ok(one) => vec![one.clone()],
            Err(_) => state
                .try_iter()
                .and_then(|items| {
                    items
                        .map(|item| Ok(item?.cast_into::<PyDict>()?))
                        .collect::<PyResult<Vec<_>>>()
                })
                .map_err(|_| {
                    PyTypeError::new_err(
                        "load_state_dict takes a state_dict() or a list of every rank's",
                    )
                })?,
        };
        let Some(first) = states.first() else {
            return Err(PyValueError::new_err("load_state_dict got no states"));
        };
        let saved: Vec<Saved> = states
            .iter()
            .map(|s| self.saved(py, s))
            .collect::<PyResult<_>>()?;
        let world = saved[0].world_size;
        // Ranks (and a rank's workers) may stand at different batches; they must share
        // the epoch and how it was divided.
        for (s, other) in saved.iter().zip(&states).skip(1) {
            if (s.epoch, s.world_size, s.workers, s.pad, &s.remaining)
                != (
                    saved[0].epoch,
                    world,
                    saved[0].workers,
                    saved[0].pad,
                    &saved[0].remaining,
                )
            {
                return Err(PyValueError::new_err(format!(
                    "the states are not of one checkpoint of one run (their epochs, world sizes or divisions of the epoch differ): {} and {}",
                    first.repr()?,
                    other.repr()?
                )));
            }
        }
        self.seed = first
            .get_item("seed")?
            .ok_or_else(|| PyKeyError::new_err("state_dict has no \"seed\""))?
            .extract()?;
        // Padding divides nothing differently on one rank (`world` counts every rank's
        // workers).
        let division =
            |world: usize, workers: usize, pad: bool| (world, workers, pad && world > workers);
        let fresh = saved
            .iter()
            .all(|s| s.batches == 0 && s.remaining.is_none());
        if fresh {
            // Nothing of the epoch delivered: it starts afresh, on any division.
            self.remaining = None;
            self.set_position(Position::start(saved[0].epoch));
        } else if division(world, saved[0].workers, saved[0].pad)
            == division(self.world_size, self.workers, self.pad)
        {
            // The same split: replay this rank's own stream to where it stood.
            let lone = saved.len() == 1;
            let own = match saved.into_iter().find(|s| s.rank == self.rank || lone) {
                Some(own) if own.rank == self.rank => own,
                // Another rank's state alone (frameworks save rank 0's): ranks of equal
                // shares take their steps together, so this rank stood at the same batch
                // of its own stream; which rows those were, only its own state says.
                Some(other)
                    if other.remaining.is_none()
                        && py.detach(|| self.same_share(other.rank))? =>
                {
                    Saved {
                        consumed: None,
                        ..other
                    }
                }
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "no state of rank {} among the states given (another rank's alone resumes it only when every rank's share of the epoch is known to be as long)",
                        self.rank
                    )));
                }
            };
            self.remaining = own.remaining.map(|rows| (own.epoch, Arc::new(rows)));
            self.set_position(Position {
                epoch: own.epoch,
                batches: own.batches,
                consumed: own.consumed.map(Delivered::new),
                last_batch: None,
                ended: None,
            });
        } else {
            let epoch = saved[0].epoch;
            let remaining = py.detach(|| self.remaining_after(saved))?;
            self.remaining = Some((epoch, Arc::new(remaining)));
            self.set_position(Position::start(epoch));
        }
        self.resuming = true;
        Ok(())
    }

    /// The positions of the rows of the batch delivered last (`None` when rows carry
    /// none): what the torch adapter records of a batch it hands out sample by sample.
    fn _batch_positions(&self) -> Option<Vec<u64>> {
        self.with_position(|p| p.last_batch.as_ref().map(|b| b.values().to_vec()))
    }

    /// Counters since the loader was made (rows, batches, bytes read, files opened...),
    /// where the time went (the consumer waiting for batches; the pipeline waiting for
    /// bytes and for decodes; decoding, summed over threads), and the depths autotune
    /// has chosen.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.stats.snapshot();
        let d = PyDict::new(py);
        d.set_item("rows", s.rows)?;
        d.set_item("batches", s.batches)?;
        d.set_item("units", s.units)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("files_opened", s.files_opened)?;
        d.set_item("wait_seconds", s.wait_ns as f64 / 1e9)?;
        d.set_item("consumer_waits", s.consumer_waits)?;
        d.set_item("fetch_wait_seconds", s.fetch_wait_ns as f64 / 1e9)?;
        d.set_item("decode_wait_seconds", s.decode_wait_ns as f64 / 1e9)?;
        d.set_item("decode_seconds", s.decode_ns as f64 / 1e9)?;
        d.set_item("assemble_seconds", s.assemble_ns as f64 / 1e9)?;
        d.set_item("pipeline_cpu_seconds", s.pipeline_cpu_ns as f64 / 1e9)?;
        d.set_item("consumer_cpu_seconds", s.consumer_cpu_ns as f64 / 1e9)?;
        d.set_item("shuffle_cpu_seconds", s.shuffle_cpu_ns as f64 / 1e9)?;
        d.set_item("skipped_records", s.skipped_records)?;
        d.set_item("skipped_units", s.skipped_units)?;
        d.set_item("padded_rows", s.padded_rows)?;
        d.set_item("requests", s.requests)?;
        d.set_item("retries", s.retries)?;
        d.set_item("bytes_fetched", s.bytes_fetched)?;
        d.set_item("cache_hits", s.cache_hits)?;
        d.set_item("cache_misses", s.cache_misses)?;
        d.set_item("shuffle_buffer_rows", s.shuffle_buffer_rows)?;
        d.set_item("read_plan", s.read_plan.map(|plan| plan.name()))?;
        d.set_item("spilled_bytes", s.spilled_bytes)?;
        let t = &self.tuning;
        d.set_item("num_threads", t.threads)?;
        d.set_item("prefetch", t.prefetch.get())?;
        d.set_item("read_ahead", t.read_ahead_units())?;
        d.set_item("read_ahead_peak_bytes", s.read_ahead_peak_bytes)?;
        d.set_item("decode_tasks", t.decode_tasks.get())?;
        d.set_item("memory_limit", t.memory_limit)?;
        Ok(d)
    }

    /// The counters behind `report()` (see `shardflow.report`): what happened in the
    /// epoch so far (the whole last epoch once it has ended), or in the last `seconds`;
    /// `None` before the first epoch.
    #[pyo3(signature = (seconds=None))]
    fn _report_counters<'py>(
        &self,
        py: Python<'py>,
        seconds: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        if let Some(s) = seconds {
            checked_seconds(s)?;
        }
        let Some((counters, wall)) = lock(&self.report).window(&self.stats, seconds) else {
            return Ok(None);
        };
        let d = super::report::to_dict(py, &counters, wall)?;
        let t = &self.tuning;
        d.set_item("num_threads", t.threads)?;
        d.set_item("prefetch", t.prefetch.get())?;
        d.set_item("memory_limit", t.memory_limit)?;
        d.set_item(
            "max_concurrency",
            self.dataset.storage().map(|s| s.options.max_concurrency),
        )?;
        d.set_item("epoch", self.with_position(|p| p.epoch))?;
        Ok(Some(d))
    }

    /// Is training input-bound? A `shardflow.report.Report` of the epoch so far (the whole
    /// last epoch once it has ended), or of the last `seconds`: the share of the time the
    /// consumer waited for batches, the busiest stage, each stage's busy time against
    /// its threads, the queue of ready batches, and the I/O's latencies. `str()` of it is
    /// a short table.
    #[pyo3(signature = (seconds=None))]
    fn report<'py>(&self, py: Python<'py>, seconds: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let counters = self._report_counters(py, seconds)?.ok_or_else(|| {
            PyValueError::new_err("report() describes an epoch: iterate the loader first")
        })?;
        py.import("shardflow.report")?
            .getattr("Report")?
            .call_method1("from_counters", (counters,))
    }

    /// How fast this loader could go if training took no time: a loader of the same
    /// dataset and settings (its own counters and position) read for `seconds` with no
    /// step between batches. A dict: `rows_per_second`, `batches_per_second`, `seconds`,
    /// and its `report`. Compare its rate with the rate your training consumes.
    #[pyo3(signature = (seconds=10.0))]
    fn headspace<'py>(&self, py: Python<'py>, seconds: f64) -> PyResult<Bound<'py, PyAny>> {
        // NaN or infinity would read forever.
        checked_seconds(seconds)?;
        let fresh = Py::new(py, self.fresh())?;
        py.import("shardflow.report")?
            .getattr("headspace")?
            .call1((fresh, seconds))
    }

    /// The dataset's column types (see `Dataset._column_types`).
    fn _column_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let dataset = Bound::new(
            py,
            super::dataset::PyDataset::from_inner(self.dataset.clone()),
        )?;
        dataset
            .call_method0("_column_types")?
            .cast_into()
            .map_err(Into::into)
    }

    /// One epoch as an Arrow stream of batches (advances the epoch like iterating does).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The protocol lets a producer ignore the request; consumers cast.
        let _ = requested_schema;
        let (receiver, at) = self.start_epoch(py, false)?;
        self.set_position(Position::start(at.epoch + 1));
        let fallback = if self.dataset.keeps_source_schema() {
            Some(py.detach(|| self.dataset.source_schema())?)
        } else {
            None
        };
        stream_capsule(py, receiver, fallback)
    }

    fn __repr__(&self) -> String {
        format!(
            "shardflow.DataLoader(batch_size={}, shuffle={}, drop_last={}, pad={}, rank={}, world_size={}, num_threads={}, prefetch={}, epoch={})",
            self.batch_size,
            self.shuffle,
            self.drop_last,
            self.pad,
            self.rank,
            self.world_size,
            self.tuning.threads,
            self.tuning.prefetch.get(),
            self.with_position(|p| p.epoch)
        )
    }
}

/// What a saved state says about where its rank stood.
#[derive(Debug, Clone)]
struct Saved {
    epoch: u64,
    batches: u64,
    rank: usize,
    world_size: usize,
    remaining: Option<RowSet>,
    consumed: Option<RowSet>,
    /// How the saving run padded its shares. It need not match this loader's `pad`,
    /// which shapes only the new division (the default differs between 1 and N ranks).
    pad: bool,
    workers: usize,
}

/// Yields the batches of one epoch.
#[pyclass(name = "BatchIterator", module = "shardflow")]
pub struct BatchIterator {
    receiver: Option<BatchReceiver>,
    output: Output,
    position: Arc<Mutex<Position>>,
    epoch: u64,
    /// Calls of `__next__` so far: with arrow output the consumer's CPU is read at one
    /// call in `ARROW_CPU_SAMPLE` (see `__next__`).
    calls: u64,
    report: Arc<Mutex<ReportWindow>>,
    stats: Arc<Stats>,
}

/// Batches between two looks at whether the report's once-a-second reading is due.
const REPORT_TICK_EVERY: u64 = 16;

/// With arrow output, one call of `__next__` in this many has its CPU time read, and
/// counts for the calls since the last one read. Reading the thread's CPU clock is a
/// system call (about 0.4 µs here), twice per call: a quarter of the consumer's own work
/// per batch of arrow output, paid for a statistic. Conversion to numpy or torch costs
/// tens of µs or more per batch, with rare large calls (Python's garbage collection of
/// the objects it made), which a sample would miss or multiply: those calls are all read.
const ARROW_CPU_SAMPLE: u64 = 8;

fn batch_class(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static BATCH: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    BATCH.import(py, "shardflow._batch", "Batch")
}

fn torch(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static TORCH: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    TORCH
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("torch")?.unbind()))
        .map(|m| m.bind(py))
}

/// Whether pinned memory can be had; says so once when it cannot.
fn cuda_available(py: Python<'_>) -> PyResult<bool> {
    let available = torch(py)?
        .getattr("cuda")?
        .call_method0("is_available")?
        .is_truthy()?;
    if !available {
        let warnings = py.import("warnings")?;
        warnings.call_method1(
            "warn",
            ("pin_memory=True has no effect: there is no CUDA device, so batches stay in ordinary memory",),
        )?;
    }
    Ok(available)
}

/// numpy columns to tensors: numbers via `torch.from_numpy` (no copy), anything torch
/// cannot hold (strings, bytes, ragged lists) as a Python list, structs as dicts.
fn to_torch<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
    pin: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if let Ok(dict) = value.cast::<PyDict>() {
        let out = PyDict::new(py);
        for (k, v) in dict.iter() {
            out.set_item(k, to_torch(py, &v, pin)?)?;
        }
        return Ok(out.into_any());
    }
    let kind: String = value.getattr("dtype")?.getattr("kind")?.extract()?;
    if kind == "O" {
        return lists_to_torch(py, value, pin);
    }
    if !"biufc".contains(kind.as_str()) {
        return value.call_method0("tolist");
    }
    let tensor = torch(py)?.call_method1("from_numpy", (value,))?;
    if pin {
        tensor.call_method0("pin_memory")
    } else {
        Ok(tensor)
    }
}

/// A column of one numeric array per row (a list column): one tensor when every row's
/// array has the same shape and dtype (token ids of one length), else a list of
/// tensors; other objects (strings, bytes, nulls) as a list.
fn lists_to_torch<'py>(
    py: Python<'py>,
    column: &Bound<'py, PyAny>,
    pin: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy")?;
    let ndarray = np.getattr("ndarray")?;
    let items: Vec<Bound<'py, PyAny>> = column.try_iter()?.collect::<PyResult<_>>()?;
    let mut shapes = Vec::with_capacity(items.len());
    for item in &items {
        if !item.is_instance(&ndarray)? {
            return column.call_method0("tolist");
        }
        let kind: String = item.getattr("dtype")?.getattr("kind")?.extract()?;
        if !"biufc".contains(kind.as_str()) {
            return column.call_method0("tolist");
        }
        shapes.push((
            item.getattr("dtype")?.str()?.to_string(),
            item.getattr("shape")?.extract::<Vec<usize>>()?,
        ));
    }
    if !items.is_empty() && shapes.iter().all(|s| *s == shapes[0]) {
        let stacked = np.call_method1("stack", (PyList::new(py, &items)?,))?;
        return to_torch(py, &stacked, pin);
    }
    let tensors = items
        .iter()
        .map(|item| to_torch(py, item, pin))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyList::new(py, tensors)?.into_any())
}

fn to_output<'py>(py: Python<'py>, batch: RecordBatch, output: Output) -> PyResult<Py<PyAny>> {
    match output {
        Output::Torch { pin } => {
            let columns = batch_to_numpy(py, &batch)?;
            let out = to_torch(py, columns.as_any(), pin)?;
            // Images of their own sizes (and decoded clips' `array`) are a list of
            // tensors in every batch, even one whose tensors happen to share a shape.
            let ragged = |values: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
                let tensors = values
                    .try_iter()?
                    .map(|value| match value? {
                        value if value.is_none() => Ok(value),
                        value => to_torch(py, &value, pin),
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, tensors)?.into_any())
            };
            for field in batch.schema().fields() {
                let Some(values) = columns.get_item(field.name())? else {
                    continue;
                };
                if crate::format::is_variable_tensor(field) {
                    out.set_item(field.name(), ragged(values)?)?;
                } else if let arrow_schema::DataType::Struct(children) = field.data_type()
                    && let Ok(values) = values.cast_into::<PyDict>()
                    && let Ok(converted) = out.get_item(field.name())
                {
                    for child in children
                        .iter()
                        .filter(|c| crate::format::is_variable_tensor(c))
                    {
                        if let Some(child_values) = values.get_item(child.name())? {
                            converted.set_item(child.name(), ragged(child_values)?)?;
                        }
                    }
                }
            }
            Ok(out.unbind())
        }
        Output::Arrow => Ok(Py::new(py, PyRecordBatch { batch })?.into_any()),
        Output::Numpy => {
            let columns = batch_to_numpy(py, &batch)?;
            let out = batch_class(py)?.call1((columns,))?;
            out.setattr("_record_batch", PyRecordBatch { batch })?;
            Ok(out.unbind())
        }
    }
}

#[pymethods]
impl BatchIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let Some(receiver) = self.receiver.as_mut() else {
            return Ok(None);
        };
        // The first call (the epoch's one-off start) counts for itself; later ones read
        // count for the calls since the last one read.
        let every = match self.output {
            Output::Arrow => ARROW_CPU_SAMPLE,
            Output::Numpy | Output::Torch { .. } => 1,
        };
        let weight = match self.calls {
            0 => 1,
            n if n.is_multiple_of(every) => every,
            _ => 0,
        };
        self.calls += 1;
        if weight == 0 {
            return self.next_output(py);
        }
        let cpu = crate::pipeline::stats::thread_cpu_ns();
        let stats = receiver.stats().clone();
        let out = self.next_output(py);
        let used = crate::pipeline::stats::thread_cpu_ns()
            .saturating_sub(cpu)
            .saturating_sub(crate::pipeline::stats::clock_read_ns());
        stats
            .consumer_cpu_ns
            .fetch_add(used * weight, std::sync::atomic::Ordering::Relaxed);
        out
    }
}

impl BatchIterator {
    /// The next batch, converted (see `__next__`).
    fn next_output(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let Some(receiver) = self.receiver.as_mut() else {
            return Ok(None);
        };
        let batch = next_batch(py, receiver).inspect_err(|_| self.receiver = None)?;
        let mut position = self.position.lock().unwrap_or_else(|p| p.into_inner());
        match batch {
            Some(batch) => {
                let (batch, positions) = rows::detach(batch);
                if position.epoch == self.epoch {
                    position.batches += 1;
                    match positions {
                        Some(positions) if !positions.values().contains(&rows::UNKNOWN) => {
                            if let Some(consumed) = position.consumed.as_mut() {
                                consumed.add(positions.values());
                            }
                            position.last_batch = Some(positions);
                        }
                        _ => {
                            position.consumed = None;
                            position.last_batch = None;
                        }
                    }
                }
                drop(position);
                // A reading a second at most: the clock is looked at every few batches.
                if self.calls.is_multiple_of(REPORT_TICK_EVERY) {
                    lock(&self.report).tick(&self.stats);
                }
                Ok(Some(to_output(py, batch, self.output)?))
            }
            None => {
                if position.epoch == self.epoch {
                    let ended = std::mem::replace(&mut *position, Position::start(self.epoch + 1));
                    position.ended = Some(Box::new(Position {
                        ended: None,
                        ..ended
                    }));
                }
                lock(&self.report).epoch_ended(&self.stats);
                self.receiver = None;
                if let Some(trace) = self.stats.trace() {
                    trace.write()?;
                }
                Ok(None)
            }
        }
    }
}

/// The report's readings, under their lock (a panic elsewhere leaves them usable).
fn lock(window: &Mutex<ReportWindow>) -> std::sync::MutexGuard<'_, ReportWindow> {
    window.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for PyDataLoader {
    /// A timeline is written at the end of every epoch; one left part-way is written here.
    fn drop(&mut self) {
        if let Some(trace) = self.stats.trace() {
            let _ = trace.write();
        }
    }
}

/// `seconds` where it is a number of seconds, 0 or more (not NaN or infinite).
fn checked_seconds(seconds: f64) -> PyResult<f64> {
    match seconds.is_finite() && seconds >= 0.0 {
        true => Ok(seconds),
        false => Err(PyValueError::new_err(format!(
            "seconds={seconds}: a number of seconds, 0 or more"
        ))),
    }
}
