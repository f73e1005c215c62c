//! Writing objects under a remote prefix, as `write` does: what each object store's
//! backend provides ([`PrefixWriter`], [`Upload`]) so that the writer (`write::dest`)
//! names none of them. An object appears only when whole: in one request, or as an
//! upload of parts that the store shows only once it is completed (S3's multipart
//! upload, GCS's resumable upload, Azure's block list), and that a failed write aborts.
//!
//! Each call is one try; the writer retries it (see `write::dest`).

use std::sync::Arc;

use bytes::Bytes;

use super::object::BoxFuture;
pub use super::retry::Tried;

/// The objects under one prefix (a write destination), by their names relative to it.
pub trait PrefixWriter: Send + Sync {
    /// Every name below the prefix (all pages of the listing).
    fn list(&self) -> BoxFuture<'_, Tried<Vec<String>>>;
    /// Removes `name`; one that is not there is no error.
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<()>>;
    /// Writes `name` whole in one request.
    fn put<'a>(&'a self, name: &'a str, bytes: Bytes) -> BoxFuture<'a, Tried<()>>;
    /// Starts an upload of `name` in parts.
    fn start_upload<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<Arc<dyn Upload>>>;
}

/// An upload of one object in parts, invisible until [`Upload::complete`].
pub trait Upload: Send + Sync {
    /// Parts that may be on their way at once (1 where the store takes them in order).
    fn parts_in_flight(&self) -> usize;
    /// Sends part `number` (from 1), whose first byte is the object's byte `offset`;
    /// returns what completing the upload needs to know of it (an ETag, a block id).
    fn send_part(&self, number: u32, offset: u64, bytes: Bytes) -> BoxFuture<'_, Tried<String>>;
    /// Sends `last` (the final bytes, perhaps none), from `offset`, and makes the object
    /// whole from the parts sent (`parts`: number and what sending it returned, in
    /// order).
    fn complete<'a>(
        &'a self,
        parts: &'a [(u32, String)],
        last: Bytes,
        offset: u64,
    ) -> BoxFuture<'a, Tried<()>>;
    /// Gives the upload up, so that none of it stays (best effort).
    fn abort(&self) -> BoxFuture<'_, Tried<()>>;
}

/// The keys below `key` (a destination's path in its bucket) begin with this: `key/`,
/// or nothing for a whole bucket.
pub fn key_prefix(key: &str) -> String {
    match key.trim_end_matches('/') {
        "" => String::new(),
        key => format!("{key}/"),
    }
}

/// The names of `objects` (listed below `prefix`) relative to it.
pub fn relative_names(objects: Vec<super::listing::ListedObject>, prefix: &str) -> Vec<String> {
    objects
        .into_iter()
        .filter_map(|o| o.name.strip_prefix(prefix).map(str::to_string))
        .collect()
}
