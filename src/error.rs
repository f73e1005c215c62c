//! The crate's one error type. Every variant that concerns data names the file/URL
//! and, where it is known, the position inside it, so a user can find the bad bytes.
//! Messages show URLs with their secrets masked (see [`redact`]); the `url` fields keep
//! them whole.

use std::fmt;

use crate::source::redact;

/// `url: ` to start an error's message, or nothing when no file or URL is at fault (a
/// `concatenate` of in-memory datasets, a cast).
fn located(url: &str) -> String {
    if url.is_empty() {
        String::new()
    } else {
        format!("{}: ", redact(url))
    }
}

/// Where inside a file an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Position {
    /// Not known, or the error concerns the whole file.
    #[default]
    Unknown,
    /// Byte offset from the start of the (decompressed) stream.
    Byte(u64),
    /// 1-based line number (line-oriented formats).
    Line(u64),
    /// 0-based Parquet row group.
    RowGroup(usize),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Unknown => Ok(()),
            Position::Byte(offset) => write!(f, " at byte {offset}"),
            Position::Line(line) => write!(f, " at line {line}"),
            Position::RowGroup(rg) => write!(f, " in row group {rg}"),
        }
    }
}

/// Everything that can go wrong in shardflow. Python sees each variant as a subclass of
/// `shardflow.ShardflowError` (`NotFound` is also a `FileNotFoundError`, and so on).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or object that does not exist.
    #[error("{}: no such file", redact(.url))]
    NotFound {
        /// The path or URL.
        url: String,
    },

    /// A Hugging Face Hub repo, revision or file that does not exist (or that the token
    /// given may not see): the reason says which.
    #[error("{}: {reason}", redact(.url))]
    NotOnHub {
        /// The `hf://` URL.
        url: String,
        /// What the Hub did not find.
        reason: String,
    },

    /// A glob or prefix that matches nothing.
    #[error("no files match {:?}", redact(.pattern))]
    NoMatch {
        /// The pattern as given.
        pattern: String,
    },

    /// Reading (or listing) was refused.
    #[error("{}: permission denied", redact(.url))]
    PermissionDenied {
        /// The path or URL.
        url: String,
    },

    // The cause's own text may quote the URL (HTTP client errors do).
    /// A failed read, after any retries.
    #[error("{}{position}: I/O error: {}", redact(.url), redact(&.source.to_string()))]
    Io {
        /// The path or URL.
        url: String,
        /// Where the read was.
        position: Position,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not valid data of the expected format.
    #[error("{}{position}: invalid {format} data: {}", redact(.url), redact(.message))]
    Decode {
        /// The file or URL.
        url: String,
        /// The format's name ("Parquet", "JSON", ...).
        format: &'static str,
        /// Where in the file.
        position: Position,
        /// What is wrong.
        message: String,
    },

    /// A write whose destination already holds files.
    #[error("{}: already exists (pass overwrite=True to replace it)", redact(.url))]
    Exists {
        /// The destination.
        url: String,
    },

    /// Writing a shard or a manifest failed.
    #[error("{}: write failed: {}", redact(.url), redact(&.source.to_string()))]
    Write {
        /// The file or object being written.
        url: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// Valid data whose columns do not fit the dataset's schema.
    #[error("{}schema mismatch: {}", located(.url), redact(.message))]
    Schema {
        /// The file or URL.
        url: String,
        /// What does not fit.
        message: String,
    },

    /// A bad argument from the caller.
    #[error("{}", redact(.0))]
    InvalidArgument(String),

    /// A row a chat template or tokenizer cannot turn into tokens (no messages, content
    /// of the wrong type, the template's own `raise_exception`): the message names the
    /// row.
    #[error("{0}")]
    Template(String),

    /// An error raised by a user function (map/filter/...); carried through unchanged.
    #[error("{0}")]
    Callback(Box<dyn std::error::Error + Send + Sync>),

    /// A bug in shardflow, including a panic caught inside a decoder.
    #[error("internal error: {}", redact(.0))]
    Internal(String),
}

/// shardflow's `Result`, with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A bad argument, in the caller's words.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Invalid `format` data in `url` at `position`.
    pub fn decode(
        url: impl Into<String>,
        format: &'static str,
        position: Position,
        message: impl fmt::Display,
    ) -> Self {
        Error::Decode {
            url: url.into(),
            format,
            position,
            message: message.to_string(),
        }
    }

    /// An `std::io::Error` from writing `url`.
    pub fn write(url: impl Into<String>, source: std::io::Error) -> Self {
        Error::Write {
            url: url.into(),
            source,
        }
    }

    /// Maps an `std::io::Error` from opening or reading `url` to the most precise variant.
    pub fn io(url: impl Into<String>, position: Position, source: std::io::Error) -> Self {
        let url = url.into();
        match source.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound { url },
            std::io::ErrorKind::PermissionDenied => Error::PermissionDenied { url },
            _ => Error::Io {
                url,
                position,
                source,
            },
        }
    }

    /// The file or URL the error concerns, if any.
    pub fn url(&self) -> Option<&str> {
        match self {
            Error::NotFound { url }
            | Error::NotOnHub { url, .. }
            | Error::PermissionDenied { url }
            | Error::Exists { url }
            | Error::Write { url, .. }
            | Error::Io { url, .. }
            | Error::Decode { url, .. }
            | Error::Schema { url, .. } => Some(url),
            Error::NoMatch { pattern } => Some(pattern),
            _ => None,
        }
    }

    /// Errors in the data itself, which `on_error="skip"` may skip.
    pub fn is_data_error(&self) -> bool {
        matches!(self, Error::Decode { .. } | Error::Schema { .. })
    }
}

/// Formats a caught panic payload for an `Internal` error.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_file_and_position() {
        let e = Error::decode("data/a.jsonl", "JSON", Position::Line(7), "expected value");
        assert_eq!(
            e.to_string(),
            "data/a.jsonl at line 7: invalid JSON data: expected value"
        );
        let e = Error::io(
            "x.parquet",
            Position::Byte(10),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert!(matches!(e, Error::NotFound { .. }));
        assert_eq!(e.url(), Some("x.parquet"));
        let e = Error::io(
            "y",
            Position::Unknown,
            std::io::ErrorKind::PermissionDenied.into(),
        );
        assert!(matches!(e, Error::PermissionDenied { .. }));
        let e = Error::io(
            "z",
            Position::Byte(3),
            std::io::ErrorKind::UnexpectedEof.into(),
        );
        assert_eq!(
            e.to_string(),
            "z at byte 3: I/O error: unexpected end of file"
        );
    }

    #[test]
    fn messages_mask_secrets_in_urls() {
        let url = "https://u:pw@h/x.parquet?X-Amz-Signature=SECRET";
        let errors = [
            Error::NotFound { url: url.into() },
            Error::decode(url, "Parquet", Position::Byte(4), format!("unlike {url}")),
            Error::io(
                url,
                Position::Unknown,
                std::io::Error::other(format!("for url ({url})")),
            ),
            Error::invalid_argument(format!("{url}: cannot infer the format")),
            Error::Internal(url.into()),
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.contains("SECRET") && !text.contains("pw"), "{text}");
            assert!(
                text.contains("https://***@h/x.parquet?X-Amz-Signature=***"),
                "{text}"
            );
        }
        assert_eq!(Error::NotFound { url: url.into() }.url(), Some(url));
    }
}
