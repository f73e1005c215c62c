//! Keeping secrets that ride in URLs out of text shown to people. Presigned URLs carry
//! signatures and tokens in their query string, and `https://user:password@host/...`
//! carries a password; errors, reprs and warnings show them with those parts masked.
//! Requests always use the URL as given.

use std::borrow::Cow;

/// What a masked secret reads as.
const MASK: &str = "***";

/// Query parameters whose values are secrets: these names exactly, and any name that
/// contains one of [`SECRET_WORDS`] (compared without case).
const SECRET_NAMES: &[&str] = &["sig", "token"];
const SECRET_WORDS: &[&str] = &[
    "signature",
    "token",
    "key",
    "credential",
    "secret",
    "password",
];

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_NAMES.contains(&name.as_str()) || SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// Where a URL written inside text stops.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')
}

/// `text` with the user info and secret query values of every URL in it masked: a
/// bare URL, or a message that quotes URLs anywhere.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let end = after.find(ends_url).unwrap_or(after.len());
        let (url, tail) = after.split_at(end);
        redact_after_scheme(url, &mut out);
        rest = tail;
    }
    out.push_str(rest);
    if out == text {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(out)
    }
}

/// Appends `url` (what follows `scheme://`) to `out` with its secrets masked.
fn redact_after_scheme(url: &str, out: &mut String) {
    let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, path) = url.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(MASK);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let Some(query_start) = path.find('?') else {
        out.push_str(path);
        return;
    };
    let (path, query) = path.split_at(query_start + 1);
    out.push_str(path);
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, value)) if is_secret_param(name) && !value.is_empty() => {
                out.push_str(name);
                out.push('=');
                out.push_str(MASK);
                // Text such as "(url ...)" may close right after the value.
                if let Some(close) = value.find(')') {
                    out.push_str(&value[close..]);
                }
            }
            _ => out.push_str(pair),
        }
    }
    out.push_str(fragment);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_user_info_and_secret_parameters() {
        let url = "https://alice:hunter2@example.com:8443/d/x.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2024&X-Amz-Signature=deadbeef&X-Amz-Security-Token=tok&sig=s1&token=t1&api_key=k&partNumber=2#frag";
        assert_eq!(
            redact(url),
            "https://***@example.com:8443/d/x.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Security-Token=***&sig=***&token=***&api_key=***&partNumber=2#frag"
        );
    }

    #[test]
    fn masks_urls_inside_messages_and_leaves_other_text_alone() {
        let message = "error sending request for url (https://u:p@h/x?Signature=abc): timed out; see \"s3://b/k?AWSAccessKeyId=AKIA&Expires=1\"";
        assert_eq!(
            redact(message),
            "error sending request for url (https://***@h/x?Signature=***): timed out; see \"s3://b/k?AWSAccessKeyId=***&Expires=1\""
        );
        for plain in [
            "data/a.jsonl at line 7: invalid JSON data",
            "s3://bucket/train-{000..009}.parquet",
            "https://example.com/a?b=c",
            "naïve text ☃ without URLs",
        ] {
            assert!(matches!(redact(plain), Cow::Borrowed(_)), "{plain}");
        }
        assert_eq!(redact("é://ü@x?token=ü"), "é://***@x?token=***");
    }

    #[test]
    fn odd_text_is_safe() {
        for text in [
            "://",
            "a://",
            "://@",
            "://?",
            "://?&=&",
            "x://@@/?sig=&token",
            "://#?sig=1",
            "s3://b/k?sig=(x)",
            "https://h/?a=1&&sig=2#f?token=3",
            "://\u{0}é?key=é",
        ] {
            let out = redact(text);
            assert!(
                out.matches("://").count() == text.matches("://").count(),
                "{text}"
            );
        }
        assert_eq!(redact("x://@@/?sig=&token"), "x://***@/?sig=&token");
        assert_eq!(redact("s3://b/k?sig=(x)"), "s3://b/k?sig=***)");
    }
}
