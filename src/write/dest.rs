//! Where `write` puts shards: a local directory or a remote prefix (`s3://`, `gs://`,
//! `az://`), each file written as a stream through a [`Sink`]. A file appears under its
//! final name only when it is whole: locally it is written under a hidden temporary name
//! and renamed; remotely an object exists only once its single PUT or its upload in parts
//! (sent as they fill: see `source::upload`) completes. So a writer killed half-way
//! leaves complete shards and hidden temporaries, never a truncated shard under a
//! shard's name.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::source::retry::Failure;
use crate::source::upload::{PrefixWriter, Upload};
use crate::source::{Storage, manifest, runtime};

/// Objects larger than this go up in parts of this size (a multiple of the 256 KiB that
/// GCS's resumable uploads take).
const PART_BYTES: usize = 16 << 20;

pub enum Destination {
    Local {
        dir: PathBuf,
    },
    Remote {
        /// `scheme://bucket/prefix` without a trailing `/`.
        url: String,
        writer: Box<dyn PrefixWriter>,
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
        if let Some(path) = crate::source::local_path(dest) {
            return Ok(Destination::Local {
                dir: PathBuf::from(path),
            });
        }
        if dest
            .split_once("://")
            .is_some_and(|(_, rest)| rest.contains(['*', '?', '[', '{']))
        {
            return Err(Error::invalid_argument(format!(
                "{dest}: a write destination is a prefix, not a pattern"
            )));
        }
        Ok(Destination::Remote {
            url: dest.trim_end_matches('/').to_string(),
            writer: crate::source::writer(dest, storage)?,
            storage: storage.clone(),
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
            Destination::Remote { url: prefix, .. } => url.starts_with(&format!("{prefix}/")),
        }
    }

    /// The destination itself, for messages and the shard URLs.
    pub fn url(&self) -> String {
        match self {
            Destination::Local { dir } => dir.to_string_lossy().into_owned(),
            Destination::Remote { url, .. } => url.clone(),
        }
    }

    fn url_of(&self, name: &str) -> String {
        manifest::join(&self.url(), name)
    }

    /// Whether the destination is there already (a local directory; a remote prefix
    /// always is).
    pub fn exists(&self) -> bool {
        match self {
            Destination::Local { dir } => dir.exists(),
            Destination::Remote { .. } => true,
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

    /// Names directly in the destination (local) or under the prefix (remote).
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
            Destination::Remote { writer, .. } => self.retrying("LIST", || writer.list()),
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
            Destination::Remote { writer, .. } => self.retrying("DELETE", || writer.delete(name)),
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
            Destination::Remote { .. } => Target::Remote {
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

    fn put_object(&self, name: &str, bytes: Bytes) -> Result<()> {
        let Destination::Remote { writer, .. } = self else {
            return Err(Error::Internal("not a remote destination".into()));
        };
        self.retrying("PUT", || writer.put(name, bytes.clone()))
    }

    fn start_upload(&self, name: &str) -> Result<Parts> {
        let Destination::Remote { writer, .. } = self else {
            return Err(Error::Internal("not a remote destination".into()));
        };
        let upload = self.retrying("start an upload", || writer.start_upload(name))?;
        Ok(Parts {
            upload,
            next_part: 1,
            offset: 0,
            uploading: tokio::task::JoinSet::new(),
            parts: Vec::new(),
        })
    }

    /// Runs one request to completion on the I/O runtime, with the storage options'
    /// retries and timeout.
    fn retrying<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        T: Send,
        F: FnMut() -> Fut + Send,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>> + Send,
    {
        let Destination::Remote { storage, url, .. } = self else {
            return Err(Error::Internal("not a remote destination".into()));
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
    /// Bytes not yet sent; once they pass a part's size, an upload in parts.
    Remote {
        buffer: Vec<u8>,
        upload: Option<Parts>,
    },
}

/// An upload in parts under way: parts are sent as they fill, at most the upload's
/// `parts_in_flight()` at once.
struct Parts {
    upload: Arc<dyn Upload>,
    next_part: u32,
    /// Where the next part starts in the object.
    offset: u64,
    uploading: tokio::task::JoinSet<Result<(u32, String)>>,
    /// Parts sent: their numbers and what completing needs of each.
    parts: Vec<(u32, String)>,
}

/// One file being written as a stream (see [`Destination::create`]). It holds at most a
/// 1 MiB write buffer locally, and remotely one part being filled plus the parts in
/// flight. Dropped without [`Sink::commit`], it leaves nothing: the temporary is
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
            Target::Remote { buffer, upload } => match upload {
                None => {
                    let bytes = Bytes::from(std::mem::take(buffer));
                    self.destination.put_object(&self.name, bytes)?;
                }
                Some(_) => self.complete()?,
            },
        }
        self.committed = true;
        Ok(self.written)
    }

    /// Sends the buffer as the next part (starting the upload if needed), waiting for
    /// an earlier part first when as many as the upload takes are on their way.
    fn send_part(&mut self) -> Result<()> {
        let url = self.url();
        let Target::Remote { buffer, upload } = &mut self.target else {
            return Ok(());
        };
        let Destination::Remote { storage, .. } = self.destination else {
            return Err(Error::Internal("not a remote destination".into()));
        };
        if upload.is_none() {
            *upload = Some(self.destination.start_upload(&self.name)?);
        }
        let Some(parts) = upload else {
            return Ok(());
        };
        let rt = runtime()?;
        while parts.uploading.len() >= parts.upload.parts_in_flight() {
            if let Some(sent) = runtime::block_on_outside(rt, parts.uploading.join_next())? {
                parts.parts.push(joined(sent, &url)??);
            }
        }
        let chunk = Bytes::from(std::mem::take(buffer));
        let (number, offset) = (parts.next_part, parts.offset);
        parts.next_part += 1;
        parts.offset += chunk.len() as u64;
        let (upload, storage) = (parts.upload.clone(), storage.clone());
        parts.uploading.spawn_on(
            async move {
                let tag = retry(&storage, &url, "upload a part", || {
                    upload.send_part(number, offset, chunk.clone())
                })
                .await?;
                Ok((number, tag))
            },
            rt.handle(),
        );
        Ok(())
    }

    /// Waits for the parts on their way, sends the rest of the buffer and completes the
    /// upload.
    fn complete(&mut self) -> Result<()> {
        let url = self.url();
        let Target::Remote {
            buffer,
            upload: Some(parts),
        } = &mut self.target
        else {
            return Ok(());
        };
        let rt = runtime()?;
        while let Some(sent) = runtime::block_on_outside(rt, parts.uploading.join_next())? {
            parts.parts.push(joined(sent, &url)??);
        }
        parts.parts.sort_by_key(|(number, _)| *number);
        let last = Bytes::from(std::mem::take(buffer));
        let (upload, done, offset) = (&parts.upload, &parts.parts, parts.offset);
        self.destination.retrying("complete the upload", || {
            upload.complete(done, last.clone(), offset)
        })
    }

    fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        match &mut self.target {
            Target::Local { file, .. } => {
                std::io::Write::write_all(file, data).map_err(|e| Error::write(self.url(), e))
            }
            Target::Remote { buffer, .. } => {
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
    sent: std::result::Result<Result<(u32, String)>, tokio::task::JoinError>,
    url: &str,
) -> Result<Result<(u32, String)>> {
    sent.map_err(|e| Error::write(url, std::io::Error::other(format!("upload a part: {e}"))))
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
            Target::Remote {
                upload: Some(parts),
                ..
            } => {
                // Best effort: stores also drop abandoned uploads by their own rules.
                parts.uploading.abort_all();
                if let Ok(rt) = runtime() {
                    let _ = runtime::block_on_outside(rt, parts.upload.abort());
                }
            }
            Target::Remote { upload: None, .. } => {}
        }
    }
}
