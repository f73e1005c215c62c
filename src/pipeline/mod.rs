//! WHAT order and shape records arrive in. Files by job:
//!
//! - `dataset`: what a dataset is (its origin and ops) and the verbs that build one;
//! - `plan`: how an epoch divides it between ranks and workers (head, split, shares,
//!   padding, row counts, equal ranks behind a filter or flat_map), in the terms of the
//!   executable model in `tests/model`;
//! - `combine`: datasets read as one (`concatenate`, `interleave`): how their parts are
//!   divided, chained and mixed;
//! - `run`: reading an epoch as a stream of stages on the pipeline thread, the schema
//!   seen on the first batch, and random access with ops read into memory;
//! - the stages `run` builds: `decode` (decode tasks on the pool), `ops` (take, skip,
//!   transforms, dealing, padding), `shuffle` (the buffer), `batch` (re-batching),
//!   `assemble` and `own_thread` (the batch threads and a stage's own thread),
//!   `prefetch` (the bounded queue to the consumer), `autotune` (their depths);
//! - `random_access` (rows by index), `index_stream` (a head read by index) and `spill`
//!   (its external two-pass shuffle), `rows` (row positions, shares), `rng` (seeded
//!   draws), `stream` (the batch stream and schemas shared across datasets), `stats`.

mod assemble;
mod autotune;
mod batch;
mod combine;
mod dataset;
mod decode;
mod index_stream;
pub mod ops;
mod own_thread;
mod plan;
mod pool;
mod prefetch;
mod random_access;
pub mod report;
pub mod rng;
pub mod rows;
mod run;
mod shuffle;
mod spill;
pub mod stage_times;
pub mod stats;
mod stream;

pub use autotune::{DEFAULT_MEMORY_LIMIT, SpillOptions, Tuning, default_num_threads};
pub use batch::Rebatch;
pub use dataset::{Combined, DataSource, Dataset, Mix, Stopping};
pub use ops::{BatchTransform, Batches, BufferBounds, Columns, Draws, Indices, Op, Weights};
pub use plan::{PartPlan, ROWS_SPLIT_NOT_ELASTIC, RunOptions};
pub use prefetch::{BatchReceiver, Received};
pub use random_access::RandomAccess;
pub use rows::{RowList, RowSet, Share};
pub use shuffle::DEFAULT_SHUFFLE_BUFFER;
pub use stats::{ReadPlan, Stats, StatsSnapshot};
pub use stream::{
    BatchIter, conform, interleave_rows, interleave_viewing, unify_schemas, unviewed,
};
