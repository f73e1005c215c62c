//! Shell-style brace expansion: `shard-{000..099}.tar` (numeric ranges, zero padding kept)
//! and `{train,valid}.parquet` (alternatives). Globs (`*`, `?`, `[..]`) are left in place
//! for the store to match against its listing.

use crate::error::{Error, Result};

/// Upper bounds on what one pattern may expand to, in names and in bytes of names, so a
/// typo such as `{0..99999999}` (or a long name times a wide range) fails fast instead
/// of exhausting memory.
const MAX_EXPANSION: usize = 1_000_000;
const MAX_EXPANSION_BYTES: usize = 256 << 20;

/// Expands every `{...}` group in `pattern`, left to right, in the order written.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let Some((open, close)) = find_group(pattern)? else {
        return Ok(vec![pattern.to_string()]);
    };
    let (head, body, tail) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    let choices = expand_group(pattern, body)?;
    let tails = expand_braces(tail)?;
    let longest = |names: &[String]| names.iter().map(String::len).max().unwrap_or(0);
    let names = choices.len().saturating_mul(tails.len());
    let bytes = names.saturating_mul(head.len() + longest(&choices) + longest(&tails));
    check_expansion(pattern, names, bytes)?;
    let mut out = Vec::with_capacity(names);
    for choice in &choices {
        for tail in &tails {
            out.push(format!("{head}{choice}{tail}"));
        }
    }
    Ok(out)
}

fn check_expansion(pattern: &str, names: usize, bytes: usize) -> Result<()> {
    if names > MAX_EXPANSION || bytes > MAX_EXPANSION_BYTES {
        return Err(Error::invalid_argument(format!(
            "pattern {pattern:?} expands to more than {MAX_EXPANSION} names or {} MiB of them",
            MAX_EXPANSION_BYTES >> 20
        )));
    }
    Ok(())
}

/// Finds the first top-level `{...}` group, returning byte offsets of the braces.
fn find_group(pattern: &str) -> Result<Option<(usize, usize)>> {
    let Some(open) = pattern.find('{') else {
        if pattern.contains('}') {
            return Err(unbalanced(pattern));
        }
        return Ok(None);
    };
    let mut depth = 0usize;
    for (i, c) in pattern[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(Some((open, open + i)));
                }
            }
            _ => {}
        }
    }
    Err(unbalanced(pattern))
}

fn unbalanced(pattern: &str) -> Error {
    Error::invalid_argument(format!("unbalanced braces in pattern {pattern:?}"))
}

fn expand_group(pattern: &str, body: &str) -> Result<Vec<String>> {
    if let Some((start, end)) = body.split_once("..")
        && let (Some(a), Some(b)) = (parse_bound(start), parse_bound(end))
    {
        return expand_range(pattern, start, end, a, b);
    }
    // Alternatives; each may itself contain braces.
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for alt in split_top_level_commas(body) {
        let names = expand_braces(alt)?;
        bytes = bytes.saturating_add(names.iter().map(String::len).sum());
        out.extend(names);
        check_expansion(pattern, out.len(), bytes)?;
    }
    if out.len() < 2 && !body.contains(',') {
        return Err(Error::invalid_argument(format!(
            "cannot expand {{{body}}} in pattern {pattern:?}: expected a range like {{000..099}} or alternatives like {{a,b}}"
        )));
    }
    Ok(out)
}

fn parse_bound(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn expand_range(pattern: &str, start: &str, end: &str, a: u64, b: u64) -> Result<Vec<String>> {
    let count = usize::try_from(a.abs_diff(b)).map_or(usize::MAX, |d| d.saturating_add(1));
    check_expansion(
        pattern,
        count,
        count.saturating_mul(start.len().max(end.len())),
    )?;
    // Zero padding as bash does it: when either bound has a leading zero, pad to the wider one.
    let padded =
        (start.len() > 1 && start.starts_with('0')) || (end.len() > 1 && end.starts_with('0'));
    let width = if padded {
        start.len().max(end.len())
    } else {
        0
    };
    let values: Box<dyn Iterator<Item = u64>> = if a <= b {
        Box::new(a..=b)
    } else {
        Box::new((b..=a).rev())
    };
    Ok(values.map(|v| format!("{v:0width$}")).collect())
}

fn split_top_level_commas(body: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut last) = (0usize, 0usize);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&body[last..i]);
                last = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[last..]);
    parts
}

/// Whether a path contains glob metacharacters.
pub fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_padded_range_keeps_width() {
        let names = expand_braces("shard-{000..002}.tar").unwrap();
        assert_eq!(names, ["shard-000.tar", "shard-001.tar", "shard-002.tar"]);
        let names = expand_braces("s{8..10}").unwrap();
        assert_eq!(names, ["s8", "s9", "s10"]);
        assert_eq!(expand_braces("s{3..1}").unwrap(), ["s3", "s2", "s1"]);
    }

    #[test]
    fn alternatives_and_products() {
        let names = expand_braces("{train,valid}-{0..1}.pq").unwrap();
        assert_eq!(
            names,
            ["train-0.pq", "train-1.pq", "valid-0.pq", "valid-1.pq"]
        );
        let names = expand_braces("a{b,c{1..2}}d").unwrap();
        assert_eq!(names, ["abd", "ac1d", "ac2d"]);
        assert_eq!(expand_braces("plain.parquet").unwrap(), ["plain.parquet"]);
    }

    #[test]
    fn bad_patterns_are_errors() {
        assert!(expand_braces("a{0..2").is_err());
        assert!(expand_braces("a}b").is_err());
        assert!(expand_braces("a{x}b").is_err());
        assert!(expand_braces("a{0..99999999999}").is_err());
        assert!(expand_braces("a{0..18446744073709551615}").is_err());
        // Within the count, but a long name times a wide range is too many bytes.
        let long = format!("{}{{0..999999}}", "x".repeat(1000));
        assert!(expand_braces(&long).is_err());
        // Alternatives add up.
        let wide = format!("{{{}}}", vec!["{0..999999}"; 3].join(","));
        assert!(expand_braces(&wide).is_err());
    }
}
