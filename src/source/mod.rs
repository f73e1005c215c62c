//! WHERE bytes come from: resolving user paths/URLs/patterns to a stable shard list,
//! and reading those shards whole, by range, or as a stream.

mod local;
pub mod pattern;
pub mod ranges;
mod runtime;

use std::fmt::Debug;
use std::future::Future;
use std::io::Read;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::error::{Error, Result};
pub use local::LocalSource;
pub use runtime::runtime;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One readable object: a local file (or, later, an S3 object or HTTP resource).
///
/// Random access is async so that many requests can be in flight on the shared
/// runtime; the streaming reader is blocking and is used from blocking threads.
pub trait Source: Send + Sync + Debug {
    /// The path or URL as the user should see it in messages.
    fn url(&self) -> &str;
    fn size(&self) -> BoxFuture<'_, Result<u64>>;
    /// Reads exactly `range`; a short object is an error naming the offset.
    fn read_range(&self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>>;
    /// A reader over the whole object from its first byte.
    fn open_stream(&self) -> Result<Box<dyn Read + Send>>;
}

/// I/O counters shared by every source a loader opens.
#[derive(Debug, Default)]
pub struct IoCounters {
    pub bytes_read: AtomicU64,
    pub files_opened: AtomicU64,
}

impl IoCounters {
    pub fn add_bytes(&self, n: u64) {
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_file(&self) {
        self.files_opened.fetch_add(1, Ordering::Relaxed);
    }
}

/// A shard as listed: its URL and, where the listing told us, its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMeta {
    pub url: String,
    pub size: Option<u64>,
}

/// Turns user input (paths, `file://` URLs, globs, brace ranges, directories) into the
/// shard list. Each pattern's matches are sorted; the order of the patterns is kept.
pub fn resolve(specs: &[String]) -> Result<Vec<ShardMeta>> {
    if specs.is_empty() {
        return Err(Error::invalid_argument("no source given"));
    }
    let mut shards = Vec::new();
    for spec in specs {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(Error::invalid_argument("empty source path"));
        }
        match scheme(spec) {
            Scheme::Local(path) => {
                for expanded in pattern::expand_braces(path)? {
                    shards.extend(local::list(&expanded)?);
                }
            }
            Scheme::Unsupported(name) => {
                return Err(Error::invalid_argument(format!(
                    "{spec}: {name} sources are not supported by this build of shardflow"
                )));
            }
        }
    }
    Ok(shards)
}

/// Opens one shard for reading.
pub fn open(url: &str, counters: Arc<IoCounters>) -> Result<Arc<dyn Source>> {
    match scheme(url) {
        Scheme::Local(path) => Ok(Arc::new(LocalSource::new(path, counters))),
        Scheme::Unsupported(name) => Err(Error::invalid_argument(format!(
            "{url}: {name} sources are not supported by this build of shardflow"
        ))),
    }
}

enum Scheme<'a> {
    Local(&'a str),
    Unsupported(&'a str),
}

fn scheme(spec: &str) -> Scheme<'_> {
    if let Some(path) = spec.strip_prefix("file://") {
        return Scheme::Local(path);
    }
    match spec.split_once("://") {
        Some((name, _)) if !name.contains('/') => Scheme::Unsupported(name),
        _ => Scheme::Local(spec),
    }
}

/// Reads a whole stream while counting the bytes that pass.
pub(crate) struct CountingReader<R> {
    inner: R,
    counters: Arc<IoCounters>,
}

impl<R> CountingReader<R> {
    pub(crate) fn new(inner: R, counters: Arc<IoCounters>) -> Self {
        Self { inner, counters }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counters.add_bytes(n as u64);
        Ok(n)
    }
}
