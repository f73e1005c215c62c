//! HTTP(S) objects: explicit URLs (brace ranges expand; there is no listing), read with
//! Range requests through the transport's [`HttpObject`], their ETag pinned.

use std::sync::Arc;

use super::backend::Backend;
use super::object::{IoCounters, ShardMeta, Source};
use super::remote::open_shard;
use super::storage::Storage;
use super::transport::HttpObject;
use crate::error::{Error, Result};

/// `http://` and `https://` URLs.
pub struct Http;

impl Backend for Http {
    /// The URL itself: HTTP servers cannot be listed, so a glob is an error.
    fn list(&self, spec: &str, _storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        if spec.contains('*') {
            return Err(Error::invalid_argument(format!(
                "{spec}: HTTP servers cannot be listed; name the files (brace ranges like {{000..099}} work)"
            )));
        }
        Ok(vec![ShardMeta {
            url: spec.to_string(),
            size: None,
            etag: None,
            rows: None,
        }])
    }

    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let object = HttpObject::new(&shard.url, storage)?;
        Ok(open_shard(shard, Box::new(object), storage, counters))
    }
}
