//! `storage_options`: how remote data is reached (endpoint, region, credentials, limits,
//! retries, cache), and the per-dataset state built from them: the request limit every
//! reader of the dataset shares, the disk cache, and clients rebuilt after `fork()`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::cache::DiskCache;
use super::retry::RetryPolicy;
use crate::error::Result;
use crate::options::Options;

/// Settings for S3 and HTTP(S) sources. Secrets are never printed.
#[derive(Clone)]
pub struct StorageOptions {
    /// S3-compatible endpoint; `AWS_ENDPOINT_URL` when not given.
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    /// Unsigned requests (public buckets).
    pub anonymous: bool,
    /// `bucket.host` (false) or `host/bucket` (true) addressing; path style by default
    /// when an endpoint is given, as S3-compatible servers expect.
    pub force_path_style: Option<bool>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// A named profile from the shared AWS config/credentials files.
    pub profile: Option<String>,
    /// Requests in flight at once, for the whole dataset.
    pub max_concurrency: usize,
    pub retry: RetryPolicy,
    /// Limit on waiting for a response, and for each part of a body.
    pub timeout: Duration,
    /// Objects larger than this are fetched as parallel ranges of this size.
    pub chunk_size: u64,
    pub cache_dir: Option<PathBuf>,
    pub cache_size: u64,
    /// The Hugging Face Hub's address; `HF_ENDPOINT` when not given.
    pub hf_endpoint: Option<String>,
    /// The Hub token; `HF_TOKEN`, or the token file, when not given.
    pub hf_token: Option<String>,
    /// GCS (named as gcsfs names them): `token` (a credentials file, `"anon"`,
    /// `"google_default"`, `"cloud"`), `project`, and whether buckets bill the requester.
    pub gcs_token: Option<String>,
    pub gcs_project: Option<String>,
    pub requester_pays: bool,
    /// Azure (named as adlfs names them).
    pub azure: AzureOptions,
}

/// Azure Blob settings, named as adlfs names them; each falls back on its `AZURE_STORAGE_*`
/// variable (see `source::azure`).
#[derive(Clone, Default)]
pub struct AzureOptions {
    pub account_name: Option<String>,
    pub account_key: Option<String>,
    pub connection_string: Option<String>,
    pub sas_token: Option<String>,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// Unsigned requests (public containers).
    pub anon: bool,
}

impl std::fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageOptions")
            .field(
                "endpoint_url",
                &self.endpoint_url.as_deref().map(super::redact),
            )
            .field("region", &self.region)
            .field("anonymous", &self.anonymous)
            .field(
                "credentials",
                &self.access_key_id.as_ref().map(|_| "<given>"),
            )
            .field("hf_endpoint", &self.hf_endpoint)
            .field("hf_token", &self.hf_token.as_ref().map(|_| "<given>"))
            .field("gcs_token", &self.gcs_token.as_ref().map(|_| "<given>"))
            .field("gcs_project", &self.gcs_project)
            .field("azure_account_name", &self.azure.account_name)
            .field("max_concurrency", &self.max_concurrency)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            endpoint_url: None,
            region: None,
            anonymous: false,
            force_path_style: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            profile: None,
            max_concurrency: 64,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            chunk_size: 8 * 1024 * 1024,
            cache_dir: None,
            cache_size: 10 << 30,
            hf_endpoint: None,
            hf_token: None,
            gcs_token: None,
            gcs_project: None,
            requester_pays: false,
            azure: AzureOptions::default(),
        }
    }
}

impl StorageOptions {
    pub fn parse(options: &Options) -> Result<Self> {
        let d = Self::default();
        let mut r = options.storage_reader();
        let owned = |s: Option<&str>| s.map(str::to_string);
        let parsed = Self {
            endpoint_url: owned(r.string("endpoint_url")?),
            region: owned(r.string("region")?),
            anonymous: r.bool("anonymous", false)?,
            force_path_style: match r.string("addressing_style")? {
                None => None,
                Some("path") => Some(true),
                Some("virtual") => Some(false),
                Some(_) => {
                    return Err(crate::error::Error::invalid_argument(
                        "storage_options[\"addressing_style\"] must be \"path\" or \"virtual\"",
                    ));
                }
            },
            access_key_id: owned(r.string("access_key_id")?),
            secret_access_key: owned(r.string("secret_access_key")?),
            session_token: owned(r.string("session_token")?),
            profile: owned(r.string("profile")?),
            max_concurrency: r.u64("max_concurrency", d.max_concurrency as u64)?.max(1) as usize,
            retry: RetryPolicy {
                max_attempts: r
                    .u64("max_attempts", u64::from(d.retry.max_attempts))?
                    .clamp(1, 100) as u32,
                base: r.seconds("retry_base_seconds", d.retry.base)?,
                max: r.seconds("retry_max_seconds", d.retry.max)?,
            },
            timeout: r
                .seconds("timeout_seconds", d.timeout)?
                .max(Duration::from_millis(1)),
            chunk_size: r.u64("chunk_size", d.chunk_size)?.max(64 * 1024),
            cache_dir: owned(r.string("cache_dir")?).map(PathBuf::from),
            cache_size: r.u64("cache_size", d.cache_size)?,
            hf_endpoint: owned(r.string("hf_endpoint")?),
            hf_token: owned(r.string("hf_token")?),
            gcs_token: owned(r.string("token")?),
            gcs_project: owned(r.string("project")?),
            requester_pays: r.bool("requester_pays", false)?,
            azure: AzureOptions {
                account_name: owned(r.string("account_name")?),
                account_key: owned(r.string("account_key")?),
                connection_string: owned(r.string("connection_string")?),
                sas_token: owned(r.string("sas_token")?),
                tenant_id: owned(r.string("tenant_id")?),
                client_id: owned(r.string("client_id")?),
                client_secret: owned(r.string("client_secret")?),
                anon: r.bool("anon", false)?,
            },
        };
        r.finish()?;
        Ok(parsed)
    }
}

/// A client that belongs to the process that built it (connection pools do not survive
/// `fork()`; PyTorch workers fork).
pub struct PerProcess<T: Clone> {
    slot: Mutex<Option<(u32, T)>>,
}

impl<T: Clone> Default for PerProcess<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }
}

impl<T: Clone> PerProcess<T> {
    /// This process's value, made by `make` on first use here. The lock is not held
    /// while `make` runs: a `fork()` while another thread is inside `make` (which may do
    /// network I/O) must not leave the child with a lock nobody will release.
    pub fn get_or_try_init(&self, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let pid = std::process::id();
        if let Some(value) = self.current(pid) {
            return Ok(value);
        }
        let value = make()?;
        Ok(self.install(pid, value))
    }

    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> T {
        let pid = std::process::id();
        self.current(pid)
            .unwrap_or_else(|| self.install(pid, make()))
    }

    /// Keeps `value` as this process's, unless another thread of the process got there
    /// first (then everyone shares that one).
    fn install(&self, pid: u32, value: T) -> T {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, existing)) = slot.as_ref()
            && *owner == pid
        {
            return existing.clone();
        }
        // A value inherited from the parent is left alone, not dropped: its pool refers
        // to threads this process does not have.
        if let Some(stale) = slot.replace((pid, value.clone())) {
            std::mem::forget(stale);
        }
        value
    }

    fn current(&self, pid: u32) -> Option<T> {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some((owner, value)) if *owner == pid => Some(value.clone()),
            _ => None,
        }
    }
}

/// What every remote read of one dataset shares.
pub struct Storage {
    pub options: StorageOptions,
    /// Requests in flight, across all loaders of the dataset in this process. Per
    /// process: a forked child inherits the parent's permits as taken by tasks it does
    /// not have, which would never give them back.
    limit: PerProcess<Arc<Semaphore>>,
    pub cache: Option<DiskCache>,
    /// Each backend's clients (see [`Storage::client`]).
    clients: Clients,
}

/// This process's clients, one per type: each backend keeps its own here (the HTTP
/// transport its reqwest client, S3 its SDK client and signer), so that storage names
/// none of them.
#[derive(Default)]
struct Clients {
    /// A [`PerProcess`] slot per type, made on first use. The slots themselves carry no
    /// process state, so a forked child keeps using them: their values are what
    /// `PerProcess` rebuilds.
    slots: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Clients {
    fn slot<T: Clone + Send + Sync + 'static>(&self) -> Arc<PerProcess<T>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(PerProcess::<T>::default()))
            .clone();
        slot.downcast::<PerProcess<T>>()
            .unwrap_or_else(|_| unreachable!("the slot of a type holds that type"))
    }
}

impl Storage {
    pub fn new(options: StorageOptions) -> Result<Arc<Self>> {
        let cache = match &options.cache_dir {
            Some(dir) => Some(DiskCache::open(dir.clone(), options.cache_size)?),
            None => None,
        };
        Ok(Arc::new(Self {
            limit: PerProcess::default(),
            cache,
            options,
            clients: Clients::default(),
        }))
    }

    pub fn local_only() -> Arc<Self> {
        Arc::new(Self {
            limit: PerProcess::default(),
            cache: None,
            options: StorageOptions::default(),
            clients: Clients::default(),
        })
    }

    /// The request limit shared by this process's readers of the dataset.
    pub fn limit(&self) -> Arc<Semaphore> {
        self.limit
            .get_or_init(|| Arc::new(Semaphore::new(self.options.max_concurrency)))
    }

    /// This process's client of type `T` for the dataset, made by `make` on first use
    /// here (and again in a forked child), as [`PerProcess::get_or_try_init`] makes it:
    /// no lock is held while `make` runs, so `make` may ask for another client.
    pub fn client<T: Clone + Send + Sync + 'static>(
        &self,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.clients.slot::<T>().get_or_try_init(make)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_kept_one_per_type() {
        let storage = Storage::local_only();
        assert_eq!(storage.client(|| Ok(7u32)).unwrap(), 7);
        assert_eq!(storage.client::<u32>(|| unreachable!()).unwrap(), 7);
        // `make` may ask for another client: no lock is held while it runs.
        let made = storage.client(|| Ok(format!("{}", storage.client::<u32>(|| unreachable!())?)));
        assert_eq!(made.unwrap(), "7");
        assert!(
            storage
                .client::<u64>(|| Err(crate::error::Error::Internal("no".into())))
                .is_err()
        );
        assert_eq!(storage.client(|| Ok(8u64)).unwrap(), 8);
    }
}
