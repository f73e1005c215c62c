//! An on-disk cache of fetched byte ranges, shared safely by several processes (e.g.
//! PyTorch workers). Entries are keyed by URL, ETag and range, so a changed object is
//! never served from the cache. Writes go to a temporary file renamed into place
//! (atomic), so a process killed mid-write leaves at most a temporary file, which a
//! later process removes; each entry ends with its length and CRC32C, checked on every
//! read, so a damaged entry is a miss, never data. The least recently used entries are
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

pub(crate) const TMP_PREFIX: &str = "tmp-";
/// What follows an entry's data: its CRC32C (u32 LE), its length (u64 LE), this magic.
const TRAILER_MAGIC: &[u8; 4] = b"SFC1";
const TRAILER: usize = 16;
/// A temporary file this old is a leftover whatever its process (PIDs are reused).
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(600);

fn trailer(data: &[u8]) -> [u8; TRAILER] {
    let mut out = [0u8; TRAILER];
    out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
    out[4..12].copy_from_slice(&(data.len() as u64).to_le_bytes());
    out[12..].copy_from_slice(TRAILER_MAGIC);
    out
}

/// Whether a temporary file was left by a process that is gone (killed mid-write).
pub(crate) fn abandoned_tmp(name: &str, modified: SystemTime) -> bool {
    let Some(rest) = name.strip_prefix(TMP_PREFIX) else {
        return false;
    };
    let old = modified.elapsed().is_ok_and(|age| age > STALE_TMP);
    let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
    let gone = pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
    old || gone
}

impl DiskCache {
    pub fn open(dir: PathBuf, max_bytes: u64) -> Result<Self> {
        let url = dir.to_string_lossy().into_owned();
        fs::create_dir_all(&dir).map_err(|e| Error::io(url, Position::Unknown, e))?;
        let cache = Self {
            dir,
            max_bytes,
            approx_bytes: AtomicU64::new(0),
        };
        let total = cache.entries().iter().map(|e| e.1).sum();
        cache.approx_bytes.store(total, Ordering::Relaxed);
        // Processes that shared the cache may have left it over its size (each evicts
        // by what it believes the others wrote), or died before evicting.
        if total > max_bytes {
            cache.evict();
        }
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

    /// The entry, if present, whole and of the expected size; marks it recently used.
    /// A damaged or wrong-sized entry is removed and missed.
    pub fn get(&self, key: &str, expected_len: u64) -> Option<Bytes> {
        let path = self.dir.join(key);
        let mut data = fs::read(&path).ok()?;
        let whole = data.len() as u64 == expected_len.saturating_add(TRAILER as u64) && {
            let split = data.len() - TRAILER;
            data[split..] == trailer(&data[..split])
        };
        if !whole {
            let _ = fs::remove_file(&path);
            return None;
        }
        data.truncate(data.len() - TRAILER);
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
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(data)?;
            f.write_all(&trailer(data))
        });
        // A failed write only costs a later re-fetch.
        if written.is_err() || fs::rename(&tmp, self.dir.join(key)).is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        let size = (data.len() + TRAILER) as u64;
        let total = self.approx_bytes.fetch_add(size, Ordering::Relaxed) + size;
        if total > self.max_bytes {
            self.evict();
        }
    }

    /// (path, size, last use) of every entry. Temporary files of processes that died
    /// mid-write are removed on the way; those still being written are not entries.
    fn entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.filter_map(|entry| {
            let entry = entry.ok()?;
            let meta = entry.metadata().ok()?;
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TMP_PREFIX) {
                if abandoned_tmp(&name, modified) {
                    let _ = fs::remove_file(entry.path());
                }
                return None;
            }
            meta.is_file().then(|| (entry.path(), meta.len(), modified))
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

    #[test]
    fn damaged_entries_are_misses_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path().to_path_buf(), 1 << 20).unwrap();
        let data: Vec<u8> = (0..200u8).collect();
        for damage in 0..4 {
            let key = format!("k{damage}");
            cache.put(&key, &data);
            let path = dir.path().join(&key);
            let mut stored = fs::read(&path).unwrap();
            match damage {
                0 => {}
                1 => stored[17] ^= 1,      // a flipped bit in the data
                2 => stored.truncate(150), // cut short
                _ => stored.truncate(200), // the data without its trailer
            }
            fs::write(&path, &stored).unwrap();
            let got = cache.get(&key, 200);
            assert_eq!(got.is_some(), damage == 0, "damage {damage}");
            if damage > 0 {
                assert!(!path.exists(), "a damaged entry is removed");
            }
        }
        assert_eq!(cache.get("k0", 200).unwrap(), &data[..]);
        // A temporary file of a process that no longer exists (PIDs stop well below
        // 2^31 - 1) goes at the next scan; one of a live process stays.
        let dead = dir.path().join(format!("{TMP_PREFIX}2147483646-abc"));
        let live = dir
            .path()
            .join(format!("{TMP_PREFIX}{}-abc", std::process::id()));
        fs::write(&dead, b"partial").unwrap();
        fs::write(&live, b"partial").unwrap();
        assert_eq!(cache.entries().len(), 1);
        assert!(!dead.exists() && live.exists());
    }
}
