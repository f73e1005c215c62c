//! Rows of a Parquet column chunk whose values sit in its dictionary page, read where they
//! are. pyarrow's default layout for wide values in small row groups (a dictionary page
//! per column chunk, no page index) puts every value of a row group's column in one page,
//! and the arrow reader decodes all of it to reach any row: a permutation that visits
//! each row group many times decodes the data many times over. Where that page is stored
//! uncompressed, its length prefixes give each value's place in the file, and the data
//! pages (the values' indices, small) each row's value; a row then costs its own bytes.
//!
//! Anything this reader does not expect (a compressed chunk, a data page that fell back to
//! plain values, levels of a nested column, a count that does not add up) leaves the
//! chunk to the arrow reader, which also reports what is corrupt.

use std::ops::Range;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::source::Source;

/// Dictionary pages smaller than this are decoded whole by the arrow reader: reading the
/// page costs less than the small reads that find its values.
pub const MIN_DICTIONARY_BYTES: u64 = 1 << 20;

/// Where the rows of one dictionary-encoded column chunk are in its file.
pub struct DictionaryColumn {
    /// Each dictionary value's bytes (after its length prefix).
    values: Vec<Range<u64>>,
    /// Each row's value, `None` where null.
    rows: Vec<Option<u32>>,
}

impl DictionaryColumn {
    /// Finds the values and each row's index in `chunk` (a flat, uncompressed BYTE_ARRAY
    /// column chunk of `rows` rows, `max_def` its highest definition level, at most 1).
    /// `None` where the chunk is not laid out as this reader expects.
    pub fn find(
        source: &dyn Source,
        chunk: Range<u64>,
        rows: usize,
        max_def: i16,
    ) -> Result<Option<Self>> {
        let mut at = chunk.start;
        let Some((dictionary, header_len)) = header_at(source, at, chunk.end)? else {
            return Ok(None);
        };
        let plain = matches!(dictionary.encoding, PLAIN | PLAIN_DICTIONARY);
        if dictionary.kind != DICTIONARY_PAGE
            || !plain
            || dictionary.compressed_size != dictionary.uncompressed_size
        {
            return Ok(None);
        }
        let Some(body) = page_body(at, header_len, &dictionary, chunk.end) else {
            return Ok(None);
        };
        if body.end - body.start < MIN_DICTIONARY_BYTES {
            return Ok(None);
        }
        let Some(values) = value_ranges(source, body.clone(), dictionary.num_values)? else {
            return Ok(None);
        };
        at = body.end;
        // `rows` is the footer's claim: reserved up to what a plain chunk could hold.
        let mut indices: Vec<Option<u32>> = Vec::with_capacity(rows.min(1 << 20));
        while indices.len() < rows && at < chunk.end {
            let Some((page, header_len)) = header_at(source, at, chunk.end)? else {
                return Ok(None);
            };
            let Some(body) = page_body(at, header_len, &page, chunk.end) else {
                return Ok(None);
            };
            at = body.end;
            let levels = match page.kind {
                INDEX_PAGE => continue,
                DATA_PAGE if page.def_level_encoding == RLE || max_def == 0 => Levels::Prefixed,
                DATA_PAGE_V2 if page.rep_levels_len == 0 => Levels::Sized(page.def_levels_len),
                _ => return Ok(None),
            };
            if !matches!(page.encoding, PLAIN_DICTIONARY | RLE_DICTIONARY) {
                return Ok(None); // the dictionary filled up: plain values follow
            }
            // A flat column's values are its rows: a page claiming more than are left
            // is not one this reader trusts (its levels are allocated by that count).
            if usize::try_from(page.num_values).map_or(true, |n| n > rows - indices.len()) {
                return Ok(None);
            }
            let data = source.read_range_blocking(body)?;
            let Some(page_rows) = page_indices(&data, page.num_values, max_def, levels) else {
                return Ok(None);
            };
            indices.extend(page_rows);
        }
        let in_range = indices
            .iter()
            .flatten()
            .all(|&i| (i as usize) < values.len());
        if indices.len() != rows || !in_range {
            return Ok(None);
        }
        Ok(Some(Self {
            values,
            rows: indices,
        }))
    }

    /// The values of rows `rows` (offsets in the chunk), read from `source` one after
    /// another into one buffer: the buffer, where each value ends in it, and whether each
    /// is present (not null).
    pub fn read(
        &self,
        source: &dyn Source,
        rows: &[u64],
    ) -> Result<(Vec<u8>, Vec<usize>, Vec<bool>)> {
        let mut wanted = Vec::with_capacity(rows.len());
        for &row in rows {
            match usize::try_from(row).ok().and_then(|r| self.rows.get(r)) {
                Some(value) => wanted.push(value.map(|v| self.values[v as usize].clone())),
                None => {
                    return Err(Error::Internal(format!(
                        "row {row} of {} asked of a column chunk",
                        self.rows.len()
                    )));
                }
            }
        }
        let bytes: u64 = wanted.iter().flatten().map(|r| r.end - r.start).sum();
        let mut values = Vec::with_capacity(usize::try_from(bytes).unwrap_or(0));
        let mut ends = Vec::with_capacity(wanted.len());
        for range in &wanted {
            if let Some(range) = range {
                source.read_into_blocking(range.clone(), &mut values)?;
            }
            ends.push(values.len());
        }
        Ok((values, ends, wanted.iter().map(Option::is_some).collect()))
    }
}

/// How a data page's definition levels are stored.
#[derive(Clone, Copy)]
enum Levels {
    /// V1: a 4-byte length, then the levels.
    Prefixed,
    /// V2: the header gives their length.
    Sized(i32),
}

/// Each of a data page's `num_values` rows: its dictionary index, or `None` where null.
fn page_indices(
    data: &[u8],
    num_values: i32,
    max_def: i16,
    levels: Levels,
) -> Option<Vec<Option<u32>>> {
    let n = usize::try_from(num_values).ok()?;
    let (defined, values) = if max_def > 0 {
        let (levels, rest) = match levels {
            Levels::Prefixed => {
                let (len, rest) = data.split_first_chunk::<4>()?;
                rest.split_at_checked(u32::from_le_bytes(*len) as usize)?
            }
            Levels::Sized(len) => data.split_at_checked(usize::try_from(len).ok()?)?,
        };
        let levels = rle_hybrid(levels, 1, n)?;
        (
            levels.into_iter().map(|l| l == 1).collect::<Vec<bool>>(),
            rest,
        )
    } else {
        let values = match levels {
            Levels::Sized(len) => data.get(usize::try_from(len).ok()?..)?,
            Levels::Prefixed => data,
        };
        (vec![true; n], values)
    };
    let present = defined.iter().filter(|&&d| d).count();
    let (&bit_width, packed) = values.split_first()?;
    let mut indices = rle_hybrid(packed, bit_width, present)?.into_iter();
    defined
        .into_iter()
        .map(|d| {
            if d {
                indices.next().map(Some)
            } else {
                Some(None)
            }
        })
        .collect()
}

/// `n` values of the RLE / bit-packing hybrid encoding at `bit_width` bits each.
fn rle_hybrid(data: &[u8], bit_width: u8, n: usize) -> Option<Vec<u32>> {
    if bit_width > 32 {
        return None;
    }
    let width = usize::from(bit_width);
    let mut out = Vec::with_capacity(n.min(1 << 20));
    let mut input = Compact { buf: data, at: 0 };
    while out.len() < n {
        let header = input.varint().ok()?;
        if header & 1 == 0 {
            // A run: one value, little-endian in as many bytes as the width needs.
            let len = usize::try_from(header >> 1).ok()?;
            let bytes = width.div_ceil(8);
            let mut value = 0u32;
            for k in 0..bytes {
                value |= u32::from(input.byte().ok()?) << (8 * k);
            }
            out.extend(std::iter::repeat_n(value, len.min(n - out.len())));
        } else {
            // Groups of 8 values, bit-packed from the least significant bit.
            let count = usize::try_from(header >> 1).ok()?.checked_mul(8)?;
            let bytes = count.checked_mul(width)? / 8;
            let packed = input.buf.get(input.at..input.at.checked_add(bytes)?)?;
            input.at += bytes;
            for k in 0..count.min(n - out.len()) {
                let mut value = 0u32;
                for bit in 0..width {
                    let at = k * width + bit;
                    value |= u32::from(packed[at / 8] >> (at % 8) & 1) << bit;
                }
                out.push(value);
            }
        }
    }
    Some(out)
}

/// Each value's bytes in a PLAIN dictionary page body: a 4-byte length before each.
/// The lengths are read through a small window, so that wide values cost a read of a few
/// bytes each and narrow ones share reads.
fn value_ranges(
    source: &dyn Source,
    body: Range<u64>,
    count: i32,
) -> Result<Option<Vec<Range<u64>>>> {
    const WINDOW: u64 = 4096;
    let Ok(count) = usize::try_from(count) else {
        return Ok(None);
    };
    let mut values = Vec::with_capacity(count.min(1 << 20));
    let mut window = (0u64, Bytes::new());
    let mut at = body.start;
    for _ in 0..count {
        if at + 4 > body.end {
            return Ok(None);
        }
        let (start, bytes) = &window;
        if at < *start || at + 4 > start + bytes.len() as u64 {
            window = (
                at,
                source.read_range_blocking(at..body.end.min(at + WINDOW))?,
            );
        }
        let offset = (at - window.0) as usize;
        let len = u64::from(u32::from_le_bytes(
            window.1[offset..offset + 4].try_into().unwrap_or_default(),
        ));
        let end = at + 4 + len;
        if end > body.end {
            return Ok(None);
        }
        values.push(at + 4..end);
        at = end;
    }
    Ok(Some(values))
}

// Page types and encodings (parquet.thrift).
const DATA_PAGE: i32 = 0;
const INDEX_PAGE: i32 = 1;
const DICTIONARY_PAGE: i32 = 2;
const DATA_PAGE_V2: i32 = 3;
const PLAIN: i32 = 0;
const PLAIN_DICTIONARY: i32 = 2;
const RLE: i32 = 3;
const RLE_DICTIONARY: i32 = 8;

/// The fields of a page header this reader uses.
#[derive(Default, Debug, PartialEq)]
struct PageHeader {
    kind: i32,
    uncompressed_size: i32,
    compressed_size: i32,
    num_values: i32,
    encoding: i32,
    /// V1 data pages.
    def_level_encoding: i32,
    /// V2 data pages: the bytes of each level section.
    def_levels_len: i32,
    rep_levels_len: i32,
}

/// First read for a page header; one holding the statistics of wide values takes more,
/// each twice the last.
const HEADER_FIRST_READ: u64 = 512;

/// The page header at `at` and its length, read in growing reads; `None` if it does not
/// parse before `end`.
fn header_at(source: &dyn Source, at: u64, end: u64) -> Result<Option<(PageHeader, u64)>> {
    let mut len = HEADER_FIRST_READ;
    loop {
        let stop = end.min(at.saturating_add(len));
        let bytes = source.read_range_blocking(at..stop)?;
        match page_header(&bytes) {
            Ok((header, used)) => return Ok(Some((header, used as u64))),
            Err(Short::More) if stop < end => len = len.saturating_mul(2),
            Err(_) => return Ok(None),
        }
    }
}

/// The body of a page whose header at `at` took `header_len` bytes, if within `end`.
fn page_body(at: u64, header_len: u64, header: &PageHeader, end: u64) -> Option<Range<u64>> {
    let start = at.checked_add(header_len)?;
    let body = start.checked_add(u64::try_from(header.compressed_size).ok()?)?;
    (body <= end).then_some(start..body)
}

/// Why a header did not parse.
#[derive(Debug, PartialEq)]
enum Short {
    /// It runs past the bytes read.
    More,
    /// It is not a header.
    Bad,
}

fn page_header(buf: &[u8]) -> std::result::Result<(PageHeader, usize), Short> {
    let mut input = Compact { buf, at: 0 };
    let mut header = PageHeader::default();
    input.fields(0, &mut |input, id, kind| {
        match (id, kind) {
            (1, I32) => header.kind = input.int()?,
            (2, I32) => header.uncompressed_size = input.int()?,
            (3, I32) => header.compressed_size = input.int()?,
            // data_page_header
            (5, STRUCT) => input.fields(1, &mut |input, id, kind| {
                match (id, kind) {
                    (1, I32) => header.num_values = input.int()?,
                    (2, I32) => header.encoding = input.int()?,
                    (3, I32) => header.def_level_encoding = input.int()?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?,
            // dictionary_page_header
            (7, STRUCT) => input.fields(1, &mut |input, id, kind| {
                match (id, kind) {
                    (1, I32) => header.num_values = input.int()?,
                    (2, I32) => header.encoding = input.int()?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?,
            // data_page_header_v2
            (8, STRUCT) => input.fields(1, &mut |input, id, kind| {
                match (id, kind) {
                    (1, I32) => header.num_values = input.int()?,
                    (4, I32) => header.encoding = input.int()?,
                    (5, I32) => header.def_levels_len = input.int()?,
                    (6, I32) => header.rep_levels_len = input.int()?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok((header, input.at))
}

// Thrift compact protocol types.
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

/// Nesting deeper than this is not a page header.
const MAX_DEPTH: usize = 16;

/// A reader of the thrift compact protocol over bytes.
struct Compact<'a> {
    buf: &'a [u8],
    at: usize,
}

type Field<'f, 'a> = dyn FnMut(&mut Compact<'a>, i16, u8) -> std::result::Result<bool, Short> + 'f;

impl<'a> Compact<'a> {
    fn byte(&mut self) -> std::result::Result<u8, Short> {
        let b = *self.buf.get(self.at).ok_or(Short::More)?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> std::result::Result<u64, Short> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Short::Bad)
    }

    /// A zigzag integer, as an i32 field.
    fn int(&mut self) -> std::result::Result<i32, Short> {
        let v = self.varint()?;
        i32::try_from((v >> 1) as i64 ^ -((v & 1) as i64)).map_err(|_| Short::Bad)
    }

    fn skip_bytes(&mut self, n: u64) -> std::result::Result<(), Short> {
        let n = usize::try_from(n).map_err(|_| Short::Bad)?;
        let end = self.at.checked_add(n).ok_or(Short::Bad)?;
        if end > self.buf.len() {
            return Err(Short::More);
        }
        self.at = end;
        Ok(())
    }

    /// Passes over a value of type `kind`.
    fn skip(&mut self, kind: u8, depth: usize) -> std::result::Result<(), Short> {
        if depth > MAX_DEPTH {
            return Err(Short::Bad);
        }
        match kind {
            TRUE | FALSE => Ok(()),
            BYTE => self.byte().map(drop),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.skip_bytes(8),
            BINARY => {
                let len = self.varint()?;
                self.skip_bytes(len)
            }
            LIST | SET => {
                let head = self.byte()?;
                let count = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                for _ in 0..count {
                    match head & 0x0f {
                        TRUE | FALSE => self.byte().map(drop)?,
                        element => self.skip(element, depth + 1)?,
                    }
                }
                Ok(())
            }
            MAP => {
                let count = self.varint()?;
                if count > 0 {
                    let kinds = self.byte()?;
                    for _ in 0..count {
                        self.skip(kinds >> 4, depth + 1)?;
                        self.skip(kinds & 0x0f, depth + 1)?;
                    }
                }
                Ok(())
            }
            STRUCT => self.fields(depth + 1, &mut |_, _, _| Ok(false)),
            _ => Err(Short::Bad),
        }
    }

    /// A struct's fields up to its stop byte: each given to `field` (id, type), which
    /// reads it and says so, or leaves it to be passed over.
    fn fields(
        &mut self,
        depth: usize,
        field: &mut Field<'_, 'a>,
    ) -> std::result::Result<(), Short> {
        if depth > MAX_DEPTH {
            return Err(Short::Bad);
        }
        let mut last = 0i16;
        loop {
            let head = self.byte()?;
            if head == 0 {
                return Ok(());
            }
            let kind = head & 0x0f;
            let id = match head >> 4 {
                0 => i16::try_from(self.int()?).map_err(|_| Short::Bad)?,
                delta => last.checked_add(i16::from(delta)).ok_or(Short::Bad)?,
            };
            last = id;
            if !field(self, id, kind)? {
                self.skip(kind, depth)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rle_hybrid_reads_runs_and_bit_packed_groups() {
        // A run of 3 fives (width 3: one byte), then one bit-packed group of 8 values 0..8.
        let mut data = vec![3 << 1, 5];
        data.push((1 << 1) | 1);
        let mut bits = 0u32;
        for v in 0..8u32 {
            bits |= v << (3 * v);
        }
        data.extend_from_slice(&bits.to_le_bytes()[..3]);
        assert_eq!(
            rle_hybrid(&data, 3, 11),
            Some(vec![5, 5, 5, 0, 1, 2, 3, 4, 5, 6, 7])
        );
        // Short input is refused, not read past.
        assert_eq!(rle_hybrid(&data[..4], 3, 11), None);
    }

    #[test]
    fn a_header_runs_short_or_is_refused() {
        // type=2 (i32 field 1), uncompressed 10, compressed 10, then a dictionary header
        // {num_values 3, encoding 0}, stop.
        let header = [0x15, 4, 0x15, 20, 0x15, 20, 0x4c, 0x15, 6, 0x15, 0, 0, 0];
        let (parsed, used) = page_header(&header).expect("parses");
        assert_eq!(used, header.len());
        assert_eq!(
            (
                parsed.kind,
                parsed.compressed_size,
                parsed.num_values,
                parsed.encoding
            ),
            (2, 10, 3, 0)
        );
        assert_eq!(page_header(&header[..7]).map(drop), Err(Short::More));
        assert_eq!(page_header(&[0x1f]).map(drop), Err(Short::Bad));
    }
}
