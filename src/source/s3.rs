//! S3 (and S3-compatible stores) through `aws-sdk-s3`: the standard credential chain
//! (environment, shared profile, instance metadata) or explicit keys, unsigned
//! (anonymous) access, custom endpoints with path-style addressing, prefixes and globs
//! listed with ListObjectsV2.

use std::sync::Arc;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use bytes::Bytes;

use super::remote::{Backend, Body, ObjectInfo, Request, Response};
use super::retry::{Failure, transient_status};
use super::storage::Storage;
use super::{BoxFuture, ShardMeta, pattern};
use crate::error::{Error, Result};

/// `s3://bucket/key` split in two.
pub fn split(url: &str) -> Result<(&str, &str)> {
    let rest = url.strip_prefix("s3://").unwrap_or(url);
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() => Ok((bucket, key)),
        None if !rest.is_empty() => Ok((rest, "")),
        _ => Err(Error::invalid_argument(format!(
            "{url}: expected s3://bucket/key"
        ))),
    }
}

/// The dataset's S3 client (built on first use, and again in a forked child). Callable
/// from anywhere, runtime tasks included: the first use in a forked child is often a
/// read inside a task.
pub fn client(storage: &Storage) -> Result<aws_sdk_s3::Client> {
    storage.s3.get_or_try_init(|| {
        let options = &storage.options;
        let rt = super::runtime()?;
        let config = super::runtime::block_on_outside(rt, async {
            // Retries are ours (see `remote`), so they count attempts and resume bodies.
            let mut loader = aws_config::defaults(BehaviorVersion::latest())
                .retry_config(RetryConfig::disabled());
            if let Some(profile) = &options.profile {
                loader = loader.profile_name(profile);
            }
            if let Some(endpoint) = &options.endpoint_url {
                loader = loader.endpoint_url(endpoint);
            }
            if let Some(region) = &options.region {
                loader = loader.region(aws_config::Region::new(region.clone()));
            }
            if options.anonymous {
                loader = loader.no_credentials();
            } else if let (Some(key), Some(secret)) =
                (&options.access_key_id, &options.secret_access_key)
            {
                loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
                    key,
                    secret,
                    options.session_token.clone(),
                    None,
                    "storage_options",
                ));
            }
            loader.load().await
        })?;
        let custom_endpoint = config.endpoint_url().is_some();
        let mut builder = aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(options.force_path_style.unwrap_or(custom_endpoint));
        if config.region().is_none() {
            // Custom endpoints rarely care, but the SDK insists on a region.
            builder = builder.region(aws_config::Region::new("us-east-1"));
        }
        Ok(aws_sdk_s3::Client::from_conf(builder.build()))
    })
}

/// Why an S3 call failed, as the retry loop sees it. Messages carry the status and the
/// service's error code, never request details (which could hold credentials).
pub(crate) fn failure<E: ProvideErrorMetadata + std::error::Error + 'static>(
    url: &str,
    err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> Failure {
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().unwrap_or_default().to_string();
    match status {
        Some(404) => Failure::Permanent(Error::NotFound { url: url.into() }),
        Some(403) => Failure::Permanent(Error::PermissionDenied { url: url.into() }),
        Some(412) => Failure::Permanent(changed(url)),
        Some(s) if transient_status(s) => {
            Failure::Transient(format!("HTTP {s} {code}").trim_end().to_string())
        }
        Some(s) => Failure::Permanent(Error::Io {
            url: url.into(),
            position: crate::error::Position::Unknown,
            source: std::io::Error::other(format!("HTTP {s} {code}")),
        }),
        // No response: timeouts, refused or reset connections, broken bodies.
        None => match &err {
            SdkError::ConstructionFailure(_) => {
                Failure::Permanent(Error::invalid_argument(format!(
                    "{url}: cannot build the request: {}",
                    aws_sdk_s3::error::DisplayErrorContext(&err)
                )))
            }
            _ => Failure::Transient(short_cause(&err)),
        },
    }
}

/// The innermost cause of a transport failure, e.g. "connection reset by peer".
fn short_cause(err: &dyn std::error::Error) -> String {
    let mut cause = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    cause
}

pub fn changed(url: &str) -> Error {
    Error::Io {
        url: url.into(),
        position: crate::error::Position::Unknown,
        source: std::io::Error::other(
            "the object changed while it was being read (its ETag no longer matches)",
        ),
    }
}

pub struct S3Backend {
    url: String,
    bucket: String,
    key: String,
    client: aws_sdk_s3::Client,
}

impl S3Backend {
    pub fn new(url: &str, storage: &Arc<Storage>) -> Result<Self> {
        let (bucket, key) = split(url)?;
        Ok(Self {
            url: url.to_string(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            client: client(storage)?,
        })
    }
}

struct S3Body(aws_sdk_s3::primitives::ByteStream);

impl Body for S3Body {
    fn next(&mut self) -> BoxFuture<'_, Option<std::result::Result<Bytes, String>>> {
        Box::pin(async move { self.0.next().await.map(|r| r.map_err(|e| short_cause(&e))) })
    }
}

/// `bytes 0-9/100` -> 100.
pub fn size_from_content_range(value: &str) -> Option<u64> {
    value.rsplit_once('/')?.1.trim().parse().ok()
}

impl Backend for S3Backend {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let out = self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .send()
                .await
                .map_err(|e| failure(&self.url, e))?;
            Ok(ObjectInfo {
                size: out.content_length().unwrap_or(0).max(0) as u64,
                etag: out.e_tag().map(str::to_string),
            })
        })
    }

    fn get(
        &self,
        request: Request,
        if_match: Option<String>,
    ) -> BoxFuture<'_, std::result::Result<Response, Failure>> {
        Box::pin(async move {
            let range = request.range_header();
            let out = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .range(range)
                .set_if_match(if_match)
                .send()
                .await
                .map_err(|e| failure(&self.url, e))?;
            Ok(Response {
                object_size: out.content_range().and_then(size_from_content_range),
                body: Box::new(S3Body(out.body)),
            })
        })
    }
}

/// Lists `s3://bucket/prefix...`: a glob's matches, everything below a prefix ending in
/// `/`, or the one object named. Sizes and ETags come from the listing.
pub fn list(url: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
    let (bucket, key) = split(url)?;
    let client = client(storage)?;
    let rt = super::runtime()?;
    let glob = pattern::is_glob(key);
    if !glob && !key.is_empty() && !key.ends_with('/') {
        // One object: HEAD it, so a missing one fails now.
        let backend = S3Backend::new(url, storage)?;
        let info = rt.block_on(backend.head()).map_err(|f| match f {
            Failure::Permanent(e) => e,
            Failure::Transient(cause) | Failure::Throttled(cause, _) => Error::Io {
                url: url.into(),
                position: crate::error::Position::Unknown,
                source: std::io::Error::other(cause),
            },
        })?;
        return Ok(vec![ShardMeta {
            url: url.to_string(),
            size: Some(info.size),
            etag: info.etag,
            rows: None,
        }]);
    }
    let literal_prefix = &key[..key.find(['*', '?', '[']).unwrap_or(key.len())];
    let matcher = if glob {
        Some(
            glob::Pattern::new(key)
                .map_err(|e| Error::invalid_argument(format!("bad glob {url:?}: {e}")))?,
        )
    } else {
        None
    };
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let mut shards = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = rt
            .block_on(
                client
                    .list_objects_v2()
                    .bucket(bucket)
                    .prefix(literal_prefix)
                    .set_continuation_token(token.take())
                    .send(),
            )
            .map_err(|e| match failure(url, e) {
                Failure::Permanent(e) => e,
                Failure::Transient(cause) | Failure::Throttled(cause, _) => Error::Io {
                    url: url.into(),
                    position: crate::error::Position::Unknown,
                    source: std::io::Error::other(format!("listing failed: {cause}")),
                },
            })?;
        for object in page.contents() {
            let Some(name) = object.key() else { continue };
            let keep = match &matcher {
                Some(m) => m.matches_with(name, options),
                // A prefix: everything below it but hidden and `_` files, as for directories.
                None => {
                    let base = name.rsplit('/').next().unwrap_or(name);
                    !base.is_empty() && !base.starts_with(['.', '_'])
                }
            };
            if keep {
                shards.push(ShardMeta {
                    url: format!("s3://{bucket}/{name}"),
                    size: object.size().map(|s| s.max(0) as u64),
                    etag: object.e_tag().map(str::to_string),
                    rows: None,
                });
            }
        }
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    if shards.is_empty() {
        return Err(Error::NoMatch {
            pattern: url.to_string(),
        });
    }
    shards.sort_by(|a, b| a.url.cmp(&b.url));
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_content_ranges() {
        assert_eq!(split("s3://b/k/x.parquet").unwrap(), ("b", "k/x.parquet"));
        assert_eq!(split("s3://b").unwrap(), ("b", ""));
        assert!(split("s3:///k").is_err());
        assert_eq!(size_from_content_range("bytes 0-9/100"), Some(100));
        assert_eq!(size_from_content_range("bytes */100"), Some(100));
    }
}
