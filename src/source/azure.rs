//! Azure Blob Storage over the Blob REST API, on the shared transport: `az://container/
//! path`, `abfs[s]://container@account.dfs.core.windows.net/path` and
//! `https://account.blob.core.windows.net/container/path`. Listing with `marker`
//! pagination, ranged reads pinned with `If-Match` on the ETag, writes as block blobs.
//!
//! Credentials, in the order adlfs takes them: a connection string
//! (`storage_options["connection_string"]` or `AZURE_STORAGE_CONNECTION_STRING`: its
//! account, key or SAS, and endpoint), an account key (`account_key`,
//! `AZURE_STORAGE_ACCOUNT_KEY` or `AZURE_STORAGE_KEY`), a SAS token (`sas_token`,
//! `AZURE_STORAGE_SAS_TOKEN`), then Entra ID: a client secret (`tenant_id`, `client_id`,
//! `client_secret`, or their `AZURE_*` variables), workload identity
//! (`AZURE_FEDERATED_TOKEN_FILE`), a managed identity through IMDS; then anonymous
//! requests for public containers (`anon=True` asks for them outright). The account is
//! the URL's, or `account_name` (`AZURE_STORAGE_ACCOUNT_NAME` or
//! `AZURE_STORAGE_ACCOUNT`). The Entra ID chain, token refreshes and SharedKey signing
//! are the `object_store` crate's; requests, retries, ranges and the cache are ours.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use bytes::Bytes;
use object_store::azure::{
    AzureAuthorizer, AzureCredential, AzureCredentialProvider, MicrosoftAzureBuilder,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue};

use super::backend::Backend;
use super::listing::{ListedObject, list_spec};
use super::object::{BoxFuture, IoCounters, ShardMeta, Source};
use super::remote::{ObjectInfo, ObjectRequests, Request, Response, open_shard};
use super::retry::Failure;
use super::storage::{AzureOptions, Storage};
use super::transport::{range_response, short_cause, status_failure, succeeded, transport_failure};
use super::upload::{PrefixWriter, Tried, Upload, key_prefix, relative_names};
use crate::error::{Error, Position, Result};

/// Blobs a listing page holds (Azure's largest).
const BLOBS_PER_PAGE: u32 = 5000;

/// What a blob name keeps unescaped in a URL path: unreserved characters and `/`.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');
/// A query value: unreserved characters only.
const QUERY: &AsciiSet = &PATH.add(b'/');

/// One of the URL forms, taken apart.
#[derive(Debug, PartialEq, Eq)]
struct BlobUrl<'a> {
    /// What listed blobs' URLs begin with: the URL up to and including the container's
    /// `/`.
    root: String,
    /// The account the URL names (`None` for `az://container/...`).
    account: Option<&'a str>,
    container: &'a str,
    /// The blob's name or the listing's path.
    path: &'a str,
}

fn parse(url: &str) -> Result<BlobUrl<'_>> {
    let bad = || {
        Error::invalid_argument(format!(
            "{url}: expected az://container/path, abfs[s]://container@account.dfs.core.windows.net/path or https://account.blob.core.windows.net/container/path"
        ))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (head, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (account, container, root) = if scheme == "https" || scheme == "http" {
        let account = head
            .split('.')
            .next()
            .filter(|a| !a.is_empty())
            .ok_or_else(bad)?;
        let (container, path) = path.split_once('/').unwrap_or((path, ""));
        let root = format!("{scheme}://{head}/{container}/");
        return match container {
            "" => Err(bad()),
            _ => Ok(BlobUrl {
                root,
                account: Some(account),
                container,
                path,
            }),
        };
    } else {
        match head.split_once('@') {
            Some((container, host)) => (
                host.split('.').next(),
                container,
                format!("{scheme}://{head}/"),
            ),
            None => (None, head, format!("{scheme}://{head}/")),
        }
    };
    if container.is_empty() || account == Some("") {
        return Err(bad());
    }
    Ok(BlobUrl {
        root,
        account,
        container,
        path,
    })
}

/// Whether `host` (of an `https://` URL) is Azure Blob Storage's.
pub fn is_blob_host(url: &str) -> bool {
    url.strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|host| host.ends_with(".blob.core.windows.net"))
}

/// The parts of a connection string that matter here.
#[derive(Default)]
struct ConnectionString {
    account: Option<String>,
    key: Option<String>,
    sas: Option<String>,
    endpoint: Option<String>,
}

fn connection_string(text: &str) -> Result<ConnectionString> {
    let mut parts = ConnectionString::default();
    let mut protocol = "https".to_string();
    let mut suffix = "core.windows.net".to_string();
    for field in text.split(';').map(str::trim).filter(|f| !f.is_empty()) {
        let Some((name, value)) = field.split_once('=') else {
            return Err(Error::invalid_argument(
                "storage_options[\"connection_string\"]: expected Name=value;Name=value...",
            ));
        };
        let value = value.to_string();
        match name {
            "AccountName" => parts.account = Some(value),
            "AccountKey" => parts.key = Some(value),
            "SharedAccessSignature" => parts.sas = Some(value),
            "BlobEndpoint" => parts.endpoint = Some(value.trim_end_matches('/').to_string()),
            "DefaultEndpointsProtocol" => protocol = value,
            "EndpointSuffix" => suffix = value,
            _ => {}
        }
    }
    if parts.endpoint.is_none()
        && let Some(account) = &parts.account
    {
        parts.endpoint = Some(format!("{protocol}://{account}.blob.{suffix}"));
    }
    Ok(parts)
}

/// An environment variable's value, if set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// This process's Azure client for one dataset and account.
#[derive(Clone)]
struct AzureClients(Arc<Clients>);

struct Clients {
    http: reqwest::Client,
    account: String,
    /// `scheme://host[/account]`: blob URLs are `<endpoint>/<container>/<name>`.
    endpoint: String,
    /// `None`: anonymous requests.
    credentials: Option<AzureCredentialProvider>,
    /// Whether a failure to get a token means anonymous requests (the chain ended at the
    /// managed identity, and no credentials were named).
    anonymous_if_none: bool,
    fell_back: AtomicBool,
}

/// The dataset's clients, one per account (built on first use here): the account a URL
/// names (`None`: the one the options or environment name) and its clients.
#[derive(Clone, Default)]
struct Accounts(Arc<std::sync::Mutex<Vec<AccountClients>>>);

type AccountClients = (Option<String>, AzureClients);

fn clients(storage: &Storage, account: Option<&str>) -> Result<AzureClients> {
    let accounts = storage.client(|| Ok(Accounts::default()))?;
    let known = || accounts.0.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = known().iter().find(|(a, _)| a.as_deref() == account) {
        return Ok(c.clone());
    }
    let made = make_clients(storage, account)?;
    known().push((account.map(str::to_string), made.clone()));
    Ok(made)
}

fn make_clients(storage: &Storage, url_account: Option<&str>) -> Result<AzureClients> {
    let options: &AzureOptions = &storage.options.azure;
    // Credentials in storage_options come before the environment's (each in adlfs's
    // order): a key passed in code is not overridden by a connection string exported
    // in the shell.
    let in_options = options.connection_string.is_some()
        || options.account_key.is_some()
        || options.sas_token.is_some()
        || options.client_secret.is_some();
    let env_credential = |name: &str| if in_options { None } else { env(name) };
    let connection = match options
        .connection_string
        .clone()
        .or_else(|| env_credential("AZURE_STORAGE_CONNECTION_STRING"))
    {
        Some(text) => connection_string(&text)?,
        None => ConnectionString::default(),
    };
    let account = url_account
        .map(str::to_string)
        .or_else(|| options.account_name.clone())
        .or(connection.account.clone())
        .or_else(|| env("AZURE_STORAGE_ACCOUNT_NAME"))
        .or_else(|| env("AZURE_STORAGE_ACCOUNT"))
        .ok_or_else(|| {
            Error::invalid_argument(
                "Azure: no storage account (name it in the URL, storage_options[\"account_name\"], a connection string or AZURE_STORAGE_ACCOUNT_NAME)",
            )
        })?;
    let endpoint = storage
        .options
        .endpoint_url
        .clone()
        .or(connection.endpoint.clone())
        .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"))
        .trim_end_matches('/')
        .to_string();
    let key = connection
        .key
        .or_else(|| options.account_key.clone())
        .or_else(|| env_credential("AZURE_STORAGE_ACCOUNT_KEY"))
        .or_else(|| env_credential("AZURE_STORAGE_KEY"));
    let sas = connection
        .sas
        .or_else(|| options.sas_token.clone())
        .or_else(|| env_credential("AZURE_STORAGE_SAS_TOKEN"));
    let mut builder = MicrosoftAzureBuilder::from_env()
        .with_account(&account)
        .with_container_name("credentials");
    let mut named = true;
    builder = if let Some(key) = key {
        builder.with_access_key(key).with_config(
            object_store::azure::AzureConfigKey::CredentialType,
            "access_key",
        )
    } else if let Some(sas) = sas {
        builder
            .with_config(
                object_store::azure::AzureConfigKey::SasKey,
                sas.trim_start_matches('?'),
            )
            .with_config(
                object_store::azure::AzureConfigKey::CredentialType,
                "sas_token",
            )
    } else {
        let (tenant, client, secret) = (
            &options.tenant_id,
            &options.client_id,
            &options.client_secret,
        );
        named = tenant.is_some()
            || client.is_some()
            || secret.is_some()
            || env("AZURE_CLIENT_ID").is_some()
            || env("AZURE_FEDERATED_TOKEN_FILE").is_some();
        let mut builder = builder;
        if let Some(tenant) = tenant {
            builder = builder.with_tenant_id(tenant);
        }
        if let Some(client) = client {
            builder = builder.with_client_id(client);
        }
        if let Some(secret) = secret {
            builder = builder.with_client_secret(secret);
        }
        builder
    };
    let anonymous = options.anon;
    let credentials = if anonymous {
        None
    } else {
        let retry = object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: storage.options.timeout,
            ..Default::default()
        };
        let azure = builder
            .with_retry(retry)
            .with_client_options(
                object_store::ClientOptions::new().with_timeout(storage.options.timeout),
            )
            .build()
            .map_err(|e| {
                Error::invalid_argument(format!("Azure credentials: {}", short_cause(&e)))
            })?;
        Some(azure.credentials().clone())
    };
    Ok(AzureClients(Arc::new(Clients {
        http: super::transport::client(storage)?,
        account,
        endpoint,
        credentials,
        anonymous_if_none: !named,
        fell_back: AtomicBool::new(false),
    })))
}

impl AzureClients {
    /// `<endpoint>/<container>/<name>`, the name escaped.
    fn blob_url(&self, container: &str, name: &str) -> String {
        format!(
            "{}/{container}/{}",
            self.0.endpoint,
            utf8_percent_encode(name, PATH)
        )
    }

    async fn credential(&self) -> Tried<Option<Arc<AzureCredential>>> {
        let inner = &self.0;
        let Some(credentials) = &inner.credentials else {
            return Ok(None);
        };
        if inner.fell_back.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match credentials.get_credential().await {
            Ok(credential) => Ok(Some(credential)),
            Err(_) if inner.anonymous_if_none => {
                inner.fell_back.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(Failure::Transient(format!(
                "no Azure credential: {}",
                short_cause(&e)
            ))),
        }
    }

    /// A request to `url` with `headers` (and `length` bytes of body to come), signed:
    /// the signature covers the headers, so they are set here, not after.
    async fn request(
        &self,
        method: reqwest::Method,
        url: &str,
        headers: &[(HeaderName, String)],
        length: usize,
    ) -> Tried<reqwest::RequestBuilder> {
        let bad =
            |what: String| Failure::Permanent(Error::invalid_argument(format!("{url}: {what}")));
        let mut request =
            object_store::client::HttpRequest::new(object_store::client::HttpRequestBody::empty());
        *request.method_mut() = method.clone();
        *request.uri_mut() = url.parse().map_err(|e| bad(format!("{e}")))?;
        let mut all = HeaderMap::new();
        for (name, value) in headers {
            all.insert(
                name.clone(),
                HeaderValue::from_str(value).map_err(|e| bad(format!("{e}")))?,
            );
        }
        if length > 0 || matches!(method, reqwest::Method::PUT) {
            all.insert(CONTENT_LENGTH, HeaderValue::from(length));
        }
        *request.headers_mut() = all;
        match self.credential().await? {
            Some(credential) => AzureAuthorizer::new(&credential, &self.0.account)
                .try_authorize(&mut request)
                .map_err(|e| {
                    Failure::Permanent(Error::invalid_argument(format!(
                        "Azure signing: {}",
                        short_cause(&e)
                    )))
                })?,
            None => {
                request
                    .headers_mut()
                    .insert("x-ms-version", HeaderValue::from_static("2023-11-03"));
            }
        }
        let mut builder = self.0.http.request(method, request.uri().to_string());
        for (name, value) in request.headers() {
            builder = builder.header(name, value);
        }
        Ok(builder)
    }

    /// Blobs of `container` whose names start with `prefix`.
    async fn list_all(&self, url: &str, container: &str, prefix: &str) -> Tried<Vec<ListedObject>> {
        let mut blobs = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut query = format!(
                "{}/{container}?restype=container&comp=list&prefix={}&maxresults={BLOBS_PER_PAGE}",
                self.0.endpoint,
                utf8_percent_encode(prefix, QUERY)
            );
            if let Some(marker) = &marker {
                query.push_str(&format!("&marker={}", utf8_percent_encode(marker, QUERY)));
            }
            let response = self
                .request(reqwest::Method::GET, &query, &[], 0)
                .await?
                .send()
                .await
                .map_err(transport_failure)?;
            if !response.status().is_success() {
                return Err(status_failure(url, &response, None));
            }
            let body = response.bytes().await.map_err(transport_failure)?;
            let text = std::str::from_utf8(&body).map_err(|_| bad_reply(url, "not UTF-8"))?;
            for blob in elements(text, "Blob") {
                let (Some(name), Some(size), Some(etag)) = (
                    element(blob, "Name"),
                    element(blob, "Content-Length").and_then(|s| s.parse().ok()),
                    element(blob, "Etag"),
                ) else {
                    return Err(bad_reply(url, "a listed blob lacks its name, size or ETag"));
                };
                // Listings give ETags bare, headers quoted: one form, so that `If-Match`
                // and the cache see the same version either way.
                let etag = if etag.starts_with('"') {
                    etag
                } else {
                    format!("\"{etag}\"")
                };
                blobs.push(ListedObject {
                    name,
                    size: Some(size),
                    version: Some(etag),
                });
            }
            marker = element(text, "NextMarker").filter(|m| !m.is_empty());
            if marker.is_none() {
                return Ok(blobs);
            }
        }
    }
}

fn bad_reply(url: &str, what: &str) -> Failure {
    Failure::Permanent(Error::Io {
        url: url.into(),
        position: Position::Unknown,
        source: std::io::Error::other(format!("Azure answered oddly: {what}")),
    })
}

/// The contents of each `<tag>...</tag>` in `xml`, in order.
fn elements<'a>(xml: &'a str, tag: &str) -> impl Iterator<Item = &'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let inner = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(inner)
    })
}

/// The text of the first `<tag>` in `xml`, its entities replaced.
fn element(xml: &str, tag: &str) -> Option<String> {
    let text = elements(xml, tag).next()?;
    Some(
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// The requests of one blob.
struct AzureBlob {
    url: String,
    blob_url: String,
    clients: AzureClients,
}

impl AzureBlob {
    fn new(url: &str, storage: &Storage) -> Result<Self> {
        let parsed = parse(url)?;
        let clients = clients(storage, parsed.account)?;
        Ok(Self {
            url: url.to_string(),
            blob_url: clients.blob_url(parsed.container, parsed.path),
            clients,
        })
    }
}

impl ObjectRequests for AzureBlob {
    fn head(&self) -> BoxFuture<'_, std::result::Result<ObjectInfo, Failure>> {
        Box::pin(async move {
            let response = self
                .clients
                .request(reqwest::Method::HEAD, &self.blob_url, &[], 0)
                .await?
                .send()
                .await
                .map_err(transport_failure)?;
            if !response.status().is_success() {
                return Err(status_failure(&self.url, &response, None));
            }
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
            let size = header(CONTENT_LENGTH)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad_reply(&self.url, "no Content-Length"))?;
            Ok(ObjectInfo {
                size,
                etag: header(reqwest::header::ETAG).map(str::to_string),
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
            let mut headers = vec![(
                HeaderName::from_static("x-ms-range"),
                request.range_header(),
            )];
            if let Some(etag) = if_match {
                headers.push((reqwest::header::IF_MATCH, etag));
            }
            let response = self
                .clients
                .request(reqwest::Method::GET, &self.blob_url, &headers, 0)
                .await?
                .send()
                .await
                .map_err(transport_failure)?;
            range_response(&self.url, response, range.start, None)
        })
    }
}

/// Azure Blob URLs (`az://`, `abfs://`, `abfss://`, and `https://` on a
/// `*.blob.core.windows.net` host).
pub struct Azure;

impl Backend for Azure {
    fn is_object_store(&self) -> bool {
        true
    }

    /// A glob's matches, everything below a path ending in `/` (or a whole container),
    /// or the one blob named. Sizes and ETags come from the listing.
    fn list(&self, spec: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        let parsed = parse(spec)?;
        list_spec(
            spec,
            parsed.path,
            || {
                let blob = AzureBlob::new(spec, storage)?;
                Ok(async move { blob.head().await })
            },
            |prefix| {
                let clients = clients(storage, parsed.account)?;
                let container = parsed.container;
                Ok(async move { clients.list_all(spec, container, &prefix).await })
            },
            |name| format!("{}{name}", parsed.root),
        )
    }

    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let blob = AzureBlob::new(&shard.url, storage)?;
        Ok(open_shard(shard, Box::new(blob), storage, counters))
    }

    fn writer(&self, url: &str, storage: &Arc<Storage>) -> Option<Result<Box<dyn PrefixWriter>>> {
        Some(parse(url).and_then(|parsed| {
            Ok(Box::new(AzureWriter {
                url: url.trim_end_matches('/').to_string(),
                container: parsed.container.to_string(),
                prefix: key_prefix(parsed.path),
                clients: clients(storage, parsed.account)?,
            }) as Box<dyn PrefixWriter>)
        }))
    }
}

/// Blobs written under a path: Put Blob, or blocks committed by a block list.
struct AzureWriter {
    url: String,
    container: String,
    prefix: String,
    clients: AzureClients,
}

impl AzureWriter {
    fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    fn blob_url(&self, name: &str) -> String {
        self.clients
            .blob_url(&self.container, &format!("{}{name}", self.prefix))
    }
}

/// Sends a PUT of `body` to `blob_url` (with `query`), signed with `headers`.
async fn put(
    clients: &AzureClients,
    url: &str,
    blob_url: &str,
    headers: &[(HeaderName, String)],
    body: Bytes,
) -> Tried<()> {
    let response = clients
        .request(reqwest::Method::PUT, blob_url, headers, body.len())
        .await?
        .body(body)
        .send()
        .await
        .map_err(transport_failure)?;
    succeeded(url, &response)
}

impl PrefixWriter for AzureWriter {
    fn list(&self) -> BoxFuture<'_, Tried<Vec<String>>> {
        Box::pin(async move {
            let blobs = self
                .clients
                .list_all(&self.url, &self.container, &self.prefix)
                .await?;
            Ok(relative_names(blobs, &self.prefix))
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            let response = self
                .clients
                .request(reqwest::Method::DELETE, &self.blob_url(name), &[], 0)
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
            let headers = [(
                HeaderName::from_static("x-ms-blob-type"),
                "BlockBlob".to_string(),
            )];
            put(
                &self.clients,
                &self.url_of(name),
                &self.blob_url(name),
                &headers,
                bytes,
            )
            .await
        })
    }

    fn start_upload<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Tried<Arc<dyn Upload>>> {
        Box::pin(async move {
            Ok(Arc::new(BlockUpload {
                url: self.url_of(name),
                blob_url: self.blob_url(name),
                clients: self.clients.clone(),
            }) as Arc<dyn Upload>)
        })
    }
}

/// A block blob uploaded in blocks: staged blocks are invisible until the block list
/// commits them, and Azure discards uncommitted ones by itself (after a week), so an
/// abandoned upload leaves no blob.
struct BlockUpload {
    url: String,
    blob_url: String,
    clients: AzureClients,
}

/// Block ids are Base64 and, within a blob, all of one length.
fn block_id(number: u32) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("block-{number:08}"))
}

impl Upload for BlockUpload {
    fn parts_in_flight(&self) -> usize {
        4
    }

    fn send_part(&self, number: u32, _offset: u64, bytes: Bytes) -> BoxFuture<'_, Tried<String>> {
        Box::pin(async move {
            let id = block_id(number);
            let url = format!(
                "{}?comp=block&blockid={}",
                self.blob_url,
                utf8_percent_encode(&id, QUERY)
            );
            put(&self.clients, &self.url, &url, &[], bytes).await?;
            Ok(id)
        })
    }

    fn complete<'a>(
        &'a self,
        parts: &'a [(u32, String)],
        last: Bytes,
        offset: u64,
    ) -> BoxFuture<'a, Tried<()>> {
        Box::pin(async move {
            let mut ids: Vec<String> = parts.iter().map(|(_, id)| id.clone()).collect();
            if !last.is_empty() {
                let number = parts.last().map_or(1, |(n, _)| n + 1);
                ids.push(self.send_part(number, offset, last).await?);
            }
            let mut list = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
            for id in ids {
                list.push_str(&format!("<Latest>{id}</Latest>"));
            }
            list.push_str("</BlockList>");
            let url = format!("{}?comp=blocklist", self.blob_url);
            put(&self.clients, &self.url, &url, &[], Bytes::from(list)).await
        })
    }

    fn abort(&self) -> BoxFuture<'_, Tried<()>> {
        // Nothing to undo: uncommitted blocks are never seen, and expire.
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms_name_account_container_and_path() {
        let az = parse("az://c/a/b.parquet").unwrap();
        assert_eq!(
            (az.account, az.container, az.path),
            (None, "c", "a/b.parquet")
        );
        assert_eq!(az.root, "az://c/");
        let abfs = parse("abfss://c@acct.dfs.core.windows.net/a/b").unwrap();
        assert_eq!(
            (abfs.account, abfs.container, abfs.path),
            (Some("acct"), "c", "a/b")
        );
        assert_eq!(abfs.root, "abfss://c@acct.dfs.core.windows.net/");
        let https = parse("https://acct.blob.core.windows.net/c/a/b").unwrap();
        assert_eq!(
            (https.account, https.container, https.path),
            (Some("acct"), "c", "a/b")
        );
        assert_eq!(https.root, "https://acct.blob.core.windows.net/c/");
        assert!(parse("az:///x").is_err());
        assert!(is_blob_host("https://acct.blob.core.windows.net/c/x"));
        assert!(!is_blob_host("https://example.com/c/x"));
    }

    #[test]
    fn listings_and_connection_strings_are_read() {
        let xml = "<EnumerationResults><Blobs><Blob><Name>a&amp;b</Name><Properties><Content-Length>3</Content-Length><Etag>\"0x1\"</Etag></Properties></Blob></Blobs><NextMarker>m</NextMarker></EnumerationResults>";
        let blob = elements(xml, "Blob").next().unwrap();
        assert_eq!(element(blob, "Name").as_deref(), Some("a&b"));
        assert_eq!(element(blob, "Etag").as_deref(), Some("\"0x1\""));
        assert_eq!(element(xml, "NextMarker").as_deref(), Some("m"));
        let parts =
            connection_string("DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=a2V5;")
                .unwrap();
        assert_eq!(
            parts.endpoint.as_deref(),
            Some("http://dev.blob.core.windows.net")
        );
        assert_eq!(parts.key.as_deref(), Some("a2V5"));
    }
}
