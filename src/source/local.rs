//! Local files: listing (globs, directories) and positioned reads.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::backend::Backend;
use super::object::{BoxFuture, CountingReader, IoCounters, ShardMeta, Source};
use super::pattern::is_glob;
use super::storage::Storage;
use crate::error::{Error, Position, Result};

/// Local paths and `file://` URLs.
pub struct Local;

impl Backend for Local {
    fn list(&self, spec: &str, _storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        list(self.local_path(spec).unwrap_or(spec))
    }

    fn open(
        &self,
        shard: &ShardMeta,
        _storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let path = self.local_path(&shard.url).unwrap_or(&shard.url);
        Ok(Arc::new(LocalSource::new(path, counters)))
    }

    fn local_path<'a>(&self, url: &'a str) -> Option<&'a str> {
        Some(url.strip_prefix("file://").unwrap_or(url))
    }
}

#[derive(Debug)]
pub struct LocalSource {
    path: PathBuf,
    url: String,
    /// Opened on first use and shared by every read of this shard.
    file: Mutex<Option<Arc<File>>>,
    counters: Arc<IoCounters>,
}

impl LocalSource {
    pub fn new(path: &str, counters: Arc<IoCounters>) -> Self {
        Self {
            path: PathBuf::from(path),
            url: path.to_string(),
            file: Mutex::new(None),
            counters,
        }
    }

    fn file(&self) -> Result<Arc<File>> {
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = slot.as_ref() {
            return Ok(file.clone());
        }
        let file = Arc::new(self.open_file()?);
        *slot = Some(file.clone());
        Ok(file)
    }

    fn open_file(&self) -> Result<File> {
        let file =
            File::open(&self.path).map_err(|e| Error::io(&self.url, Position::Unknown, e))?;
        self.counters.add_file();
        Ok(file)
    }
}

impl Source for LocalSource {
    fn url(&self) -> &str {
        &self.url
    }

    fn size(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            let file = self.file()?;
            let meta = file
                .metadata()
                .map_err(|e| Error::io(&self.url, Position::Unknown, e))?;
            Ok(meta.len())
        })
    }

    fn read_range(&self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        Box::pin(async move {
            let file = self.file()?;
            let (url, counters) = (self.url.clone(), self.counters.clone());
            tokio::task::spawn_blocking(move || read_at(&file, &url, &counters, range))
                .await
                .map_err(|e| Error::Internal(format!("{}: read task failed: {e}", self.url)))?
        })
    }

    fn read_range_blocking(&self, range: Range<u64>) -> Result<Bytes> {
        read_at(&*self.file()?, &self.url, &self.counters, range)
    }

    fn read_into_blocking(&self, range: Range<u64>, out: &mut Vec<u8>) -> Result<()> {
        append_at(&*self.file()?, &self.url, &self.counters, range, out)
    }

    fn open_stream(&self) -> Result<Box<dyn Read + Send>> {
        let file = self.open_file()?;
        Ok(Box::new(CountingReader::new(file, self.counters.clone())))
    }
}

/// Reads exactly `range` of `file`; a file shorter than the range is an error at its start.
fn read_at(file: &File, url: &str, counters: &IoCounters, range: Range<u64>) -> Result<Bytes> {
    let mut buf = Vec::new();
    append_at(file, url, counters, range, &mut buf)?;
    Ok(Bytes::from(buf))
}

/// [`read_at`], appending to `out`. The bytes are read into `out`'s spare capacity, not
/// zeroed first: a page cache read of wide rows spent a fifth of its time clearing the
/// buffer it then overwrote.
fn append_at(
    file: &File,
    url: &str,
    counters: &IoCounters,
    range: Range<u64>,
    out: &mut Vec<u8>,
) -> Result<()> {
    let size = file
        .metadata()
        .map_err(|e| Error::io(url, Position::Unknown, e))?
        .len();
    if range.end > size {
        return Err(Error::io(
            url,
            Position::Byte(range.start),
            std::io::ErrorKind::UnexpectedEof.into(),
        ));
    }
    let len = usize::try_from(range.end.saturating_sub(range.start))
        .map_err(|_| Error::invalid_argument(format!("{url}: range too large")))?;
    out.reserve(len);
    let start = out.len();
    let mut done = 0usize;
    while done < len {
        let offset = libc::off_t::try_from(range.start + done as u64)
            .map_err(|_| Error::invalid_argument(format!("{url}: offset too large")))?;
        // SAFETY: `reserve` made room for `len` bytes after `start`; pread writes at most
        // `len - done` bytes there, and only what it wrote is counted in below.
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(file),
                out.as_mut_ptr().add(start + done).cast(),
                len - done,
                offset,
            )
        };
        match n {
            0 => {
                return Err(Error::io(
                    url,
                    Position::Byte(range.start + done as u64),
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::io(url, Position::Byte(range.start + done as u64), e));
                }
            }
            n => done += n as usize,
        }
    }
    // SAFETY: the `len` bytes after `start` were written by pread above.
    unsafe { out.set_len(start + len) };
    counters.add_bytes(len as u64);
    Ok(())
}

/// Lists one brace-expanded local pattern: a glob, a directory (recursively) or a file.
pub fn list(pattern: &str) -> Result<Vec<ShardMeta>> {
    let mut paths = if is_glob(pattern) {
        let matches = glob::glob(pattern)
            .map_err(|e| Error::invalid_argument(format!("bad glob {pattern:?}: {e}")))?;
        let mut files = Vec::new();
        for entry in matches {
            let path = entry.map_err(|e| Error::io(pattern, Position::Unknown, e.into()))?;
            if path.is_file() {
                files.push(path);
            }
        }
        if files.is_empty() {
            return Err(Error::NoMatch {
                pattern: pattern.to_string(),
            });
        }
        files
    } else {
        let path = Path::new(pattern);
        let meta = std::fs::metadata(path).map_err(|e| Error::io(pattern, Position::Unknown, e))?;
        if meta.is_dir() {
            let mut files = Vec::new();
            walk(path, &mut files)?;
            if files.is_empty() {
                return Err(Error::NoMatch {
                    pattern: pattern.to_string(),
                });
            }
            files
        } else {
            vec![path.to_path_buf()]
        }
    };
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let size = std::fs::metadata(&path).ok().map(|m| m.len());
            Ok(ShardMeta {
                url: path.to_string_lossy().into_owned(),
                size,
                etag: None,
                rows: None,
            })
        })
        .collect()
}

/// Collects regular files below `dir`, skipping hidden and `_`-prefixed names
/// (`.DS_Store`, `_SUCCESS`, `_common_metadata`), as Spark and pyarrow do.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let url = dir.to_string_lossy();
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(url.as_ref(), Position::Unknown, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(url.as_ref(), Position::Unknown, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}
