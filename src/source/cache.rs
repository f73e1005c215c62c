//! An on-disk cache of fetched byte ranges, shared safely by several processes (e.g.
//! PyTorch workers). Entries are keyed by URL, ETag and range, so a changed object is
//! never served from the cache; each entry's size is checked when read. Writes go to a
//! temporary file renamed into place (atomic); the least recently used entries are
//! removed when the cache grows past its size.

use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::error::{Error, Position, Result};

pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    /// What this process believes the cache holds; corrected by each eviction scan.
    approx_bytes: AtomicU64,
}

const TMP_PREFIX: &str = "tmp-";

impl DiskCache {
    pub fn open(dir: PathBuf, max_bytes: u64) -> Result<Self> {
        let url = dir.to_string_lossy().into_owned();
        fs::create_dir_all(&dir).map_err(|e| Error::io(url, Position::Unknown, e))?;
        let cache = Self {
            dir,
            max_bytes,
            approx_bytes: AtomicU64::new(0),
        };
        cache
            .approx_bytes
            .store(cache.entries().iter().map(|e| e.1).sum(), Ordering::Relaxed);
        Ok(cache)
    }

    /// The cache's folder (the record index keeps its files in `index/` below it).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub fn key(url: &str, etag: &str, range: &Range<u64>) -> String {
        let mut hash = Sha256::new();
        for part in [url, etag, &format!("{}-{}", range.start, range.end)] {
            hash.update(part.as_bytes());
            hash.update([0u8]);
        }
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The entry, if present and of the expected size; marks it recently used.
    pub fn get(&self, key: &str, expected_len: u64) -> Option<Bytes> {
        let path = self.dir.join(key);
        let data = fs::read(&path).ok()?;
        if data.len() as u64 != expected_len {
            let _ = fs::remove_file(&path);
            return None;
        }
        if let Ok(file) = fs::File::options().write(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(Bytes::from(data))
    }

    pub fn put(&self, key: &str, data: &[u8]) {
        if data.len() as u64 > self.max_bytes {
            return;
        }
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{}-{key}", std::process::id()));
        let written = fs::File::create(&tmp).and_then(|mut f| f.write_all(data));
        // A failed write only costs a later re-fetch.
        if written.is_err() || fs::rename(&tmp, self.dir.join(key)).is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        let total = self
            .approx_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed)
            + data.len() as u64;
        if total > self.max_bytes {
            self.evict();
        }
    }

    /// (path, size, last use) of every entry.
    fn entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.filter_map(|entry| {
            let entry = entry.ok()?;
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                return None;
            }
            let meta = entry.metadata().ok()?;
            meta.is_file().then(|| {
                (
                    entry.path(),
                    meta.len(),
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                )
            })
        })
        .collect()
    }

    /// Removes least recently used entries until the cache is at 90% of its size. Another
    /// process may be reading an entry removed here: an open file stays readable, and a
    /// later open just misses.
    fn evict(&self) {
        let mut entries = self.entries();
        entries.sort_by_key(|e| e.2);
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        let target = self.max_bytes / 10 * 9;
        for (path, size, _) in entries {
            if total <= target {
                break;
            }
            if fs::remove_file(path).is_ok() {
                total -= size;
            }
        }
        self.approx_bytes.store(total, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_validation_and_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path().to_path_buf(), 1000).unwrap();
        let a = DiskCache::key("s3://b/k", "etag1", &(0..10));
        assert_ne!(a, DiskCache::key("s3://b/k", "etag2", &(0..10)));
        cache.put(&a, b"0123456789");
        assert_eq!(cache.get(&a, 10).unwrap(), &b"0123456789"[..]);
        assert!(cache.get(&a, 11).is_none(), "a size mismatch is a miss");
        assert!(cache.get(&a, 10).is_none(), "and the bad entry is gone");
        for i in 0..30 {
            cache.put(&format!("k{i:02}"), &[0u8; 100]);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let total: u64 = cache.entries().iter().map(|e| e.1).sum();
        assert!(total <= 1000, "{total}");
        assert!(cache.get("k29", 100).is_some() && cache.get("k00", 100).is_none());
    }
}
