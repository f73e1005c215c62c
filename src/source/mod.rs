//! WHERE bytes come from: resolving user paths/URLs/patterns to a stable shard list,
//! and reading those shards whole, by range, or as a stream.

pub mod cache;
mod hf;
mod http;
mod local;
pub mod manifest;
pub mod pattern;
pub mod ranges;
mod redact;
pub mod remote;
pub mod retry;
pub mod runtime;
pub mod s3;
mod sigv4;
pub mod storage;

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
pub use redact::redact;
pub use runtime::runtime;
pub use storage::{Storage, StorageOptions};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One readable object: a local file, an S3 object or an HTTP(S) resource.
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
    /// Whether reads cross a network (so many should be in flight at once).
    fn is_remote(&self) -> bool {
        false
    }
    /// Reads exactly `range`, waiting on the calling thread: through the I/O runtime,
    /// or directly where that is cheaper (local files: a small file then costs no
    /// thread hand-off).
    fn read_range_blocking(&self, range: Range<u64>) -> Result<Bytes> {
        runtime::block_on_outside(runtime()?, self.read_range(range))?
    }
    /// [`Self::read_range_blocking`], appending the bytes to `out` (a local file reads
    /// them there, with no buffer between).
    fn read_into_blocking(&self, range: Range<u64>, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&self.read_range_blocking(range)?);
        Ok(())
    }
}

/// Reads `ranges` of `source` one after another on the calling thread (a decode thread,
/// or a random-access reader); `size` is the source's, when the listing knew it.
pub fn read_ranges_blocking(
    source: &dyn Source,
    size: Option<u64>,
    ranges: Vec<Range<u64>>,
) -> Result<ranges::RangeSet> {
    let size = match size {
        Some(size) => size,
        None => runtime::block_on_outside(runtime()?, source.size())??,
    };
    let mut set = ranges::RangeSet::new(size);
    for range in ranges {
        let start = range.start;
        set.insert(start, source.read_range_blocking(range)?);
    }
    Ok(set)
}

/// I/O counters shared by every source a loader opens.
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Bytes handed to decoders (from disk, the network or the cache).
    pub bytes_read: AtomicU64,
    pub files_opened: AtomicU64,
    /// Remote requests made, retries among them, and the bytes they brought.
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
}

impl IoCounters {
    pub fn add_bytes(&self, n: u64) {
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_file(&self) {
        self.files_opened.fetch_add(1, Ordering::Relaxed);
    }
}

/// A shard as listed: its URL and, where the listing told us, its size and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMeta {
    pub url: String,
    pub size: Option<u64>,
    pub etag: Option<String>,
    /// Rows in the shard, where a manifest written with it says so.
    pub rows: Option<u64>,
}

/// What opening a shard needs: the dataset's storage and the counters to charge.
#[derive(Clone)]
pub struct Io {
    pub storage: Arc<Storage>,
    pub counters: Arc<IoCounters>,
}

impl Io {
    pub fn open(&self, shard: &ShardMeta) -> Result<Arc<dyn Source>> {
        open(shard, &self.storage, self.counters.clone())
    }
}

/// Turns user input (paths, `file://`/`s3://`/`hf://`/`http(s)://` URLs, globs, brace ranges,
/// directories and prefixes) into the shard list. Each pattern's matches are sorted; the
/// order of the patterns is kept.
pub fn resolve(specs: &[String], storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
    if specs.is_empty() {
        return Err(Error::invalid_argument("no source given"));
    }
    let mut shards = Vec::new();
    for spec in specs {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(Error::invalid_argument("empty source path"));
        }
        for expanded in pattern::expand_braces(spec)? {
            match scheme(&expanded) {
                Scheme::Local(path) => shards.extend(local::list(path)?),
                Scheme::S3 => shards.extend(s3::list(&expanded, storage)?),
                Scheme::Hub => shards.extend(hf::list(&expanded, storage)?),
                Scheme::Http => {
                    if expanded.contains('*') {
                        return Err(Error::invalid_argument(format!(
                            "{expanded}: HTTP servers cannot be listed; name the files (brace ranges like {{000..099}} work)"
                        )));
                    }
                    shards.push(ShardMeta {
                        url: expanded.clone(),
                        size: None,
                        etag: None,
                        rows: None,
                    });
                }
                Scheme::Unsupported(name) => {
                    return Err(Error::invalid_argument(format!(
                        "{spec}: {name}:// sources are not supported (use a path, s3://, hf:// or http(s)://)"
                    )));
                }
            }
        }
    }
    Ok(shards)
}

/// Opens one shard for reading.
pub fn open(
    shard: &ShardMeta,
    storage: &Arc<Storage>,
    counters: Arc<IoCounters>,
) -> Result<Arc<dyn Source>> {
    let url = shard.url.as_str();
    let info = shard.size.map(|size| remote::ObjectInfo {
        size,
        etag: shard.etag.clone(),
    });
    let backend: Box<dyn remote::Backend> = match scheme(url) {
        Scheme::Local(path) => return Ok(Arc::new(LocalSource::new(path, counters))),
        Scheme::S3 => Box::new(s3::S3Backend::new(url, storage)?),
        Scheme::Http => Box::new(http::HttpBackend::new(url, storage)?),
        Scheme::Hub => Box::new(hf::backend(url, storage)?),
        Scheme::Unsupported(name) => {
            return Err(Error::invalid_argument(format!(
                "{url}: {name}:// sources are not supported"
            )));
        }
    };
    counters.add_file();
    Ok(Arc::new(remote::RemoteSource::new(
        url.to_string(),
        backend,
        info,
        storage.clone(),
        counters,
    )))
}

/// The path of a local file (a plain path or a `file://` URL); `None` for remote URLs.
pub fn local_path(url: &str) -> Option<&str> {
    match scheme(url) {
        Scheme::Local(path) => Some(path),
        _ => None,
    }
}

/// `source`'s size: the listing's, when it had one, else asked for (a HEAD for remote
/// objects), waiting on the calling thread.
pub fn size_blocking(source: &dyn Source, listed: Option<u64>) -> Result<u64> {
    match listed {
        Some(size) => Ok(size),
        None => runtime::block_on_outside(runtime()?, source.size())?,
    }
}

enum Scheme<'a> {
    Local(&'a str),
    S3,
    Http,
    /// A Hugging Face Hub dataset repo.
    Hub,
    Unsupported(&'a str),
}

fn scheme(spec: &str) -> Scheme<'_> {
    if let Some(path) = spec.strip_prefix("file://") {
        return Scheme::Local(path);
    }
    match spec.split_once("://") {
        Some(("s3", _)) => Scheme::S3,
        Some(("http" | "https", _)) => Scheme::Http,
        Some(("hf", _)) => Scheme::Hub,
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
