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
use super::retry::Failure;
use super::storage::Storage;
use super::{BoxFuture, IoCounters, Source};
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

/// One protocol's requests.
pub trait Backend: Send + Sync + 'static {
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
    backend: Box<dyn Backend>,
    storage: Arc<Storage>,
    counters: Arc<IoCounters>,
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
        backend: Box<dyn Backend>,
        info: Option<ObjectInfo>,
        storage: Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Self {
        Self(Arc::new(Inner {
            url,
            backend,
            storage,
            counters,
            info: Mutex::new(info),
        }))
    }
}

impl Inner {
    async fn info(self: &Arc<Self>) -> Result<ObjectInfo> {
        if let Some(info) = self.info.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(info);
        }
        let info = self
            .retrying(0, "HEAD", || async { self.backend.head().await })
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
                tokio::time::timeout(self.storage.options.timeout, attempt()).await
            };
            let mut asked = Duration::ZERO;
            let cause = match outcome {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(Failure::Permanent(e))) => return Err(e),
                Ok(Err(Failure::Transient(cause))) => cause,
                Ok(Err(Failure::Throttled(cause, wait))) => {
                    asked = wait;
                    cause
                }
                Err(_) => format!("no response within {:?}", self.storage.options.timeout),
            };
            if tries >= policy.max_attempts {
                return Err(self.gave_up(offset, what, &cause, tries));
            }
            self.counters.retries.fetch_add(1, Relaxed);
            tokio::time::sleep(policy.backoff(tries).max(asked)).await;
        }
    }

    fn gave_up(&self, offset: u64, what: &str, cause: &str, tries: u32) -> Error {
        Error::Io {
            url: self.url.clone(),
            position: Position::Byte(offset),
            source: std::io::Error::other(format!("{what} failed after {tries} attempts: {cause}")),
        }
    }

    /// Reads `range` exactly into `buf` (emptied first; pass one with room for the range
    /// to avoid reallocation); resumes a broken body where it stopped.
    async fn fetch(
        self: &Arc<Self>,
        range: Range<u64>,
        etag: Option<String>,
        mut buf: BytesMut,
    ) -> Result<BytesMut> {
        let want = (range.end - range.start) as usize;
        buf.clear();
        buf.reserve(want);
        let policy = self.storage.options.retry;
        let timeout = self.storage.options.timeout;
        let mut tries = 0;
        while buf.len() < want {
            tries += 1;
            let from = range.start + buf.len() as u64;
            let before = buf.len();
            let mut asked = Duration::ZERO;
            let cause = {
                let _permit = self.storage.limit().acquire_owned().await;
                self.counters.requests.fetch_add(1, Relaxed);
                let request = Request::Range(from..range.end);
                match tokio::time::timeout(timeout, self.backend.get(request, etag.clone())).await {
                    Err(_) => format!("no response within {timeout:?}"),
                    Ok(Err(Failure::Permanent(e))) => return Err(e),
                    Ok(Err(Failure::Transient(cause))) => cause,
                    Ok(Err(Failure::Throttled(cause, wait))) => {
                        asked = wait;
                        cause
                    }
                    Ok(Ok(mut response)) => {
                        read_body(&mut *response.body, &mut buf, want, timeout).await
                    }
                }
            };
            let received = buf.len() - before;
            self.counters
                .bytes_fetched
                .fetch_add(received as u64, Relaxed);
            if buf.len() >= want {
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
            self.counters.retries.fetch_add(1, Relaxed);
            tokio::time::sleep(policy.backoff(tries.max(1)).max(asked)).await;
        }
        buf.truncate(want);
        Ok(buf)
    }

    /// `fetch` through the disk cache.
    async fn fetch_cached(
        self: &Arc<Self>,
        range: Range<u64>,
        etag: Option<String>,
        buf: BytesMut,
    ) -> Result<BytesMut> {
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
                let mut buf = buf;
                buf.clear();
                buf.extend_from_slice(&bytes);
                return Ok(buf);
            }
            self.counters.cache_misses.fetch_add(1, Relaxed);
        }
        let buf = self.fetch(range, etag, buf).await?;
        if let Some(key) = cache_key {
            let (this, data) = (self.clone(), Bytes::copy_from_slice(&buf));
            // Written in the background: the reader need not wait for the disk.
            tokio::task::spawn_blocking(move || {
                if let Some(cache) = &this.storage.cache {
                    cache.put(&key, &data);
                }
            });
        }
        Ok(buf)
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
            let buf = BytesMut::with_capacity(total);
            return Ok(self.fetch_cached(range, info.etag, buf).await?.freeze());
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
                this.fetch_cached(part_range, etag, part).await
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

/// Reads a body into `buf` until `want` bytes, the end, or a failure (returned as text).
async fn read_body(
    body: &mut dyn Body,
    buf: &mut BytesMut,
    want: usize,
    timeout: Duration,
) -> String {
    loop {
        match tokio::time::timeout(timeout, body.next()).await {
            Err(_) => return format!("the body stalled for {timeout:?}"),
            Ok(None) if buf.len() >= want => return String::new(),
            Ok(None) => return format!("the body ended early, {} bytes short", want - buf.len()),
            Ok(Some(Err(cause))) => return cause,
            Ok(Some(Ok(chunk))) => {
                let room = want - buf.len().min(want);
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if buf.len() >= want {
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
        let rt = super::runtime()?;
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
                    let buf = BytesMut::with_capacity((part.end - part.start) as usize);
                    ahead.push_back(tokio::spawn(async move {
                        this.fetch_cached(part, etag, buf)
                            .await
                            .map(BytesMut::freeze)
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
