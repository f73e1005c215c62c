//! WHERE bytes come from: resolving user paths/URLs/patterns to a stable shard list,
//! and reading those shards whole, by range, or as a stream.
//!
//! - `object`: what every backend shares: [`Source`] (one readable object), [`ShardMeta`]
//!   (a shard as listed), the I/O counters, blocking read helpers.
//! - `backend`: the `Backend` trait, one kind of storage (list, open, write).
//! - `schemes`: the table of backends by URL scheme; [`resolve`], [`open`], [`local_path`].
//! - Backends, each importing no other: `local` (files), [`s3`] (with `sigv4`, its
//!   signer), `gcs` (`gs://`), `azure` (`az://`, `abfs[s]://`, Azure's `https://`),
//!   `http` (plain `http(s)://` URLs), `hf` (Hugging Face Hub dataset repos).
//! - `listing`: what the object stores share in listing a spec (one object, or the
//!   keys below a prefix or matching a glob).
//! - [`upload`]: what a backend that can be written to provides the writer (objects
//!   under a prefix, uploads in parts).
//! - [`remote`]: a remote object read with retries, resumed bodies, parallel ranges,
//!   read-ahead and the disk cache, over a backend's [`remote::ObjectRequests`].
//! - `transport`: the one HTTP transport: client, refusals, range responses, and
//!   `HttpObject`, one object read with range GETs.
//! - [`storage`]: `storage_options` and the per-dataset state (request limit, cache,
//!   per-process clients).
//! - [`retry`], [`runtime`](mod@runtime) (the I/O runtime), [`cache`] (the disk cache),
//!   [`ranges`] (fetched byte ranges), [`pattern`] (globs, brace ranges), [`manifest`] (a
//!   written dataset's shard list), `redact` (credentials out of URLs in messages).

mod azure;
mod backend;
pub mod cache;
mod gcs;
mod hf;
mod http;
mod listing;
mod local;
pub mod manifest;
mod object;
pub mod pattern;
pub mod ranges;
mod redact;
pub mod remote;
pub mod retry;
pub mod runtime;
pub mod s3;
mod schemes;
mod sigv4;
pub mod storage;
mod transport;
pub mod upload;

pub use local::LocalSource;
pub use object::{
    BoxFuture, IoCounters, SchemeSnapshot, ShardMeta, Source, read_ranges_blocking, size_blocking,
};
pub use redact::redact;
pub use runtime::runtime;
pub use schemes::{Io, is_object_store, local_path, open, read_whole, resolve, writer};
pub use sigv4::civil_from_days;
pub use storage::{Storage, StorageOptions};
