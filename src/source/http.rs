//! HTTP(S) objects: explicit URLs (brace ranges expand; there is no listing), read with
//! Range requests, and the requests of the Hub's files (see `hf`). TLS certificates are
//! verified.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_MATCH, RANGE};

use super::BoxFuture;
use super::remote::{Backend, Body, ObjectInfo, Request, Response};
use super::retry::{Failure, asked_wait, transient_status};
use super::s3::{changed, size_from_content_range};
use super::storage::Storage;
use crate::error::{Error, Result};

pub fn client(storage: &Storage) -> Result<reqwest::Client> {
    storage.client(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(storage.options.max_concurrency)
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))
    })
}

pub struct HttpBackend {
    /// Where requests go.
    url: String,
    /// How errors name the object: the URL the user sees (an `hf://` URL for the Hub).
    name: String,
    client: reqwest::Client,
    /// `Authorization` sent with every request (the Hub's token). reqwest drops it when a
    /// redirect leads to another host (the Hub's storage), as `huggingface_hub` does.
    authorization: Option<String>,
    /// Whether requests pin the object's ETag with `If-Match`. Not on the Hub: its URLs
    /// name a commit, so their bytes never change, and its redirects land on a storage
    /// host whose ETags are not the Hub's.
    pin_etag: bool,
}

impl HttpBackend {
    pub fn new(url: &str, storage: &Arc<Storage>) -> Result<Self> {
        Ok(Self {
            url: url.to_string(),
            name: url.to_string(),
            client: client(storage)?,
            authorization: None,
            pin_etag: true,
        })
    }

    /// A file of a Hub repo: `url` its `resolve` URL, `name` its `hf://` URL.
    pub fn hub(
        url: String,
        name: String,
        token: Option<&str>,
        storage: &Arc<Storage>,
    ) -> Result<Self> {
        Ok(Self {
            url,
            name,
            client: client(storage)?,
            authorization: token.map(|t| format!("Bearer {t}")),
            pin_etag: false,
        })
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, &self.url);
        match &self.authorization {
            Some(value) => builder.header(AUTHORIZATION, value),
            None => builder,
        }
    }

    fn status_failure(&self, response: &reqwest::Response) -> Failure {
        status_failure(&self.name, response)
    }
}

/// What a refusal means: not found (the Hub's `X-Error-Code` saying which of repo,
/// revision or file), denied, changed, or worth another try (after the wait a 429 asks).
pub fn status_failure(name: &str, response: &reqwest::Response) -> Failure {
    let status = response.status();
    let header = |key: &str| response.headers().get(key).and_then(|v| v.to_str().ok());
    let url = name.to_string();
    if let Some(code) = header("x-error-code")
        && matches!(status.as_u16(), 401 | 403 | 404)
        && let Some(e) = super::hf::not_found(name, code, header("x-error-message"))
    {
        return Failure::Permanent(e);
    }
    match status.as_u16() {
        404 | 410 => Failure::Permanent(Error::NotFound { url }),
        401 | 403 => Failure::Permanent(Error::PermissionDenied { url }),
        412 => Failure::Permanent(changed(name)),
        429 => match asked_wait(header("retry-after"), header("ratelimit")) {
            Some(wait) => Failure::Throttled(format!("HTTP {status}"), wait),
            None => Failure::Transient(format!("HTTP {status}")),
        },
        s if transient_status(s) => Failure::Transient(format!("HTTP {status}")),
        _ => Failure::Permanent(Error::Io {
            url,
            position: crate::error::Position::Unknown,
            source: std::io::Error::other(format!("HTTP {status}")),
        }),
    }
}

pub fn transport(e: reqwest::Error) -> Failure {
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    Failure::Transient(cause)
}

/// A body, less `skip` leading bytes (for a server that ignored our Range header).
struct HttpBody {
    response: reqwest::Response,
    skip: u64,
}

impl Body for HttpBody {
    fn next(&mut self) -> BoxFuture<'_, Option<std::result::Result<Bytes, String>>> {
        Box::pin(async move {
            loop {
                let chunk = match self.response.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => return None,
                    Err(e) => {
                        return Some(Err(match transport(e) {
                            Failure::Transient(cause) | Failure::Throttled(cause, _) => cause,
                            Failure::Permanent(e) => e.to_string(),
                        }));
                    }
                };
                if self.skip >= chunk.len() as u64 {
                    self.skip -= chunk.len() as u64;
                    continue;
                }
                let chunk = chunk.slice(self.skip as usize..);
                self.skip = 0;
                return Some(Ok(chunk));
            }
        })
    }
}

impl Backend for HttpBackend {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let response = self
                .request(reqwest::Method::HEAD)
                .send()
                .await
                .map_err(transport)?;
            if !response.status().is_success() {
                return Err(self.status_failure(&response));
            }
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
            let size = header(CONTENT_LENGTH)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    Failure::Permanent(Error::Io {
                        url: self.name.clone(),
                        position: crate::error::Position::Unknown,
                        source: std::io::Error::other(
                            "the server does not say the object's size (no Content-Length)",
                        ),
                    })
                })?;
            Ok(ObjectInfo {
                size,
                etag: header(ETAG).map(str::to_string),
            })
        })
    }

    fn get(
        &self,
        request: Request,
        if_match: Option<String>,
    ) -> BoxFuture<'_, std::result::Result<Response, Failure>> {
        Box::pin(async move {
            let Request::Range(range) = &request;
            let start = range.start;
            let mut builder = self
                .request(reqwest::Method::GET)
                .header(RANGE, request.range_header());
            if let Some(etag) = if_match.filter(|_| self.pin_etag) {
                builder = builder.header(IF_MATCH, etag);
            }
            let response = builder.send().await.map_err(transport)?;
            range_response(&self.name, response, start)
        })
    }
}

/// The reply to a GET of a range from `start`: its body, and the object's size where the
/// reply says it; a refusal as `status_failure` reads it.
pub fn range_response(
    name: &str,
    response: reqwest::Response,
    start: u64,
) -> std::result::Result<Response, Failure> {
    let status = response.status();
    let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
    let object_size = match status {
        StatusCode::PARTIAL_CONTENT => header(CONTENT_RANGE).and_then(size_from_content_range),
        StatusCode::OK => header(CONTENT_LENGTH).and_then(|v| v.parse().ok()),
        _ => return Err(status_failure(name, &response)),
    };
    // 200 means the whole object came back: skip to the part we asked for.
    let skip = if status == StatusCode::OK { start } else { 0 };
    Ok(Response {
        object_size,
        body: Box::new(HttpBody { response, skip }),
    })
}
