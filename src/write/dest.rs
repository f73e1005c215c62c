//! Where `write` puts shards: a local directory or an `s3://` prefix, each file written
//! as a stream through a [`Sink`]. A file appears under its final name only when it is
//! whole: locally it is written under a hidden temporary name and renamed; on S3 an
//! object exists only once its single PUT or its multipart upload (parts sent as they
//! fill) completes. So a writer killed half-way leaves complete shards and
//! hidden temporaries, never a truncated shard under a shard's name.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;

use crate::error::{Error, Result};
use crate::source::retry::Failure;
use crate::source::{Storage, manifest, runtime, s3};

/// Objects larger than this go up as a multipart upload, in parts of this size.
const PART_BYTES: usize = 16 << 20;
/// Parts of one object uploaded at once.
const PARTS_IN_FLIGHT: usize = 4;

pub enum Destination {
    Local {
        dir: PathBuf,
    },
    S3 {
        /// `s3://bucket/prefix` without a trailing `/`.
        url: String,
        bucket: String,
        /// The key prefix, ending in `/` unless empty.
        prefix: String,
        storage: Arc<Storage>,
    },
}

/// Temporary names differ between processes and between files of one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether `name` is one this writer gives a shard (`part-00012.parquet`), or the
/// hidden temporary of one.
fn is_ours(name: &str) -> bool {
    let name = name.strip_prefix('.').unwrap_or(name);
    name.strip_prefix("part-").is_some_and(|rest| {
        let digits = rest.split('.').next().unwrap_or("");
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

impl Destination {
    pub fn new(dest: &str, storage: &Arc<Storage>) -> Result<Self> {
        if let Some(rest) = dest.strip_prefix("s3://") {
            let (bucket, key) = s3::split(dest)?;
            if rest.contains(['*', '?', '[', '{']) {
                return Err(Error::invalid_argument(format!(
                    "{dest}: a write destination is a prefix, not a pattern"
                )));
            }
            let key = key.trim_end_matches('/');
            return Ok(Destination::S3 {
                url: format!("s3://{bucket}/{key}")
                    .trim_end_matches('/')
                    .to_string(),
                bucket: bucket.to_string(),
                prefix: if key.is_empty() {
                    String::new()
                } else {
                    format!("{key}/")
                },
                storage: storage.clone(),
            });
        }
        if dest.contains("://") && !dest.starts_with("file://") {
            return Err(Error::invalid_argument(format!(
                "{dest}: write() writes to a local directory or an s3:// prefix"
            )));
        }
        Ok(Destination::Local {
            dir: PathBuf::from(dest.strip_prefix("file://").unwrap_or(dest)),
        })
    }

    /// Whether `url` (a shard being read) lies inside the destination.
    pub fn contains(&self, url: &str) -> bool {
        match self {
            Destination::Local { dir } => {
                let (Ok(dir), Ok(file)) = (
                    std::fs::canonicalize(dir),
                    std::fs::canonicalize(crate::source::local_path(url).unwrap_or(url)),
                ) else {
                    return false;
                };
                file.starts_with(dir)
            }
            Destination::S3 { url: prefix, .. } => url.starts_with(&format!("{prefix}/")),
        }
    }

    /// The destination itself, for messages and the shard URLs.
    pub fn url(&self) -> String {
        match self {
            Destination::Local { dir } => dir.to_string_lossy().into_owned(),
            Destination::S3 { url, .. } => url.clone(),
        }
    }

    fn url_of(&self, name: &str) -> String {
        manifest::join(&self.url(), name)
    }

    /// Whether the destination is there already (a local directory; an S3 prefix always
    /// is).
    pub fn exists(&self) -> bool {
        match self {
            Destination::Local { dir } => dir.exists(),
            Destination::S3 { .. } => true,
        }
    }

    /// Removes the local directory if it holds nothing.
    pub fn remove_if_empty(&self) {
        if let Destination::Local { dir } = self {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Makes the destination ready: refuses one that holds anything unless `overwrite`,
    /// and then removes its manifest first, so that a write that fails half-way never
    /// leaves an old manifest describing new shards. Returns the names already there.
    pub fn prepare(&self, overwrite: bool) -> Result<Vec<String>> {
        let existing = self.list()?;
        if existing.is_empty() {
            return Ok(existing);
        }
        if !overwrite {
            return Err(Error::Exists { url: self.url() });
        }
        if existing.iter().any(|n| n == manifest::MANIFEST_NAME) {
            self.remove(manifest::MANIFEST_NAME)?;
        }
        Ok(existing)
    }

    /// After a successful overwrite: removes shards of an earlier write that the new one
    /// did not replace, and temporaries that killed writers left. Other files stay.
    pub fn remove_stale(&self, existing: &[String], written: &[String]) -> Result<()> {
        for name in existing {
            if is_ours(name) && !written.contains(name) {
                self.remove(name)?;
            }
        }
        Ok(())
    }

    /// Names directly in the destination (local) or under the prefix (S3).
    fn list(&self) -> Result<Vec<String>> {
        match self {
            Destination::Local { dir } => {
                let entries = match std::fs::read_dir(dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(Error::write(self.url(), e)),
                };
                let mut names = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(|e| Error::write(self.url(), e))?;
                    names.push(entry.file_name().to_string_lossy().into_owned());
                }
                Ok(names)
            }
            Destination::S3 { .. } => {
                let (client, bucket, prefix) = self.s3_parts()?;
                let mut names = Vec::new();
                let mut token: Option<String> = None;
                loop {
                    let page = self.retrying("LIST", || {
                        let request = client
                            .list_objects_v2()
                            .bucket(bucket)
                            .prefix(prefix)
                            .set_continuation_token(token.clone());
                        async move {
                            request
                                .send()
                                .await
                                .map_err(|e| s3::failure(&self.url(), e))
                        }
                    })?;
                    names.extend(
                        page.contents()
                            .iter()
                            .filter_map(|o| o.key()?.strip_prefix(prefix).map(str::to_string)),
                    );
                    token = page.next_continuation_token().map(str::to_string);
                    if token.is_none() {
                        return Ok(names);
                    }
                }
            }
        }
    }

    fn remove(&self, name: &str) -> Result<()> {
        match self {
            Destination::Local { dir } => match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::write(self.url_of(name), e))
                }
                _ => Ok(()),
            },
            Destination::S3 { .. } => {
                let (client, bucket, prefix) = self.s3_parts()?;
                let url = self.url_of(name);
                self.retrying("DELETE", || {
                    let request = client
                        .delete_object()
                        .bucket(bucket)
                        .key(format!("{prefix}{name}"));
                    let url = url.clone();
                    async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
                })?;
                Ok(())
            }
        }
    }

    /// Writes `bytes` as `name`, whole or not at all.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<u64> {
        let mut sink = self.create(name)?;
        let failure = sink.failure();
        sink.write_all(bytes)
            .map_err(|e| failure.or(Error::write(self.url_of(name), e)))?;
        sink.commit()
    }

    /// A file `name` to write as a stream: it appears under its name, whole, only at
    /// [`Sink::commit`].
    pub fn create(&self, name: &str) -> Result<Sink<'_>> {
        let target = match self {
            Destination::Local { dir } => {
                std::fs::create_dir_all(dir).map_err(|e| Error::write(self.url(), e))?;
                let temp = dir.join(format!(
                    ".{name}.tmp-{}-{}",
                    std::process::id(),
                    TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                let file =
                    std::fs::File::create(&temp).map_err(|e| Error::write(self.url_of(name), e))?;
                Target::Local {
                    file: std::io::BufWriter::with_capacity(1 << 20, file),
                    temp,
                    path: dir.join(name),
                }
            }
            Destination::S3 { .. } => Target::S3 {
                buffer: Vec::new(),
                upload: None,
            },
        };
        Ok(Sink {
            destination: self,
            name: name.to_string(),
            written: 0,
            target,
            failure: SinkFailure::default(),
            committed: false,
        })
    }

    fn s3_parts(&self) -> Result<(aws_sdk_s3::Client, &str, &str)> {
        match self {
            Destination::S3 {
                bucket,
                prefix,
                storage,
                ..
            } => Ok((s3::client(storage)?, bucket, prefix)),
            Destination::Local { .. } => Err(Error::Internal("not an S3 destination".into())),
        }
    }

    fn bucket(&self) -> Result<&str> {
        match self {
            Destination::S3 { bucket, .. } => Ok(bucket),
            Destination::Local { .. } => Err(Error::Internal("not an S3 destination".into())),
        }
    }

    fn put_object(&self, name: &str, bytes: Bytes) -> Result<()> {
        let (client, bucket, prefix) = self.s3_parts()?;
        let url = self.url_of(name);
        self.retrying("PUT", || {
            let request = client
                .put_object()
                .bucket(bucket)
                .key(format!("{prefix}{name}"))
                .body(ByteStream::from(bytes.clone()));
            let url = url.clone();
            async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
        })?;
        Ok(())
    }

    fn start_upload(&self, name: &str) -> Result<Multipart> {
        let (client, bucket, prefix) = self.s3_parts()?;
        let key = format!("{prefix}{name}");
        let url = self.url_of(name);
        let created = self.retrying("CreateMultipartUpload", || {
            let request = client.create_multipart_upload().bucket(bucket).key(&key);
            let url = url.clone();
            async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
        })?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| Error::write(&url, std::io::Error::other("no upload id in the reply")))?
            .to_string();
        Ok(Multipart {
            client,
            key,
            upload_id,
            next_part: 1,
            uploading: tokio::task::JoinSet::new(),
            parts: Vec::new(),
        })
    }

    /// Runs one S3 request to completion on the I/O runtime, with the storage options'
    /// retries and timeout.
    fn retrying<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        T: Send,
        F: FnMut() -> Fut + Send,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>> + Send,
    {
        let Destination::S3 { storage, url, .. } = self else {
            return Err(Error::Internal("not an S3 destination".into()));
        };
        runtime::block_on_outside(runtime()?, retry(storage, url, what, attempt))?
    }
}

/// Tries `attempt` until it succeeds, fails for good, or runs out of the storage
/// options' tries; each try is bounded by their timeout.
async fn retry<T, F, Fut>(storage: &Storage, url: &str, what: &str, attempt: F) -> Result<T>
where
    T: Send,
    F: FnMut() -> Fut + Send,
    Fut: std::future::Future<Output = std::result::Result<T, Failure>> + Send,
{
    let options = &storage.options;
    crate::source::retry::retrying(options.retry, options.timeout, attempt, |cause, tries| {
        Error::write(
            url,
            std::io::Error::other(format!("{what} failed after {tries} attempts: {cause}")),
        )
    })
    .await
}

/// Where a [`Sink`]'s bytes go until it is committed.
enum Target {
    /// A hidden temporary, renamed to the file's name (`path`) at commit.
    Local {
        file: std::io::BufWriter<std::fs::File>,
        temp: PathBuf,
        path: PathBuf,
    },
    /// Bytes not yet sent; once they pass a part's size, a multipart upload.
    S3 {
        buffer: Vec<u8>,
        upload: Option<Multipart>,
    },
}

/// A multipart upload under way: parts are sent as they fill, at most
/// `PARTS_IN_FLIGHT` at once.
struct Multipart {
    client: aws_sdk_s3::Client,
    key: String,
    upload_id: String,
    next_part: i32,
    uploading: tokio::task::JoinSet<Result<CompletedPart>>,
    parts: Vec<CompletedPart>,
}

/// One file being written as a stream (see [`Destination::create`]). It holds at most a
/// 1 MiB write buffer locally, and on S3 one part being filled plus `PARTS_IN_FLIGHT`
/// being sent. Dropped without [`Sink::commit`], it leaves nothing: the temporary is
/// removed, the multipart upload aborted.
pub struct Sink<'a> {
    destination: &'a Destination,
    name: String,
    written: u64,
    target: Target,
    failure: SinkFailure,
    committed: bool,
}

impl Sink<'_> {
    fn url(&self) -> String {
        self.destination.url_of(&self.name)
    }

    /// A handle on the sink's first failure, for whoever holds the sink inside an encoder.
    pub fn failure(&self) -> SinkFailure {
        self.failure.clone()
    }

    /// Makes the file whole under its name; returns its size.
    pub fn commit(mut self) -> Result<u64> {
        let url = self.url();
        match &mut self.target {
            Target::Local { file, temp, path } => {
                // On disk before it is renamed: after a crash, a name is whole or absent.
                std::io::Write::flush(file)
                    .and_then(|()| file.get_ref().sync_all())
                    .and_then(|()| std::fs::rename(&*temp, &*path))
                    .map_err(|e| Error::write(&url, e))?;
            }
            Target::S3 { buffer, upload } => match upload {
                None => {
                    let bytes = Bytes::from(std::mem::take(buffer));
                    self.destination.put_object(&self.name, bytes)?;
                }
                Some(_) => {
                    self.send_part()?;
                    self.complete()?;
                }
            },
        }
        self.committed = true;
        Ok(self.written)
    }

    /// Sends the buffer as the next part (starting the upload if needed), waiting for
    /// an earlier part first when `PARTS_IN_FLIGHT` are on their way.
    fn send_part(&mut self) -> Result<()> {
        let url = self.url();
        let Target::S3 { buffer, upload } = &mut self.target else {
            return Ok(());
        };
        let Destination::S3 { storage, .. } = self.destination else {
            return Err(Error::Internal("not an S3 destination".into()));
        };
        if upload.is_none() {
            *upload = Some(self.destination.start_upload(&self.name)?);
        }
        let Some(upload) = upload else {
            return Ok(());
        };
        let rt = runtime()?;
        while upload.uploading.len() >= PARTS_IN_FLIGHT {
            if let Some(sent) = runtime::block_on_outside(rt, upload.uploading.join_next())? {
                upload.parts.push(joined(sent, &url)??);
            }
        }
        // S3 takes a last part of any size, but none of zero bytes after the first.
        if buffer.is_empty() && upload.next_part > 1 {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(buffer));
        let number = upload.next_part;
        upload.next_part += 1;
        let (client, storage) = (upload.client.clone(), storage.clone());
        let (bucket, key, upload_id) = (
            self.destination.bucket()?.to_string(),
            upload.key.clone(),
            upload.upload_id.clone(),
        );
        upload.uploading.spawn_on(
            async move {
                let sent = retry(&storage, &url, "UploadPart", || {
                    let request = client
                        .upload_part()
                        .bucket(&bucket)
                        .key(&key)
                        .upload_id(&upload_id)
                        .part_number(number)
                        .body(ByteStream::from(chunk.clone()));
                    let url = url.clone();
                    async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
                })
                .await?;
                Ok(CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(sent.e_tag().map(str::to_string))
                    .build())
            },
            rt.handle(),
        );
        Ok(())
    }

    /// Waits for the parts on their way and completes the upload.
    fn complete(&mut self) -> Result<()> {
        let url = self.url();
        let Target::S3 {
            upload: Some(upload),
            ..
        } = &mut self.target
        else {
            return Ok(());
        };
        let rt = runtime()?;
        while let Some(sent) = runtime::block_on_outside(rt, upload.uploading.join_next())? {
            upload.parts.push(joined(sent, &url)??);
        }
        upload.parts.sort_by_key(|p| p.part_number());
        let (client, key, upload_id) = (&upload.client, &upload.key, &upload.upload_id);
        let parts = upload.parts.clone();
        let bucket = self.destination.bucket()?;
        self.destination
            .retrying("CompleteMultipartUpload", || {
                let request = client
                    .complete_multipart_upload()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts.clone()))
                            .build(),
                    );
                let url = url.clone();
                async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
            })
            .map(drop)
    }

    fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        match &mut self.target {
            Target::Local { file, .. } => {
                std::io::Write::write_all(file, data).map_err(|e| Error::write(self.url(), e))
            }
            Target::S3 { buffer, .. } => {
                buffer.extend_from_slice(data);
                if buffer.len() >= PART_BYTES {
                    self.send_part()?;
                }
                Ok(())
            }
        }
    }
}

/// The first failure of a [`Sink`], kept whole: an encoder writing to it sees only the
/// message an `io::Error` carries.
#[derive(Clone, Default)]
pub struct SinkFailure(Arc<Mutex<Option<Error>>>);

impl SinkFailure {
    /// The sink's failure if it had one (the cause of `error`), else `error`.
    pub fn or(&self, error: Error) -> Error {
        self.slot().take().unwrap_or(error)
    }

    fn set(&self, error: Error) {
        self.slot().get_or_insert(error);
    }

    fn is_set(&self) -> bool {
        self.slot().is_some()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Error>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A part upload's outcome, or why its task ended without one.
fn joined(
    sent: std::result::Result<Result<CompletedPart>, tokio::task::JoinError>,
    url: &str,
) -> Result<Result<CompletedPart>> {
    sent.map_err(|e| Error::write(url, std::io::Error::other(format!("UploadPart: {e}"))))
}

impl std::io::Write for Sink<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.failure.is_set() {
            return Err(std::io::Error::other("an earlier write failed"));
        }
        match self.write_bytes(data) {
            Ok(()) => {
                self.written += data.len() as u64;
                Ok(data.len())
            }
            Err(e) => {
                let message = e.to_string();
                self.failure.set(e);
                Err(std::io::Error::other(message))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Bytes go out as parts fill and at commit; a flush promises nothing sooner.
        Ok(())
    }
}

impl Drop for Sink<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        match &mut self.target {
            Target::Local { temp, .. } => {
                let _ = std::fs::remove_file(&*temp);
            }
            Target::S3 {
                upload: Some(upload),
                ..
            } => {
                // Best effort: the store also expires abandoned uploads by its own rules.
                upload.uploading.abort_all();
                if let (Ok(bucket), Ok(rt)) = (self.destination.bucket(), runtime()) {
                    let abort = upload
                        .client
                        .abort_multipart_upload()
                        .bucket(bucket)
                        .key(&upload.key)
                        .upload_id(&upload.upload_id);
                    let _ = runtime::block_on_outside(rt, abort.send());
                }
            }
            Target::S3 { upload: None, .. } => {}
        }
    }
}
