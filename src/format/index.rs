//! The record index of stream formats (JSONL, CSV, TFRecord, WebDataset tar): where each
//! record of a shard starts, found in one streaming pass. With it a stream format knows
//! its row count, splits its shards into work units of known rows read by byte range,
//! and fetches single records for `ds[i]`.
//!
//! An index is kept in memory for the process, and persisted in `cache_dir/index/` when
//! the dataset has a cache, else beside a local shard (`.NAME.sfindex`) where that
//! directory is writable, else (remote shards) in the user's cache folder. Each is keyed by the shard's URL, size and modification time
//! (local) or ETag (remote); a key that no longer matches the shard makes the index stale,
//! and a stale index is rebuilt, never read.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub use super::records::{RecordAccess, RecordCodec, ShardIndex};
use super::{BatchSink, PreparedShards, UnitJob, UnitJobs, WorkUnit};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta};

/// Bytes of records one work unit of an indexed (uncompressed) shard covers.
const UNIT_BYTES: u64 = 4 << 20;
/// Shards scanned at once while indexing.
const SCAN_THREADS: usize = 8;

/// version (an HTTP resource without ETag), so that no index of it is persisted.
pub(super) fn current_key(shard: &ShardMeta) -> Option<String> {
    let url = shard.url.as_str();
    if let Some(path) = crate::source::local_path(url) {
        let meta = std::fs::metadata(path).ok()?;
        let mtime = meta
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos();
        return Some(format!("{url}\0{}\0{mtime}", meta.len()));
    }
    let etag = shard.etag.as_deref()?;
    Some(format!("{url}\0{:?}\0{etag}", shard.size))
}

/// The indexes this process holds, one per shard URL (with the version it describes),
/// bounded in bytes: a shard that changed replaces its old index, and past the bound the
/// oldest go (to be loaded from disk again if needed). A long-running process that reads
/// many shards, or one shard rewritten many times, does not grow without end.
#[derive(Default)]
struct KnownIndexes {
    by_url: HashMap<String, (String, Arc<ShardIndex>)>,
    /// URLs, oldest first.
    order: std::collections::VecDeque<String>,
    bytes: usize,
}

/// Bytes of record offsets held in memory at most: 64M records' worth.
const KNOWN_INDEX_BYTES: usize = 512 << 20;

fn index_bytes(index: &ShardIndex) -> usize {
    index.offsets.len() * 8 + index.header.len() + index.key.len()
}

impl KnownIndexes {
    fn get(&self, url: &str, key: &str) -> Option<Arc<ShardIndex>> {
        let (known_key, index) = self.by_url.get(url)?;
        (known_key == key).then(|| index.clone())
    }

    fn insert(&mut self, url: &str, key: String, index: Arc<ShardIndex>) {
        self.bytes += index_bytes(&index);
        match self.by_url.insert(url.to_string(), (key, index)) {
            Some((_, old)) => self.bytes -= index_bytes(&old),
            None => self.order.push_back(url.to_string()),
        }
        while self.bytes > KNOWN_INDEX_BYTES && self.order.len() > 1 {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, old)) = self.by_url.remove(&oldest) {
                self.bytes -= index_bytes(&old);
            }
        }
    }
}

fn memory() -> &'static Mutex<KnownIndexes> {
    static INDEXES: OnceLock<Mutex<KnownIndexes>> = OnceLock::new();
    INDEXES.get_or_init(Default::default)
}

/// Where the index of `shard` is persisted: the dataset's cache, else beside a local
/// file, else (a remote shard) in the user's cache folder, so that other processes (a
/// loader's spawned workers, the next run) need not read the shard again to index it.
fn persisted_path(shard: &ShardMeta, io: &Io) -> Option<PathBuf> {
    use sha2::{Digest, Sha256};
    let digest = || -> String {
        Sha256::digest(shard.url.as_bytes())[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    if let Some(cache) = &io.storage.cache {
        return Some(
            cache
                .dir()
                .join("index")
                .join(format!("{}.sfindex", digest())),
        );
    }
    let url = shard.url.as_str();
    if url.contains("://") && !url.starts_with("file://") {
        return Some(
            user_cache_dir()?
                .join("index")
                .join(format!("{}.sfindex", digest())),
        );
    }
    let path = std::path::Path::new(url.strip_prefix("file://").unwrap_or(url));
    let name = path.file_name()?.to_string_lossy();
    Some(path.with_file_name(format!(".{name}.sfindex")))
}

/// `$SHARDFLOW_CACHE_DIR`, else `$XDG_CACHE_HOME/shardflow`, else `~/.cache/shardflow`.
pub fn user_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("SHARDFLOW_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("shardflow")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("shardflow")))
}

fn load(path: &PathBuf, key: &str) -> Option<ShardIndex> {
    let index = ShardIndex::decode(&std::fs::read(path).ok()?)?;
    (index.key == key).then_some(index)
}

/// Writes atomically (a temporary file renamed into place); a directory we may not
/// write to just means the index is not kept.
fn persist(path: &PathBuf, index: &ShardIndex) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, index.encode()).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The index of one shard: from memory, from disk if still current, or by a scan.
fn shard_index(shard: &ShardMeta, codec: &dyn RecordCodec, io: &Io) -> Result<Arc<ShardIndex>> {
    let key = current_key(shard);
    if let Some(key) = &key {
        let known = memory()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shard.url, key);
        if let Some(index) = known {
            return Ok(index);
        }
    }
    let path = key.as_ref().and_then(|_| persisted_path(shard, io));
    let found = match (&key, &path) {
        (Some(key), Some(path)) => load(path, key),
        _ => None,
    };
    let index = match found {
        Some(index) => index,
        None => {
            let stream = io.open(shard)?.open_stream()?;
            let index = codec.scan(shard, stream, key.clone().unwrap_or_default())?;
            if let Some(path) = &path {
                persist(path, &index);
            }
            index
        }
    };
    let index = Arc::new(index);
    if let Some(key) = key {
        memory()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(&shard.url, key, index.clone());
    }
    Ok(index)
}

/// A prepared stream-format dataset with every shard indexed: units of known rows, read
/// by byte range where the shard is uncompressed.
struct IndexedJobs {
    plain: Arc<PreparedShards>,
    codec: Arc<dyn RecordCodec>,
    indexes: Vec<Arc<ShardIndex>>,
    /// For each unit of an uncompressed shard, `(first record, end record)`.
    parts: Vec<Vec<(u64, u64)>>,
}

impl UnitJobs for IndexedJobs {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let index = self.indexes[unit.shard].clone();
        if !index.by_range() {
            // A compressed file is read whole, front to back, as without the index.
            return self.plain.job(&WorkUnit {
                shard: unit.shard,
                part: 0,
                rows: None,
            });
        }
        let (first, end) = self.parts[unit.shard][unit.part];
        let range = index.offsets[first as usize]..index.offsets[end as usize];
        let (codec, shard) = (self.codec.clone(), shard.clone());
        UnitJob::Ranges {
            ranges: vec![range.clone()],
            decode: Box::new(
                move |fetched: crate::source::ranges::RangeSet, _: &mut BatchSink| {
                    let data = fetched
                        .get(range.start, range.end - range.start)
                        .ok_or_else(|| {
                            Error::Internal(format!("{}: the fetched range is missing", shard.url))
                        })?;
                    codec.decode_records(&shard, &index, data, first)
                },
            ),
        }
    }

    fn record_access(&self) -> Option<RecordAccess> {
        Some(RecordAccess {
            codec: self.codec.clone(),
            indexes: self.indexes.clone(),
            parts: self.parts.clone(),
        })
    }
}

/// Indexes every shard of `plain` (many at once) and returns the dataset split into
/// units of known rows. Formats that know their rows already come back as they are;
/// formats without a record codec are an error.
pub fn index_shards(
    plain: Arc<PreparedShards>,
    io: &Io,
    on_error: super::OnError,
) -> Result<Arc<PreparedShards>> {
    if plain.units.iter().all(|u| u.rows.is_some()) {
        return Ok(plain);
    }
    let Some(codec) = plain.record_codec() else {
        return Err(Error::invalid_argument(format!(
            "{} data cannot be indexed; iterate it instead",
            plain.format
        )));
    };
    let shards = &plain.shards;
    let results: Vec<Mutex<Option<Result<Arc<ShardIndex>>>>> =
        shards.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..SCAN_THREADS.min(shards.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(shard) = shards.get(i) else { break };
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        shard_index(shard, codec.as_ref(), io)
                    }))
                    .unwrap_or_else(|panic| {
                        Err(Error::decode(
                            &shard.url,
                            plain.format,
                            Position::Unknown,
                            format!("indexing failed: {}", crate::error::panic_message(&*panic)),
                        ))
                    });
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
                }
            });
        }
    });
    let mut indexes = Vec::with_capacity(shards.len());
    let mut skipped = plain.skipped_shards;
    for (shard, result) in shards.iter().zip(results) {
        let result = result
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_else(|| Err(Error::Internal(format!("{}: not indexed", shard.url))));
        match result {
            Ok(index) => indexes.push(index),
            Err(_) if on_error == super::OnError::Skip => {
                skipped += 1;
                indexes.push(Arc::new(ShardIndex {
                    key: String::new(),
                    rows: 0,
                    offsets: vec![0],
                    header: Vec::new(),
                }));
            }
            Err(e) => return Err(e),
        }
    }
    let mut units = Vec::new();
    let mut parts = Vec::with_capacity(indexes.len());
    for (shard, index) in indexes.iter().enumerate() {
        let mut cuts = Vec::new();
        if !index.by_range() {
            units.push(WorkUnit {
                shard,
                part: 0,
                rows: Some(index.rows),
            });
        } else {
            let mut first = 0u64;
            while first < index.rows {
                let start = index.offsets[first as usize];
                let mut end = first + 1;
                while end < index.rows && index.offsets[end as usize + 1] - start <= UNIT_BYTES {
                    end += 1;
                }
                units.push(WorkUnit {
                    shard,
                    part: cuts.len(),
                    rows: Some(end - first),
                });
                cuts.push((first, end));
                first = end;
            }
        }
        parts.push(cuts);
    }
    let jobs = IndexedJobs {
        plain: plain.clone(),
        codec,
        indexes,
        parts,
    };
    Ok(Arc::new(
        PreparedShards::new(
            plain.format,
            plain.schema.clone(),
            plain.shards.clone(),
            units,
            jobs,
        )
        .with_skipped_shards(skipped),
    ))
}

/// Record starts of JSON Lines: each record ends at a newline; lines of only whitespace
/// are not records but stay inside the byte range of the record before them.
pub fn scan_lines(reader: &mut dyn Read, url: &str, mut at: u64) -> Result<Vec<u64>> {
    let mut offsets = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    // Whether the current line has seen anything but whitespace, and where it started.
    let mut line_start = at;
    let mut line_has_data = false;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(super::compression::stream_error(url, Position::Byte(at), e));
            }
        };
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' {
                if line_has_data {
                    offsets.push(line_start);
                }
                line_start = at + i as u64 + 1;
                line_has_data = false;
            } else if !line_has_data && !b.is_ascii_whitespace() {
                line_has_data = true;
            }
        }
        at += n as u64;
    }
    if line_has_data {
        offsets.push(line_start);
    }
    offsets.push(at);
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_records_skip_blank_lines() {
        let data = b"{\"a\":1}\n\n{\"a\":2}\r\n  \n{\"a\":3}";
        let offsets = scan_lines(&mut &data[..], "t", 0).unwrap();
        assert_eq!(offsets, vec![0, 9, 21, 28]);
    }

    #[test]
    fn persisted_indexes_round_trip_and_reject_damage() {
        let index = ShardIndex {
            key: "f\01\02".into(),
            rows: 2,
            offsets: vec![0, 5, 9],
            header: b"a,b\n".to_vec(),
        };
        let bytes = index.encode();
        assert_eq!(ShardIndex::decode(&bytes), Some(index));
        assert_eq!(ShardIndex::decode(&bytes[..bytes.len() - 1]), None);
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(ShardIndex::decode(&bad), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "builds indexes of hundreds of megabytes")]
    fn known_indexes_replace_old_versions_and_stay_bounded() {
        let index = |rows: usize| {
            Arc::new(ShardIndex::new(
                String::new(),
                (0..=rows as u64).collect(),
                true,
                Vec::new(),
            ))
        };
        let mut known = KnownIndexes::default();
        // One shard rewritten many times holds one index: the newest.
        for version in 0..100 {
            known.insert("a.jsonl", format!("v{version}"), index(10));
        }
        assert_eq!(known.by_url.len(), 1);
        assert!(known.get("a.jsonl", "v98").is_none());
        assert!(known.get("a.jsonl", "v99").is_some());
        // Many large indexes: the oldest go once the bound is passed.
        let big = KNOWN_INDEX_BYTES / 8 / 3;
        for shard in 0..5 {
            known.insert(&format!("s{shard}"), "k".into(), index(big));
        }
        assert!(known.bytes <= KNOWN_INDEX_BYTES, "{}", known.bytes);
        assert!(known.get("s4", "k").is_some() && known.get("s0", "k").is_none());
        let held: usize = known.by_url.values().map(|(_, i)| index_bytes(i)).sum();
        assert_eq!(held, known.bytes);
    }
}
