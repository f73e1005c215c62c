//! The manifest `ds.write` leaves beside its shards (`_shardflow.json`): the format, the
//! shard names with their rows and sizes, and the columns. Opening the directory or
//! prefix then lists the shards from it, in the order written, with their row counts, so
//! `len()` and exact rank splits need no pass over the data. Its name starts with `_`, so
//! directory and prefix listings (ours, Spark's, pyarrow's) skip it as a data file.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{ShardMeta, Storage};
use crate::error::{Error, Position, Result};

pub const MANIFEST_NAME: &str = "_shardflow.json";
/// The layout version this build writes and reads.
const VERSION: u64 = 1;
/// A manifest is small (a line per shard); anything larger is not ours.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// One shard a manifest lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestShard {
    /// The shard's name, relative to the manifest's directory or prefix.
    pub path: String,
    /// Rows it holds.
    pub rows: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// What `write` made: the format and the shards, in row order.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The format name as `format=` takes it.
    pub format: String,
    /// The `format_options` that read the shards as written (NPZ: `{"mode": "rows"}`).
    pub format_options: serde_json::Map<String, Value>,
    /// The codec, when the shards are compressed.
    pub compression: Option<String>,
    /// The shards, in row order.
    pub shards: Vec<ManifestShard>,
    /// `(name, type)` of each column, as Arrow names types; for people and tools.
    pub columns: Vec<(String, String)>,
}

impl Manifest {
    /// Rows in all shards.
    pub fn rows(&self) -> u64 {
        self.shards.iter().map(|s| s.rows).sum()
    }

    /// Bytes of all shards.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// The manifest as written to `_shardflow.json`.
    pub fn to_json(&self) -> Value {
        json!({
            "shardflow_manifest": VERSION,
            "format": self.format,
            "format_options": self.format_options,
            "compression": self.compression,
            "rows": self.rows(),
            "bytes": self.bytes(),
            "columns": self.columns.iter().map(|(name, ty)| json!({"name": name, "type": ty})).collect::<Vec<_>>(),
            "shards": self.shards.iter().map(|s| json!({"path": s.path, "rows": s.rows, "bytes": s.bytes})).collect::<Vec<_>>(),
        })
    }

    /// Parses a manifest read from `url`; anything malformed is a decode error naming it.
    pub fn parse(url: &str, text: &[u8]) -> Result<Self> {
        let bad = |message: &str| Error::decode(url, "manifest", Position::Unknown, message);
        let value: Value = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?;
        match value.get("shardflow_manifest").and_then(Value::as_u64) {
            Some(VERSION) => {}
            Some(other) => {
                return Err(bad(&format!(
                    "manifest version {other}; this shardflow reads version {VERSION}"
                )));
            }
            None => return Err(bad("not a shardflow manifest")),
        }
        let text_field = |v: &Value, key: &str| -> Result<String> {
            v.get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(&format!("{key:?} is missing or not a string")))
        };
        let count = |v: &Value, key: &str| -> Result<u64> {
            v.get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(&format!("{key:?} is missing or not a count")))
        };
        let list = |key: &str| -> Result<&Vec<Value>> {
            value
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(&format!("{key:?} is missing or not a list")))
        };
        let mut shards = Vec::new();
        for shard in list("shards")? {
            let path = text_field(shard, "path")?;
            // Names stay inside the manifest's directory.
            if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
                return Err(bad(&format!("shard path {path:?} leaves the directory")));
            }
            shards.push(ManifestShard {
                path,
                rows: count(shard, "rows")?,
                bytes: count(shard, "bytes")?,
            });
        }
        let columns = list("columns")?
            .iter()
            .map(|c| Ok((text_field(c, "name")?, text_field(c, "type")?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            format: text_field(&value, "format")?,
            format_options: value
                .get("format_options")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            compression: value
                .get("compression")
                .and_then(Value::as_str)
                .map(str::to_string),
            shards,
            columns,
        })
    }
}

/// `dir` and `name` joined with one `/` (paths and URLs alike).
pub fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The manifest of a directory or an object store's prefix, if `spec` names one that has
/// it.
/// Globs, brace ranges, single files and HTTP URLs never have one.
pub fn find(spec: &str, storage: &Arc<Storage>) -> Result<Option<Manifest>> {
    if super::pattern::is_glob(spec) || spec.contains('{') {
        return Ok(None);
    }
    let is_prefix = match super::local_path(spec) {
        Some(dir) => std::path::Path::new(dir).is_dir(),
        // An object store cannot tell a prefix from an object without asking: a last
        // segment with an extension (`chat.jsonl`) is taken for an object, so that its
        // errors (credentials, say) name it rather than a manifest beside it.
        None => {
            super::is_object_store(spec) && {
                let rest = spec.split_once("://").map_or("", |(_, rest)| rest);
                let last = rest.rsplit('/').next().unwrap_or("");
                !rest.is_empty() && (rest.ends_with('/') || !last.contains('.'))
            }
        }
    };
    if !is_prefix {
        return Ok(None);
    }
    let url = join(super::local_path(spec).unwrap_or(spec), MANIFEST_NAME);
    let meta = ShardMeta {
        url: url.clone(),
        size: None,
        etag: None,
        rows: None,
    };
    let source = super::open(&meta, storage, Arc::default())?;
    let size = match super::size_blocking(source.as_ref(), None) {
        Ok(size) => size,
        Err(Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if size > MAX_MANIFEST_BYTES {
        return Err(Error::decode(
            &url,
            "manifest",
            Position::Unknown,
            format!("{size} bytes; a manifest is at most {MAX_MANIFEST_BYTES}"),
        ));
    }
    let text = source.read_range_blocking(0..size)?;
    Manifest::parse(&url, &text).map(Some)
}

/// The shards a manifest names under `spec`, checked against the store: a shard that
/// is missing, or whose size differs from the manifest's, means the directory changed
/// after it was written, and its row counts cannot be trusted.
pub fn shards(spec: &str, manifest: &Manifest, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
    if manifest.shards.is_empty() {
        return Err(Error::NoMatch {
            pattern: format!(
                "{} (its {MANIFEST_NAME} lists no shards: the dataset written was empty)",
                spec
            ),
        });
    }
    // A prefix lists what is below it only with its trailing `/`.
    let listing = match super::is_object_store(spec) {
        true => join(spec, ""),
        false => spec.to_string(),
    };
    let listed = super::resolve(&[listing], storage).or_else(|e| match e {
        // Every shard may be gone: each is reported missing below.
        Error::NoMatch { .. } => Ok(Vec::new()),
        other => Err(other),
    })?;
    manifest
        .shards
        .iter()
        .map(|shard| {
            let url = join(spec, &shard.path);
            let url = super::local_path(&url).unwrap_or(&url).to_string();
            let found = listed.iter().find(|s| s.url == url);
            match found {
                None => Err(Error::NotFound { url }),
                Some(meta) if meta.size.is_some_and(|size| size != shard.bytes) => {
                    Err(Error::Schema {
                        url,
                        message: format!(
                            "{} bytes, but {MANIFEST_NAME} says {}: the directory changed after it was written \
                             (delete {MANIFEST_NAME} to read the files as they are)",
                            meta.size.unwrap_or_default(),
                            shard.bytes
                        ),
                    })
                }
                Some(meta) => Ok(ShardMeta {
                    rows: Some(shard.rows),
                    ..meta.clone()
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: "jsonl".into(),
            format_options: Default::default(),
            compression: Some("gzip".into()),
            shards: vec![
                ManifestShard {
                    path: "part-00000.jsonl.gz".into(),
                    rows: 10,
                    bytes: 120,
                },
                ManifestShard {
                    path: "part-00001.jsonl.gz".into(),
                    rows: 3,
                    bytes: 40,
                },
            ],
            columns: vec![("id".into(), "Int64".into())],
        }
    }

    #[test]
    fn round_trips_and_refuses_what_is_not_one() {
        let m = manifest();
        let text = serde_json::to_vec(&m.to_json()).unwrap();
        assert_eq!(Manifest::parse("m", &text).unwrap(), m);
        assert_eq!((m.rows(), m.bytes()), (13, 160));
        for bad in [
            &b"{"[..],
            br#"{"format": "jsonl"}"#,
            br#"{"shardflow_manifest": 2, "format": "jsonl", "shards": [], "columns": []}"#,
            br#"{"shardflow_manifest": 1, "format": "jsonl", "shards": [{"path": "../x", "rows": 1, "bytes": 1}], "columns": []}"#,
            br#"{"shardflow_manifest": 1, "format": "jsonl", "shards": [{"path": "x", "rows": -1, "bytes": 1}], "columns": []}"#,
        ] {
            assert!(matches!(
                Manifest::parse("m", bad),
                Err(Error::Decode { .. })
            ));
        }
    }
}
