//! Where `write` puts shards: a local directory or an `s3://` prefix. A file appears
//! under its final name only when it is whole: locally it is written under a hidden
//! temporary name and renamed; on S3 an object exists only once its single PUT or its
//! multipart upload completes. So a writer killed half-way leaves complete shards and
//! hidden temporaries, never a truncated shard under a shard's name.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Destination::Local { dir } => {
                let url = self.url_of(name);
                std::fs::create_dir_all(dir).map_err(|e| Error::write(self.url(), e))?;
                let temp = dir.join(format!(
                    ".{name}.tmp-{}-{}",
                    std::process::id(),
                    TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                // On disk before it is renamed: after a crash, a name is whole or absent.
                let written = std::fs::File::create(&temp)
                    .and_then(|mut file| {
                        std::io::Write::write_all(&mut file, &bytes)?;
                        file.sync_all()
                    })
                    .and_then(|()| std::fs::rename(&temp, dir.join(name)));
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&temp);
                    return Err(Error::write(url, e));
                }
                Ok(())
            }
            Destination::S3 { .. } if bytes.len() <= PART_BYTES => {
                self.put_object(name, bytes.into())
            }
            Destination::S3 { .. } => self.put_multipart(name, bytes.into()),
        }
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

    /// A large object in parts, several in flight; aborted on failure, so no partial
    /// object and no stored parts are left behind.
    fn put_multipart(&self, name: &str, bytes: Bytes) -> Result<()> {
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
        let uploaded = self.upload_parts(&client, bucket, &key, &upload_id, &url, &bytes);
        let completed = uploaded.and_then(|parts| {
            self.retrying("CompleteMultipartUpload", || {
                let request = client
                    .complete_multipart_upload()
                    .bucket(bucket)
                    .key(&key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts.clone()))
                            .build(),
                    );
                let url = url.clone();
                async move { request.send().await.map_err(|e| s3::failure(&url, e)) }
            })
        });
        if let Err(error) = completed {
            // Best effort: the store also expires abandoned uploads by its own rules.
            let abort = client
                .abort_multipart_upload()
                .bucket(bucket)
                .key(&key)
                .upload_id(&upload_id);
            let _ = runtime::block_on_outside(runtime()?, abort.send());
            return Err(error);
        }
        Ok(())
    }

    fn upload_parts(
        &self,
        client: &aws_sdk_s3::Client,
        bucket: &str,
        key: &str,
        upload_id: &str,
        url: &str,
        bytes: &Bytes,
    ) -> Result<Vec<CompletedPart>> {
        let Destination::S3 { storage, .. } = self else {
            return Err(Error::Internal("not an S3 destination".into()));
        };
        let rt = runtime()?;
        let starts: Vec<usize> = (0..bytes.len()).step_by(PART_BYTES).collect();
        let mut parts = Vec::with_capacity(starts.len());
        for group in starts.chunks(PARTS_IN_FLIGHT) {
            let mut uploads = tokio::task::JoinSet::new();
            for &start in group {
                let number = (start / PART_BYTES) as i32 + 1;
                let chunk = bytes.slice(start..(start + PART_BYTES).min(bytes.len()));
                let (client, storage, url) = (client.clone(), storage.clone(), url.to_string());
                let (bucket, key, upload_id) =
                    (bucket.to_string(), key.to_string(), upload_id.to_string());
                uploads.spawn_on(
                    async move {
                        let uploaded = retry(&storage, &url, "UploadPart", || {
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
                        Ok::<_, Error>(
                            CompletedPart::builder()
                                .part_number(number)
                                .set_e_tag(uploaded.e_tag().map(str::to_string))
                                .build(),
                        )
                    },
                    rt.handle(),
                );
            }
            let done = runtime::block_on_outside(rt, uploads.join_all())?;
            for part in done {
                parts.push(part?);
            }
        }
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
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
