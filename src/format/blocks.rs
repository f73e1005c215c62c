//! Cutting a stream into blocks that end at record boundaries, so the blocks of one
//! file can be decoded in parallel while the file is read once, front to back.

use std::io::Read;

use bytes::Bytes;

use super::compression::stream_error;
use crate::error::{Error, Position, Result};

/// A "record" longer than this is treated as corrupt input rather than buffered forever.
const MAX_RECORD_BYTES: usize = 512 * 1024 * 1024;

/// Reads until `buf` is full or the stream ends; returns the bytes read.
pub fn read_full(reader: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads `reader` in blocks of about `block_bytes`, each ending just after the position
/// `last_end` finds (the last record end in the data, e.g. a newline), and calls
/// `f(block, number of its first line)`; stops early when `f` returns false. A record
/// longer than a block grows the block instead of being split.
pub fn split_blocks(
    reader: &mut dyn Read,
    url: &str,
    format: &'static str,
    block_bytes: usize,
    last_end: impl Fn(&[u8]) -> Option<usize>,
    f: &mut dyn FnMut(Bytes, u64) -> bool,
) -> Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(block_bytes);
    let mut want = block_bytes;
    let mut line = 1u64;
    let mut eof = false;
    loop {
        while !eof && buf.len() < want {
            let filled = buf.len();
            buf.resize(want, 0);
            let n = reader
                .read(&mut buf[filled..])
                .map_err(|e| stream_error(url, Position::Line(line), e))?;
            buf.truncate(filled + n);
            eof = n == 0;
        }
        if buf.is_empty() {
            return Ok(());
        }
        let cut = if eof {
            buf.len()
        } else if let Some(pos) = last_end(&buf) {
            pos + 1
        } else if want >= MAX_RECORD_BYTES {
            return Err(Error::decode(
                url,
                format,
                Position::Line(line),
                format!("record longer than {MAX_RECORD_BYTES} bytes"),
            ));
        } else {
            want = (want * 2).min(MAX_RECORD_BYTES);
            continue;
        };
        let rest = buf.split_off(cut);
        let block = Bytes::from(std::mem::replace(&mut buf, rest));
        let lines = memchr::memchr_iter(b'\n', &block).count() as u64;
        if !f(block, line) {
            return Ok(());
        }
        line += lines;
        want = block_bytes.max(buf.len() + 1);
        if eof && buf.is_empty() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(data: &[u8], block_bytes: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let newline = |d: &[u8]| memchr::memrchr(b'\n', d);
        split_blocks(
            &mut &data[..],
            "t",
            "test",
            block_bytes,
            newline,
            &mut |b, line| {
                out.push((String::from_utf8(b.to_vec()).unwrap(), line));
                true
            },
        )
        .unwrap();
        out
    }

    #[test]
    fn blocks_end_at_record_ends_and_count_lines() {
        let got = blocks(b"aa\nbb\ncc\ndd", 4);
        assert_eq!(
            got,
            [
                ("aa\n".into(), 1),
                ("bb\n".into(), 2),
                ("cc\n".into(), 3),
                ("dd".into(), 4)
            ]
        );
        // A record longer than a block grows the block instead of being split.
        let got = blocks(b"abcdefghij\nk\nlmnopqrstuvwxyz", 4);
        assert_eq!(got[0], ("abcdefghij\nk\n".into(), 1));
        assert_eq!(got.last().unwrap().1, 3);
        let all: String = blocks(b"x\ny\nz\n", 1 << 20)
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(all, "x\ny\nz\n");
    }
}
