//! Which backend reads a path or URL, by its scheme: the table of backends, and the
//! entry points that go through it (listing specs, opening shards, telling local paths
//! from remote URLs). A new kind of storage is one backend file and one line of
//! [`SCHEMES`].

use std::sync::Arc;

use super::backend::Backend;
use super::object::{IoCounters, ShardMeta, Source};
use super::storage::Storage;
use super::upload::PrefixWriter;
use super::{azure, gcs, hf, http, local, pattern, s3};
use crate::error::{Error, Result};

/// The backends by URL scheme (the part before `://`).
const SCHEMES: &[(&str, &dyn Backend)] = &[
    ("file", &local::Local),
    ("s3", &s3::S3),
    ("gs", &gcs::Gcs),
    ("az", &azure::Azure),
    ("abfs", &azure::Azure),
    ("abfss", &azure::Azure),
    ("http", &http::Http),
    ("https", &http::Http),
    // Hugging Face Hub dataset repos.
    ("hf", &hf::Hf),
];

/// The backend of a spec without a scheme: a local path.
const NO_SCHEME: &dyn Backend = &local::Local;

/// The backend that reads `spec`; `Err` with the scheme's name where none does.
fn backend(spec: &str) -> std::result::Result<&'static dyn Backend, &str> {
    // Azure Blob Storage's own https:// URLs are read with its API (listing, SharedKey).
    if azure::is_blob_host(spec) {
        return Ok(&azure::Azure);
    }
    match spec.split_once("://") {
        Some((name, _)) if !name.contains('/') => SCHEMES
            .iter()
            .find(|(scheme, _)| *scheme == name)
            .map(|(_, backend)| *backend)
            .ok_or(name),
        _ => Ok(NO_SCHEME),
    }
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
            match backend(&expanded) {
                Ok(backend) => shards.extend(backend.list(&expanded, storage)?),
                Err(name) => {
                    return Err(Error::invalid_argument(format!(
                        "{spec}: {name}:// sources are not supported (use a path, s3://, gs://, az://, hf:// or http(s)://)"
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
    match backend(&shard.url) {
        Ok(backend) => backend.open(shard, storage, counters),
        Err(name) => Err(Error::invalid_argument(format!(
            "{}: {name}:// sources are not supported",
            shard.url
        ))),
    }
}

/// Writes objects under the remote prefix `url`; an error for a scheme that cannot be
/// written to.
pub fn writer(url: &str, storage: &Arc<Storage>) -> Result<Box<dyn PrefixWriter>> {
    let backend = backend(url).ok();
    match backend.and_then(|b| b.writer(url, storage)) {
        Some(writer) => writer,
        None => Err(Error::invalid_argument(format!(
            "{url}: write() writes to a local directory or an s3://, gs:// or az:// prefix"
        ))),
    }
}

/// Whether `url` is in an object store (S3, GCS, Azure Blob): a prefix there is listed.
pub fn is_object_store(url: &str) -> bool {
    backend(url).is_ok_and(|b| b.is_object_store())
}

/// The path of a local file (a plain path or a `file://` URL); `None` for remote URLs.
pub fn local_path(url: &str) -> Option<&str> {
    backend(url).ok()?.local_path(url)
}

/// The bytes of one file or object at `url` (a local path or any URL shardflow reads);
/// `size` as a listing said, if known.
pub fn read_whole(url: String, size: Option<u64>, storage: &Arc<Storage>) -> Result<bytes::Bytes> {
    let shard = ShardMeta {
        url,
        size,
        etag: None,
        rows: None,
    };
    let source = open(&shard, storage, Arc::default())?;
    let size = super::size_blocking(source.as_ref(), size)?;
    source.read_range_blocking(0..size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_dirs_and_ranges_resolve_sorted() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b-001.txt", "a-000.txt", "c-002.txt", ".hidden", "_SUCCESS"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let d = dir.path().to_str().unwrap();
        let storage = Storage::local_only();
        let urls = |specs: &[String]| -> Vec<String> {
            resolve(specs, &storage)
                .unwrap()
                .into_iter()
                .map(|s| s.url)
                .collect()
        };
        let all = urls(&[format!("{d}/*.txt")]);
        assert_eq!(all.len(), 3);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(urls(&[d.to_string()]), all);
        assert_eq!(urls(&[format!("file://{d}")]), all);
        assert_eq!(urls(&[format!("{d}/{{a-000,b-001}}.txt")]), all[..2]);
        assert!(matches!(
            resolve(&[format!("{d}/*.parquet")], &storage),
            Err(Error::NoMatch { .. })
        ));
        assert!(matches!(
            resolve(&[format!("{d}/missing-{{0..1}}.txt")], &storage),
            Err(Error::NotFound { .. })
        ));
    }

    #[test]
    fn schemes_pick_backends() {
        assert_eq!(local_path("/a/b.parquet"), Some("/a/b.parquet"));
        assert_eq!(local_path("file:///a/b.parquet"), Some("/a/b.parquet"));
        assert_eq!(local_path("rel/x://y"), Some("rel/x://y"));
        for remote in [
            "s3://b/k",
            "http://h/x",
            "https://h/x",
            "hf://datasets/o/n/x",
            "gs://b/k",
        ] {
            assert_eq!(local_path(remote), None, "{remote}");
        }
        assert!(matches!(backend("ftp://b/k"), Err("ftp")));
    }
}
