//! The one HTTP transport every remote backend uses: the dataset's reqwest client, what
//! a refusal or a failed request means to the retry loop, range responses and their
//! bodies, and [`HttpObject`], one object read with range GETs (a plain `http(s)://`
//! URL, a Hub file). TLS certificates are verified. It names no backend: a service that
//! says more in its own error headers (the Hub's `X-Error-Code`) passes its reading of
//! them in as [`ErrorCodes`].

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_MATCH, RANGE};

use super::object::BoxFuture;
use super::remote::{Body, ObjectInfo, ObjectRequests, Request, Response};
use super::retry::{Failure, asked_wait, transient_status};
use super::storage::Storage;
use crate::error::{Error, Result};

/// The dataset's HTTP client (built on first use, and again in a forked child).
pub fn client(storage: &Storage) -> Result<reqwest::Client> {
    storage.client(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(storage.options.max_concurrency)
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))
    })
}

/// A service's reading of its own error headers: the error for a refusal whose
/// `X-Error-Code` is `code` (with its `X-Error-Message`), for the object `name`; `None`
/// for codes that mean something else.
pub type ErrorCodes = fn(name: &str, code: &str, message: Option<&str>) -> Option<Error>;

/// One object read over HTTP range GETs.
pub struct HttpObject {
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
    /// What the service's `X-Error-Code` says of a 401, 403 or 404 (see [`status_failure`]).
    error_codes: Option<ErrorCodes>,
}

impl HttpObject {
    /// `url`, named by itself in errors, sent without `Authorization`, its ETag pinned.
    pub fn new(url: &str, storage: &Storage) -> Result<Self> {
        Ok(Self {
            url: url.to_string(),
            name: url.to_string(),
            client: client(storage)?,
            authorization: None,
            pin_etag: true,
            error_codes: None,
        })
    }

    /// Errors name the object `name` rather than the URL requests go to.
    pub fn named(mut self, name: String) -> Self {
        self.name = name;
        self
    }

    /// Sends `value` as every request's `Authorization`.
    pub fn authorization(mut self, value: Option<String>) -> Self {
        self.authorization = value;
        self
    }

    /// Requests do not pin the ETag (for URLs whose bytes never change).
    pub fn unpinned(mut self) -> Self {
        self.pin_etag = false;
        self
    }

    /// Refusals are read with the service's `X-Error-Code` first.
    pub fn error_codes(mut self, read: ErrorCodes) -> Self {
        self.error_codes = Some(read);
        self
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, &self.url);
        match &self.authorization {
            Some(value) => builder.header(AUTHORIZATION, value),
            None => builder,
        }
    }

    fn status_failure(&self, response: &reqwest::Response) -> Failure {
        status_failure(&self.name, response, self.error_codes)
    }
}

/// What a refusal means: not found (where `error_codes` is given, the service's
/// `X-Error-Code` saying what, e.g. which of the Hub's repo, revision or file), denied,
/// changed, or worth another try (after the wait a 429 asks).
pub fn status_failure(
    name: &str,
    response: &reqwest::Response,
    error_codes: Option<ErrorCodes>,
) -> Failure {
    let status = response.status();
    let header = |key: &str| response.headers().get(key).and_then(|v| v.to_str().ok());
    let url = name.to_string();
    if let Some(read) = error_codes
        && let Some(code) = header("x-error-code")
        && matches!(status.as_u16(), 401 | 403 | 404)
        && let Some(e) = read(name, code, header("x-error-message"))
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

/// A reply whose body does not matter: success, or what the refusal means (as
/// [`status_failure`] reads it, naming `name`).
pub fn succeeded(name: &str, response: &reqwest::Response) -> std::result::Result<(), Failure> {
    match response.status().is_success() {
        true => Ok(()),
        false => Err(status_failure(name, response, None)),
    }
}

/// A request that got no answer (refused, reset, timed out): worth another try.
pub fn transport_failure(e: reqwest::Error) -> Failure {
    Failure::Transient(short_cause(&e))
}

/// The innermost cause of a transport failure, e.g. "connection reset by peer".
pub(crate) fn short_cause(err: &dyn std::error::Error) -> String {
    let mut cause = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    cause
}

/// The error for a read whose pinned ETag no longer matches (a 412).
pub fn changed(url: &str) -> Error {
    Error::Io {
        url: url.into(),
        position: crate::error::Position::Unknown,
        source: std::io::Error::other(
            "the object changed while it was being read (its ETag no longer matches)",
        ),
    }
}

/// `bytes 0-9/100` -> 100.
pub fn size_from_content_range(value: &str) -> Option<u64> {
    value.rsplit_once('/')?.1.trim().parse().ok()
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
                        return Some(Err(match transport_failure(e) {
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

impl ObjectRequests for HttpObject {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let response = self
                .request(reqwest::Method::HEAD)
                .send()
                .await
                .map_err(transport_failure)?;
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
            let response = builder.send().await.map_err(transport_failure)?;
            range_response(&self.name, response, start, self.error_codes)
        })
    }
}

/// The reply to a GET of a range from `start`: its body, and the object's size where the
/// reply says it; a refusal as [`status_failure`] reads it.
pub fn range_response(
    name: &str,
    response: reqwest::Response,
    start: u64,
    error_codes: Option<ErrorCodes>,
) -> std::result::Result<Response, Failure> {
    let status = response.status();
    let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
    let object_size = match status {
        StatusCode::PARTIAL_CONTENT => header(CONTENT_RANGE).and_then(size_from_content_range),
        StatusCode::OK => header(CONTENT_LENGTH).and_then(|v| v.parse().ok()),
        _ => return Err(status_failure(name, &response, error_codes)),
    };
    // 200 means the whole object came back: skip to the part we asked for.
    let skip = if status == StatusCode::OK { start } else { 0 };
    Ok(Response {
        object_size,
        body: Box::new(HttpBody { response, skip }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_give_the_size() {
        assert_eq!(size_from_content_range("bytes 0-9/100"), Some(100));
        assert_eq!(size_from_content_range("bytes */100"), Some(100));
    }
}
