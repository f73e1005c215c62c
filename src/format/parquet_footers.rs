//! The Parquet footers this process has read, so that a dataset pickled for spawned
//! workers can carry them and the workers need not read every file's footer again (one
//! request per file and worker, against the Hub or S3).
//!
//! Footers read are remembered by file URL and size; a pickled dataset takes those of
//! its files ([`of_files`]), and the process that unpickles it hands them back
//! ([`give`]). Only given footers are ever used in place of a read: a footer this
//! process read itself is never reused for a later read, which would miss a file
//! rewritten in between at the same size.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use bytes::Bytes;

/// Footer bytes kept of those read, at most (the oldest let go first).
const READ_BYTES: usize = 64 << 20;

type Key = (String, u64);

#[derive(Default)]
struct Footers {
    /// Footers read here, the latest last, and their bytes in all.
    read: VecDeque<(Key, Bytes)>,
    read_bytes: usize,
    /// Footers given with an unpickled dataset.
    given: HashMap<Key, Bytes>,
}

fn footers() -> &'static Mutex<Footers> {
    static FOOTERS: OnceLock<Mutex<Footers>> = OnceLock::new();
    FOOTERS.get_or_init(Mutex::default)
}

/// Remembers the bytes at the end of file `url` of `size` bytes that its metadata was
/// parsed from.
pub fn remember(url: &str, size: u64, tail: Bytes) {
    let mut f = footers().lock().unwrap_or_else(|p| p.into_inner());
    let key = (url.to_string(), size);
    if let Some(at) = f.read.iter().position(|(k, _)| *k == key) {
        let (_, old) = f.read.remove(at).unwrap_or_default();
        f.read_bytes -= old.len();
    }
    f.read_bytes += tail.len();
    f.read.push_back((key, tail));
    while f.read_bytes > READ_BYTES && f.read.len() > 1 {
        let (_, old) = f.read.pop_front().unwrap_or_default();
        f.read_bytes -= old.len();
    }
}

/// The footer given for file `url` of `size` bytes, if one was.
pub fn given(url: &str, size: u64) -> Option<Bytes> {
    let f = footers().lock().unwrap_or_else(|p| p.into_inner());
    f.given.get(&(url.to_string(), size)).cloned()
}

/// The footers known of these files (by URL), to carry with a pickled dataset.
pub fn of_files(urls: &[String]) -> Vec<(String, u64, Bytes)> {
    let f = footers().lock().unwrap_or_else(|p| p.into_inner());
    let wanted: std::collections::HashSet<&str> = urls.iter().map(String::as_str).collect();
    let mut out: HashMap<Key, Bytes> = f
        .given
        .iter()
        .filter(|((url, _), _)| wanted.contains(url.as_str()))
        .map(|(k, tail)| (k.clone(), tail.clone()))
        .collect();
    // (Those read here last, over any given.)
    for (key, tail) in f
        .read
        .iter()
        .filter(|((url, _), _)| wanted.contains(url.as_str()))
    {
        out.insert(key.clone(), tail.clone());
    }
    out.into_iter()
        .map(|((url, size), tail)| (url, size, tail))
        .collect()
}

/// Footers carried by an unpickled dataset, used in place of reading them.
pub fn give(carried: Vec<(String, u64, Bytes)>) {
    let mut f = footers().lock().unwrap_or_else(|p| p.into_inner());
    for (url, size, tail) in carried {
        f.given.insert((url, size), tail);
    }
}
