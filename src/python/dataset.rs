//! `shardflow.Dataset`: its verbs (ops, splits, columns), random access, iteration,
//! writing and pickling. The functions that make one are in `open`.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::RecordBatch;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyString, PyTuple};

use super::args::{
    DEFAULT_SEED, check_callable, name_list, non_negative, parse_options, source_list,
};
use super::arrow_ffi::{batches_from_py, schema_from_py, stream_capsule};
use super::column_types::column_types;
use super::errors::callback_error;
use super::to_python::batch_to_rows;
use super::tokenizer::{ChatVerb, PyTokenizer};
use super::transform::{Columns, Kind, PyTransform};
use super::wait::next_batch;
use crate::pipeline::{
    self, BatchReceiver, Dataset, Indices, Op, RandomAccess, RunOptions, Stats, Weights,
};
use crate::source::{Storage, StorageOptions};
use crate::write::{ShardFormat, WriteOptions};

/// Rows per call of a batched `map` when the user gives no `batch_size` (as in
/// Hugging Face `datasets`).
const DEFAULT_MAP_BATCH: usize = 1000;

/// A dataset: where its records are (files, URLs, a Hub repo, or data in memory) and the
/// operations over them, as a recipe that nothing reads until it is iterated, indexed or
/// given to a `DataLoader`. Every verb returns a new dataset; `sf.dataset(...)` and
/// `sf.load_dataset(...)` make one.
#[pyclass(frozen, name = "Dataset", module = "shardflow")]
pub struct PyDataset {
    pub(crate) inner: Dataset,
    /// How to build this dataset again: `("dataset", kwargs)` then `(method, args)` for
    /// each op, seeds resolved. Pickling sends this (PyTorch's spawned workers rebuild
    /// the dataset from it; the footers are read again there).
    pub(super) recipe: Vec<(&'static str, Py<PyAny>)>,
    /// Set up on the first `ds[i]`.
    pub(super) access: std::sync::Mutex<Option<(u64, Arc<RandomAccess>)>>,
    /// The epoch that `ds[i]` and `iter(ds)` read (see `set_epoch`).
    pub(super) epoch: std::sync::atomic::AtomicU64,
}

impl PyDataset {
    /// A dataset of records in memory; `recipe_step` is how a pickled copy rebuilds it.
    pub(super) fn in_memory(
        py: Python<'_>,
        schema: arrow_schema::SchemaRef,
        batches: Vec<RecordBatch>,
        recipe_step: (&'static str, Bound<'_, PyDict>),
    ) -> Self {
        let inner = py.detach(|| Dataset::from_batches(schema, batches, None));
        Self {
            inner,
            recipe: vec![(recipe_step.0, recipe_step.1.into_any().unbind())],
            access: Default::default(),
            epoch: Default::default(),
        }
    }

    /// `shardflow.from_arrow(data)` (see `open::from_arrow`), which `add_column` uses too.
    pub(super) fn from_arrow(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        // An HF Dataset's `.data` is its whole table; its rows are that table through its
        // indices mapping, which the "arrow" format applies.
        let (schema, batches) =
            if data.hasattr("flatten_indices")? && data.hasattr("with_format")? {
                let table = data
                    .call_method1("with_format", ("arrow",))?
                    .get_item(pyo3::types::PySlice::full(py))?;
                batches_from_py(&table)?
            } else {
                batches_from_py(data)?
            };
        let kwargs = PyDict::new(py);
        kwargs.set_item("data", data)?;
        Ok(Self::in_memory(py, schema, batches, ("from_arrow", kwargs)))
    }

    /// Row numbers from a range or any iterable of non-negative integers.
    fn indices_of(&self, py: Python<'_>, indices: &Bound<'_, PyAny>) -> PyResult<Indices> {
        if let Ok(range) = indices.cast::<pyo3::types::PyRange>() {
            let (start, stop, step): (i64, i64, i64) = (
                range.getattr("start")?.extract()?,
                range.getattr("stop")?.extract()?,
                range.getattr("step")?.extract()?,
            );
            if step == 1 && start >= 0 {
                return Ok(Indices::Range {
                    start: start as u64,
                    len: (stop - start).max(0) as u64,
                });
            }
        }
        let _ = py;
        let mut rows = Vec::new();
        for item in indices.try_iter()? {
            let i: i64 = item?.extract()?;
            if i < 0 {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "select takes row numbers from 0, not {i}"
                )));
            }
            rows.push(i as u64);
        }
        Ok(Indices::list(rows))
    }

    /// Every row's value of `name` (read in the current epoch), as a list.
    fn column_values<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let schema = py.detach(|| self.inner.schema())?;
        if schema.index_of(name).is_err() {
            return Err(pyo3::exceptions::PyKeyError::new_err(format!(
                "no column {name:?}; the columns are {:?}",
                crate::format::field_names(&schema)
            )));
        }
        let all = self
            .select_columns(py, &PyString::new(py, name).into_any())?
            .all_rows(py)?;
        let columns = super::to_python::batch_to_pydict(py, &all)?;
        columns
            .get_item(name)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))
    }

    /// Every row, read in the dataset's current epoch, as one batch.
    fn all_rows(&self, py: Python<'_>) -> PyResult<RecordBatch> {
        let mut receiver = self.start(py)?;
        let mut batches = Vec::new();
        while let Some(batch) = next_batch(py, &mut receiver)? {
            batches.push(batch);
        }
        let schema = match batches.first() {
            Some(batch) => batch.schema(),
            None => py.detach(|| self.inner.schema())?,
        };
        Ok(arrow_select::concat::concat_batches(&schema, &batches)
            .map_err(|e| crate::error::Error::Internal(e.to_string()))?)
    }

    /// This dataset with a column verb added, its schema checked now where known.
    pub(super) fn columns(
        &self,
        py: Python<'_>,
        verb: pipeline::Columns,
        method: &'static str,
        args: Bound<'_, PyAny>,
    ) -> PyResult<PyDataset> {
        if self.inner.keeps_source_schema() {
            let schema = py.detach(|| self.inner.source_schema())?;
            verb.check(&schema)?;
        }
        let inner = self.inner.with_op(Op::Transform(Arc::new(verb)));
        Ok(self.derived(inner, method, args))
    }

    /// Random access as in the dataset's current epoch, set up once per epoch. The lock
    /// is not held while setting up (that reads data, with the GIL released).
    fn random_access(&self, py: Python<'_>) -> PyResult<Arc<RandomAccess>> {
        let epoch = self.current_epoch();
        let cached = || self.access.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, access)) = cached().as_ref()
            && *e == epoch
        {
            return Ok(access.clone());
        }
        let access = Arc::new(py.detach(|| self.inner.random_access(epoch))?);
        *cached() = Some((epoch, access.clone()));
        Ok(access)
    }

    fn current_epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A dataset object for internal use (no recipe: it is never pickled).
    pub(crate) fn from_inner(inner: Dataset) -> Self {
        Self {
            inner,
            recipe: Vec::new(),
            access: Default::default(),
            epoch: Default::default(),
        }
    }

    /// This dataset with `op` added; `method(*args)` is how the recipe replays it.
    fn with(&self, op: Op, method: &'static str, args: Bound<'_, PyTuple>) -> PyDataset {
        self.derived(self.inner.with_op(op), method, args.into_any())
    }

    /// `inner`, made from this dataset by `method(*args)` (`method(**args)` when `args`
    /// is a dict).
    pub(super) fn derived(
        &self,
        inner: Dataset,
        method: &'static str,
        args: Bound<'_, PyAny>,
    ) -> PyDataset {
        let mut recipe: Vec<_> = self
            .recipe
            .iter()
            .map(|(m, a)| (*m, a.clone_ref(args.py())))
            .collect();
        recipe.push((method, args.unbind()));
        PyDataset {
            inner,
            recipe,
            access: Default::default(),
            epoch: Default::default(),
        }
    }

    /// This dataset with the user's function `func` added, called as `call` (`func`
    /// itself, or wrapped to take `input_columns`/`fn_kwargs`); `how` is its kind,
    /// whether it takes row indices, its `schema=` and the columns it removes.
    fn transform(
        &self,
        py: Python<'_>,
        func: &Bound<'_, PyAny>,
        call: Option<Bound<'_, PyAny>>,
        how: (Kind, bool, Option<&Bound<'_, PyAny>>, Vec<String>),
        method: &'static str,
        args: Bound<'_, PyDict>,
    ) -> PyResult<PyDataset> {
        let (kind, with_indices, schema, remove_columns) = how;
        check_callable(func)?;
        let schema = schema.map(schema_from_py).transpose()?;
        let mut transform = PyTransform::new(func, kind, schema)
            .removing(remove_columns)
            .indexed(with_indices);
        if let Some(call) = call {
            transform = transform.calling(&call);
        }
        let rows = if with_indices {
            // As `datasets` numbers a map's rows: in the order of the dataset it is
            // called on, so its rows are read by index (a select of all of them).
            let n = self.__len__(py)? as u64;
            self.inner
                .with_op(Op::Select(Indices::Range { start: 0, len: n }))
        } else {
            self.inner.clone()
        };
        let inner = rows.with_op(Op::Transform(Arc::new(transform)));
        Ok(self.derived(inner, method, args.into_any()))
    }

    /// Starts one pass over the dataset's records, in decoded batches.
    pub fn start(&self, py: Python<'_>) -> PyResult<BatchReceiver> {
        let run = RunOptions {
            epoch: self.current_epoch(),
            ..RunOptions::default()
        };
        let ds = self.inner.clone();
        Ok(py.detach(|| ds.start(run, Arc::new(Stats::default())))?)
    }
}

#[pymethods]
impl PyDataset {
    /// Shuffles the rows, seeded and new each epoch. Without `buffer_size` /
    /// `buffer_bytes`, on a dataset whose rows can be addressed (every format, through
    /// `select`, `take`, `skip`, `map`, and `filter`, which is then run once over the
    /// rows when the epoch is first read), this is a uniform permutation of all rows, as
    /// Hugging Face's `Dataset.shuffle`. With either, or after a `flat_map`, it is a
    /// streaming shuffle: shard order plus a buffer of at most `buffer_size` rows and
    /// `buffer_bytes` bytes, as `IterableDataset.shuffle`.
    #[pyo3(signature = (seed=None, buffer_size=None, buffer_bytes=None))]
    fn shuffle(
        &self,
        py: Python<'_>,
        seed: Option<u64>,
        buffer_size: Option<usize>,
        buffer_bytes: Option<u64>,
    ) -> PyResult<PyDataset> {
        let seed = seed.unwrap_or(DEFAULT_SEED);
        if buffer_size.is_none() && buffer_bytes.is_none() && self.inner.addressable() {
            let args = (seed, py.None(), py.None()).into_pyobject(py)?;
            return Ok(self.with(Op::Permute { seed }, "shuffle", args));
        }
        let default = pipeline::DEFAULT_SHUFFLE_BUFFER;
        let buffer = pipeline::BufferBounds {
            rows: buffer_size.unwrap_or(default.rows),
            bytes: buffer_bytes.unwrap_or(default.bytes),
        };
        if buffer.rows == 0 || buffer.bytes == 0 {
            return Err(PyValueError::new_err(
                "buffer_size and buffer_bytes must be at least 1",
            ));
        }
        let args = (seed, buffer.rows, buffer.bytes).into_pyobject(py)?;
        Ok(self.with(Op::Shuffle { seed, buffer }, "shuffle", args))
    }

    /// `num_samples` rows (all rows' count by default) drawn by weight, new each epoch
    /// and the same for the same (seed, epoch): `weights` is a numeric column's name or
    /// one weight per row (a list or numpy array); `source_weights` gives each dataset
    /// of a `sf.concatenate` its chance of being drawn from. With `replacement` a row can
    /// come more than once (as torch's `WeightedRandomSampler`); without, rows come once
    /// each, heavier ones likelier first. Ranks and workers split the drawn rows.
    #[pyo3(signature = (weights=None, num_samples=None, *, source_weights=None, replacement=true, seed=None))]
    fn weighted_sample(
        &self,
        py: Python<'_>,
        weights: Option<&Bound<'_, PyAny>>,
        num_samples: Option<u64>,
        source_weights: Option<Vec<f64>>,
        replacement: bool,
        seed: Option<u64>,
    ) -> PyResult<PyDataset> {
        let seed = seed.unwrap_or(DEFAULT_SEED);
        let (chosen, arg): (Weights, Py<PyAny>) = match (weights, source_weights) {
            (Some(w), None) => match w.extract::<String>() {
                Ok(name) => (Weights::column(name), w.clone().unbind()),
                Err(_) => {
                    let values: Vec<f64> = w
                        .try_iter()?
                        .map(|v| v?.extract::<f64>())
                        .collect::<PyResult<_>>()
                        .map_err(|_| {
                            PyTypeError::new_err(
                                "weights is a column name or a sequence of numbers, one per row",
                            )
                        })?;
                    let arg = PyList::new(py, &values)?.into_any().unbind();
                    (Weights::rows(values), arg)
                }
            },
            (None, Some(per_source)) => (Weights::Sources(per_source), py.None()),
            _ => {
                return Err(PyValueError::new_err(
                    "give weights= (a column or one per row) or source_weights=, not both",
                ));
            }
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("weights", arg)?;
        kwargs.set_item("num_samples", num_samples)?;
        if let Weights::Sources(w) = &chosen {
            kwargs.set_item("source_weights", w.clone())?;
        }
        kwargs.set_item("replacement", replacement)?;
        kwargs.set_item("seed", seed)?;
        let op = Op::Sample {
            weights: chosen,
            num_samples,
            replacement,
            seed,
        };
        let dataset = self.derived(self.inner.with_op(op), "weighted_sample", kwargs.into_any());
        // Weights that do not fit the rows are refused now, not on first iteration.
        py.detach(|| dataset.inner.random_access(0))?;
        Ok(dataset)
    }

    /// The rows at `indices` (a range, slice, list or numpy integer array), in that
    /// order. Lazy: nothing is copied, and only the selected rows are read. Rows an op
    /// decides as it runs are found when the selection is first read, once per process:
    /// a filter is run over the rows (its row numbers kept); the rows out of a flat_map,
    /// a batched map, a shuffle buffer or an interleave are read into memory.
    fn select(&self, py: Python<'_>, indices: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
        let chosen = if let Ok(slice) = indices.cast::<pyo3::types::PySlice>() {
            let len = self.__len__(py)?;
            let range = py
                .import("builtins")?
                .getattr("range")?
                .call1(slice.call_method1("indices", (len,))?.cast::<PyTuple>()?)?;
            self.indices_of(py, &range)?
        } else {
            self.indices_of(py, indices)?
        };
        let arg: Py<PyAny> = match &chosen {
            Indices::Range { start, len } => py
                .import("builtins")?
                .getattr("range")?
                .call1((*start, start + len))?
                .unbind(),
            Indices::List { rows, .. } => PyList::new(py, rows.iter())?.into_any().unbind(),
        };
        let dataset = self.with(Op::Select(chosen), "select", PyTuple::new(py, [arg])?);
        // Refuse a selection that cannot be read now, not on first iteration.
        Ok(dataset)
    }

    /// Part `index` of `num_shards`, as in Hugging Face `datasets`: with `contiguous`,
    /// consecutive rows (the first `len % num_shards` parts one row longer), else every
    /// `num_shards`-th row from `index`.
    #[pyo3(signature = (num_shards, index, contiguous=true))]
    fn shard(
        &self,
        py: Python<'_>,
        num_shards: usize,
        index: usize,
        contiguous: bool,
    ) -> PyResult<PyDataset> {
        if num_shards == 0 || index >= num_shards {
            return Err(PyValueError::new_err(format!(
                "index {index} is not a shard of {num_shards}"
            )));
        }
        let len = self.__len__(py)?;
        let range = py.import("builtins")?.getattr("range")?;
        let rows = if contiguous {
            let (each, extra) = (len / num_shards, len % num_shards);
            let start = each * index + index.min(extra);
            let end = start + each + usize::from(index < extra);
            range.call1((start, end))?
        } else {
            range.call1((index, len, num_shards))?
        };
        self.select(py, &rows)
    }

    /// Splits the rows into `{"train": ds, "test": ds}`, as Hugging Face's
    /// `train_test_split`: sizes are row counts (int) or fractions (float); the test
    /// rows are the first of a seeded permutation (or the last rows, without
    /// `shuffle`). Disjoint, deterministic for a seed, together every row when the sizes
    /// add up.
    #[pyo3(signature = (test_size=None, train_size=None, *, seed=None, shuffle=true))]
    fn train_test_split<'py>(
        &self,
        py: Python<'py>,
        test_size: Option<&Bound<'py, PyAny>>,
        train_size: Option<&Bound<'py, PyAny>>,
        seed: Option<u64>,
        shuffle: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let n = self.__len__(py)? as u64;
        let size = |value: Option<&Bound<'py, PyAny>>, round_up: bool| -> PyResult<Option<u64>> {
            let Some(value) = value.filter(|v| !v.is_none()) else {
                return Ok(None);
            };
            if value.is_instance_of::<pyo3::types::PyFloat>() {
                let f: f64 = value.extract()?;
                if !(0.0 < f && f < 1.0) {
                    return Err(PyValueError::new_err(format!(
                        "a fractional size must be between 0 and 1, not {f}"
                    )));
                }
                let rows = f * n as f64;
                return Ok(Some(
                    if round_up { rows.ceil() } else { rows.floor() } as u64
                ));
            }
            let rows: i64 = value.extract()?;
            if rows < 0 || rows as u64 > n {
                return Err(PyValueError::new_err(format!(
                    "a size of {rows} rows does not fit {n} rows"
                )));
            }
            Ok(Some(rows as u64))
        };
        let (test, train) = match (size(test_size, true)?, size(train_size, false)?) {
            (None, None) => {
                let test = (0.25 * n as f64).ceil() as u64;
                (test, n - test)
            }
            (Some(test), None) => (test, n - test),
            (None, Some(train)) => (n - train, train),
            (Some(test), Some(train)) => (test, train),
        };
        if test + train > n {
            return Err(PyValueError::new_err(format!(
                "test ({test}) and train ({train}) rows add up to more than the {n} rows"
            )));
        }
        if test == 0 || train == 0 {
            return Err(PyValueError::new_err(format!(
                "with {n} rows these sizes leave the {} split empty",
                if test == 0 { "test" } else { "train" }
            )));
        }
        let out = PyDict::new(py);
        let range = py.import("builtins")?.getattr("range")?;
        if shuffle {
            let mut order: Vec<u64> = (0..n).collect();
            pipeline::rng::Rng::new(seed.unwrap_or(DEFAULT_SEED), 0, 0).shuffle(&mut order);
            let test_rows = PyList::new(py, &order[..test as usize])?;
            let train_rows = PyList::new(py, &order[test as usize..(test + train) as usize])?;
            out.set_item("train", self.select(py, train_rows.as_any())?)?;
            out.set_item("test", self.select(py, test_rows.as_any())?)?;
        } else {
            out.set_item("train", self.select(py, &range.call1((0, train))?)?)?;
            out.set_item(
                "test",
                self.select(py, &range.call1((train, train + test))?)?,
            )?;
        }
        Ok(out)
    }

    /// Adds `input_ids` (`list<int32>`): each text of `column` tokenized by `tokenizer`
    /// (a `shardflow.Tokenizer`), as `tokenizer(text)["input_ids"]` in transformers,
    /// truncated to `max_length` with `truncation=True`. Runs on the loader's threads.
    /// A row that fails (a null text) raises `sf.TemplateError` naming it, or with
    /// `on_error="skip"` is left out and counted in `stats()["skipped_records"]`.
    #[pyo3(signature = (tokenizer, column="text", max_length=None, truncation=false, add_special_tokens=true, on_error="raise"))]
    #[allow(clippy::too_many_arguments)]
    fn tokenize(
        &self,
        py: Python<'_>,
        tokenizer: &Bound<'_, PyTokenizer>,
        column: &str,
        max_length: Option<usize>,
        truncation: bool,
        add_special_tokens: bool,
        on_error: &str,
    ) -> PyResult<PyDataset> {
        self.tokenized(
            py,
            tokenizer,
            column,
            (max_length, truncation),
            add_special_tokens,
            on_error,
        )
    }

    /// Renders each conversation of `column` (a list of messages, or its JSON text)
    /// through the tokenizer's chat template and tokenizes it, as transformers'
    /// `apply_chat_template(tokenize=True, return_dict=True,
    /// return_assistant_tokens_mask=True)`: adds `input_ids`, `assistant_masks` (1 on the
    /// assistant's tokens: when the template marks them with `{% generation %}`, or
    /// always with `return_assistant_tokens_mask=True`) and, with `labels=True`,
    /// `labels` (`-100` off the assistant's tokens, as TRL's `assistant_only_loss`). The
    /// other columns stay but `remove_columns`. `now` (a datetime or POSIX seconds) is
    /// what `strftime_now` gives; by default the time of this call, so every epoch,
    /// worker and resume renders the same text. Other keyword arguments are variables
    /// for the template. Runs on the loader's threads. A malformed row (not a list of
    /// messages, or one the template raises on) raises `sf.TemplateError` naming it, or
    /// with `on_error="skip"` is left out and counted in `stats()["skipped_records"]`.
    #[pyo3(signature = (
        tokenizer, column="messages", chat_template=None, add_generation_prompt=false,
        continue_final_message=None, tools=None, documents=None, max_length=None,
        truncation=false, return_assistant_tokens_mask=None, labels=false,
        remove_columns=None, now=None, on_error="raise", **template_kwargs
    ))]
    #[allow(clippy::too_many_arguments)]
    fn apply_chat_template(
        &self,
        py: Python<'_>,
        tokenizer: &Bound<'_, PyTokenizer>,
        column: &str,
        chat_template: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<&Bound<'_, PyAny>>,
        tools: Option<&Bound<'_, PyAny>>,
        documents: Option<&Bound<'_, PyAny>>,
        max_length: Option<usize>,
        truncation: bool,
        return_assistant_tokens_mask: Option<bool>,
        labels: bool,
        remove_columns: Option<&Bound<'_, PyAny>>,
        now: Option<&Bound<'_, PyAny>>,
        on_error: &str,
        template_kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDataset> {
        self.chat_tokens(
            py,
            ChatVerb {
                tokenizer,
                column,
                chat_template,
                add_generation_prompt,
                continue_final_message,
                tools,
                documents,
                max_length,
                truncation,
                return_assistant_tokens_mask,
                labels,
                remove_columns,
                now,
                on_error,
                template_kwargs,
            },
        )
    }

    /// Token sequences packed into rows of at most `seq_length` tokens, as TRL's
    /// `pack_dataset` packs them, each window of `buffer_rows` rows on its own: `"bfd"`
    /// (best fit decreasing; a `seq_lengths` column gives each row's sequences) with
    /// `on_too_long` `"truncate"`, `"split"` or `"error"`, or `"wrapped"`. Packs
    /// `columns` (default `input_ids` and the per-token columns beside it).
    #[pyo3(signature = (seq_length, strategy="bfd", columns=None, buffer_rows=1000, on_too_long="truncate"))]
    fn pack(
        &self,
        py: Python<'_>,
        seq_length: usize,
        strategy: &str,
        columns: Option<&Bound<'_, PyAny>>,
        buffer_rows: usize,
        on_too_long: &str,
    ) -> PyResult<PyDataset> {
        self.packed(py, seq_length, strategy, columns, buffer_rows, on_too_long)
    }

    /// A dataset whose rows are batches of `batch_size` rows: each column a list of the
    /// batch's values, as `datasets`' `IterableDataset.batch`; `drop_last_batch` leaves
    /// out a last, shorter one. (For training, `DataLoader(ds, batch_size)` makes
    /// numpy/torch batches directly.)
    #[pyo3(signature = (batch_size, drop_last_batch=false))]
    fn batch(
        &self,
        py: Python<'_>,
        batch_size: usize,
        drop_last_batch: bool,
    ) -> PyResult<PyDataset> {
        if batch_size == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        let op = Op::Transform(Arc::new(pipeline::Batches {
            rows: batch_size,
            drop_last: drop_last_batch,
        }));
        let args = PyDict::new(py);
        args.set_item("batch_size", batch_size)?;
        args.set_item("drop_last_batch", drop_last_batch)?;
        Ok(self.derived(self.inner.with_op(op), "batch", args.into_any()))
    }

    /// Only these columns, in this order; read as a projection where the format allows.
    fn select_columns(&self, py: Python<'_>, names: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
        let names = name_list(names)?;
        let args = PyTuple::new(py, [PyList::new(py, &names)?])?;
        if let Some(projected) = self.inner.with_columns(&names) {
            let dataset = self.derived(projected, "select_columns", args.into_any());
            // Check now that the columns exist, as the verb does without push-down.
            py.detach(|| dataset.inner.source_schema())?;
            return Ok(dataset);
        }
        self.columns(
            py,
            pipeline::Columns::Select(names),
            "select_columns",
            args.into_any(),
        )
    }

    /// Every column but these.
    fn remove_columns(&self, py: Python<'_>, names: &Bound<'_, PyAny>) -> PyResult<PyDataset> {
        let names = name_list(names)?;
        let args = PyTuple::new(py, [PyList::new(py, &names)?])?;
        self.columns(
            py,
            pipeline::Columns::Remove(names),
            "remove_columns",
            args.into_any(),
        )
    }

    /// Renames columns: `{old: new}`.
    fn rename_columns(
        &self,
        py: Python<'_>,
        column_mapping: &Bound<'_, PyDict>,
    ) -> PyResult<PyDataset> {
        let pairs: Vec<(String, String)> = column_mapping
            .iter()
            .map(|(k, v)| Ok((k.extract()?, v.extract()?)))
            .collect::<PyResult<_>>()?;
        let args = PyTuple::new(py, [column_mapping])?;
        self.columns(
            py,
            pipeline::Columns::Rename(pairs),
            "rename_columns",
            args.into_any(),
        )
    }

    /// Renames one column, as `datasets`' `rename_column`.
    fn rename_column(
        &self,
        py: Python<'_>,
        original_column_name: String,
        new_column_name: String,
    ) -> PyResult<PyDataset> {
        let mapping = PyDict::new(py);
        mapping.set_item(original_column_name, new_column_name)?;
        self.rename_columns(py, &mapping)
    }

    /// Casts the columns that `schema` names (an Arrow schema, e.g. `pyarrow.schema`)
    /// to its types; the other columns stay as they are. A value that does not convert
    /// raises a `SchemaError` naming the column and the value (as `datasets` raises),
    /// or with `on_invalid="null"` becomes a null.
    #[pyo3(signature = (schema, *, on_invalid="raise"))]
    fn cast(
        &self,
        py: Python<'_>,
        schema: &Bound<'_, PyAny>,
        on_invalid: &str,
    ) -> PyResult<PyDataset> {
        self.cast_to(py, schema, on_invalid)
    }

    /// Casts one column to `dtype` (a pyarrow `DataType`); see `cast`.
    #[pyo3(signature = (column, dtype, *, on_invalid="raise"))]
    fn cast_column(
        &self,
        py: Python<'_>,
        column: String,
        dtype: &Bound<'_, PyAny>,
        on_invalid: &str,
    ) -> PyResult<PyDataset> {
        let schema = py
            .import("shardflow.features")?
            .call_method1("_cast_schema", (dtype, column))?;
        self.cast(py, &schema, on_invalid)
    }

    /// The columns' features as `datasets` describes them (`shardflow.features.Features`:
    /// `Value`, `ClassLabel`, `List`, `Image`, `Audio`, ...): those the files were
    /// written with (their `huggingface` metadata), carried through renames, selections
    /// and casts; a column a function made or changed has the feature its Arrow type
    /// infers. `schema` keeps the Arrow schema.
    #[getter]
    fn features<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.features_of(py)
    }

    /// The features' JSON the files were written with (their `huggingface` metadata),
    /// where they carry it.
    #[getter]
    fn _stored_features(&self, py: Python<'_>) -> PyResult<Option<String>> {
        Ok(py.detach(|| self.inner.stored_features())?)
    }

    /// The Arrow schema of the records this dataset yields, as an object with the Arrow
    /// PyCapsule interface (`pyarrow.schema(ds.schema)`).
    #[getter]
    pub(super) fn schema(&self, py: Python<'_>) -> PyResult<super::arrow_ffi::PySchema> {
        let schema = py.detach(|| self.inner.schema())?;
        Ok(super::arrow_ffi::PySchema { schema })
    }

    /// Builds the record index of every shard (stream formats: one pass over each, in
    /// parallel; kept beside the data or in `cache_dir`) and returns the number of rows.
    fn index(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(py.detach(|| self.inner.index())?)
    }

    /// The first `n` rows of the dataset (all of them, if it has fewer), counted before
    /// the epoch is divided between ranks and workers.
    fn take(&self, py: Python<'_>, n: i64) -> PyResult<PyDataset> {
        Ok(self.with(
            Op::Take(non_negative("n", n)?),
            "take",
            PyTuple::new(py, [n])?,
        ))
    }

    /// The rows after the first `n`, counted before the epoch is divided between ranks
    /// and workers.
    fn skip(&self, py: Python<'_>, n: i64) -> PyResult<PyDataset> {
        Ok(self.with(
            Op::Skip(non_negative("n", n)?),
            "skip",
            PyTuple::new(py, [n])?,
        ))
    }

    /// Keeps the samples for which `fn(sample)` is true; with `batched=True`,
    /// `fn(batch)` gives one verdict per row of `batch_size` rows at a time (default
    /// 1000). `input_columns` (a name or a list) passes those columns as the function's
    /// arguments instead of the whole row, and `fn_kwargs` its keyword arguments, as in
    /// `datasets`. A batch is a dict of lists, or of numpy arrays with
    /// `batch_format="numpy"`.
    #[pyo3(signature = (function, batched=false, batch_size=None, *, with_indices=false, input_columns=None, fn_kwargs=None, batch_format="python"))]
    #[allow(clippy::too_many_arguments)]
    fn filter(
        &self,
        py: Python<'_>,
        function: &Bound<'_, PyAny>,
        batched: bool,
        batch_size: Option<usize>,
        with_indices: bool,
        input_columns: Option<&Bound<'_, PyAny>>,
        fn_kwargs: Option<&Bound<'_, PyDict>>,
        batch_format: &str,
    ) -> PyResult<PyDataset> {
        let kind = match batching(batched, batch_size, batch_format)? {
            None => Kind::Filter,
            Some((batch_rows, columns)) => Kind::FilterBatched {
                batch_rows,
                columns,
            },
        };
        let args = PyDict::new(py);
        let call = FunctionArgs {
            function,
            batched,
            batch_size,
            with_indices,
            input_columns,
            fn_kwargs,
            batch_format,
        }
        .recorded(&args)?;
        let transform = (kind, with_indices, None, Vec::new());
        self.transform(py, function, call, transform, "filter", args)
    }

    /// `fn(sample) -> dict`, or with `batched=True`, `fn(batch) -> dict of columns` on
    /// `batch_size` rows at a time (default 1000), a batch being a dict of lists (or of
    /// numpy arrays, `batch_format="numpy"`). As in `datasets`, the returned dict is
    /// merged into the sample (new keys added, returned keys replaced), less the input
    /// columns `remove_columns` names; `input_columns` and `fn_kwargs` as for `filter`.
    /// The returned columns' schema is `schema=` (every batch cast to it, a value that
    /// does not fit an error) or that of the first batch (later batches widened to it or
    /// refused).
    #[pyo3(signature = (function, batched=false, batch_size=None, schema=None, remove_columns=None, *, with_indices=false, input_columns=None, fn_kwargs=None, batch_format="python"))]
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        py: Python<'_>,
        function: &Bound<'_, PyAny>,
        batched: bool,
        batch_size: Option<usize>,
        schema: Option<&Bound<'_, PyAny>>,
        remove_columns: Option<&Bound<'_, PyAny>>,
        with_indices: bool,
        input_columns: Option<&Bound<'_, PyAny>>,
        fn_kwargs: Option<&Bound<'_, PyDict>>,
        batch_format: &str,
    ) -> PyResult<PyDataset> {
        let kind = match batching(batched, batch_size, batch_format)? {
            None => Kind::Map,
            Some((batch_rows, columns)) => Kind::MapBatched {
                batch_rows,
                columns,
            },
        };
        let args = PyDict::new(py);
        args.set_item("schema", schema)?;
        args.set_item("remove_columns", remove_columns)?;
        let call = FunctionArgs {
            function,
            batched,
            batch_size,
            with_indices,
            input_columns,
            fn_kwargs,
            batch_format,
        }
        .recorded(&args)?;
        // A column name alone, or a list of them (as `datasets` takes).
        let remove = remove_columns
            .map(name_list)
            .transpose()?
            .unwrap_or_default();
        self.transform(
            py,
            function,
            call,
            (kind, with_indices, schema, remove),
            "map",
            args,
        )
    }

    /// Adds `column` (one value per row, in the order the rows come in the current
    /// epoch) as `name`, as `datasets`' `add_column`. The rows are read into memory (a
    /// `pyarrow` table) to line the values up with them.
    fn add_column<'py>(
        slf: &Bound<'py, Self>,
        name: &str,
        column: &Bound<'py, PyAny>,
    ) -> PyResult<PyDataset> {
        let py = slf.py();
        if slf.get().column_names(py)?.iter().any(|c| c == name) {
            return Err(PyValueError::new_err(format!(
                "add_column: the dataset already has a column {name:?}"
            )));
        }
        let table = Self::to_arrow(slf)?;
        let rows: usize = table.getattr("num_rows")?.extract()?;
        let values = py.import("pyarrow")?.call_method1("array", (column,))?;
        let given: usize = values.len()?;
        if given != rows {
            return Err(PyValueError::new_err(format!(
                "add_column: {given} values for {rows} rows"
            )));
        }
        Self::from_arrow(py, &table.call_method1("append_column", (name, values))?)
    }

    /// `fn(sample) -> iterable of samples`; the schema as for `map`.
    #[pyo3(signature = (func, schema=None))]
    fn flat_map(
        &self,
        func: &Bound<'_, PyAny>,
        schema: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDataset> {
        let py = func.py();
        let args = PyDict::new(py);
        args.set_item("func", func)?;
        args.set_item("schema", schema)?;
        let transform = (Kind::FlatMap, false, schema, Vec::new());
        self.transform(py, func, None, transform, "flat_map", args)
    }

    /// Chooses the epoch that `ds[i]`, `ds.__getitems__` and `iter(ds)` read: what a
    /// full shuffle or a weighted sample draws depends on it (as Hugging Face's
    /// `IterableDataset.set_epoch`). A `DataLoader` keeps its own epoch.
    fn set_epoch(&self, epoch: u64) {
        self.epoch
            .store(epoch, std::sync::atomic::Ordering::Relaxed);
    }

    /// The epoch that `ds[i]` and `iter(ds)` read (see `set_epoch`).
    #[getter]
    fn epoch(&self) -> u64 {
        self.current_epoch()
    }

    /// Pickles as its recipe (the `dataset(...)` call and the ops, seeds included) and
    /// its epoch.
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        (Bound<'py, PyList>, u64, Bound<'py, PyList>),
    )> {
        let rebuild = py.import("shardflow._recipe")?.getattr("rebuild")?;
        let steps = PyList::empty(py);
        for (method, args) in &self.recipe {
            steps.append((*method, args.bind(py)))?;
        }
        // The Parquet footers read of its files travel with it, so that a spawned
        // worker rebuilding it does not read them again.
        let urls: Vec<String> = self.inner.shards().into_iter().map(|s| s.url).collect();
        let footers = PyList::empty(py);
        for (url, size, tail) in crate::format::parquet_footers::of_files(&urls) {
            footers.append((url, size, pyo3::types::PyBytes::new(py, &tail)))?;
        }
        Ok((rebuild, (steps, self.current_epoch(), footers)))
    }

    /// Number of samples; stream formats are indexed to count them. Where an op decides
    /// it as it runs, the first call does what `datasets` does when the op is called:
    /// runs a filter once over the rows (keeping the row numbers that pass), or reads the
    /// rows out of a flat_map, a batched map, a shuffle buffer or an interleave into
    /// memory (see `select`).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        if let Some(rows) = py.detach(|| self.inner.len())? {
            return Ok(rows as usize);
        }
        Ok(self.random_access(py)?.len() as usize)
    }

    /// The sample at `index` (negative counts from the end) as a dict; for a slice,
    /// the samples as one dict of lists, as in Hugging Face `datasets`.
    /// `ds[i]`: one sample (a dict); `ds[i:j]`, `ds[[i, j, ...]]` (a list or numpy
    /// array of row numbers) or `ds[mask]` (a boolean list or array, one per row): a
    /// dict of columns (lists); `ds["column"]`: that column of every row, as a list (as
    /// `datasets` gives a column).
    fn __getitem__<'py>(
        slf: &Bound<'py, Self>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Ok(name) = index.extract::<String>() {
            return this.column_values(py, &name);
        }
        let rows: Vec<i64> = if let Ok(slice) = index.cast::<pyo3::types::PySlice>() {
            let len = this.random_access(py)?.len() as isize;
            let picked = slice.indices(len)?;
            (0..picked.slicelength)
                .map(|k| (picked.start + k as isize * picked.step) as i64)
                .collect()
        } else if let Ok(one) = index.extract::<i64>() {
            let mut rows = this.__getitems__(py, vec![one])?;
            return rows.pop().map(Bound::into_any).ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!("no sample at index {one}"))
            });
        } else if let Ok(mask) = index.extract::<Vec<bool>>() {
            let len = this.random_access(py)?.len();
            if mask.len() as u64 != len {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "a boolean mask of {} values for {len} rows",
                    mask.len()
                )));
            }
            (0..mask.len() as i64)
                .filter(|&i| mask[i as usize])
                .collect()
        } else {
            index.extract::<Vec<i64>>().map_err(|_| {
                PyTypeError::new_err(
                    "a dataset is indexed by a row number, a slice, a list of row numbers, a boolean mask or a column name",
                )
            })?
        };
        let access = this.random_access(py)?;
        let rows = in_range(rows, access.len())?;
        let batch = py.detach(|| access.rows(&rows))?;
        Ok(super::to_python::batch_to_pydict(py, &batch)?.into_any())
    }

    /// Every row as a `pyarrow.Table`, in the order iteration yields them (in the
    /// dataset's current epoch). `to_list`, `to_dict` and `to_pandas` read it.
    fn to_arrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let pa = py.import("pyarrow").map_err(|_| {
            pyo3::exceptions::PyImportError::new_err(
                "to_arrow, to_list, to_dict and to_pandas need pyarrow: pip install 'shardflow[arrow]'",
            )
        })?;
        // Read here, not through `__arrow_c_stream__`: pyarrow pulls a stream with the
        // GIL released, which a stream made inside this call could not take back.
        let batch = super::batch::PyRecordBatch {
            batch: slf.get().all_rows(py)?,
        };
        let batch = pa.getattr("record_batch")?.call1((batch,))?;
        pa.getattr("Table")?
            .call_method1("from_batches", (PyList::new(py, [batch])?,))
    }

    /// Every row as a dict of plain Python values, as `datasets`' `to_list`.
    fn to_list<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::to_arrow(slf)?.call_method0("to_pylist")
    }

    /// Every column as a list of plain Python values, as `datasets`' `to_dict`.
    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::to_arrow(slf)?.call_method0("to_pydict")
    }

    /// The rows sorted by `column_names` (a name, or a list: by the first, then the
    /// next...), ascending unless `reverse` (one flag, or one per column); nulls last
    /// (`null_placement="at_start"` puts them first), ties in their order. As
    /// `datasets`' `sort`: the keys are read once and the rows then selected in order.
    #[pyo3(signature = (column_names, reverse=None, null_placement="at_end"))]
    fn sort(
        &self,
        py: Python<'_>,
        column_names: &Bound<'_, PyAny>,
        reverse: Option<&Bound<'_, PyAny>>,
        null_placement: &str,
    ) -> PyResult<PyDataset> {
        let names = name_list(column_names)?;
        let descending: Vec<bool> = match reverse {
            None => vec![false; names.len()],
            Some(r) if r.extract::<bool>().is_ok() => vec![r.extract()?; names.len()],
            Some(r) => r.extract()?,
        };
        if descending.len() != names.len() {
            return Err(PyValueError::new_err(format!(
                "reverse= has {} flags for {} columns",
                descending.len(),
                names.len()
            )));
        }
        let nulls_first = match null_placement {
            "at_end" | "last" => false,
            "at_start" | "first" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "null_placement must be \"at_end\" or \"at_start\", not {other:?}"
                )));
            }
        };
        let keys = self
            .select_columns(py, &PyList::new(py, &names)?.into_any())?
            .all_rows(py)?;
        let columns: Vec<arrow_ord::sort::SortColumn> = names
            .iter()
            .zip(&descending)
            .map(|(name, &descending)| {
                let values = keys.column_by_name(name).ok_or_else(|| {
                    PyValueError::new_err(format!("sort: no column {name:?} was read"))
                })?;
                Ok(arrow_ord::sort::SortColumn {
                    values: values.clone(),
                    options: Some(arrow_ord::sort::SortOptions {
                        descending,
                        nulls_first,
                    }),
                })
            })
            .collect::<PyResult<_>>()?;
        let order = arrow_ord::sort::lexsort_to_indices(&columns, None)
            .map_err(|e| crate::error::Error::Internal(format!("sorting: {e}")))?;
        let rows: Vec<u64> = order.values().iter().map(|&i| u64::from(i)).collect();
        let args = PyDict::new(py);
        args.set_item("column_names", column_names)?;
        args.set_item("reverse", reverse)?;
        args.set_item("null_placement", null_placement)?;
        let inner = self.inner.with_op(Op::Select(Indices::list(rows)));
        Ok(self.derived(inner, "sort", args.into_any()))
    }

    /// The distinct values of `column`, in the order they first come (as `datasets`'
    /// `unique`).
    fn unique<'py>(&self, py: Python<'py>, column: String) -> PyResult<Bound<'py, PyAny>> {
        let values = self.column_values(py, &column)?;
        let distinct = PyDict::new(py);
        for value in values.try_iter()? {
            let value = value?;
            // Lists and dicts are not hashable: keyed by their repr, kept as they are.
            let key = match value.hash() {
                Ok(_) => value.clone(),
                Err(_) => value.repr()?.into_any(),
            };
            if !distinct.contains(&key)? {
                distinct.set_item(key, value)?;
            }
        }
        Ok(distinct.values().into_any())
    }

    /// Every row as a pandas DataFrame (needs pandas and pyarrow).
    fn to_pandas<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::to_arrow(slf)?.call_method0("to_pandas")
    }

    /// The samples at `indices`, reading each needed part of the data once (PyTorch's
    /// DataLoader calls this with a whole batch of sampler indices).
    fn __getitems__<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<i64>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let access = self.random_access(py)?;
        let indices = in_range(indices, access.len())?;
        let batch = py.detach(|| access.rows(&indices))?;
        batch_to_rows(py, &batch)
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<SampleIterator> {
        Ok(SampleIterator {
            receiver: Some(self.start(py)?),
            rows: VecDeque::new(),
        })
    }

    /// How `parallelism` readers would divide an epoch (at most one per work unit): for
    /// each, its rows, the files it opens and the bytes it reads of them (None where not
    /// known). What `shardflow.ray` makes its read tasks from.
    fn _read_plan<'py>(
        &self,
        py: Python<'py>,
        parallelism: usize,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let plans = py.detach(|| self.inner.read_plan(parallelism.max(1)))?;
        plans
            .into_iter()
            .map(|plan| {
                let d = PyDict::new(py);
                d.set_item("rows", plan.rows)?;
                d.set_item("files", plan.files)?;
                d.set_item("bytes", plan.bytes)?;
                Ok(d)
            })
            .collect()
    }

    /// This dataset as a `ray.data.Dataset` (see `shardflow.ray`).
    #[pyo3(signature = (**read_args))]
    fn to_ray<'py>(
        slf: &Bound<'py, Self>,
        read_args: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("shardflow.ray")?
            .getattr("from_dataset")?
            .call((slf,), read_args)
    }

    /// Writes the rows, in this dataset's order, as shards of `format` under `dest` (a
    /// directory or an `s3://`, `gs://` or `az://` prefix), with a manifest that `shardflow.dataset(dest)`
    /// reads; returns the manifest as a dict. Shards are encoded as streams, so memory
    /// does not grow with their size: `memory_limit` (default 512 MiB) bounds the rows
    /// held, and each of the `num_threads` writers adds at most a Parquet row group
    /// (32 MiB) or, on an object store, five 16 MiB upload parts (two on GCS, whose
    /// resumable uploads take parts in order). NPZ keeps a shard's rows until it ends,
    /// so its shards are cut to fit the writers' half of `memory_limit`.
    #[pyo3(signature = (dest, format="parquet", *, max_rows_per_shard=None, max_bytes_per_shard=None, compression=None, overwrite=false, storage_options=None, num_threads=None, memory_limit=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn write<'py>(
        &self,
        py: Python<'py>,
        dest: &Bound<'py, PyAny>,
        format: &str,
        max_rows_per_shard: Option<i64>,
        max_bytes_per_shard: Option<i64>,
        compression: Option<&str>,
        overwrite: bool,
        storage_options: Option<&Bound<'py, PyDict>>,
        num_threads: Option<usize>,
        memory_limit: Option<i64>,
        progress: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dest = source_list(dest)?;
        let [dest] = dest.as_slice() else {
            return Err(PyTypeError::new_err("dest must be one path or URL"));
        };
        let positive = |name: &str, n: Option<i64>| -> PyResult<Option<u64>> {
            n.map(|n| match u64::try_from(n) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(PyValueError::new_err(format!(
                    "{name} must be >= 1, got {n}"
                ))),
            })
            .transpose()
        };
        if let Some(progress) = &progress {
            check_callable(progress)?;
        }
        let options = WriteOptions {
            format: ShardFormat::parse(format, compression)?,
            max_rows_per_shard: positive("max_rows_per_shard", max_rows_per_shard)?,
            max_bytes_per_shard: positive("max_bytes_per_shard", max_bytes_per_shard)?,
            overwrite,
            threads: match num_threads {
                Some(0) => return Err(PyValueError::new_err("num_threads must be >= 1")),
                Some(n) => n,
                None => pipeline::default_num_threads(),
            },
            memory_limit: positive("memory_limit", memory_limit)?
                .unwrap_or(pipeline::DEFAULT_MEMORY_LIMIT),
            // The features as `datasets` stores them, for the formats that keep them.
            huggingface: match format {
                "parquet" => Some(
                    py.import("shardflow.features")?
                        .call_method1(
                            "_stored_json",
                            (self.features(py)?, self.schema(py)?.storage()),
                        )?
                        .extract()?,
                ),
                _ => None,
            },
        };
        let storage = match (storage_options, self.inner.storage()) {
            (Some(given), _) => Storage::new(StorageOptions::parse(&parse_options(given)?)?)?,
            (None, Some(storage)) => storage,
            (None, None) => Storage::new(StorageOptions::default())?,
        };
        let epoch = self.current_epoch();
        let progress = progress.map(Bound::unbind);
        // Called on this thread between batches: it takes the GIL back for the user's
        // callback and for Ctrl-C.
        let mut report = |rows: u64, bytes: u64| -> crate::error::Result<()> {
            Python::attach(|py| {
                py.check_signals()?;
                if let Some(progress) = &progress {
                    progress.call1(py, (rows, bytes))?;
                }
                Ok::<_, PyErr>(())
            })
            .map_err(callback_error)
        };
        let manifest = py.detach(|| {
            crate::write::write(&self.inner, epoch, dest, &storage, &options, &mut report)
        })?;
        let text = serde_json::to_string(&manifest.to_json())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Each shard's URL, size in bytes and rows, where known without reading data
    /// (Parquet footers, a write manifest); for `shardflow inspect`.
    fn _shard_table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let rows = py.detach(|| self.inner.shard_rows())?;
        let table = PyList::empty(py);
        for (shard, rows) in self.inner.shards().iter().zip(rows) {
            let entry = PyDict::new(py);
            entry.set_item("url", crate::source::redact(&shard.url))?;
            entry.set_item("bytes", shard.size)?;
            entry.set_item("rows", rows)?;
            table.append(entry)?;
        }
        Ok(table)
    }

    /// The shard files, in read order before shuffling.
    #[getter]
    fn shards(&self) -> Vec<String> {
        self.inner.shards().iter().map(|s| s.url.clone()).collect()
    }

    #[getter]
    fn format(&self) -> &'static str {
        self.inner.format_name()
    }

    /// Whether reading it runs Python code (a map, filter or flat_map, here or in a
    /// dataset it combines).
    fn _runs_python(&self) -> bool {
        self.inner.runs_python()
    }

    /// Column names of the records this dataset yields (after its maps, which may read
    /// a first batch to see them).
    #[getter]
    fn column_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let schema = py.detach(|| self.inner.schema())?;
        Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
    }

    /// Each column's type as frameworks see it, for building tensor specs: a list of
    /// dicts with `name`, `dtype` (a numpy dtype name, "string", "bytes" or "object"),
    /// `shape` (per sample; None for a ragged axis) and, for structs, `fields`.
    fn _column_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let schema = if self.inner.keeps_source_schema() {
            py.detach(|| self.inner.source_schema())?
        } else {
            // User functions decide the columns: look at the first batch they make.
            let mut receiver = self.start(py)?;
            match next_batch(py, &mut receiver)? {
                Some(batch) => batch.schema(),
                None => return Ok(PyList::empty(py)),
            }
        };
        column_types(py, schema.fields())
    }

    /// One pass over the records as an Arrow stream (e.g. `pyarrow.RecordBatchReader.from_stream(ds)`).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The protocol lets a producer ignore the request; consumers cast.
        let _ = requested_schema;
        let fallback = if self.inner.keeps_source_schema() {
            Some(py.detach(|| self.inner.source_schema())?)
        } else {
            None
        };
        stream_capsule(py, self.start(py)?, fallback)
    }

    fn __repr__(&self) -> String {
        let ops: Vec<String> = self
            .inner
            .ops()
            .iter()
            .map(|op| format!("{op:?}"))
            .collect();
        let repr = format!(
            "shardflow.Dataset(format={}, shards={}, ops=[{}])",
            self.inner.format_name(),
            self.inner.shards().len(),
            ops.join(", ")
        );
        crate::source::redact(&repr).into_owned()
    }
}

/// Column names from one name or a list of them.
/// `indices` as row numbers of `len` rows, negative ones counted from the end.
fn in_range(indices: Vec<i64>, len: u64) -> PyResult<Vec<u64>> {
    let len = len as i64;
    indices
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + len } else { i };
            if (0..len).contains(&j) {
                Ok(j as u64)
            } else {
                Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "index {i} is out of range for {len} samples"
                )))
            }
        })
        .collect()
}

/// How a batched function is fed: `None` for a function of one row, else its rows per
/// call and what its batch holds.
fn batching(
    batched: bool,
    batch_size: Option<usize>,
    batch_format: &str,
) -> PyResult<Option<(usize, Columns)>> {
    let columns = match batch_format {
        "python" => Columns::Lists,
        "numpy" => Columns::Numpy,
        other => {
            return Err(PyValueError::new_err(format!(
                "batch_format is \"python\" (lists, as datasets gives them) or \"numpy\", not {other:?}"
            )));
        }
    };
    match (batched, batch_size) {
        (false, None) if columns == Columns::Lists => Ok(None),
        (false, None) => Err(PyValueError::new_err(
            "batch_format= is only used with batched=True",
        )),
        (false, Some(_)) => Err(PyValueError::new_err(
            "batch_size= is only used with batched=True",
        )),
        (true, Some(0)) => Err(PyValueError::new_err("batch_size must be at least 1")),
        (true, rows) => Ok(Some((rows.unwrap_or(DEFAULT_MAP_BATCH), columns))),
    }
}

/// The arguments `map` and `filter` share.
struct FunctionArgs<'a, 'py> {
    function: &'a Bound<'py, PyAny>,
    batched: bool,
    batch_size: Option<usize>,
    with_indices: bool,
    input_columns: Option<&'a Bound<'py, PyAny>>,
    fn_kwargs: Option<&'a Bound<'py, PyDict>>,
    batch_format: &'a str,
}

impl<'py> FunctionArgs<'_, 'py> {
    /// Records them in `args` (the verb's recipe step), and gives the function as the
    /// verb calls it (see `calling`).
    fn recorded(&self, args: &Bound<'py, PyDict>) -> PyResult<Option<Bound<'py, PyAny>>> {
        args.set_item("function", self.function)?;
        args.set_item("batched", self.batched)?;
        args.set_item("batch_size", self.batch_size)?;
        args.set_item("with_indices", self.with_indices)?;
        args.set_item("input_columns", self.input_columns)?;
        args.set_item("fn_kwargs", self.fn_kwargs)?;
        args.set_item("batch_format", self.batch_format)?;
        calling(self.function, self.input_columns, self.fn_kwargs)
    }
}

/// `function` as `map`/`filter` call it: wrapped to take `input_columns` (a name or a
/// list) and `fn_kwargs` when either is given.
fn calling<'py>(
    function: &Bound<'py, PyAny>,
    input_columns: Option<&Bound<'py, PyAny>>,
    fn_kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let columns = input_columns
        .filter(|c| !c.is_none())
        .map(name_list)
        .transpose()?;
    let kwargs = fn_kwargs.filter(|k| !k.is_empty());
    if columns.is_none() && kwargs.is_none() {
        return Ok(None);
    }
    let call = function.py().import("shardflow._calls")?.getattr("Call")?;
    Ok(Some(call.call1((function, columns, kwargs))?))
}

/// Yields one dict per sample.
#[pyclass(name = "SampleIterator", module = "shardflow")]
pub struct SampleIterator {
    receiver: Option<BatchReceiver>,
    rows: VecDeque<Py<PyDict>>,
}

#[pymethods]
impl SampleIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyDict>>> {
        loop {
            if let Some(row) = self.rows.pop_front() {
                return Ok(Some(row));
            }
            let Some(receiver) = self.receiver.as_mut() else {
                return Ok(None);
            };
            let batch: Option<RecordBatch> =
                next_batch(py, receiver).inspect_err(|_| self.receiver = None)?;
            match batch {
                Some(batch) => self
                    .rows
                    .extend(batch_to_rows(py, &batch)?.into_iter().map(Bound::unbind)),
                None => self.receiver = None,
            }
        }
    }
}
