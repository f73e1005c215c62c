//! Hugging Face Hub repos: `hf://datasets/org/name[@revision][/path]` (and model repos,
//! `hf://org/name...`, for tokenizers), named as
//! `huggingface_hub`'s `HfFileSystem` names them (a revision with slashes, such as
//! `refs/convert/parquet`, written plainly or as `refs%2Fconvert%2Fparquet`).
//!
//! - A listing asks for the revision's commit (one request) and lists the files with the
//!   tree API (one request a page, following the `Link` header). Every shard URL then
//!   names that commit, so each process, rank and resume reads the same bytes whatever is
//!   pushed meanwhile, and a dataset's pickled recipe carries the listing (workers list
//!   nothing).
//! - Files are read with range GETs on `resolve/{commit}/{path}`, which the Hub answers
//!   with a redirect to its storage host; reqwest drops the `Authorization` header on a
//!   redirect to another host, as `huggingface_hub` does.
//! - `HF_ENDPOINT` (or `storage_options["hf_endpoint"]`) chooses the server; the token is
//!   `storage_options["hf_token"]`, else `HF_TOKEN`, else the file `hf auth login`
//!   writes (`HF_TOKEN_PATH`, else `$HF_HOME/token`).
//! - A 404's `X-Error-Code` says which of repo, revision and file is missing; a 429 is
//!   retried after the wait its `Retry-After` or `RateLimit` header asks.

use std::sync::Arc;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use reqwest::header::{AUTHORIZATION, HeaderMap, LINK};
use serde_json::Value;

use super::backend::Backend;
use super::object::{IoCounters, ShardMeta, Source};
use super::pattern::is_glob;
use super::remote::open_shard;
use super::retry::{Failure, retrying};
use super::runtime::runtime;
use super::storage::Storage;
use super::transport::{HttpObject, client, status_failure, transport_failure};
use crate::error::{Error, Position, Result};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The revision a URL without `@revision` reads, as on the Hub.
const DEFAULT_REVISION: &str = "main";

/// Escaped in a revision or a path segment of a request URL.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b']');
/// Escaped in a path (its slashes kept).
const PATH: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'?')
    .add(b'[')
    .add(b']');

/// What a repo holds: a dataset (`hf://datasets/org/name`) or a model (`hf://org/name`,
/// as `HfFileSystem` names it; `hf://models/org/name` is read too), such as a
/// tokenizer's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    Dataset,
    Model,
}

impl RepoKind {
    /// What comes before `org/name` in `hf://` URLs and on the Hub's pages.
    fn prefix(self) -> &'static str {
        match self {
            RepoKind::Dataset => "datasets/",
            RepoKind::Model => "",
        }
    }

    /// The API's name for repos of this kind.
    fn api(self) -> &'static str {
        match self {
            RepoKind::Dataset => "datasets",
            RepoKind::Model => "models",
        }
    }
}

/// A place in a repo: `hf://datasets/{repo}@{revision}/{path}`, or `hf://{repo}@...` for
/// a model repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoPath {
    pub kind: RepoKind,
    /// `org/name`.
    pub repo: String,
    pub revision: Option<String>,
    /// Below the repo's root, without leading or trailing `/`; may be a glob.
    pub path: String,
}

impl RepoPath {
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid_argument(format!(
                "{url}: {why}; expected hf://datasets/org/name[@revision][/path] (a dataset repo) or hf://org/name[@revision][/path] (a model repo)"
            ))
        };
        let rest = url
            .strip_prefix("hf://")
            .ok_or_else(|| bad("not an hf:// URL"))?;
        let (kind, rest) = if let Some(rest) = rest.strip_prefix("datasets/") {
            (RepoKind::Dataset, rest)
        } else if rest.starts_with("spaces/") {
            return Err(bad("Spaces cannot be read"));
        } else {
            (
                RepoKind::Model,
                rest.strip_prefix("models/").unwrap_or(rest),
            )
        };
        let mut parts = rest.splitn(3, '/');
        let org = parts.next().filter(|s| !s.is_empty());
        let second = parts.next().filter(|s| !s.is_empty());
        let (Some(org), Some(second)) = (org, second) else {
            return Err(bad("no repo id"));
        };
        let mut path = parts.next().unwrap_or("");
        let (name, revision) = match second.split_once('@') {
            None => (second, None),
            Some((name, revision)) => {
                let mut revision = percent_decode_str(revision)
                    .decode_utf8_lossy()
                    .into_owned();
                // `refs/convert/parquet` and `refs/pr/N`, slashes unescaped: their
                // segments run on into the path.
                if revision == "refs" {
                    let mut segments = path.splitn(3, '/');
                    match (segments.next(), segments.next()) {
                        (Some(kind @ ("convert" | "pr")), Some(id)) if !id.is_empty() => {
                            revision = format!("refs/{kind}/{id}");
                            path = segments.next().unwrap_or("");
                        }
                        _ => return Err(bad("an incomplete refs/ revision")),
                    }
                }
                if revision.is_empty() {
                    return Err(bad("an empty revision"));
                }
                (name, Some(revision))
            }
        };
        if name.is_empty() {
            return Err(bad("no repo name"));
        }
        Ok(Self {
            kind,
            repo: format!("{org}/{name}"),
            revision,
            path: path.trim_matches('/').to_string(),
        })
    }

    fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }
}

/// The `hf://` URL of `path` in `repo` (of `kind`) at `revision`.
pub fn url_of(kind: RepoKind, repo: &str, revision: &str, path: &str) -> String {
    let revision = utf8_percent_encode(revision, SEGMENT);
    let prefix = kind.prefix();
    match path {
        "" => format!("hf://{prefix}{repo}@{revision}"),
        _ => format!("hf://{prefix}{repo}@{revision}/{path}"),
    }
}

/// The server and the token.
struct Hub {
    endpoint: String,
    token: Option<String>,
}

impl Hub {
    fn new(storage: &Storage) -> Self {
        let options = &storage.options;
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let endpoint = options
            .hf_endpoint
            .clone()
            .or_else(|| env("HF_ENDPOINT"))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = options
            .hf_token
            .clone()
            .or_else(|| env("HF_TOKEN"))
            .or_else(|| {
                let text = std::fs::read_to_string(token_file(env)?).ok()?;
                Some(text.trim().to_string()).filter(|t| !t.is_empty())
            });
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    fn api(&self, kind: RepoKind, repo: &str, tail: &str) -> String {
        format!("{}/api/{}/{repo}/{tail}", self.endpoint, kind.api())
    }

    /// GETs a JSON answer of the API, retried as file reads are; `name` is what errors
    /// name. Returns the `Link: <...>; rel="next"` page with it.
    async fn get_json(
        &self,
        url: &str,
        name: &str,
        storage: &Storage,
    ) -> Result<(Value, Option<String>)> {
        let client = client(storage)?;
        let options = &storage.options;
        let attempt = || async {
            let mut request = client.get(url);
            if let Some(token) = &self.token {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let response = request.send().await.map_err(transport_failure)?;
            if !response.status().is_success() {
                return Err(status_failure(name, &response, Some(not_found)));
            }
            let next = next_page(response.headers());
            let body = response.bytes().await.map_err(transport_failure)?;
            let value = serde_json::from_slice(&body).map_err(|e| {
                Failure::Permanent(Error::decode(
                    name,
                    "Hub API answer",
                    Position::Unknown,
                    e.to_string(),
                ))
            })?;
            Ok((value, next))
        };
        retrying(options.retry, options.timeout, attempt, |cause, tries| {
            Error::Io {
                url: name.to_string(),
                position: Position::Unknown,
                source: std::io::Error::other(format!(
                    "the Hub's API failed after {tries} attempts: {cause}"
                )),
            }
        })
        .await
    }
}

/// Where `hf auth login` keeps the token: `HF_TOKEN_PATH`, else `$HF_HOME/token`, where
/// `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
fn token_file(env: impl Fn(&str) -> Option<String>) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(path) = env("HF_TOKEN_PATH") {
        return Some(PathBuf::from(path));
    }
    let home = match env("HF_HOME") {
        Some(home) => PathBuf::from(home),
        None => {
            let cache = env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            cache.join("huggingface")
        }
    };
    Some(home.join("token"))
}

/// A commit id (40 hex digits) names itself; a branch or tag must be asked for.
fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The `rel="next"` URL of a `Link` header.
fn next_page(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| matches!(p.trim(), r#"rel="next""# | "rel=next"))
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

/// Lists `hf://datasets/org/name[@revision][/path]`: a glob's matches, the files below a
/// folder (recursively, hidden and `_` files left out, as for local folders and `s3://`
/// prefixes), or the one file named. Sizes and versions come from the listing.
pub fn list(url: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
    let target = RepoPath::parse(url)?;
    let hub = Hub::new(storage);
    let rt = runtime()?;
    let revision = target.revision();
    let commit = if is_commit(revision) {
        revision.to_string()
    } else {
        let info_url = hub.api(
            target.kind,
            &target.repo,
            &format!("revision/{}", utf8_percent_encode(revision, SEGMENT)),
        );
        let name = url_of(target.kind, &target.repo, revision, "");
        let (info, _) = rt.block_on(hub.get_json(&info_url, &name, storage))?;
        info.get("sha")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| Error::Io {
                url: name.clone(),
                position: Position::Unknown,
                source: std::io::Error::other("the Hub's answer names no commit (\"sha\")"),
            })?
    };
    let glob = is_glob(&target.path);
    // The folder to list: above the first glob character, or above the path named (a
    // file or a folder, which the listing tells apart).
    let literal = match glob {
        true => &target.path[..target.path.find(['*', '?', '[']).unwrap_or(0)],
        false => target.path.as_str(),
    };
    let folder = match literal.rfind('/') {
        Some(i) => &literal[..i],
        None => "",
    };
    let mut next = Some(format!(
        "{}?recursive=true&expand=false",
        hub.api(
            target.kind,
            &target.repo,
            &format!(
                "tree/{}/{}",
                utf8_percent_encode(&commit, SEGMENT),
                utf8_percent_encode(folder, PATH)
            )
        )
        .trim_end_matches('/')
    ));
    let matcher = match glob {
        true => Some(
            glob::Pattern::new(&target.path)
                .map_err(|e| Error::invalid_argument(format!("bad glob {url:?}: {e}")))?,
        ),
        false => None,
    };
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let name = url_of(target.kind, &target.repo, revision, folder);
    let mut shards = Vec::new();
    while let Some(page) = next.take() {
        let (entries, following) = rt.block_on(hub.get_json(&page, &name, storage))?;
        next = following;
        for entry in entries.as_array().into_iter().flatten() {
            if entry.get("type").and_then(Value::as_str) != Some("file") {
                continue;
            }
            let Some(path) = entry.get("path").and_then(Value::as_str) else {
                continue;
            };
            let keep = match &matcher {
                Some(m) => m.matches_with(path, options),
                None if path == target.path => true,
                None => {
                    let below = match target.path.as_str() {
                        "" => Some(path),
                        dir => path.strip_prefix(dir).and_then(|p| p.strip_prefix('/')),
                    };
                    below.is_some_and(|rest| !rest.split('/').any(|s| s.starts_with(['.', '_'])))
                }
            };
            if !keep {
                continue;
            }
            let lfs = entry.get("lfs");
            let field = |key: &str| {
                lfs.and_then(|l| l.get(key))
                    .or_else(|| entry.get(key))
                    .cloned()
            };
            shards.push(ShardMeta {
                url: url_of(target.kind, &target.repo, &commit, path),
                size: field("size").and_then(|v| v.as_u64()),
                etag: field("oid").and_then(|v| v.as_str().map(str::to_string)),
                rows: None,
            });
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

/// `hf://` URLs.
pub struct Hf;

impl Backend for Hf {
    fn list(&self, spec: &str, storage: &Arc<Storage>) -> Result<Vec<ShardMeta>> {
        list(spec, storage)
    }

    fn open(
        &self,
        shard: &ShardMeta,
        storage: &Arc<Storage>,
        counters: Arc<IoCounters>,
    ) -> Result<Arc<dyn Source>> {
        let object = object(&shard.url, storage)?;
        Ok(open_shard(shard, Box::new(object), storage, counters))
    }
}

/// The requests of one file of a repo: range GETs of its `resolve` URL, named by its
/// `hf://` URL, with the token. Its ETag is not pinned (the URL names a commit, so the
/// bytes never change, and the redirects land on a storage host whose ETags are not the
/// Hub's); a refusal's `X-Error-Code` says what is missing.
fn object(url: &str, storage: &Arc<Storage>) -> Result<HttpObject> {
    let target = RepoPath::parse(url)?;
    if target.path.is_empty() || is_glob(&target.path) {
        return Err(Error::invalid_argument(format!(
            "{url}: not one file of the repo"
        )));
    }
    let hub = Hub::new(storage);
    let resolve = format!(
        "{}/{}{}/resolve/{}/{}",
        hub.endpoint,
        target.kind.prefix(),
        target.repo,
        utf8_percent_encode(target.revision(), SEGMENT),
        utf8_percent_encode(&target.path, PATH)
    );
    Ok(HttpObject::new(&resolve, storage)?
        .named(url.to_string())
        .authorization(hub.token.as_deref().map(|t| format!("Bearer {t}")))
        .unpinned()
        .error_codes(not_found))
}

/// The error for a refusal whose `X-Error-Code` says what the Hub did not find; `None`
/// for codes that mean something else.
pub fn not_found(url: &str, code: &str, message: Option<&str>) -> Option<Error> {
    let place = RepoPath::parse(url).ok();
    let repo = place.as_ref().map_or("the repo", |p| p.repo.as_str());
    let revision = place.as_ref().map_or(DEFAULT_REVISION, |p| p.revision());
    let reason = match code {
        "RepoNotFound" => format!(
            "no dataset repo {repo} on the Hub (or it is private: pass token= or set HF_TOKEN)"
        ),
        "RevisionNotFound" => format!("repo {repo} has no revision {revision:?}"),
        "EntryNotFound" => {
            let path = place.as_ref().map_or("", |p| p.path.as_str());
            format!("repo {repo} has no file {path:?} at revision {revision:?}")
        }
        "GatedRepo" => {
            format!("repo {repo} is gated: accept its conditions on the Hub and pass a token")
        }
        _ => return None,
    };
    let reason = match message {
        Some(m) if !m.is_empty() => format!("{reason} ({m})"),
        _ => reason,
    };
    Some(Error::NotOnHub {
        url: url.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(repo: &str, revision: Option<&str>, path: &str) -> RepoPath {
        RepoPath {
            kind: RepoKind::Dataset,
            repo: repo.into(),
            revision: revision.map(str::to_string),
            path: path.into(),
        }
    }

    #[test]
    fn urls_name_repo_revision_and_path() {
        let parse = |u: &str| RepoPath::parse(u).unwrap();
        assert_eq!(parse("hf://datasets/o/n"), path("o/n", None, ""));
        assert_eq!(parse("hf://datasets/o/n/"), path("o/n", None, ""));
        assert_eq!(
            parse("hf://datasets/o/n@v1.0/data/*.parquet"),
            path("o/n", Some("v1.0"), "data/*.parquet")
        );
        let converted = path(
            "o/n",
            Some("refs/convert/parquet"),
            "default/train/0.parquet",
        );
        assert_eq!(
            parse("hf://datasets/o/n@refs/convert/parquet/default/train/0.parquet"),
            converted
        );
        assert_eq!(
            parse("hf://datasets/o/n@refs%2Fconvert%2Fparquet/default/train/0.parquet"),
            converted
        );
        assert_eq!(
            parse("hf://datasets/o/n@refs/pr/3"),
            path("o/n", Some("refs/pr/3"), "")
        );
        let model = |p: RepoPath| RepoPath {
            kind: RepoKind::Model,
            ..p
        };
        assert_eq!(
            parse("hf://o/n@v2/tokenizer.json"),
            model(path("o/n", Some("v2"), "tokenizer.json"))
        );
        assert_eq!(parse("hf://models/o/n"), model(path("o/n", None, "")));
        assert_eq!(
            url_of(RepoKind::Model, "o/n", "main", "a"),
            "hf://o/n@main/a"
        );
        for bad in [
            "hf://spaces/o/n",
            "hf://o",
            "hf://datasets/o",
            "hf://datasets/o/n@",
            "hf://datasets/o/n@refs/x",
        ] {
            assert!(RepoPath::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            url_of(
                RepoKind::Dataset,
                "o/n",
                "refs/convert/parquet",
                "a b.parquet"
            ),
            "hf://datasets/o/n@refs%2Fconvert%2Fparquet/a b.parquet"
        );
        let back = RepoPath::parse(&url_of(RepoKind::Dataset, "o/n", "refs/pr/1", "x")).unwrap();
        assert_eq!(back, path("o/n", Some("refs/pr/1"), "x"));
    }

    #[test]
    fn pages_follow_the_link_header() {
        let mut headers = HeaderMap::new();
        headers.insert(
            LINK,
            r#"<https://h/api/datasets/o/n/tree/main?cursor=abc>; rel="next""#
                .parse()
                .unwrap(),
        );
        assert_eq!(
            next_page(&headers).as_deref(),
            Some("https://h/api/datasets/o/n/tree/main?cursor=abc")
        );
        assert_eq!(next_page(&HeaderMap::new()), None);
        assert!(is_commit(&"a".repeat(40)) && !is_commit("main"));
    }

    #[test]
    fn error_codes_say_what_is_missing() {
        let url = "hf://datasets/o/n@v2/data/x.parquet";
        let text = |code| not_found(url, code, None).unwrap().to_string();
        assert!(text("RepoNotFound").contains("no dataset repo o/n"));
        assert!(text("RevisionNotFound").contains(r#"no revision "v2""#));
        assert!(text("EntryNotFound").contains(r#"no file "data/x.parquet" at revision "v2""#));
        assert!(not_found(url, "SomethingElse", None).is_none());
    }
}
