//! [`Backend`]: what one kind of storage (local files, S3, GCS, Azure Blob, plain
//! HTTP(S), the Hugging Face Hub) does for the loader and the writer. Each implements it in its own file, importing no other
//! backend's; `schemes` picks one by a URL's scheme.

use std::sync::Arc;

use super::object::{IoCounters, ShardMeta, Source};
use super::storage::Storage;
use super::upload::PrefixWriter;
use crate::error::Result;

/// One kind of storage.
pub trait Backend: Send + Sync {
    /// The shards one brace-expanded spec of this backend's scheme names (the spec as
    /// written, scheme included): a glob's matches, the objects below a prefix or a
    /// folder, or the one object named; sorted.
    fn list(&self, spec: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>>;

    /// Opens one shard for reading; what its listing knew (size, version) is used, not
    /// asked for again.
    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>>;

    /// Writes objects under `url`, a prefix of this backend's scheme (`scheme://bucket/
    /// prefix`); `None` where the backend cannot be written to.
    fn writer(&self, url: &str, storage: &Arc<Storage>) -> Option<Result<Box<dyn PrefixWriter>>> {
        let _ = (url, storage);
        None
    }

    /// Whether URLs name objects under prefixes that can be listed (an object store), as
    /// opposed to files (local, HTTP) or repos (the Hub).
    fn is_object_store(&self) -> bool {
        false
    }

    /// The path of the local file `url` names; `None` for remote storage.
    fn local_path<'a>(&self, url: &'a str) -> Option<&'a str> {
        let _ = url;
        None
    }
}
