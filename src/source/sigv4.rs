//! AWS Signature Version 4 for plain GETs: what the S3 read path signs without the SDK's
//! per-request orchestration (identity resolution, endpoint rules, interceptors), which
//! cost about 420 µs of CPU per small object.
//!
//! Credentials come from the SDK's provider (the standard chain, profiles, explicit keys)
//! and are kept until five minutes before they expire, as the SDK's identity cache does.
//! The derived signing key is kept per (day, region, service): a GET then costs one
//! SHA-256 of its canonical request and one HMAC of the string to sign. The payload is
//! `UNSIGNED-PAYLOAD`, as the SDK and object_store send for GETs. A clock that S3 finds
//! too far off (`RequestTimeTooSkewed`) is corrected by the server's `Date`, as the SDK
//! corrects it.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_lc_rs::{digest, hmac};
use aws_sdk_s3::config::{ProvideCredentials, SharedCredentialsProvider};

use super::retry::Failure;
use crate::error::Error;

pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Credentials this close to expiring are fetched again before use.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// Where a signature is valid: the scope's region and service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub region: String,
    pub service: String,
}

/// Signs requests with the credentials of one provider.
pub struct Signer {
    provider: SharedCredentialsProvider,
    current: Mutex<Option<Arc<Keys>>>,
    /// One refresh at a time: the requests that find the credentials stale wait for it
    /// instead of each asking the provider (which may be a network call).
    refresh: tokio::sync::Mutex<()>,
    /// Seconds the server's clock is ahead of this machine's (negative: behind), learnt
    /// from a `RequestTimeTooSkewed` answer; signatures are dated by the server's clock.
    skew: AtomicI64,
}

/// One set of credentials, and the signing key derived from it last.
struct Keys {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiry: Option<SystemTime>,
    /// (day `YYYYMMDD`, scope, key).
    derived: Mutex<Option<(String, Scope, hmac::Key)>>,
}

impl Keys {
    fn fresh(&self, now: SystemTime) -> bool {
        self.expiry
            .is_none_or(|expiry| now + REFRESH_BEFORE_EXPIRY < expiry)
    }

    fn signing_key(&self, day: &str, scope: &Scope) -> hmac::Key {
        let mut derived = self.derived.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((d, s, key)) = derived.as_ref()
            && d == day
            && s == scope
        {
            return key.clone();
        }
        let key = signing_key(&self.secret_access_key, day, scope);
        *derived = Some((day.to_string(), scope.clone(), key.clone()));
        key
    }
}

impl Signer {
    pub fn new(provider: SharedCredentialsProvider) -> Self {
        Self {
            provider,
            current: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
            skew: AtomicI64::new(0),
        }
    }

    /// Dates later signatures by the server's clock, given its `Date` header.
    pub fn correct_clock(&self, server_date: &str) -> bool {
        let Some(server) = parse_http_date(server_date) else {
            return false;
        };
        let now = unix_seconds(SystemTime::now());
        self.skew.store(server - now, Ordering::Relaxed);
        true
    }

    /// Now, by the server's clock as far as it is known.
    fn now(&self) -> SystemTime {
        let skew = self.skew.load(Ordering::Relaxed);
        let now = SystemTime::now();
        let shift = Duration::from_secs(skew.unsigned_abs());
        if skew >= 0 { now + shift } else { now - shift }
    }

    /// Forgets the credentials, so the next request fetches them again (after the server
    /// said they expired).
    pub fn invalidate(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    async fn keys(&self, now: SystemTime) -> Result<Arc<Keys>, Failure> {
        let cached = || {
            self.current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .filter(|k| k.fresh(now))
        };
        if let Some(keys) = cached() {
            return Ok(keys);
        }
        let _one_at_a_time = self.refresh.lock().await;
        if let Some(keys) = cached() {
            return Ok(keys);
        }
        let credentials = self
            .provider
            .provide_credentials()
            .await
            .map_err(credentials_failure)?;
        let keys = Arc::new(Keys {
            access_key_id: credentials.access_key_id().to_string(),
            secret_access_key: credentials.secret_access_key().to_string(),
            session_token: credentials.session_token().map(str::to_string),
            expiry: credentials.expiry(),
            derived: Mutex::new(None),
        });
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(keys.clone());
        Ok(keys)
    }

    /// The headers that sign a GET of `path` (already URI-encoded, as sent) on `host`,
    /// with `range` among the signed headers: `x-amz-date`, `x-amz-content-sha256`,
    /// `x-amz-security-token` when the credentials have one, and `authorization`.
    pub async fn sign_get(
        &self,
        host: &str,
        path: &str,
        range: &str,
        scope: &Scope,
    ) -> Result<Vec<(&'static str, String)>, Failure> {
        let now = self.now();
        let keys = self.keys(SystemTime::now()).await?;
        let amz_date = amz_date(now);
        let mut headers = vec![
            ("host", host),
            ("range", range),
            ("x-amz-content-sha256", UNSIGNED_PAYLOAD),
            ("x-amz-date", amz_date.as_str()),
        ];
        if let Some(token) = &keys.session_token {
            headers.push(("x-amz-security-token", token));
        }
        // Already in name order (as the canonical request wants them).
        debug_assert!(headers.is_sorted_by_key(|(name, _)| *name));
        let day = &amz_date[..8];
        let authorization = authorization(
            &keys.access_key_id,
            &keys.signing_key(day, scope),
            scope,
            &amz_date,
            &canonical_request("GET", path, &headers, UNSIGNED_PAYLOAD),
            &headers,
        );
        let mut signed = vec![
            ("x-amz-content-sha256", UNSIGNED_PAYLOAD.to_string()),
            ("x-amz-date", amz_date.clone()),
            ("authorization", authorization),
        ];
        if let Some(token) = &keys.session_token {
            signed.push(("x-amz-security-token", token.clone()));
        }
        Ok(signed)
    }
}

/// A provider's failure as the retry loop sees it: a provider that timed out or failed
/// may answer next time; no credentials, or a broken configuration, will not.
fn credentials_failure(err: aws_credential_types::provider::error::CredentialsError) -> Failure {
    use aws_credential_types::provider::error::CredentialsError as E;
    let cause = super::transport::short_cause(&err);
    match err {
        E::ProviderTimedOut(_) | E::ProviderError(_) => {
            Failure::Transient(format!("cannot load AWS credentials: {cause}"))
        }
        _ => Failure::Permanent(Error::invalid_argument(format!(
            "no usable AWS credentials ({cause}): set storage_options access_key_id and \
             secret_access_key, a profile, the AWS_* environment, or anonymous=True for a \
             public bucket"
        ))),
    }
}

/// `kSigning` = HMAC chain of the secret over day, region, service and `aws4_request`.
fn signing_key(secret: &str, day: &str, scope: &Scope) -> hmac::Key {
    let mut key = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, format!("AWS4{secret}").as_bytes()),
        day.as_bytes(),
    );
    for part in [
        scope.region.as_str(),
        scope.service.as_str(),
        "aws4_request",
    ] {
        key = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, key.as_ref()),
            part.as_bytes(),
        );
    }
    hmac::Key::new(hmac::HMAC_SHA256, key.as_ref())
}

/// The canonical request: `headers` lowercase and sorted by name, values trimmed; no
/// query.
fn canonical_request(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
) -> String {
    let mut out = String::with_capacity(256);
    let _ = write!(out, "{method}\n{path}\n\n");
    for (name, value) in headers {
        let _ = writeln!(out, "{name}:{}", value.trim());
    }
    out.push('\n');
    out.push_str(&signed_headers(headers));
    out.push('\n');
    out.push_str(payload_hash);
    out
}

fn signed_headers(headers: &[(&str, &str)]) -> String {
    let names: Vec<&str> = headers.iter().map(|(name, _)| *name).collect();
    names.join(";")
}

/// The `Authorization` header for `canonical`, signed with `key` (see `signing_key`).
fn authorization(
    access_key_id: &str,
    key: &hmac::Key,
    scope: &Scope,
    amz_date: &str,
    canonical: &str,
    headers: &[(&str, &str)],
) -> String {
    let day = &amz_date[..8];
    let scope = format!("{day}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let signature = hex(hmac::sign(key, string_to_sign.as_bytes()).as_ref());
    format!(
        "AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={}, Signature={signature}",
        signed_headers(headers)
    )
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn unix_seconds(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, the only form servers send now) as
/// seconds since 1970.
fn parse_http_date(text: &str) -> Option<i64> {
    let parts: Vec<&str> = text.split_ascii_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts[..] else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms[..] else {
        return None;
    };
    // A server's header is input: out-of-range fields are not a date (and would overflow).
    let in_range = (1..=9999).contains(&year)
        && (1..=31).contains(&day)
        && (0..24).contains(&h)
        && (0..60).contains(&m)
        && (0..=60).contains(&s);
    if !in_range {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days since 1970-01-01 of a date (the inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(at: SystemTime) -> String {
    let secs = unix_seconds(at).max(0) as u64;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// (year, month, day) of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// An S3 key as it goes in a request path (and in the canonical request, which S3 does
/// not encode twice): every byte but `A-Z a-z 0-9 - _ . ~` and `/` percent-encoded.
pub fn encode_key(key: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~')
        .remove(b'/');
    utf8_percent_encode(key, KEEP).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// AWS's documented example "GET Object" (S3 API reference, "Signature Calculations
    /// for the Authorization Header: Transferring Payload in a Single Chunk").
    #[test]
    fn matches_the_documented_get_object_example() {
        let scope = Scope {
            region: "us-east-1".into(),
            service: "s3".into(),
        };
        let headers = [
            ("host", "examplebucket.s3.amazonaws.com"),
            ("range", "bytes=0-9"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", "20130524T000000Z"),
        ];
        let canonical = canonical_request("GET", "/test.txt", &headers, EMPTY_SHA256);
        assert_eq!(
            hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref()),
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
        );
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20130524",
            &scope,
        );
        assert_eq!(
            authorization(
                "AKIAIOSFODNN7EXAMPLE",
                &key,
                &scope,
                "20130524T000000Z",
                &canonical,
                &headers
            ),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// Hands out a new key each call, expiring `lifetime` from now.
    #[derive(Debug)]
    struct Rotating {
        calls: std::sync::atomic::AtomicUsize,
        lifetime: Duration,
    }

    impl ProvideCredentials for Rotating {
        fn provide_credentials<'a>(
            &'a self,
        ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            aws_credential_types::provider::future::ProvideCredentials::ready(Ok(
                aws_credential_types::Credentials::new(
                    format!("KEY{n}"),
                    "secret",
                    Some(format!("token{n}")),
                    Some(SystemTime::now() + self.lifetime),
                    "test",
                ),
            ))
        }
    }

    /// The headers `signer` signs a GET with, by name.
    fn sign(signer: &Signer) -> impl Fn(&str) -> String {
        let scope = Scope {
            region: "us-east-1".into(),
            service: "s3".into(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let headers = rt
            .block_on(signer.sign_get("h", "/b/k", "bytes=0-9", &scope))
            .unwrap();
        move |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap()
        }
    }

    fn signed_key(signer: &Signer) -> (String, String) {
        let get = sign(signer);
        assert!(get("authorization").contains(
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token,"
        ));
        (get("authorization"), get("x-amz-security-token"))
    }

    #[test]
    fn credentials_are_kept_until_near_expiry_or_refused() {
        let lasting = Signer::new(SharedCredentialsProvider::new(Rotating {
            calls: 0.into(),
            lifetime: Duration::from_secs(3600),
        }));
        let (first, token) = signed_key(&lasting);
        assert!(first.contains("Credential=KEY0/") && token == "token0");
        assert!(signed_key(&lasting).0.contains("Credential=KEY0/"));
        // The server said the token expired: the next request fetches new credentials.
        lasting.invalidate();
        let (after, token) = signed_key(&lasting);
        assert!(after.contains("Credential=KEY1/") && token == "token1");

        // Credentials within five minutes of expiring are fetched again for each request.
        let short = Signer::new(SharedCredentialsProvider::new(Rotating {
            calls: 0.into(),
            lifetime: Duration::from_secs(60),
        }));
        assert!(signed_key(&short).0.contains("Credential=KEY0/"));
        assert!(signed_key(&short).0.contains("Credential=KEY1/"));
    }

    #[test]
    fn signatures_are_dated_by_the_servers_clock_once_known() {
        let signer = Signer::new(SharedCredentialsProvider::new(Rotating {
            calls: 0.into(),
            lifetime: Duration::from_secs(3600),
        }));
        assert!(sign(&signer)("x-amz-date").starts_with(&amz_date(SystemTime::now())[..8]));
        assert!(!signer.correct_clock("not a date"));
        assert!(signer.correct_clock("Fri, 24 May 2013 00:00:00 GMT"));
        let get = sign(&signer);
        assert!(
            get("x-amz-date").starts_with("20130524T0000"),
            "{}",
            get("x-amz-date")
        );
        // The scope's day follows the corrected date too.
        assert!(get("authorization").contains("/20130524/us-east-1/s3/aws4_request"));
    }

    #[test]
    fn dates_and_keys() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(amz_date(at(1_369_353_600)), "20130524T000000Z");
        assert_eq!(amz_date(at(951_782_400 + 3_723)), "20000229T010203Z");
        assert_eq!(amz_date(at(0)), "19700101T000000Z");
        assert_eq!(amz_date(at(4_102_444_799)), "20991231T235959Z");
        assert_eq!(
            parse_http_date("Fri, 24 May 2013 00:00:00 GMT"),
            Some(1_369_353_600)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 01:02:03 GMT"),
            Some(951_782_400 + 3_723)
        );
        assert_eq!(parse_http_date("Tue, 29 Feb 2000 01:02:03 CET"), None);
        assert_eq!(parse_http_date("yesterday"), None);
        assert_eq!(
            parse_http_date("Tue, 29 Feb 99999999999999999 01:02:03 GMT"),
            None
        );
        for days in [-1000, 0, 11_000, 20_000, 50_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m.into(), d.into()), days);
        }
        assert_eq!(
            encode_key("a b/c+d=é~_.-/x%y"),
            "a%20b/c%2Bd%3D%C3%A9~_.-/x%25y"
        );
    }
}
