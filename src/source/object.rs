//! What every backend shares: [`Source`], one readable object (size, range reads, a
//! stream); [`ShardMeta`], a shard as listed; the I/O counters a loader charges; and the
//! blocking helpers the decoders read through.

use std::fmt::Debug;
use std::future::Future;
use std::io::Read;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::ranges;
use super::runtime::{self, runtime};
use crate::error::Result;

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
    /// Requests the store answered with 429/503 and a wait (counted in `retries` too).
    pub throttled: AtomicU64,
    /// The requests of each URL scheme (`s3`, `https`, `hf`, ...), for the input-bound
    /// report.
    schemes: std::sync::Mutex<Vec<(String, Arc<SchemeIo>)>>,
    /// The loader's timeline, when it keeps one: each request is an async span there.
    pub trace: std::sync::OnceLock<Arc<crate::trace::Trace>>,
}

impl IoCounters {
    pub fn add_bytes(&self, n: u64) {
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_file(&self) {
        self.files_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters of `url`'s scheme (made on first use).
    pub fn scheme_of(&self, url: &str) -> Arc<SchemeIo> {
        let scheme = url.split_once("://").map_or("file", |(scheme, _)| scheme);
        let mut schemes = self.schemes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, io)) = schemes.iter().find(|(s, _)| s == scheme) {
            return io.clone();
        }
        let io = Arc::new(SchemeIo::default());
        schemes.push((scheme.to_string(), io.clone()));
        io
    }

    /// Each scheme's counters so far.
    pub fn schemes(&self) -> Vec<(String, SchemeSnapshot)> {
        let schemes = self.schemes.lock().unwrap_or_else(|p| p.into_inner());
        schemes
            .iter()
            .map(|(s, io)| (s.clone(), io.snapshot()))
            .collect()
    }
}

/// Remote requests of one URL scheme: each one's time (from being sent to its body
/// read, or its failure), the retries and throttled answers among them, and the bytes
/// they brought.
#[derive(Debug, Default)]
pub struct SchemeIo {
    pub latency: crate::latency::Histogram,
    pub retries: AtomicU64,
    pub throttled: AtomicU64,
    pub bytes: AtomicU64,
}

impl SchemeIo {
    fn snapshot(&self) -> SchemeSnapshot {
        SchemeSnapshot {
            latency: self.latency.snapshot(),
            retries: self.retries.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// A scheme's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemeSnapshot {
    pub latency: crate::latency::HistogramSnapshot,
    pub retries: u64,
    pub throttled: u64,
    pub bytes: u64,
}

impl SchemeSnapshot {
    /// What happened after `earlier` (a snapshot of the same scheme's counters).
    pub fn since(&self, earlier: &SchemeSnapshot) -> SchemeSnapshot {
        SchemeSnapshot {
            latency: self.latency.since(&earlier.latency),
            retries: self.retries.saturating_sub(earlier.retries),
            throttled: self.throttled.saturating_sub(earlier.throttled),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
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

/// `source`'s size: the listing's, when it had one, else asked for (a HEAD for remote
/// objects), waiting on the calling thread.
pub fn size_blocking(source: &dyn Source, listed: Option<u64>) -> Result<u64> {
    match listed {
        Some(size) => Ok(size),
        None => runtime::block_on_outside(runtime()?, source.size())?,
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
