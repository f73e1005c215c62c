//! Whole-stream compression shared by the streaming formats (`.gz` variants, TFRecord's
//! GZIP/ZLIB options), with a bound on the decompressed size so a decompression bomb
//! fails with a clear error instead of running for hours.

use std::io::{BufRead, BufReader, Read};

use flate2::bufread::{MultiGzDecoder, ZlibDecoder};

use crate::error::{Error, Position, Result};
use crate::options::OptionReader;

/// Default bound on one file's decompressed size.
pub const DEFAULT_MAX_DECOMPRESSED: u64 = 64 << 30;

/// The `max_decompressed_bytes` format option every compressed format takes.
pub fn limit_option(opts: &mut OptionReader) -> Result<u64> {
    opts.u64("max_decompressed_bytes", DEFAULT_MAX_DECOMPRESSED)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zlib,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether `head` starts a zlib stream (RFC 1950 header check).
pub fn looks_like_zlib(head: &[u8]) -> bool {
    head.len() >= 2
        && head[0] & 0x0f == 8
        && head[0] >> 4 <= 7
        && (u16::from(head[0]) << 8 | u16::from(head[1])) % 31 == 0
}

/// A reader with its first bytes available for sniffing.
pub fn buffered(reader: Box<dyn Read + Send>) -> BufReader<Box<dyn Read + Send>> {
    BufReader::with_capacity(256 * 1024, reader)
}

/// Peeks at up to `n` bytes without consuming them (fewer if the first read of the
/// stream returns fewer, as at the end of a short file).
pub fn peek<'a>(
    reader: &'a mut BufReader<Box<dyn Read + Send>>,
    url: &str,
    n: usize,
) -> Result<&'a [u8]> {
    let head = reader
        .fill_buf()
        .map_err(|e| Error::io(url, Position::Byte(0), e))?;
    Ok(&head[..head.len().min(n)])
}

/// Wraps `reader` in the decoder for `compression`, bounded to `limit` output bytes.
pub fn decoder(
    reader: BufReader<Box<dyn Read + Send>>,
    compression: Compression,
    limit: u64,
) -> Box<dyn Read + Send> {
    match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(Limited::new(MultiGzDecoder::new(reader), limit)),
        Compression::Zlib => Box::new(Limited::new(ZlibDecoder::new(reader), limit)),
    }
}

/// Whether data starting with `head` is gzip-compressed.
pub fn is_gzip(head: &[u8]) -> bool {
    head == GZIP_MAGIC
}

/// Gunzips gzip data, recognised by its magic bytes rather than the file name.
pub fn auto_gzip(
    reader: Box<dyn Read + Send>,
    url: &str,
    limit: u64,
) -> Result<Box<dyn Read + Send>> {
    Ok(sniff_gzip(reader, url, limit)?.0)
}

/// As [`auto_gzip`], also saying whether the data was gzip (so not readable by range).
pub fn sniff_gzip(
    reader: Box<dyn Read + Send>,
    url: &str,
    limit: u64,
) -> Result<(Box<dyn Read + Send>, bool)> {
    let mut reader = buffered(reader);
    let gzip = is_gzip(peek(&mut reader, url, 2)?);
    let compression = if gzip {
        Compression::Gzip
    } else {
        Compression::None
    };
    Ok((decoder(reader, compression, limit), gzip))
}

/// Errors once more than `limit` bytes have come out.
struct Limited<R> {
    inner: R,
    remaining: u64,
    limit: u64,
}

impl<R> Limited<R> {
    fn new(inner: R, limit: u64) -> Self {
        Self {
            inner,
            remaining: limit,
            limit,
        }
    }
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.remaining {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "decompressed data exceeds {} bytes (raise format_options={{\"max_decompressed_bytes\": ...}} if this file is genuine)",
                    self.limit
                ),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Maps an error from reading a (possibly decompressed) stream: bad compressed bytes
/// and early ends are faults in the data, anything else is I/O.
pub fn stream_error(url: &str, position: Position, e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    // A remote stream hands its own errors through `Read` wrapped in io::Error.
    if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        if let Some(Ok(inner)) = e.into_inner().map(|inner| inner.downcast::<Error>()) {
            return *inner;
        }
        return Error::Internal(format!("{url}: lost a stream error"));
    }
    match e.kind() {
        InvalidData | InvalidInput | UnexpectedEof => Error::decode(url, "compressed", position, e),
        _ => Error::io(url, position, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression as Level;
    use flate2::write::{GzEncoder, ZlibEncoder};
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Level::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn sniffs_gzip_and_bounds_output() {
        let data = vec![b'a'; 100_000];
        let mut out = Vec::new();
        auto_gzip(Box::new(std::io::Cursor::new(gzip(&data))), "t", 1 << 20)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
        let err = auto_gzip(Box::new(std::io::Cursor::new(gzip(&data))), "t", 1000)
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("exceeds 1000 bytes"));
        let mut plain = Vec::new();
        auto_gzip(Box::new(std::io::Cursor::new(b"x".to_vec())), "t", 10)
            .unwrap()
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, b"x");
    }

    #[test]
    fn recognises_zlib_headers() {
        let mut enc = ZlibEncoder::new(Vec::new(), Level::default());
        enc.write_all(b"hello").unwrap();
        assert!(looks_like_zlib(&enc.finish().unwrap()));
        assert!(!looks_like_zlib(&[0x1f, 0x8b]));
        assert!(!looks_like_zlib(&[0x05, 0x00]));
    }
}
