//! A remote object read over HTTP requests, whatever the protocol (S3, plain HTTP):
//! - every request waits for a slot of the dataset's request limit;
//! - failed requests are retried with backoff; a body that breaks off is resumed from
//!   the last byte received with a Range request, so nothing is lost or read twice;
//! - large reads become parallel range requests of `chunk_size`;
//! - streams read ahead several chunks at once;
//! - ranges of objects with an ETag go through the disk cache, when there is one, and
//!   every request pins the ETag (`If-Match`) so a changed object cannot mix versions.

use std::io::Read;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::cache::DiskCache;
use super::object::{BoxFuture, IoCounters, ShardMeta, Source};
use super::retry::Failure;
use super::runtime::runtime;
use super::storage::Storage;
use crate::error::{Error, Position, Result};

/// Size and version of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    pub etag: Option<String>,
}

/// What to GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Range(Range<u64>),
}

impl Request {
    /// The HTTP `Range` header value asking for it.
    pub fn range_header(&self) -> String {
        match self {
            Request::Range(r) => format!("bytes={}-{}", r.start, r.end.saturating_sub(1)),
        }
    }
}

/// A response body, read part by part.
pub trait Body: Send {
    fn next(&mut self) -> BoxFuture<'_, Option<std::result::Result<Bytes, String>>>;
}

pub struct Response {
    pub body: Box<dyn Body>,
    /// The object's size, where the reply says it (Content-Range).
    pub object_size: Option<u64>,
}

/// One object's requests, as its protocol makes them (S3's, plain HTTP's).
pub trait ObjectRequests: Send + Sync + 'static {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>>;
    fn get(
        &self,
        request: Request,
        if_match: Option<String>,
    ) -> BoxFuture<'_, std::result::Result<Response, Failure>>;
}

/// Chunks a stream keeps in flight ahead of the reader.
const READ_AHEAD: usize = 4;

struct Inner {
    url: String,
    requests: Box<dyn ObjectRequests>,
    storage: Arc<Storage>,
    counters: Arc<IoCounters>,
    /// Where each request's time goes (the counters' histogram of this URL's scheme).
    scheme: Arc<super::object::SchemeIo>,
    /// Known from the listing, or learnt on first use.
    info: Mutex<Option<ObjectInfo>>,
}

#[derive(Clone)]
pub struct RemoteSource(Arc<Inner>);

impl std::fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteSource({})", self.0.url)
    }
}

impl RemoteSource {
    pub fn new(
        url: String,
        requests: Box<dyn ObjectRequests>,
        info: Option<ObjectInfo>,
        storage: Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Self {
        let scheme = counters.scheme_of(&url);
        Self(Arc::new(Inner {
            url,
            requests,
            storage,
            counters,
            scheme,
            info: Mutex::new(info),
        }))
    }
}

/// `shard`, read with `requests`: what its listing knew (size, ETag) is used, not asked
/// for again.
pub fn open_shard(
    shard: &ShardMeta,
    requests: Box<dyn ObjectRequests>,
    storage: &Arc<Storage>,
    counters: Arc<IoCounters>,
) -> Arc<dyn Source> {
    let info = shard.size.map(|size| ObjectInfo {
        size,
        etag: shard.etag.clone(),
    });
    counters.add_file();
    Arc::new(RemoteSource::new(
        shard.url.clone(),
        requests,
        info,
        storage.clone(),
        counters,
    ))
}

impl Inner {
    async fn info(self: &Arc<Self>) -> Result<ObjectInfo> {
        if let Some(info) = self.info.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(info);
        }
        let info = self
            .retrying(0, "HEAD", || async { self.requests.head().await })
            .await?;
        *self.info.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.clone());
        Ok(info)
    }

    /// Runs `attempt` until it succeeds, fails for good, or runs out of tries.
    async fn retrying<T, F, Fut>(&self, offset: u64, what: &str, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let policy = self.storage.options.retry;
        let mut tries = 0;
        loop {
            tries += 1;
            let outcome = {
                let _permit = self.storage.limit().acquire_owned().await;
                self.counters.requests.fetch_add(1, Relaxed);
                let sent = std::time::Instant::now();
                let outcome = tokio::time::timeout(self.storage.options.timeout, attempt()).await;
                self.done(what, sent);
                outcome
            };
            let mut asked = Duration::ZERO;
            let cause = match outcome {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(Failure::Permanent(e))) => return Err(e),
                Ok(Err(Failure::Transient(cause))) => cause,
                Ok(Err(Failure::Throttled(cause, wait))) => {
                    self.throttled();
                    asked = wait;
                    cause
                }
                Err(_) => format!("no response within {:?}", self.storage.options.timeout),
            };
            if tries >= policy.max_attempts {
                return Err(self.gave_up(offset, what, &cause, tries));
            }
            self.retried();
            tokio::time::sleep(policy.backoff(tries).max(asked)).await;
        }
    }

    /// The store asked us to slow down (counted in the loader's and the scheme's totals).
    fn throttled(&self) {
        self.counters.throttled.fetch_add(1, Relaxed);
        self.scheme.throttled.fetch_add(1, Relaxed);
    }

    /// A request is tried again.
    fn retried(&self) {
        self.counters.retries.fetch_add(1, Relaxed);
        self.scheme.retries.fetch_add(1, Relaxed);
    }

    /// A request sent at `sent` is done: its time goes to the scheme's latencies and,
    /// when the loader keeps a timeline, to it.
    fn done(&self, what: &str, sent: std::time::Instant) {
        self.scheme.latency.record(sent.elapsed());
        if let Some(trace) = self.counters.trace.get() {
            trace.request(format!("{what} {}", self.url), sent);
        }
    }

    fn gave_up(&self, offset: u64, what: &str, cause: &str, tries: u32) -> Error {
        Error::Io {
            url: self.url.clone(),
            position: Position::Byte(offset),
            source: std::io::Error::other(format!("{what} failed after {tries} attempts: {cause}")),
        }
    }

    /// Reads `range` exactly into `got` (emptied first); resumes a broken body where it
    /// stopped.
    async fn fetch(
        self: &Arc<Self>,
        range: Range<u64>,
        etag: Option<String>,
        mut got: Received,
    ) -> Result<Received> {
        let want = (range.end - range.start) as usize;
        got.clear(want);
        let policy = self.storage.options.retry;
        let timeout = self.storage.options.timeout;
        let mut tries = 0;
        while got.len() < want {
            tries += 1;
            let from = range.start + got.len() as u64;
            let before = got.len();
            let mut asked = Duration::ZERO;
            let cause = {
                let _permit = self.storage.limit().acquire_owned().await;
                self.counters.requests.fetch_add(1, Relaxed);
                let request = Request::Range(from..range.end);
                let sent = std::time::Instant::now();
                let cause =
                    match tokio::time::timeout(timeout, self.requests.get(request, etag.clone()))
                        .await
                    {
                        Err(_) => format!("no response within {timeout:?}"),
                        Ok(Err(Failure::Permanent(e))) => {
                            self.done("GET", sent);
                            return Err(e);
                        }
                        Ok(Err(Failure::Transient(cause))) => cause,
                        Ok(Err(Failure::Throttled(cause, wait))) => {
                            self.throttled();
                            asked = wait;
                            cause
                        }
                        Ok(Ok(mut response)) => {
                            read_body(&mut *response.body, &mut got, want, timeout).await
                        }
                    };
                self.done("GET", sent);
                cause
            };
            let received = got.len() - before;
            self.counters
                .bytes_fetched
                .fetch_add(received as u64, Relaxed);
            self.scheme.bytes.fetch_add(received as u64, Relaxed);
            if got.len() >= want {
                break;
            }
            // Every broken try counts (what it brought is kept), so a server that always
            // breaks off ends in an error, not in an endless trickle of resumed requests.
            if tries >= policy.max_attempts {
                return Err(self.gave_up(
                    from,
                    &format!("GET bytes={from}-{}", range.end - 1),
                    &cause,
                    tries,
                ));
            }
            self.retried();
            tokio::time::sleep(policy.backoff(tries.max(1)).max(asked)).await;
        }
        Ok(got)
    }

    /// `fetch` through the disk cache.
    async fn fetch_cached(
        self: &Arc<Self>,
        range: Range<u64>,
        etag: Option<String>,
        got: Received,
    ) -> Result<Received> {
        let cache_key = match (&self.storage.cache, &etag) {
            (Some(_), Some(etag)) => Some(DiskCache::key(&self.url, etag, &range)),
            _ => None,
        };
        if let Some(key) = &cache_key {
            let (this, key, len) = (self.clone(), key.clone(), range.end - range.start);
            let hit = tokio::task::spawn_blocking(move || {
                this.storage.cache.as_ref().and_then(|c| c.get(&key, len))
            })
            .await
            .ok()
            .flatten();
            if let Some(bytes) = hit {
                self.counters.cache_hits.fetch_add(1, Relaxed);
                let (mut got, want) = (got, bytes.len());
                got.clear(want);
                got.put(bytes, want);
                return Ok(got);
            }
            self.counters.cache_misses.fetch_add(1, Relaxed);
        }
        let got = self.fetch(range, etag, got).await?;
        if let Some(key) = cache_key {
            let (this, data) = (self.clone(), got.copy());
            // Written in the background: the reader need not wait for the disk.
            tokio::task::spawn_blocking(move || {
                if let Some(cache) = &this.storage.cache {
                    cache.put(&key, &data);
                }
            });
        }
        Ok(got)
    }

    /// A range of any size: large ones as parallel chunk requests, each filling its own
    /// slice of one allocation, so the pieces join without copying.
    async fn read(self: &Arc<Self>, range: Range<u64>) -> Result<Bytes> {
        let info = self.info().await?;
        if range.end > info.size {
            return Err(Error::decode(
                &self.url,
                "remote",
                Position::Byte(range.start),
                format!(
                    "range {}..{} is beyond the {}-byte object",
                    range.start, range.end, info.size
                ),
            ));
        }
        let chunk = self.storage.options.chunk_size;
        let total = (range.end - range.start) as usize;
        if total as u64 <= chunk {
            let got = self
                .fetch_cached(range, info.etag, Received::keeping_chunks())
                .await?;
            return Ok(got.into_bytes());
        }
        // Uninitialised room, split by capacity: each part is written once, by its body.
        let mut whole = BytesMut::with_capacity(total);
        let mut tasks = Vec::new();
        for start in (range.start..range.end).step_by(chunk as usize) {
            let part_range = start..(start + chunk).min(range.end);
            let rest = whole.split_off((part_range.end - part_range.start) as usize);
            let part = std::mem::replace(&mut whole, rest);
            let (this, etag) = (self.clone(), info.etag.clone());
            tasks.push(tokio::spawn(async move {
                let got = this.fetch_cached(part_range, etag, Received::filling(part));
                got.await.map(Received::into_buf)
            }));
        }
        let mut out = BytesMut::new();
        for task in tasks {
            let part = task
                .await
                .map_err(|e| Error::Internal(format!("{}: read task failed: {e}", self.url)))??;
            // Adjacent slices of one allocation: joining them is free.
            out.unsplit(part);
        }
        Ok(out.freeze())
    }
}

/// The smallest range whose body, come in one chunk, is kept as it is. The chunk keeps the
/// HTTP client's whole read buffer (at most about 400 KB; for a body that filled one read,
/// a little more than the body), so small ranges, which a reader may hold long (a footer,
/// an index), are copied out of it.
const KEEP_CHUNKS_FROM: usize = 64 << 10;

/// What a fetch has received.
struct Received {
    /// The bytes, where they came as one chunk of the whole range, kept as they are.
    whole: Option<Bytes>,
    /// Otherwise the bytes, copied in.
    buf: BytesMut,
    /// Whether such a chunk may be kept as it is. A fetch that fills a slice of a larger
    /// allocation (the parts of a large read, joined without copying) needs its bytes in
    /// `buf`.
    keeps_chunks: bool,
}

impl Received {
    /// For a fetch of a range on its own: a body of `KEEP_CHUNKS_FROM` or more that comes
    /// in one chunk (as a 100 KB object's does) is not copied: the copy and the first
    /// touch of its memory cost about 10% of the client CPU of reading such objects.
    fn keeping_chunks() -> Self {
        Self {
            whole: None,
            buf: BytesMut::new(),
            keeps_chunks: true,
        }
    }

    /// For a fetch into `buf` (give it room for the range).
    fn filling(buf: BytesMut) -> Self {
        Self {
            whole: None,
            buf,
            keeps_chunks: false,
        }
    }

    fn len(&self) -> usize {
        self.whole.as_ref().map_or(self.buf.len(), Bytes::len)
    }

    /// Emptied, for a fetch of `want` bytes.
    fn clear(&mut self, want: usize) {
        self.whole = None;
        self.buf.clear();
        if !self.keeps_chunks {
            self.buf.reserve(want);
        }
    }

    /// Takes `chunk`, up to `want` bytes in all.
    fn put(&mut self, chunk: Bytes, want: usize) {
        if self.keeps_chunks && want >= KEEP_CHUNKS_FROM && self.len() == 0 && chunk.len() >= want {
            self.whole = Some(chunk.slice(..want));
            return;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve(want);
        }
        let room = want - self.buf.len().min(want);
        self.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    fn copy(&self) -> Bytes {
        match &self.whole {
            Some(whole) => whole.clone(),
            None => Bytes::copy_from_slice(&self.buf),
        }
    }

    fn into_bytes(self) -> Bytes {
        self.whole.unwrap_or_else(|| self.buf.freeze())
    }

    /// The bytes in `buf` (where the fetch was `filling` it, they are there already).
    fn into_buf(self) -> BytesMut {
        match self.whole {
            Some(whole) => BytesMut::from(&whole[..]),
            None => self.buf,
        }
    }
}

/// Reads a body into `got` until `want` bytes, the end, or a failure (returned as text).
async fn read_body(
    body: &mut dyn Body,
    got: &mut Received,
    want: usize,
    timeout: Duration,
) -> String {
    loop {
        match tokio::time::timeout(timeout, body.next()).await {
            Err(_) => return format!("the body stalled for {timeout:?}"),
            Ok(None) if got.len() >= want => return String::new(),
            Ok(None) => return format!("the body ended early, {} bytes short", want - got.len()),
            Ok(Some(Err(cause))) => return cause,
            Ok(Some(Ok(chunk))) => {
                got.put(chunk, want);
                if got.len() >= want {
                    return String::new();
                }
            }
        }
    }
}

impl Source for RemoteSource {
    fn url(&self) -> &str {
        &self.0.url
    }

    fn size(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move { Ok(self.0.info().await?.size) })
    }

    fn read_range(&self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        Box::pin(async move {
            let bytes = self.0.read(range).await?;
            self.0.counters.add_bytes(bytes.len() as u64);
            Ok(bytes)
        })
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn open_stream(&self) -> Result<Box<dyn Read + Send>> {
        let rt = runtime()?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(READ_AHEAD);
        let inner = self.0.clone();
        rt.spawn(async move {
            let info = match inner.info().await {
                Ok(info) => info,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let chunk = inner.storage.options.chunk_size;
            let mut starts = (0..info.size).step_by(chunk as usize);
            let mut ahead = std::collections::VecDeque::new();
            loop {
                while ahead.len() < READ_AHEAD
                    && let Some(start) = starts.next()
                {
                    let (this, etag) = (inner.clone(), info.etag.clone());
                    let part = start..(start + chunk).min(info.size);
                    ahead.push_back(tokio::spawn(async move {
                        this.fetch_cached(part, etag, Received::keeping_chunks())
                            .await
                            .map(Received::into_bytes)
                    }));
                }
                let Some(next) = ahead.pop_front() else {
                    return;
                };
                let bytes = next.await.unwrap_or_else(|e| {
                    Err(Error::Internal(format!(
                        "{}: read task failed: {e}",
                        inner.url
                    )))
                });
                let failed = bytes.is_err();
                if tx.send(bytes).await.is_err() || failed {
                    // The reader is gone, or has its error: stop the read-ahead.
                    ahead.iter().for_each(|task| task.abort());
                    return;
                }
            }
        });
        Ok(Box::new(ChannelReader {
            rx,
            current: Bytes::new(),
            counters: self.0.counters.clone(),
        }))
    }
}

/// The blocking side of a read-ahead stream.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes>>,
    current: Bytes,
    counters: Arc<IoCounters>,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(bytes)) => self.current = bytes,
                // Carried as itself, for `stream_error` to unwrap.
                Some(Err(e)) => return Err(std::io::Error::other(e)),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        self.counters.add_bytes(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_in_one_chunk_is_kept_as_it_is_and_one_in_parts_is_joined() {
        let want = KEEP_CHUNKS_FROM + 10;
        let body = Bytes::from((0..want + 10).map(|i| i as u8).collect::<Vec<_>>());
        let mut got = Received::keeping_chunks();
        got.clear(want);
        got.put(body.clone(), want);
        let kept = got.into_bytes();
        assert_eq!(kept.as_ptr(), body.as_ptr(), "the chunk itself, not a copy");
        assert_eq!(kept, body.slice(..want));

        // In parts (a body resumed after a break, or sent in pieces): copied in order.
        let mut got = Received::keeping_chunks();
        got.clear(want);
        got.put(body.slice(..30), want);
        got.put(body.slice(30..), want);
        assert_eq!(got.len(), want);
        assert_eq!(got.into_bytes(), body.slice(..want));

        // A small range is copied out of the client's buffer.
        let mut got = Received::keeping_chunks();
        got.clear(90);
        got.put(body.clone(), 90);
        let small = got.into_bytes();
        assert_eq!(small, body.slice(..90));
        assert_ne!(small.as_ptr(), body.as_ptr());

        // Filling a slice of a larger allocation: always copied into it.
        let mut whole = BytesMut::with_capacity(150);
        let room = whole.split_off(50);
        let mut got = Received::filling(whole);
        got.clear(50);
        got.put(body.clone(), 50);
        let part = got.into_buf();
        assert_eq!(&part[..], &body[..50]);
        assert_ne!(part.as_ptr(), body.as_ptr());
        drop(room);
    }
}
