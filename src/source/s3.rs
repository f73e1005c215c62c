//! S3 (and S3-compatible stores) through `aws-sdk-s3`: the standard credential chain
//! (environment, shared profile, instance metadata) or explicit keys, unsigned
//! (anonymous) access, custom endpoints with path-style addressing, prefixes and globs
//! listed with ListObjectsV2.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use bytes::Bytes;

use super::backend::Backend;
use super::listing::{ListedObject, list_spec, split_bucket};
use super::object::{BoxFuture, IoCounters, ShardMeta, Source};
use super::remote::{Body, ObjectInfo, ObjectRequests, Request, Response, open_shard};
use super::retry::{Failure, transient_status};
use super::runtime::{self, runtime};
use super::sigv4::{Scope, Signer, encode_key};
use super::storage::Storage;
use super::transport::{
    changed, range_response, short_cause, size_from_content_range, status_failure,
    transport_failure,
};
use super::upload::{PrefixWriter, Tried, Upload, relative_names};
use crate::error::{Error, Result};

/// `s3://bucket/key` split in two.
pub fn split(url: &str) -> Result<(&str, &str)> {
    split_bucket(url, "s3")
}

/// This process's S3 clients for one dataset: the SDK's, for listing, HEAD, writes and
/// the GETs only it can address; and the lean GET path (`sigv4` over the shared reqwest
/// client) for buckets whose endpoint is signed with plain SigV4.
#[derive(Clone)]
pub struct S3Clients(Arc<Clients>);

struct Clients {
    sdk: aws_sdk_s3::Client,
    http: reqwest::Client,
    /// `None`: anonymous (unsigned) requests.
    signer: Option<Signer>,
    endpoint: EndpointInputs,
    /// Each bucket's GET address, from the SDK's endpoint rules; `None` where the lean
    /// path does not apply (S3 Express, endpoints that add headers, other signers).
    buckets: Mutex<HashMap<String, Option<Arc<BucketUrl>>>>,
}

/// What the SDK's endpoint rules take besides the bucket.
struct EndpointInputs {
    region: String,
    custom: Option<String>,
    force_path_style: bool,
    use_fips: Option<bool>,
    use_dual_stack: Option<bool>,
}

/// Where a bucket's objects are fetched, and the scope their signatures carry.
#[derive(Debug)]
struct BucketUrl {
    /// `scheme://host[:port][/bucket]`, no trailing slash.
    base: String,
    /// The `Host` header, as signed.
    host: String,
    /// The path part of `base` (`/bucket` for path-style addressing, else empty).
    path: String,
    scope: Scope,
}

impl S3Clients {
    pub fn sdk(&self) -> &aws_sdk_s3::Client {
        &self.0.sdk
    }

    async fn bucket_url(&self, bucket: &str) -> Option<Arc<BucketUrl>> {
        let buckets = || self.0.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = buckets().get(bucket) {
            return known.clone();
        }
        let resolved = self.0.resolve(bucket).await.map(Arc::new);
        buckets().insert(bucket.to_string(), resolved.clone());
        resolved
    }
}

impl Clients {
    /// The bucket's endpoint by the SDK's own rules (the same resolver its requests
    /// use), when it is a plain URL signed with SigV4.
    async fn resolve(&self, bucket: &str) -> Option<BucketUrl> {
        use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
        let inputs = &self.endpoint;
        let params = Params::builder()
            .bucket(bucket)
            .region(inputs.region.clone())
            .force_path_style(inputs.force_path_style)
            .set_endpoint(inputs.custom.clone())
            .set_use_fips(inputs.use_fips)
            .set_use_dual_stack(inputs.use_dual_stack)
            .build()
            .ok()?;
        let endpoint = DefaultResolver::new()
            .resolve_endpoint(&params)
            .await
            .ok()?;
        if endpoint.headers().next().is_some() || endpoint.properties().contains_key("backend") {
            return None;
        }
        let auth = endpoint.auth_schemes().first()?;
        let text = |name: &str| auth.get(name).and_then(|d| d.as_string());
        if auth.name() != "sigv4" {
            return None;
        }
        let url = reqwest::Url::parse(endpoint.url()).ok()?;
        if !matches!(url.scheme(), "http" | "https") || url.query().is_some() {
            return None;
        }
        let host = match url.port() {
            Some(port) => format!("{}:{port}", url.host_str()?),
            None => url.host_str()?.to_string(),
        };
        let path = url.path().trim_end_matches('/').to_string();
        Some(BucketUrl {
            base: format!("{}://{host}{path}", url.scheme()),
            host,
            path,
            scope: Scope {
                region: text("signingRegion")?.to_string(),
                service: text("signingName")?.to_string(),
            },
        })
    }
}

/// The dataset's SDK client (built on first use, and again in a forked child).
pub fn client(storage: &Storage) -> Result<aws_sdk_s3::Client> {
    Ok(clients(storage)?.0.sdk.clone())
}

/// The dataset's S3 clients (built on first use, and again in a forked child). Callable
/// from anywhere, runtime tasks included: the first use in a forked child is often a
/// read inside a task.
pub fn clients(storage: &Storage) -> Result<S3Clients> {
    storage.client(|| {
        let options = &storage.options;
        let rt = runtime()?;
        let config = runtime::block_on_outside(rt, async {
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
        let custom_endpoint = custom_endpoint(&config);
        let force_path_style = options
            .force_path_style
            .unwrap_or(custom_endpoint.is_some());
        let mut builder =
            aws_sdk_s3::config::Builder::from(&config).force_path_style(force_path_style);
        // Custom endpoints rarely care, but the SDK insists on a region.
        let region = config
            .region()
            .map_or("us-east-1", |r| r.as_ref())
            .to_string();
        if config.region().is_none() {
            builder = builder.region(aws_config::Region::new(region.clone()));
        }
        Ok(S3Clients(Arc::new(Clients {
            sdk: aws_sdk_s3::Client::from_conf(builder.build()),
            http: super::transport::client(storage)?,
            signer: config.credentials_provider().map(Signer::new),
            endpoint: EndpointInputs {
                region,
                custom: custom_endpoint,
                force_path_style,
                use_fips: config.use_fips(),
                use_dual_stack: config.use_dual_stack(),
            },
            buckets: Mutex::new(HashMap::new()),
        })))
    })
}

/// The endpoint S3 requests go to, chosen as the SDK's S3 config chooses it: the one
/// given in code, else `AWS_ENDPOINT_URL_S3` (or the profile's `s3` service section),
/// else `AWS_ENDPOINT_URL` (or the profile's `endpoint_url`).
fn custom_endpoint(config: &aws_config::SdkConfig) -> Option<String> {
    use aws_types::service_config::ServiceConfigKey;
    if config.get_origin("endpoint_url").is_client_config() {
        return config.endpoint_url().map(str::to_string);
    }
    let key = ServiceConfigKey::builder()
        .service_id("S3")
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()?;
    config
        .service_config()
        .and_then(|c| c.load_config(key))
        .or_else(|| config.endpoint_url().map(str::to_string))
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

/// The requests of one object.
pub struct S3Object {
    url: String,
    bucket: String,
    key: String,
    /// The key as a request path has it; `None` where the SDK must send the GET (a `.`
    /// or `..` segment, which URL parsing would fold away).
    encoded_key: Option<String>,
    clients: S3Clients,
}

impl S3Object {
    pub fn new(url: &str, storage: &Arc<Storage>) -> Result<Self> {
        let (bucket, key) = split(url)?;
        let plain = !key.is_empty() && !key.split('/').any(|s| s == "." || s == "..");
        Ok(Self {
            url: url.to_string(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            encoded_key: plain.then(|| encode_key(key)),
            clients: clients(storage)?,
        })
    }

    /// A GET signed here and sent with reqwest (see `sigv4`).
    async fn signed_get(
        &self,
        bucket: &BucketUrl,
        key: &str,
        request: Request,
        if_match: Option<String>,
    ) -> std::result::Result<Response, Failure> {
        use reqwest::header::{HOST, IF_MATCH, RANGE};
        let Request::Range(range) = &request;
        let range_header = request.range_header();
        let mut builder = self
            .clients
            .0
            .http
            .get(format!("{}/{key}", bucket.base))
            .header(RANGE, &range_header);
        if let Some(signer) = &self.clients.0.signer {
            let path = format!("{}/{key}", bucket.path);
            let headers = signer
                .sign_get(&bucket.host, &path, &range_header, &bucket.scope)
                .await?;
            builder = builder.header(HOST, &bucket.host);
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
        }
        if let Some(etag) = if_match {
            builder = builder.header(IF_MATCH, etag);
        }
        let response = builder.send().await.map_err(transport_failure)?;
        if !response.status().is_success() {
            return Err(self.refusal(response).await);
        }
        range_response(&self.url, response, range.start, None)
    }

    /// An S3 error reply: expired credentials are fetched again, and a clock S3 finds off
    /// is set by the server's `Date`, and the request tried again; the rest as for any
    /// HTTP refusal, with S3's error code in the message.
    async fn refusal(&self, response: reqwest::Response) -> Failure {
        let status = response.status().as_u16();
        if !matches!(status, 400 | 403) {
            return status_failure(&self.url, &response, None);
        }
        let server_date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = response.bytes().await.unwrap_or_default();
        let code = error_code(&body).unwrap_or_default();
        let signer = self.clients.0.signer.as_ref();
        if matches!(code, "ExpiredToken" | "TokenRefreshRequired") {
            if let Some(signer) = signer {
                signer.invalidate();
            }
            return Failure::Transient(format!("HTTP {status} {code}"));
        }
        if code == "RequestTimeTooSkewed"
            && let (Some(signer), Some(date)) = (signer, server_date)
            && signer.correct_clock(&date)
        {
            return Failure::Transient(format!("HTTP {status} {code}"));
        }
        if status == 403 {
            return Failure::Permanent(Error::PermissionDenied {
                url: self.url.clone(),
            });
        }
        Failure::Permanent(Error::Io {
            url: self.url.clone(),
            position: crate::error::Position::Unknown,
            source: std::io::Error::other(format!("HTTP {status} {code}").trim_end().to_string()),
        })
    }
}

/// `<Code>` of an S3 error document.
fn error_code(body: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(&text[start..start + len])
}

struct S3Body(aws_sdk_s3::primitives::ByteStream);

impl Body for S3Body {
    fn next(&mut self) -> BoxFuture<'_, Option<std::result::Result<Bytes, String>>> {
        Box::pin(async move { self.0.next().await.map(|r| r.map_err(|e| short_cause(&e))) })
    }
}

impl ObjectRequests for S3Object {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let out = self
                .clients
                .sdk()
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
            if let Some(key) = &self.encoded_key
                && let Some(bucket) = self.clients.bucket_url(&self.bucket).await
            {
                return self.signed_get(&bucket, key, request, if_match).await;
            }
            let range = request.range_header();
            let out = self
                .clients
                .sdk()
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

/// `s3://bucket/key` URLs.
pub struct S3;

impl Backend for S3 {
    fn is_object_store(&self) -> bool {
        true
    }

    fn list(&self, spec: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        list(spec, storage)
    }

    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let object = S3Object::new(&shard.url, storage)?;
        Ok(open_shard(shard, Box::new(object), storage, counters))
    }

    /// Writes under `s3://bucket/prefix`.
    fn writer(&self, url: &str, storage: &Arc<Storage>) -> Option<Result<Box<dyn PrefixWriter>>> {
        Some(S3Writer::new(url, storage).map(|w| Box::new(w) as Box<dyn PrefixWriter>))
    }
}

/// Objects written under a prefix: single PUTs, and multipart uploads for large ones.
struct S3Writer {
    /// `s3://bucket/prefix`, for messages.
    url: String,
    bucket: String,
    /// The key prefix, ending in `/` unless empty.
    prefix: String,
    client: aws_sdk_s3::Client,
}

impl S3Writer {
    fn new(url: &str, storage: &Arc<Storage>) -> Result<Self> {
        let (bucket, key) = split(url)?;
        Ok(S3Writer {
            url: url.trim_end_matches('/').to_string(),
            bucket: bucket.to_string(),
            prefix: super::upload::key_prefix(key),
            client: client(storage)?,
        })
    }

    fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }
}

impl PrefixWriter for S3Writer {
    fn list(&self) -> BoxFuture<'_, Tried<Vec<String>>> {
        Box::pin(async move {
            let objects = list_objects(&self.client, &self.url, &self.bucket, &self.prefix).await?;
            Ok(relative_names(objects, &self.prefix))
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(format!("{}{name}", self.prefix))
                .send()
                .await
                .map_err(|e| failure(&self.url_of(name), e))
                .map(drop)
        })
    }

    fn put<'a>(&'a self, name: &'a str, bytes: Bytes) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(format!("{}{name}", self.prefix))
                .body(aws_sdk_s3::primitives::ByteStream::from(bytes))
                .send()
                .await
                .map_err(|e| failure(&self.url_of(name), e))
                .map(drop)
        })
    }

    fn start_upload<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<Arc<dyn Upload>>> {
        Box::pin(async move {
            let url = self.url_of(name);
            let key = format!("{}{name}", self.prefix);
            let created = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
                .map_err(|e| failure(&url, e))?;
            let upload_id = created.upload_id().map(str::to_string).ok_or_else(|| {
                Failure::Permanent(Error::write(
                    &url,
                    std::io::Error::other("no upload id in the reply"),
                ))
            })?;
            Ok(Arc::new(S3Upload {
                client: self.client.clone(),
                bucket: self.bucket.clone(),
                key,
                upload_id,
                url,
            }) as Arc<dyn Upload>)
        })
    }
}

/// A multipart upload.
struct S3Upload {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    url: String,
}

impl Upload for S3Upload {
    fn parts_in_flight(&self) -> usize {
        4
    }

    fn send_part(&self, number: u32, _offset: u64, bytes: Bytes) -> BoxFuture<'_, Tried<String>> {
        Box::pin(async move {
            let sent = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .part_number(number as i32)
                .body(aws_sdk_s3::primitives::ByteStream::from(bytes))
                .send()
                .await
                .map_err(|e| failure(&self.url, e))?;
            Ok(sent.e_tag().unwrap_or_default().to_string())
        })
    }

    fn complete<'a>(
        &'a self,
        parts: &'a [(u32, String)],
        last: Bytes,
        offset: u64,
    ) -> BoxFuture<'a, Tried<()>> {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        Box::pin(async move {
            let mut parts = parts.to_vec();
            // S3 takes a last part of any size, but none of zero bytes after the first.
            if !last.is_empty() || parts.is_empty() {
                let number = parts.last().map_or(1, |(n, _)| n + 1);
                parts.push((number, self.send_part(number, offset, last).await?));
            }
            let completed = parts
                .into_iter()
                .map(|(number, etag)| {
                    CompletedPart::builder()
                        .part_number(number as i32)
                        .e_tag(etag)
                        .build()
                })
                .collect();
            self.client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(completed))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| failure(&self.url, e))
                .map(drop)
        })
    }

    fn abort(&self) -> BoxFuture<'_, Tried<()>> {
        Box::pin(async move {
            self.client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .send()
                .await
                .map_err(|e| failure(&self.url, e))
                .map(drop)
        })
    }
}

/// Lists `s3://bucket/prefix...`: a glob's matches, everything below a prefix ending in
/// `/`, or the one object named. Sizes and ETags come from the listing.
pub fn list(url: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
    let (bucket, key) = split(url)?;
    list_spec(
        url,
        key,
        || {
            let object = S3Object::new(url, storage)?;
            Ok(async move { object.head().await })
        },
        |prefix| {
            let client = client(storage)?;
            Ok(async move { list_objects(&client, url, bucket, &prefix).await })
        },
        |name| format!("s3://{bucket}/{name}"),
    )
}

/// Every object of `bucket` whose key starts with `prefix` (ListObjectsV2, page by page).
async fn list_objects(
    client: &aws_sdk_s3::Client,
    url: &str,
    bucket: &str,
    prefix: &str,
) -> Tried<Vec<ListedObject>> {
    let mut objects = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|e| failure(url, e))?;
        objects.extend(page.contents().iter().filter_map(|o| {
            Some(ListedObject {
                name: o.key()?.to_string(),
                size: o.size().map(|s| s.max(0) as u64),
                version: o.e_tag().map(str::to_string),
            })
        }));
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            return Ok(objects);
        }
    }
}
