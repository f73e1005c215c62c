//! Google Cloud Storage (`gs://bucket/key`) over its JSON API, on the shared transport:
//! listing with pagination, reads pinned to the object's generation, writes with single
//! and resumable uploads.
//!
//! - **Versions.** An object's version is its `generation`: listings record it, every
//!   ranged GET asks for it (`generation=`), so an object replaced mid-epoch is an error
//!   naming it (GCS answers 404 for a generation no longer live), never bytes of two
//!   versions; the disk cache is keyed by it.
//! - **Encoding.** Reads send `Accept-Encoding: gzip`: without it GCS ignores `Range` on
//!   objects stored with `Content-Encoding: gzip` and serves them decompressed. With it,
//!   the stored bytes come back, as the listing's size counts them.
//! - **Credentials**, in Application Default Credentials order: `storage_options["token"]`
//!   (a credentials file, `"anon"`, `"google_default"` or `"cloud"`), else
//!   `GOOGLE_APPLICATION_CREDENTIALS` (a service account's key, signing its own JWTs, or
//!   an authorized user's refresh token), gcloud's `application_default_credentials.json`,
//!   the metadata server (`GCE_METADATA_HOST` respected), then anonymous requests for
//!   public buckets. `STORAGE_EMULATOR_HOST` points requests at an emulator and, with no
//!   token given, makes them anonymous, as gcsfs does. The chain and its token refreshes
//!   are the `object_store` crate's; requests, retries, ranges and the cache are ours.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use object_store::gcp::{GcpCredentialProvider, GoogleCloudStorageBuilder};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, RANGE};

use super::backend::Backend;
use super::listing::{ListedObject, list_spec, split_bucket};
use super::object::{BoxFuture, IoCounters, ShardMeta, Source};
use super::remote::{ObjectInfo, ObjectRequests, Request, Response, open_shard};
use super::retry::Failure;
use super::storage::Storage;
use super::transport::{range_response, status_failure, succeeded, transport_failure};
use super::upload::{PrefixWriter, Tried, Upload, key_prefix, relative_names};
use crate::error::{Error, Position, Result};

/// The JSON API's address when no emulator or endpoint is given.
const GOOGLE_APIS: &str = "https://storage.googleapis.com";

/// Objects a listing page holds (GCS's largest).
const PAGE_SIZE: u32 = 1000;

/// What an object name keeps unescaped in a URL path segment or a query value (RFC 3986's
/// unreserved characters): a `/` in a name is escaped, as the JSON API wants.
const NAME: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn escape(text: &str) -> String {
    utf8_percent_encode(text, NAME).to_string()
}

/// `gs://bucket/name` split in two.
fn split(url: &str) -> Result<(&str, &str)> {
    split_bucket(url, "gs")
}

/// This process's GCS client for one dataset.
#[derive(Clone)]
struct GcsClients(Arc<Clients>);

struct Clients {
    /// Our own client, not the transport's: GCS answers a resumable upload's parts with
    /// 308, which must not be followed as a redirect.
    http: reqwest::Client,
    /// `scheme://host[:port]` of the JSON API.
    base: String,
    /// `None`: anonymous requests.
    credentials: Option<GcpCredentialProvider>,
    /// Whether a failure to get a token means anonymous requests (the chain ended at the
    /// metadata server, and no credentials were named).
    anonymous_if_none: bool,
    /// The metadata server did not answer: requests go anonymous from then on.
    fell_back: AtomicBool,
    /// `userProject=` on every request (requester-pays buckets).
    user_project: Option<String>,
}

/// The dataset's GCS client (built on first use, and again in a forked child).
fn clients(storage: &Storage) -> Result<GcsClients> {
    storage.client(|| {
        let options = &storage.options;
        let emulator = std::env::var("STORAGE_EMULATOR_HOST")
            .ok()
            .filter(|h| !h.is_empty());
        let base = match options.endpoint_url.as_deref().or(emulator.as_deref()) {
            Some(url) if url.contains("://") => url.trim_end_matches('/').to_string(),
            Some(host) => format!("http://{}", host.trim_end_matches('/')),
            None => GOOGLE_APIS.to_string(),
        };
        let token = options.gcs_token.as_deref();
        let anonymous = options.anonymous
            || token == Some("anon")
            || (token.is_none() && emulator.is_some() && options.endpoint_url.is_none());
        let named = token.is_some_and(|t| !matches!(t, "google_default" | "cloud"))
            || std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_some();
        let credentials = if anonymous {
            None
        } else {
            Some(credential_chain(token, options.timeout)?)
        };
        let user_project = match (&options.gcs_project, options.requester_pays) {
            (Some(project), true) => Some(project.clone()),
            (None, true) => {
                return Err(Error::invalid_argument(
                    "storage_options[\"requester_pays\"] needs storage_options[\"project\"], the project to bill",
                ));
            }
            _ => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(options.max_concurrency)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))?;
        Ok(GcsClients(Arc::new(Clients {
            http,
            base,
            credentials,
            anonymous_if_none: !named,
            fell_back: AtomicBool::new(false),
            user_project,
        })))
    })
}

/// The Application Default Credentials chain, or the one link `token` names.
fn credential_chain(token: Option<&str>, timeout: Duration) -> Result<GcpCredentialProvider> {
    let mut builder = match token {
        // Only the metadata server: no environment, no gcloud file.
        Some("cloud") => GoogleCloudStorageBuilder::new(),
        _ => GoogleCloudStorageBuilder::from_env(),
    };
    if let Some(path) = token.filter(|t| !matches!(*t, "google_default" | "cloud")) {
        builder = builder.with_application_credentials(path);
    }
    let retry = object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: timeout,
        ..Default::default()
    };
    let gcs = builder
        // The builder wants a bucket; only its credentials are used.
        .with_bucket_name("credentials")
        .with_retry(retry)
        .with_client_options(object_store::ClientOptions::new().with_timeout(timeout))
        .build()
        .map_err(|e| {
            Error::invalid_argument(format!(
                "GCS credentials: {}",
                super::transport::short_cause(&e)
            ))
        })?;
    Ok(gcs.credentials().clone())
}

impl GcsClients {
    /// The `Authorization` to send, if any.
    async fn authorization(&self) -> Tried<Option<String>> {
        let inner = &self.0;
        let Some(credentials) = &inner.credentials else {
            return Ok(None);
        };
        if inner.fell_back.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match credentials.get_credential().await {
            Ok(credential) if credential.bearer.is_empty() => Ok(None),
            Ok(credential) => Ok(Some(format!("Bearer {}", credential.bearer))),
            Err(_) if inner.anonymous_if_none => {
                inner.fell_back.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(Failure::Transient(format!(
                "no GCS token: {}",
                super::transport::short_cause(&e)
            ))),
        }
    }

    /// A request to the JSON API, `path_and_query` after the host, authorized.
    async fn request(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
    ) -> Tried<reqwest::RequestBuilder> {
        let mut url = format!("{}{path_and_query}", self.0.base);
        if let Some(project) = &self.0.user_project {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!("userProject={}", escape(project)));
        }
        self.authorized(self.0.http.request(method, url)).await
    }

    async fn authorized(&self, builder: reqwest::RequestBuilder) -> Tried<reqwest::RequestBuilder> {
        Ok(match self.authorization().await? {
            Some(value) => builder.header(AUTHORIZATION, value),
            None => builder,
        })
    }

    /// One page of the objects whose names start with `prefix`, and the next page's
    /// token.
    async fn list_page(
        &self,
        url: &str,
        bucket: &str,
        prefix: &str,
        token: Option<&str>,
    ) -> Tried<(Vec<ListedObject>, Option<String>)> {
        let mut query = format!(
            "/storage/v1/b/{}/o?prefix={}&maxResults={PAGE_SIZE}&fields=items(name,size,generation),nextPageToken",
            escape(bucket),
            escape(prefix)
        );
        if let Some(token) = token {
            query.push_str(&format!("&pageToken={}", escape(token)));
        }
        let response = self
            .request(reqwest::Method::GET, &query)
            .await?
            .send()
            .await
            .map_err(transport_failure)?;
        let page = json_reply(url, response).await?;
        let mut objects = Vec::new();
        for item in page["items"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let (Some(name), Some(size), Some(generation)) = (
                item["name"].as_str(),
                number(&item["size"]),
                item["generation"].as_str(),
            ) else {
                return Err(bad_reply(
                    url,
                    "a listed object lacks its name, size or generation",
                ));
            };
            objects.push(ListedObject {
                name: name.to_string(),
                size: Some(size),
                version: Some(generation.to_string()),
            });
        }
        Ok((objects, page["nextPageToken"].as_str().map(str::to_string)))
    }

    /// Every object whose name starts with `prefix`.
    async fn list_all(&self, url: &str, bucket: &str, prefix: &str) -> Tried<Vec<ListedObject>> {
        let mut objects = Vec::new();
        let mut token = None;
        loop {
            let (page, next) = self
                .list_page(url, bucket, prefix, token.as_deref())
                .await?;
            objects.extend(page);
            match next {
                Some(next) => token = Some(next),
                None => return Ok(objects),
            }
        }
    }
}

/// The JSON API gives 64-bit numbers as strings.
fn number(value: &serde_json::Value) -> Option<u64> {
    value.as_str()?.parse().ok()
}

fn bad_reply(url: &str, what: &str) -> Failure {
    Failure::Permanent(Error::Io {
        url: url.into(),
        position: Position::Unknown,
        source: std::io::Error::other(format!("GCS answered oddly: {what}")),
    })
}

/// A successful reply's JSON body, or what the refusal means.
async fn json_reply(url: &str, response: reqwest::Response) -> Tried<serde_json::Value> {
    if !response.status().is_success() {
        return Err(status_failure(url, &response, None));
    }
    let body = response.bytes().await.map_err(transport_failure)?;
    serde_json::from_slice(&body).map_err(|_| bad_reply(url, "not JSON"))
}

/// The requests of one object.
struct GcsObject {
    url: String,
    /// `/storage/v1/b/<bucket>/o/<name>`, escaped.
    path: String,
    clients: GcsClients,
}

impl GcsObject {
    fn new(url: &str, storage: &Storage) -> Result<Self> {
        let (bucket, name) = split(url)?;
        if name.is_empty() {
            return Err(Error::invalid_argument(format!(
                "{url}: expected gs://bucket/name"
            )));
        }
        Ok(Self {
            url: url.to_string(),
            path: format!("/storage/v1/b/{}/o/{}", escape(bucket), escape(name)),
            clients: clients(storage)?,
        })
    }
}

impl ObjectRequests for GcsObject {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let query = format!("{}?fields=size,generation", self.path);
            let response = self
                .clients
                .request(reqwest::Method::GET, &query)
                .await?
                .send()
                .await
                .map_err(transport_failure)?;
            let object = json_reply(&self.url, response).await?;
            match (number(&object["size"]), object["generation"].as_str()) {
                (Some(size), Some(generation)) => Ok(ObjectInfo {
                    size,
                    etag: Some(generation.to_string()),
                }),
                _ => Err(bad_reply(&self.url, "no size or generation")),
            }
        })
    }

    /// `if_match` is the generation to read.
    fn get(
        &self,
        request: Request,
        if_match: Option<String>,
    ) -> BoxFuture<'_, std::result::Result<Response, Failure>> {
        Box::pin(async move {
            let Request::Range(range) = &request;
            let mut query = format!("{}?alt=media", self.path);
            if let Some(generation) = &if_match {
                query.push_str(&format!("&generation={}", escape(generation)));
            }
            let response = self
                .clients
                .request(reqwest::Method::GET, &query)
                .await?
                .header(RANGE, request.range_header())
                .header(ACCEPT_ENCODING, "gzip")
                .send()
                .await
                .map_err(transport_failure)?;
            if response.status() == reqwest::StatusCode::NOT_FOUND
                && let Some(generation) = if_match
            {
                // The generation read so far is no longer live: the object was replaced
                // or deleted.
                return Err(Failure::Permanent(Error::Io {
                    url: self.url.clone(),
                    position: Position::Byte(range.start),
                    source: std::io::Error::other(format!(
                        "the object changed while it was being read (generation {generation} is gone)"
                    )),
                }));
            }
            range_response(&self.url, response, range.start, None)
        })
    }
}

/// `gs://bucket/name` URLs.
pub struct Gcs;

impl Backend for Gcs {
    fn is_object_store(&self) -> bool {
        true
    }

    /// `gs://bucket/prefix...`: a glob's matches, everything below a prefix ending in `/`,
    /// or the one object named. Sizes and generations come from the listing.
    fn list(&self, spec: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        let (bucket, name) = split(spec)?;
        list_spec(
            spec,
            name,
            || {
                let object = GcsObject::new(spec, storage)?;
                Ok(async move { object.head().await })
            },
            |prefix| {
                let clients = clients(storage)?;
                Ok(async move { clients.list_all(spec, bucket, &prefix).await })
            },
            |name| format!("gs://{bucket}/{name}"),
        )
    }

    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let object = GcsObject::new(&shard.url, storage)?;
        Ok(open_shard(shard, Box::new(object), storage, counters))
    }

    fn writer(&self, url: &str, storage: &Arc<Storage>) -> Option<Result<Box<dyn PrefixWriter>>> {
        Some(split(url).and_then(|(bucket, name)| {
            Ok(Box::new(GcsWriter {
                url: url.trim_end_matches('/').to_string(),
                bucket: bucket.to_string(),
                prefix: key_prefix(name),
                clients: clients(storage)?,
            }) as Box<dyn PrefixWriter>)
        }))
    }
}

/// Objects written under a prefix: single uploads, and resumable uploads in parts.
struct GcsWriter {
    url: String,
    bucket: String,
    /// Names below the destination begin with this.
    prefix: String,
    clients: GcsClients,
}

impl GcsWriter {
    fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    fn upload_query(&self, kind: &str, name: &str) -> String {
        format!(
            "/upload/storage/v1/b/{}/o?uploadType={kind}&name={}",
            escape(&self.bucket),
            escape(&format!("{}{name}", self.prefix))
        )
    }
}

impl PrefixWriter for GcsWriter {
    fn list(&self) -> BoxFuture<'_, Tried<Vec<String>>> {
        Box::pin(async move {
            let objects = self
                .clients
                .list_all(&self.url, &self.bucket, &self.prefix)
                .await?;
            Ok(relative_names(objects, &self.prefix))
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            let path = format!(
                "/storage/v1/b/{}/o/{}",
                escape(&self.bucket),
                escape(&format!("{}{name}", self.prefix))
            );
            let response = self
                .clients
                .request(reqwest::Method::DELETE, &path)
                .await?
                .send()
                .await
                .map_err(transport_failure)?;
            if response.status() == reqwest::StatusCode::NOT_FOUND {
                return Ok(());
            }
            succeeded(&self.url_of(name), &response)
        })
    }

    fn put<'a>(&'a self, name: &'a str, bytes: Bytes) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            let response = self
                .clients
                .request(reqwest::Method::POST, &self.upload_query("media", name))
                .await?
                .header(CONTENT_LENGTH, bytes.len())
                .body(bytes)
                .send()
                .await
                .map_err(transport_failure)?;
            succeeded(&self.url_of(name), &response)
        })
    }

    fn start_upload<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<Arc<dyn Upload>>> {
        Box::pin(async move {
            let url = self.url_of(name);
            let response = self
                .clients
                .request(reqwest::Method::POST, &self.upload_query("resumable", name))
                .await?
                .header(CONTENT_LENGTH, 0)
                .send()
                .await
                .map_err(transport_failure)?;
            succeeded(&url, &response)?;
            let session = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| bad_reply(&url, "no upload session (Location) in the reply"))?
                .to_string();
            Ok(Arc::new(ResumableUpload {
                session,
                url,
                clients: self.clients.clone(),
            }) as Arc<dyn Upload>)
        })
    }
}

/// A resumable upload: parts go up in order to the session's URL, each with the byte
/// range it holds; the object appears when the last says the total size.
struct ResumableUpload {
    session: String,
    url: String,
    clients: GcsClients,
}

impl ResumableUpload {
    async fn send(&self, bytes: Bytes, range: String) -> Tried<reqwest::Response> {
        self.clients
            .authorized(self.clients.0.http.put(&self.session))
            .await?
            .header(CONTENT_RANGE, range)
            .header(CONTENT_LENGTH, bytes.len())
            .body(bytes)
            .send()
            .await
            .map_err(transport_failure)
    }
}

impl Upload for ResumableUpload {
    fn parts_in_flight(&self) -> usize {
        1
    }

    fn send_part(&self, _number: u32, offset: u64, bytes: Bytes) -> BoxFuture<'_, Tried<String>> {
        Box::pin(async move {
            if bytes.is_empty() {
                return Ok(String::new()); // nothing to send: the session stays where it is
            }
            let range = format!("bytes {offset}-{}/*", offset + bytes.len() as u64 - 1);
            let response = self.send(bytes, range).await?;
            // 308: the part is kept, more to come.
            if response.status().as_u16() == 308 {
                return Ok(String::new());
            }
            Err(match succeeded(&self.url, &response) {
                Err(failure) => failure,
                Ok(()) => bad_reply(&self.url, "the upload ended before its last part"),
            })
        })
    }

    fn complete<'a>(
        &'a self,
        _parts: &'a [(u32, String)],
        last: Bytes,
        offset: u64,
    ) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            let total = offset + last.len() as u64;
            let range = match last.len() {
                0 => format!("bytes */{total}"),
                n => format!("bytes {offset}-{}/{total}", offset + n as u64 - 1),
            };
            let response = self.send(last, range).await?;
            succeeded(&self.url, &response)
        })
    }

    fn abort(&self) -> BoxFuture<'_, Tried<()>> {
        Box::pin(async move {
            // GCS answers 499 to a cancelled session: any answer means it is gone.
            self.clients
                .authorized(self.clients.0.http.delete(&self.session))
                .await?
                .header(CONTENT_LENGTH, 0)
                .send()
                .await
                .map_err(transport_failure)
                .map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_whole() {
        assert_eq!(escape("a/b c~_.-"), "a%2Fb%20c~_.-");
    }
}
