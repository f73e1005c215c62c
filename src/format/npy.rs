//! NumPy `.npy` arrays (and the arrays inside `.npz`, see `npz.rs`).
//!
//! Two ways to read them (`format_options={"mode": ...}`):
//! - `"sample"` (default): each file is one sample; an `.npy` file gives the field
//!   `array`, an `.npz` file one field per member; arrays keep their shape.
//! - `"rows"`: rows along the first axis are samples (`.npz` members side by side).
//!
//! dtypes: bool, int8..int64, uint8..uint64, float16/32/64, complex64/128, fixed-width
//! bytes (`S`) and unicode (`U`), either byte order, C or Fortran order. Object arrays
//! hold pickles and are refused, never unpickled.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, FixedSizeListArray, LargeBinaryArray, LargeStringArray, RecordBatch,
    make_array,
};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;

use super::{
    BatchSink, Decoded, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    per_shard, shape_product, tensor_field,
};
use crate::error::{Error, Position, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta};

pub const FORMAT: &str = "NPY";
/// Field metadata telling the numpy conversion to view float pairs as complex numbers.
pub const COMPLEX_KEY: &str = "shardflow.complex";
/// Field metadata keeping a fixed-width `S`/`U` dtype (Arrow holds the values as
/// variable-length bytes and text), so the numpy conversion gives numpy's dtype back.
pub const FIXED_WIDTH_KEY: &str = "shardflow.numpy_dtype";
/// Rows of zero bytes (a 0 in the row's shape) one array may have in rows mode.
pub const MAX_EMPTY_ROWS: usize = 1 << 24;
/// Rows mode cuts arrays into units of about this many bytes.
const UNIT_BYTES: u64 = 8 * 1024 * 1024;
const MAGIC: &[u8] = b"\x93NUMPY";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    Bool,
    Int(usize),
    UInt(usize),
    Float(usize),
    Complex(usize),
    /// `S<n>`: n bytes, trailing NULs dropped as numpy does.
    Bytes(usize),
    /// `U<n>`: n UTF-32 code points.
    Unicode(usize),
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::Bool => 1,
            Elem::Int(n) | Elem::UInt(n) | Elem::Float(n) | Elem::Complex(n) | Elem::Bytes(n) => n,
            Elem::Unicode(n) => 4 * n,
        }
    }

    /// The Arrow type of one value (complex numbers are two floats).
    fn leaf(self) -> DataType {
        match self {
            Elem::Bool => DataType::Boolean,
            Elem::Int(1) => DataType::Int8,
            Elem::Int(2) => DataType::Int16,
            Elem::Int(4) => DataType::Int32,
            Elem::Int(_) => DataType::Int64,
            Elem::UInt(1) => DataType::UInt8,
            Elem::UInt(2) => DataType::UInt16,
            Elem::UInt(4) => DataType::UInt32,
            Elem::UInt(_) => DataType::UInt64,
            Elem::Float(2) => DataType::Float16,
            Elem::Float(4) | Elem::Complex(8) => DataType::Float32,
            Elem::Float(_) | Elem::Complex(_) => DataType::Float64,
            // 64-bit offsets: an array's strings may pass 2 GiB.
            Elem::Bytes(_) => DataType::LargeBinary,
            Elem::Unicode(_) => DataType::LargeUtf8,
        }
    }

    /// Bytes of one primitive lane (the swap unit for byte order).
    fn lane(self) -> usize {
        match self {
            Elem::Complex(n) => n / 2,
            Elem::Unicode(_) => 4,
            Elem::Bytes(_) | Elem::Bool => 1,
            other => other.size(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub elem: Elem,
    pub big_endian: bool,
    pub fortran: bool,
    pub shape: Vec<usize>,
    /// Where the data starts, from the start of the `.npy` bytes.
    pub data_offset: usize,
}

impl Header {
    pub fn count(&self) -> Option<usize> {
        shape_product(1, &self.shape)
    }

    /// The numpy dtype string, e.g. `<f4`, `>i8`, `|S5`.
    pub fn descr(&self) -> String {
        let order = match (self.elem.lane(), self.big_endian) {
            (1, _) => '|',
            (_, true) => '>',
            (_, false) => '<',
        };
        let (kind, size) = match self.elem {
            Elem::Bool => ('b', 1),
            Elem::Int(n) => ('i', n),
            Elem::UInt(n) => ('u', n),
            Elem::Float(n) => ('f', n),
            Elem::Complex(n) => ('c', n),
            Elem::Bytes(n) => ('S', n),
            Elem::Unicode(n) => ('U', n),
        };
        format!("{order}{kind}{size}")
    }

    pub fn data_len(&self) -> Option<u64> {
        (self.count()? as u64).checked_mul(self.elem.size() as u64)
    }

    /// Bytes of one row along the first axis (saturating; [`Header::check`] bounds it).
    pub fn row_bytes(&self) -> usize {
        shape_product(self.elem.size(), self.shape.get(1..).unwrap_or_default())
            .unwrap_or(usize::MAX)
    }

    /// Values in one row along the first axis (saturating, like `row_bytes`).
    pub fn row_values(&self) -> usize {
        shape_product(1, self.shape.get(1..).unwrap_or_default()).unwrap_or(usize::MAX)
    }

    /// Refuses shapes whose sample (the whole array, or one row in rows mode) is more
    /// than one Arrow tensor can hold, before any size is computed from them; and, in
    /// rows mode, more rows of no bytes than [`MAX_EMPTY_ROWS`]: a 100-byte file can
    /// declare 2^60 rows of shape `(0,)`, and every row costs memory downstream.
    pub fn check(&self, rows: bool) -> Result<(), String> {
        if rows && self.row_bytes() == 0 && self.shape.first().is_some_and(|&n| n > MAX_EMPTY_ROWS)
        {
            return Err(format!(
                "shape {:?} declares {} rows that hold no data; rows mode reads at most {MAX_EMPTY_ROWS}",
                self.shape, self.shape[0]
            ));
        }
        let dims = if rows {
            &self.shape[1.min(self.shape.len())..]
        } else {
            &self.shape[..]
        };
        let lanes = if let Elem::Complex(_) = self.elem {
            2
        } else {
            1
        };
        let width = shape_product(lanes, dims);
        match width {
            Some(w) if i32::try_from(w).is_ok() && w.checked_mul(self.elem.size()).is_some() => {
                Ok(())
            }
            _ => Err(format!(
                "shape {:?} has more than 2^31 values per sample, more than one tensor holds",
                self.shape
            )),
        }
    }

    /// A field for one sample of this array: a tensor of its whole shape, or (rows mode)
    /// of its shape without the first axis.
    pub fn field(&self, name: &str, rows: bool) -> Field {
        let shape = if rows {
            &self.shape[1.min(self.shape.len())..]
        } else {
            &self.shape[..]
        };
        let mut dims = shape.to_vec();
        if let Elem::Complex(_) = self.elem {
            dims.push(2);
        }
        let field = tensor_field(name, self.elem.leaf(), &dims, false);
        let (key, value) = match self.elem {
            Elem::Complex(n) => (COMPLEX_KEY, format!("complex{}", n * 8)),
            Elem::Bytes(n) => (FIXED_WIDTH_KEY, format!("S{n}")),
            Elem::Unicode(n) => (FIXED_WIDTH_KEY, format!("U{n}")),
            _ => return field,
        };
        let mut metadata = field.metadata().clone();
        metadata.insert(key.to_string(), value);
        field.with_metadata(metadata)
    }
}

/// The bytes of an `.npy` file (format 1.0) as numpy writes it, for tests, benchmarks
/// and fuzzing: `shape` is the header's Python tuple, e.g. `"(3, 4)"`.
pub fn file_bytes(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let fortran = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    // numpy pads the header with spaces so that the data starts at a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Parses the header at the start of `.npy` bytes; `buf` may be just a prefix.
pub fn parse_header(buf: &[u8]) -> Result<Header, String> {
    if buf.len() < 10 || &buf[..6] != MAGIC {
        return Err("not an .npy array (bad magic)".into());
    }
    let (len_bytes, start) = match buf[6] {
        1 => (2, 10),
        2 | 3 => (4, 12),
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    if buf.len() < start {
        return Err("truncated .npy header".into());
    }
    let header_len = if len_bytes == 2 {
        u16::from_le_bytes([buf[8], buf[9]]) as usize
    } else {
        u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize
    };
    let end = start
        .checked_add(header_len)
        .ok_or("header length overflows")?;
    let text = buf.get(start..end).ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(text).map_err(|_| "the .npy header is not text")?;
    let mut parser = Literal {
        s: text.as_bytes(),
        pos: 0,
    };
    let dict = parser.dict()?;
    let get = |key: &str| dict.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let descr = match get("descr") {
        Some(Value::Str(s)) => s.clone(),
        Some(_) => return Err("structured dtypes are not supported".into()),
        None => return Err("the header has no 'descr'".into()),
    };
    let fortran = match get("fortran_order") {
        Some(Value::Bool(b)) => *b,
        _ => return Err("the header has no 'fortran_order'".into()),
    };
    let shape = match get("shape") {
        Some(Value::Tuple(dims)) => dims.clone(),
        _ => return Err("the header has no 'shape'".into()),
    };
    let (elem, big_endian) = parse_descr(&descr)?;
    Ok(Header {
        elem,
        big_endian,
        fortran,
        shape,
        data_offset: end,
    })
}

fn parse_descr(descr: &str) -> Result<(Elem, bool), String> {
    // By char, not byte: the header is untrusted text and may hold any character.
    let mut chars = descr.chars();
    let big_endian = match chars.clone().next() {
        Some('<' | '|' | '=') => {
            chars.next();
            false
        }
        Some('>') => {
            chars.next();
            true
        }
        _ => false,
    };
    let kind = chars.next();
    if kind == Some('O') {
        return Err(
            "object arrays hold pickled Python objects, which shardflow never loads".into(),
        );
    }
    let unsupported = || format!("unsupported dtype {descr:?}");
    let digits = chars.as_str();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unsupported());
    }
    let size: usize = digits.parse().map_err(|_| unsupported())?;
    let elem = match (kind, size) {
        (Some('b'), 1) => Elem::Bool,
        (Some('i'), 1 | 2 | 4 | 8) => Elem::Int(size),
        (Some('u'), 1 | 2 | 4 | 8) => Elem::UInt(size),
        (Some('f'), 2 | 4 | 8) => Elem::Float(size),
        (Some('c'), 8 | 16) => Elem::Complex(size),
        (Some('S'), n) if n > 0 => Elem::Bytes(n),
        // Four bytes per code point must fit in memory arithmetic.
        (Some('U'), n) if n > 0 && n <= usize::MAX / 4 => Elem::Unicode(n),
        _ => return Err(unsupported()),
    };
    Ok((elem, big_endian))
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
}

/// The Python literal subset numpy writes: `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
struct Literal<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Literal<'_> {
    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn require(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("malformed .npy header: expected {:?}", c as char))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.ws();
        let quote = *self.s.get(self.pos).ok_or("malformed .npy header")?;
        if quote != b'\'' && quote != b'"' {
            return Err("malformed .npy header: expected a string".into());
        }
        let start = self.pos + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == quote)
            .ok_or("unterminated string in .npy header")?;
        self.pos = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }

    fn value(&mut self) -> Result<Value, String> {
        self.ws();
        match self.s.get(self.pos) {
            Some(b'\'' | b'"') => Ok(Value::Str(self.string()?)),
            Some(b'(') => {
                self.pos += 1;
                let mut dims = Vec::new();
                while !self.eat(b')') {
                    self.ws();
                    let start = self.pos;
                    while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                        self.pos += 1;
                    }
                    let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or_default();
                    // Python 2 era headers may write `3L`.
                    self.eat(b'L');
                    dims.push(
                        digits
                            .parse()
                            .map_err(|_| "malformed shape in .npy header")?,
                    );
                    if !self.eat(b',') {
                        self.require(b')')?;
                        break;
                    }
                }
                Ok(Value::Tuple(dims))
            }
            Some(b'[') => Err("structured dtypes are not supported".into()),
            _ => {
                for (word, value) in [("True", true), ("False", false)] {
                    if self.s[self.pos..].starts_with(word.as_bytes()) {
                        self.pos += word.len();
                        return Ok(Value::Bool(value));
                    }
                }
                Err("malformed .npy header".into())
            }
        }
    }

    fn dict(&mut self) -> Result<Vec<(String, Value)>, String> {
        self.require(b'{')?;
        let mut out = Vec::new();
        while !self.eat(b'}') {
            let key = self.string()?;
            self.require(b':')?;
            out.push((key, self.value()?));
            if !self.eat(b',') {
                self.require(b'}')?;
                break;
            }
        }
        Ok(out)
    }
}

/// Converts the data of `count` elements (laid out as `header` says) to an Arrow array of
/// `count` leaf values, in C order and native byte order.
pub fn leaf_array(header: &Header, data: Bytes, count: usize) -> Result<ArrayRef, String> {
    let elem = header.elem;
    let size = elem.size();
    let want = count.checked_mul(size).ok_or("array too large")?;
    if data.len() != want {
        return Err(format!(
            "the header promises {want} bytes of data, the file holds {}",
            data.len()
        ));
    }
    let mut data = data;
    if header.big_endian && elem.lane() > 1 {
        data = Bytes::from(byteswap(&data, elem.lane()));
    }
    if header.fortran && header.shape.len() > 1 {
        data = Bytes::from(fortran_to_c(&data, &header.shape, size));
    }
    Ok(match elem {
        Elem::Bool => Arc::new(BooleanArray::from(
            data.iter().map(|&b| b != 0).collect::<Vec<_>>(),
        )),
        Elem::Bytes(n) => Arc::new(LargeBinaryArray::from_iter_values(
            data.chunks_exact(n).map(trim_nuls),
        )),
        Elem::Unicode(n) => {
            let strings = data
                .chunks_exact(4 * n)
                .map(|chunk| {
                    let points: Vec<u32> = chunk
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    // numpy drops trailing NULs only; one inside the text is kept.
                    let len = points.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
                    points[..len]
                        .iter()
                        .map(|&c| {
                            char::from_u32(c).ok_or_else(|| format!("invalid code point {c:#x}"))
                        })
                        .collect::<Result<String, String>>()
                })
                .collect::<Result<Vec<_>, _>>()?;
            Arc::new(LargeStringArray::from(strings))
        }
        _ => {
            let lanes = if let Elem::Complex(_) = elem {
                count * 2
            } else {
                count
            };
            let leaf = elem.leaf();
            // Typed Arrow buffers must be aligned to their element size.
            let buffer = if (data.as_ptr() as usize).is_multiple_of(elem.lane()) {
                Buffer::from(data)
            } else {
                Buffer::from_slice_ref(&data)
            };
            make_array(
                ArrayData::builder(leaf)
                    .len(lanes)
                    .add_buffer(buffer)
                    .build()
                    .map_err(|e| e.to_string())?,
            )
        }
    })
}

fn trim_nuls(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
    &b[..end]
}

fn byteswap(data: &[u8], lane: usize) -> Vec<u8> {
    let mut out = data.to_vec();
    out.chunks_exact_mut(lane).for_each(<[u8]>::reverse);
    out
}

/// Reorders a Fortran-order (column-major) array's elements into C order.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    // An empty array may have dimensions whose product overflows before its 0; once
    // there are elements, every partial product is at most their count.
    let Some(count) = shape_product(1, shape).filter(|&count| count > 0) else {
        return Vec::new();
    };
    let mut out = vec![0u8; data.len()];
    // Fortran strides (in elements) of each axis.
    let mut strides = vec![1usize; shape.len()];
    for axis in 1..shape.len() {
        strides[axis] = strides[axis - 1] * shape[axis - 1];
    }
    let mut index = vec![0usize; shape.len()];
    for c in 0..count {
        let f: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out[c * size..(c + 1) * size].copy_from_slice(&data[f * size..(f + 1) * size]);
        // Advance the C-order index (last axis fastest).
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// One sample's (or rows') column: `rows` tensors of the field's shape over `leaf`.
pub fn column(field: &Field, leaf: ArrayRef, rows: usize) -> Result<ArrayRef, String> {
    let DataType::FixedSizeList(item, width) = field.data_type() else {
        return Ok(leaf);
    };
    if leaf.len() != rows * *width as usize {
        return Err(format!(
            "{} values do not make {rows} rows of {width}",
            leaf.len()
        ));
    }
    // With the length given, zero-size tensors (a 0 in the shape) still make `rows` rows.
    Ok(Arc::new(
        FixedSizeListArray::try_new_with_length(item.clone(), *width, leaf, None, rows)
            .map_err(|e| e.to_string())?,
    ))
}

// ---- the `npy` format ------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sample,
    Rows,
}

pub fn parse_mode(options: &ReadOptions, format: &'static str) -> Result<(Mode, u64)> {
    let mut opts = options.format_options.reader(format);
    let parsed = mode_options(&mut opts, options, format)?;
    opts.finish()?;
    Ok(parsed)
}

/// `mode` and `max_decompressed_bytes` for a format of whole arrays (NPY, NPZ, HDF5),
/// whose files carry their own types: `schema=` and `features=` are refused.
pub fn mode_options(
    opts: &mut crate::options::OptionReader,
    options: &ReadOptions,
    format: &'static str,
) -> Result<(Mode, u64)> {
    let mode = match opts.choice("mode", "sample", &["sample", "rows"])? {
        "rows" => Mode::Rows,
        _ => Mode::Sample,
    };
    let limit = super::compression::limit_option(opts)?;
    if options.schema.is_some() || options.features.is_some() {
        return Err(Error::invalid_argument(format!(
            "{format} files carry their own dtypes and shapes: schema= and features= have no use"
        )));
    }
    Ok((mode, limit))
}

pub struct Npy;

struct NpyFile {
    url: String,
    size: u64,
    header: Header,
}

struct PreparedNpy {
    files: Vec<NpyFile>,
    mode: Mode,
    schema: SchemaRef,
    /// Rows per unit in rows mode.
    unit_rows: usize,
}

/// The first bytes of a file, enough for any header numpy writes.
const HEADER_PREFIX: u64 = 64 * 1024;

impl Format for Npy {
    fn name(&self) -> &'static str {
        "npy"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let (mode, _) = parse_mode(options, "npy")?;
        let prefixes = per_shard(&shards, io, FORMAT, |source, size| {
            Box::pin(
                async move { Ok((size, source.read_range(0..size.min(HEADER_PREFIX)).await?)) },
            )
        })?;
        let mut files = Vec::with_capacity(shards.len());
        for (shard, prefix) in shards.iter().zip(prefixes) {
            let (size, prefix) = prefix?;
            let corrupt = |m: String| Error::decode(&shard.url, FORMAT, Position::Byte(0), m);
            let header = parse_header(&prefix).map_err(corrupt)?;
            header.check(mode == Mode::Rows).map_err(corrupt)?;
            let expected = header
                .data_len()
                .ok_or_else(|| corrupt("the shape overflows".into()))?;
            let actual = size.saturating_sub(header.data_offset as u64);
            if expected != actual {
                return Err(corrupt(format!(
                    "the header promises {expected} bytes of data, the file holds {actual}"
                )));
            }
            if mode == Mode::Rows && header.shape.is_empty() {
                return Err(corrupt(
                    "rows mode needs arrays with at least one axis; this one is a scalar".into(),
                ));
            }
            files.push(NpyFile {
                url: shard.url.clone(),
                size,
                header,
            });
        }
        let name = "array";
        let schema = files
            .first()
            .map(|f| Arc::new(Schema::new(vec![f.header.field(name, mode == Mode::Rows)])))
            .unwrap_or_else(|| Arc::new(Schema::empty()));
        for file in &files {
            let field = file.header.field(name, mode == Mode::Rows);
            if field.data_type() != schema.field(0).data_type() {
                return Err(Error::Schema {
                    url: file.url.clone(),
                    message: format!(
                        "{:?} {:?} differs from the first file's {:?}",
                        file.header.elem, file.header.shape, files[0].header.shape
                    ),
                });
            }
        }
        let row_bytes = files
            .first()
            .map(|f| f.header.row_bytes().max(1))
            .unwrap_or(1);
        let unit_rows = ((UNIT_BYTES / row_bytes as u64).max(1)) as usize;
        let mut units = Vec::new();
        for (shard, file) in files.iter().enumerate() {
            match mode {
                Mode::Sample => units.push(WorkUnit {
                    shard,
                    part: 0,
                    rows: Some(1),
                }),
                Mode::Rows => {
                    let rows = file.header.shape[0];
                    // Fortran-order rows are not contiguous: read such files whole.
                    let step = if file.header.fortran && file.header.shape.len() > 1 {
                        rows.max(1)
                    } else {
                        unit_rows
                    };
                    for (part, start) in (0..rows).step_by(step).enumerate() {
                        units.push(WorkUnit {
                            shard,
                            part,
                            rows: Some(step.min(rows - start) as u64),
                        });
                    }
                }
            }
        }
        let unit_rows = unit_rows.max(1);
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            PreparedNpy {
                files,
                mode,
                schema,
                unit_rows,
            },
        ))
    }
}

impl UnitJobs for PreparedNpy {
    fn job(&self, unit: &WorkUnit, _shard: &ShardMeta) -> UnitJob {
        let file = &self.files[unit.shard];
        let header = file.header.clone();
        let (url, schema) = (file.url.clone(), self.schema.clone());
        let rows = unit.rows.unwrap_or(1) as usize;
        let whole = self.mode == Mode::Sample || (header.fortran && header.shape.len() > 1);
        let start = if whole {
            header.data_offset as u64
        } else {
            header.data_offset as u64 + (unit.part * self.unit_rows * header.row_bytes()) as u64
        };
        let len = if whole {
            file.size - header.data_offset as u64
        } else {
            (rows * header.row_bytes()) as u64
        };
        let mode = self.mode;
        UnitJob::Ranges {
            ranges: std::iter::once(start..start + len).collect(),
            decode: Box::new(move |fetched: RangeSet, _: &mut BatchSink| {
                let corrupt = |m: String| Error::decode(&url, FORMAT, Position::Byte(start), m);
                let data = fetched
                    .get(start, len)
                    .ok_or_else(|| corrupt("range not fetched".into()))?;
                let count = (len as usize) / header.elem.size().max(1);
                let leaf = leaf_array(&header, data, count).map_err(corrupt)?;
                let rows = if mode == Mode::Sample { 1 } else { rows };
                let array = column(schema.field(0), leaf, rows).map_err(corrupt)?;
                let batch = RecordBatch::try_new(schema.clone(), vec![array])
                    .map_err(|e| corrupt(e.to_string()))?;
                Ok(Decoded {
                    batches: vec![batch],
                    skipped: Vec::new(),
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::file_bytes as npy;

    #[test]
    fn parses_headers_numpy_writes() {
        let h = parse_header(&npy("<f4", false, "(3, 4)", &[])).unwrap();
        assert_eq!(
            (h.elem, h.big_endian, h.fortran, h.shape.clone()),
            (Elem::Float(4), false, false, vec![3, 4])
        );
        assert_eq!(h.data_offset % 64, 0);
        assert_eq!(h.descr(), "<f4");
        assert_eq!(
            parse_header(&npy(">i8", true, "(5,)", &[])).unwrap().shape,
            vec![5]
        );
        assert_eq!(
            parse_header(&npy("|b1", false, "()", &[])).unwrap().shape,
            Vec::<usize>::new()
        );
        assert_eq!(
            parse_header(&npy("<U7", false, "(2,)", &[])).unwrap().elem,
            Elem::Unicode(7)
        );
        let err = parse_header(&npy("|O", false, "(2,)", &[])).unwrap_err();
        assert!(err.contains("pickle"), "{err}");
        assert!(parse_header(b"\x93NUMPY\x01\x00\xff\xff{").is_err());
        assert!(parse_header(b"garbage!!!!!").is_err());
    }

    #[test]
    fn rows_of_nothing_are_bounded() {
        let header = |shape: &str| parse_header(&npy("<f4", false, shape, &[])).unwrap();
        assert!(header("(1152921504606846976, 0)").check(true).is_err());
        assert!(header("(1152921504606846976, 0)").check(false).is_ok());
        assert!(header("(16777216, 0)").check(true).is_ok());
        assert!(header("(0, 5)").check(true).is_ok());
        // A zero after dimensions whose product overflows: still no bytes.
        let zero = header("(1, 1152921504606846976, 2, 0)");
        assert_eq!(
            (zero.row_bytes(), zero.count(), zero.data_len()),
            (0, Some(0), Some(0))
        );
    }

    #[test]
    fn hostile_headers_are_errors_not_panics() {
        for descr in [
            "<é8",
            "é",
            "<",
            "",
            "<f",
            "<f4x",
            "<i3",
            "<f+4",
            ">c4",
            "<U0",
            "<S-1",
            "<U99999999999999999999999",
            "<U4611686018427387904",
        ] {
            let err = parse_header(&npy(descr, false, "(2,)", &[])).unwrap_err();
            assert!(err.contains("dtype"), "{descr}: {err}");
        }
        for shape in ["(99999999999999999999999,)", "(1, -2)", "(1 2)"] {
            assert!(
                parse_header(&npy("<f8", false, shape, &[])).is_err(),
                "{shape}"
            );
        }
        let huge = parse_header(&npy("<f8", false, "(2147483648, 2147483648)", &[])).unwrap();
        assert!(huge.check(false).is_err() && huge.check(true).is_err());
        assert_eq!(huge.data_len(), None);
        let wide = parse_header(&npy("<c16", false, "(3, 1073741824)", &[])).unwrap();
        assert!(wide.check(true).is_err(), "complex values take two lanes");
        let empty = parse_header(&npy("<f8", false, "(0, 4611686018427387904, 4)", &[])).unwrap();
        assert_eq!(empty.data_len(), Some(0));
        assert_eq!(empty.row_bytes(), usize::MAX);
        assert!(empty.check(true).is_err());
        let fine = parse_header(&npy("<f4", false, "(5, 3, 4)", &[])).unwrap();
        assert!(fine.check(true).is_ok() && fine.check(false).is_ok());
        assert_eq!((fine.row_bytes(), fine.row_values()), (48, 12));
    }

    #[test]
    fn fortran_and_big_endian_become_c_native() {
        // 2x3 int16 array [[1,2,3],[4,5,6]] in Fortran order, big endian.
        let f: Vec<u8> = [1i16, 4, 2, 5, 3, 6]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let bytes = npy(">i2", true, "(2, 3)", &f);
        let h = parse_header(&bytes).unwrap();
        let leaf = leaf_array(&h, Bytes::copy_from_slice(&bytes[h.data_offset..]), 6).unwrap();
        let values: Vec<i16> = leaf.to_data().buffer::<i16>(0).to_vec();
        assert_eq!(values, vec![1, 2, 3, 4, 5, 6]);
        assert!(leaf_array(&h, Bytes::copy_from_slice(&bytes[h.data_offset + 2..]), 6).is_err());
    }
}
