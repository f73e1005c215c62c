//! What the object stores' backends (S3, GCS, Azure Blob) share in listing a spec: its
//! bucket and key, whether it names one object (asked for alone, so that a missing one
//! fails at once) or the objects below a prefix or matching a glob, and the shards those
//! make. Each backend lists its own way; none imports another.

use std::future::Future;

use super::object::ShardMeta;
use super::pattern::is_glob;
use super::remote::ObjectInfo;
use super::retry::Tried;
use super::runtime::{self, runtime};
use crate::error::{Error, Result};

/// `scheme://bucket/key` split in two (`key` may be empty: the whole bucket).
pub fn split_bucket<'a>(url: &'a str, scheme: &str) -> Result<(&'a str, &'a str)> {
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .unwrap_or(url);
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() => Ok((bucket, key)),
        None if !rest.is_empty() => Ok((rest, "")),
        _ => Err(Error::invalid_argument(format!(
            "{url}: expected {scheme}://bucket/key"
        ))),
    }
}

/// An object as a listing gives it.
pub struct ListedObject {
    /// Its key in the bucket.
    pub name: String,
    pub size: Option<u64>,
    /// Its version: an ETag, a generation.
    pub version: Option<String>,
}

/// The shards `spec` (whose key in its bucket is `key`) names, waiting on the calling
/// thread: a glob's matches or everything below a prefix ending in `/` (`list` gets the
/// listing's prefix; sorted by URL, `url_of` a key), or the one object named (`head`,
/// so that a missing one fails now). Sizes and versions come from the store.
pub fn list_spec<H, L>(
    spec: &str,
    key: &str,
    head: impl FnOnce() -> Result<H>,
    list: impl FnOnce(String) -> Result<L>,
    url_of: impl Fn(&str) -> String,
) -> Result<Vec<ShardMeta>>
where
    H: Future<Output = Tried<ObjectInfo>> + Send,
    L: Future<Output = Tried<Vec<ListedObject>>> + Send,
{
    let rt = runtime()?;
    if !is_glob(key) && !key.is_empty() && !key.ends_with('/') {
        let info = runtime::block_on_outside(rt, head()?)?.map_err(|f| f.given_up(spec, "HEAD"))?;
        return Ok(vec![ShardMeta {
            url: spec.to_string(),
            size: Some(info.size),
            etag: info.etag,
            rows: None,
        }]);
    }
    let keys = Keys::new(spec, key)?;
    let objects = runtime::block_on_outside(rt, list(keys.literal_prefix.clone())?)?
        .map_err(|f| f.given_up(spec, "listing"))?;
    keys.shards(spec, objects, url_of)
}

/// Which listed keys a glob or a prefix names: a glob's matches (`*` not crossing `/`),
/// or everything below the prefix but hidden and `_` files, as for directories.
struct Keys {
    literal_prefix: String,
    glob: Option<glob::Pattern>,
}

impl Keys {
    fn new(spec: &str, key: &str) -> Result<Self> {
        let glob = match is_glob(key) {
            true => Some(
                glob::Pattern::new(key)
                    .map_err(|e| Error::invalid_argument(format!("bad glob {spec:?}: {e}")))?,
            ),
            false => None,
        };
        Ok(Self {
            literal_prefix: key[..key.find(['*', '?', '[']).unwrap_or(key.len())].to_string(),
            glob,
        })
    }

    fn keeps(&self, name: &str) -> bool {
        match &self.glob {
            Some(glob) => glob.matches_with(
                name,
                glob::MatchOptions {
                    require_literal_separator: true,
                    ..Default::default()
                },
            ),
            None => {
                let base = name.rsplit('/').next().unwrap_or(name);
                !base.is_empty() && !base.starts_with(['.', '_'])
            }
        }
    }

    /// The shards among `objects` (listed below the literal prefix), sorted by URL
    /// (`url_of` a key); none is an error naming `spec`.
    fn shards(
        &self,
        spec: &str,
        objects: Vec<ListedObject>,
        url_of: impl Fn(&str) -> String,
    ) -> Result<Vec<ShardMeta>> {
        let mut shards: Vec<ShardMeta> = objects
            .into_iter()
            .filter(|o| self.keeps(&o.name))
            .map(|o| ShardMeta {
                url: url_of(&o.name),
                size: o.size,
                etag: o.version,
                rows: None,
            })
            .collect();
        if shards.is_empty() {
            return Err(Error::NoMatch {
                pattern: spec.to_string(),
            });
        }
        shards.sort_by(|a, b| a.url.cmp(&b.url));
        Ok(shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_bucket_and_key() {
        assert_eq!(
            split_bucket("s3://b/k/x.parquet", "s3").unwrap(),
            ("b", "k/x.parquet")
        );
        assert_eq!(split_bucket("gs://b", "gs").unwrap(), ("b", ""));
        assert!(split_bucket("s3:///k", "s3").is_err());
    }

    #[test]
    fn globs_and_prefixes_keep_what_a_folder_would() {
        let glob = Keys::new("s3://b/d/*.bin", "d/*.bin").unwrap();
        assert_eq!(glob.literal_prefix, "d/");
        assert!(glob.keeps("d/x.bin") && !glob.keeps("d/e/x.bin"));
        let prefix = Keys::new("s3://b/d/", "d/").unwrap();
        assert!(prefix.keeps("d/e/x.bin") && !prefix.keeps("d/_SUCCESS") && !prefix.keeps("d/.x"));
    }
}
