//! Record batches to the bytes of one shard file, per output format, as a stream: a
//! shard's encoder takes its batches as they come and writes their bytes on (Parquet
//! row groups, JSON lines, tar members and TFRecords), so it holds a bounded part of the
//! shard, never all of it; only NPZ, whose members are whole columns, keeps the shard's
//! rows until it ends. Encoders refuse, naming the column, a type their format cannot
//! hold rather than writing something that would read back different.

use std::io::Write;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, SchemaRef};
use flate2::Compression as GzLevel;
use flate2::write::{DeflateEncoder, GzEncoder};

use crate::error::{Error, Result};
use crate::format::example::{encode_len_field, encode_varint};
use crate::format::tfrecord::masked_crc;
use crate::format::{npy, tensor_shape};

/// The formats `write` produces, with their compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardFormat {
    Parquet(parquet::basic::Compression),
    /// JSON Lines; gzip-wrapped when true.
    Jsonl(bool),
    /// WebDataset tar; gzip-wrapped when true.
    WebDataset(bool),
    /// TFRecord of `tf.train.Example`s; gzip-wrapped when true (TF's `"GZIP"`).
    TfRecord(bool),
    /// One `.npz` per shard; members deflated (`np.savez_compressed`) when true.
    Npz(bool),
}

impl ShardFormat {
    /// `format=` and `compression=` as the user gives them; `None` picks the format's
    /// usual default (Snappy for Parquet, none for the others).
    pub fn parse(format: &str, compression: Option<&str>) -> Result<Self> {
        let choose = |allowed: &[&str]| -> Result<bool> {
            match compression {
                None | Some("none") => Ok(false),
                Some(c) if allowed.contains(&c) => Ok(true),
                Some(c) => Err(Error::invalid_argument(format!(
                    "compression={c:?} for {format}: choose one of {:?}",
                    [&["none"], allowed].concat()
                ))),
            }
        };
        use parquet::basic::Compression as C;
        Ok(match format {
            "parquet" => ShardFormat::Parquet(match compression.unwrap_or("snappy") {
                "none" => C::UNCOMPRESSED,
                "snappy" => C::SNAPPY,
                "gzip" => C::GZIP(Default::default()),
                "zstd" => C::ZSTD(Default::default()),
                "lz4" => C::LZ4_RAW,
                "brotli" => C::BROTLI(Default::default()),
                other => {
                    return Err(Error::invalid_argument(format!(
                        "compression={other:?} for parquet: choose one of \
                         [\"none\", \"snappy\", \"gzip\", \"zstd\", \"lz4\", \"brotli\"]"
                    )));
                }
            }),
            "jsonl" => ShardFormat::Jsonl(choose(&["gzip"])?),
            "webdataset" => ShardFormat::WebDataset(choose(&["gzip"])?),
            "tfrecord" => ShardFormat::TfRecord(choose(&["gzip"])?),
            "npz" => ShardFormat::Npz(choose(&["deflate"])?),
            other => {
                return Err(Error::invalid_argument(format!(
                    "cannot write format {other:?}; write() makes parquet, jsonl, webdataset, tfrecord or npz"
                )));
            }
        })
    }

    /// The name `format=` reads it back with.
    pub fn name(self) -> &'static str {
        match self {
            ShardFormat::Parquet(_) => "parquet",
            ShardFormat::Jsonl(_) => "jsonl",
            ShardFormat::WebDataset(_) => "webdataset",
            ShardFormat::TfRecord(_) => "tfrecord",
            ShardFormat::Npz(_) => "npz",
        }
    }

    /// The compression as the manifest records it.
    pub fn compression(self) -> Option<String> {
        match self {
            ShardFormat::Parquet(c) => Some(
                match c {
                    parquet::basic::Compression::UNCOMPRESSED => "none",
                    parquet::basic::Compression::GZIP(_) => "gzip",
                    parquet::basic::Compression::ZSTD(_) => "zstd",
                    parquet::basic::Compression::LZ4_RAW => "lz4",
                    parquet::basic::Compression::BROTLI(_) => "brotli",
                    _ => "snappy",
                }
                .into(),
            ),
            ShardFormat::Jsonl(true)
            | ShardFormat::WebDataset(true)
            | ShardFormat::TfRecord(true) => Some("gzip".into()),
            ShardFormat::Npz(true) => Some("deflate".into()),
            _ => None,
        }
    }

    /// File name extension, compression included.
    pub fn extension(self) -> &'static str {
        match self {
            ShardFormat::Parquet(_) => ".parquet",
            ShardFormat::Jsonl(gz) => {
                if gz {
                    ".jsonl.gz"
                } else {
                    ".jsonl"
                }
            }
            ShardFormat::WebDataset(gz) => {
                if gz {
                    ".tar.gz"
                } else {
                    ".tar"
                }
            }
            ShardFormat::TfRecord(gz) => {
                if gz {
                    ".tfrecord.gz"
                } else {
                    ".tfrecord"
                }
            }
            ShardFormat::Npz(_) => ".npz",
        }
    }

    /// `format_options` that read the shards back as written.
    pub fn read_options(self) -> serde_json::Map<String, serde_json::Value> {
        let mut options = serde_json::Map::new();
        if let ShardFormat::Npz(_) = self {
            options.insert("mode".into(), "rows".into());
        }
        options
    }

    /// Fails now, before anything is written, on a column the format cannot hold.
    pub fn check_schema(self, schema: &SchemaRef) -> Result<()> {
        for field in schema.fields() {
            let fits = match self {
                ShardFormat::Parquet(_) => true,
                ShardFormat::Jsonl(_) => !holds_binary(field.data_type()),
                ShardFormat::WebDataset(_) => webdataset_kind(field).is_some(),
                ShardFormat::TfRecord(_) => example_kind(field.data_type()).is_some(),
                ShardFormat::Npz(_) => {
                    npy_elem(field).is_some()
                        && !matches!(
                            field.data_type(),
                            DataType::List(_) | DataType::LargeList(_)
                        )
                }
            };
            if !fits {
                return Err(Error::invalid_argument(format!(
                    "column {:?} ({}) cannot be written as {}: {}",
                    field.name(),
                    field.data_type(),
                    self.name(),
                    self.rule()
                )));
            }
        }
        Ok(())
    }

    /// What the format holds, for the message when a column does not fit.
    fn rule(self) -> &'static str {
        match self {
            ShardFormat::Parquet(_) => "",
            ShardFormat::Jsonl(_) => {
                "JSON has no bytes type; drop the column or map it to text (e.g. base64)"
            }
            ShardFormat::WebDataset(_) => {
                "a sample's files hold bytes, text or a number; name an array column *.npy to store it as .npy"
            }
            ShardFormat::TfRecord(_) => {
                "tf.train.Example holds int64, float and bytes values and flat lists of them"
            }
            ShardFormat::Npz(_) => {
                "numpy arrays hold numbers, booleans, fixed-shape tensors, str and bytes, without nulls"
            }
        }
    }

    /// An encoder of one shard into `sink`; `first_row` numbers the rows (the WebDataset
    /// keys of a dataset without `__key__`).
    pub fn start<W: Write + Send>(
        self,
        schema: &SchemaRef,
        first_row: u64,
        sink: W,
    ) -> Result<ShardEncoder<W>> {
        Ok(match self {
            ShardFormat::Parquet(compression) => {
                let properties = parquet::file::properties::WriterProperties::builder()
                    .set_compression(compression)
                    .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
                    .build();
                ShardEncoder::Parquet(
                    parquet::arrow::ArrowWriter::try_new(sink, schema.clone(), Some(properties))
                        .map_err(|e| failed("Parquet", e))?,
                )
            }
            // Every field on every line, nulls included (arrow-json leaves null fields out
            // by default): a column null in the first lines then set is still a column of
            // every line, in the schema's order, for our reader and for pyarrow's alike.
            ShardFormat::Jsonl(gz) => ShardEncoder::Jsonl(
                arrow_json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .with_encoder_factory(Arc::new(ShortestFloats))
                    .build::<_, arrow_json::writer::LineDelimited>(Out::new(sink, gz)),
            ),
            ShardFormat::WebDataset(gz) => {
                ShardEncoder::WebDataset(TarEncoder::new(schema, first_row, Out::new(sink, gz)))
            }
            ShardFormat::TfRecord(gz) => ShardEncoder::TfRecord(Out::new(sink, gz)),
            ShardFormat::Npz(deflate) => ShardEncoder::Npz {
                schema: schema.clone(),
                batches: Vec::new(),
                deflate,
                sink,
            },
        })
    }

    /// Whether a shard's rows are kept until it ends (so its size is its writer's memory).
    pub fn holds_whole_shards(self) -> bool {
        matches!(self, ShardFormat::Npz(_))
    }
}

/// Floats in JSON as Python's `repr` prints them: the shortest digits that read back
/// to the same value (Ryu). arrow-json's own (lexical) gives a 17th digit to some that
/// need 16 (-6.182165264425728e19 as -6.1821652644257284e19): the same value, but not
/// the text Python, pyarrow or `datasets` would write.
#[derive(Debug)]
struct ShortestFloats;

struct ShortestFloat<'a, T: arrow_array::ArrowPrimitiveType>(&'a arrow_array::PrimitiveArray<T>);

impl<T> arrow_json::Encoder for ShortestFloat<'_, T>
where
    T: arrow_array::ArrowPrimitiveType,
    T::Native: ryu::Float + Into<f64>,
{
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let value = self.0.value(idx);
        if value.into().is_finite() {
            out.extend_from_slice(ryu::Buffer::new().format_finite(value).as_bytes());
        } else {
            // Refused before it gets here (see `ShardEncoder::append`).
            out.extend_from_slice(b"null");
        }
    }
}

impl arrow_json::EncoderFactory for ShortestFloats {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a arrow_schema::FieldRef,
        array: &'a dyn arrow_array::Array,
        _options: &'a arrow_json::EncoderOptions,
    ) -> std::result::Result<
        Option<arrow_json::writer::NullableEncoder<'a>>,
        arrow_schema::ArrowError,
    > {
        let encoder: Box<dyn arrow_json::Encoder + 'a> = match array.data_type() {
            DataType::Float64 => Box::new(ShortestFloat(
                array.as_primitive::<arrow_array::types::Float64Type>(),
            )),
            DataType::Float32 => Box::new(ShortestFloat(array.as_primitive::<Float32Type>())),
            _ => return Ok(None),
        };
        Ok(Some(arrow_json::writer::NullableEncoder::new(
            encoder,
            array.nulls().cloned(),
        )))
    }
}

/// One shard being encoded (see [`ShardFormat::start`]).
pub enum ShardEncoder<W: Write + Send> {
    /// Holds the open row group's encoded pages (at most `ROW_GROUP_BYTES`).
    Parquet(parquet::arrow::ArrowWriter<W>),
    Jsonl(arrow_json::Writer<Out<W>, arrow_json::writer::LineDelimited>),
    WebDataset(TarEncoder<W>),
    TfRecord(Out<W>),
    Npz {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        deflate: bool,
        sink: W,
    },
}

impl<W: Write + Send> ShardEncoder<W> {
    /// Encodes the next rows of the shard.
    pub fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            ShardEncoder::Parquet(writer) => writer.write(batch).map_err(|e| failed("Parquet", e)),
            ShardEncoder::Jsonl(writer) => {
                // arrow-json would write them as null: refused rather than changed.
                for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                    if non_finite(column.as_ref()) {
                        return Err(Error::invalid_argument(format!(
                            "column {:?} holds inf or NaN, which JSON cannot represent",
                            field.name()
                        )));
                    }
                }
                writer.write(batch).map_err(|e| failed("JSON", e))
            }
            ShardEncoder::WebDataset(tar) => tar.append(batch),
            ShardEncoder::TfRecord(out) => append_tfrecords(batch, out),
            ShardEncoder::Npz { batches, .. } => {
                batches.push(batch.clone());
                Ok(())
            }
        }
    }

    /// Writes the rest of the file (Parquet's last row group and footer, the tar's end,
    /// the gzip trailer, the whole NPZ) and gives the sink back.
    pub fn finish(self) -> Result<W> {
        match self {
            ShardEncoder::Parquet(writer) => writer.into_inner().map_err(|e| failed("Parquet", e)),
            ShardEncoder::Jsonl(mut writer) => {
                writer.finish().map_err(|e| failed("JSON", e))?;
                writer.into_inner().finish()
            }
            ShardEncoder::WebDataset(tar) => tar.finish(),
            ShardEncoder::TfRecord(out) => out.finish(),
            ShardEncoder::Npz {
                schema,
                batches,
                deflate,
                mut sink,
            } => {
                sink.write_all(&npz_bytes(&schema, &batches, deflate)?)
                    .map_err(|e| failed("npz", e))?;
                Ok(sink)
            }
        }
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("encoding {what}: {e}"))
}

/// An encoder's output: the sink itself, or gzip into it.
pub enum Out<W: Write> {
    Plain(W),
    /// Boxed: the deflate state is large, and the sink alone small.
    Gzip(Box<GzEncoder<W>>),
}

impl<W: Write> Out<W> {
    fn new(sink: W, gz: bool) -> Self {
        if gz {
            Out::Gzip(Box::new(GzEncoder::new(sink, GzLevel::default())))
        } else {
            Out::Plain(sink)
        }
    }

    /// The gzip trailer written, the sink.
    fn finish(self) -> Result<W> {
        match self {
            Out::Plain(sink) => Ok(sink),
            Out::Gzip(encoder) => encoder.finish().map_err(|e| failed("gzip", e)),
        }
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::Plain(sink) => sink.write(data),
            Out::Gzip(encoder) => encoder.write(data),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Plain(sink) => sink.flush(),
            Out::Gzip(encoder) => encoder.flush(),
        }
    }
}

// ---- Parquet --------------------------------------------------------------------------

/// Row groups of about this many encoded bytes: units of parallel reading.
const ROW_GROUP_BYTES: usize = 32 << 20;

// ---- JSON Lines -----------------------------------------------------------------------

fn holds_binary(data_type: &DataType) -> bool {
    match data_type {
        DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_)
        | DataType::BinaryView => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            holds_binary(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().any(|f| holds_binary(f.data_type())),
        _ => false,
    }
}

/// Whether any float in `array`, at any depth, is infinite or NaN.
fn non_finite(array: &dyn Array) -> bool {
    let floats = |a: &dyn Array| match a.data_type() {
        DataType::Float16 => a
            .as_primitive::<arrow_array::types::Float16Type>()
            .iter()
            .flatten()
            .any(|v| !v.is_finite()),
        DataType::Float32 => a
            .as_primitive::<Float32Type>()
            .iter()
            .flatten()
            .any(|v| !v.is_finite()),
        DataType::Float64 => a
            .as_primitive::<arrow_array::types::Float64Type>()
            .iter()
            .flatten()
            .any(|v| !v.is_finite()),
        _ => false,
    };
    match array.data_type() {
        DataType::List(_) => non_finite(array.as_list::<i32>().values().as_ref()),
        DataType::LargeList(_) => non_finite(array.as_list::<i64>().values().as_ref()),
        DataType::FixedSizeList(..) => non_finite(array.as_fixed_size_list().values().as_ref()),
        DataType::Struct(_) => array
            .as_struct()
            .columns()
            .iter()
            .any(|c| non_finite(c.as_ref())),
        _ => floats(array),
    }
}

// ---- WebDataset -----------------------------------------------------------------------

const KEY_COLUMN: &str = "__key__";
/// Derived by the reader from the shard's URL; never written.
const URL_COLUMN: &str = "__url__";

/// How a column becomes a sample's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Bytes,
    Text,
    /// A number or boolean, written as text (`.cls` holds `"3"`).
    Number,
    /// An array, written as a `.npy` file.
    Npy,
    /// Not a member: the sample's key, or the reader's URL column.
    Skip,
}

fn webdataset_kind(field: &Field) -> Option<Member> {
    let name = field.name();
    if name == KEY_COLUMN {
        return matches!(field.data_type(), DataType::Utf8 | DataType::LargeUtf8)
            .then_some(Member::Skip);
    }
    if name == URL_COLUMN {
        return Some(Member::Skip);
    }
    if name.contains('/') {
        return None;
    }
    let ext = name.rsplit('.').next().unwrap_or(name);
    match field.data_type() {
        DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_)
        | DataType::BinaryView => Some(Member::Bytes),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(Member::Text),
        t if t.is_primitive() || *t == DataType::Boolean => Some(Member::Number),
        DataType::FixedSizeList(..) | DataType::List(_) | DataType::LargeList(_)
            if ext == "npy" && npy_elem(field).is_some() =>
        {
            Some(Member::Npy)
        }
        _ => None,
    }
}

/// A WebDataset shard being written: each row's columns become `<key>.<column>` members
/// of the tar, appended as the rows come.
pub struct TarEncoder<W: Write> {
    builder: tar::Builder<Out<W>>,
    schema: SchemaRef,
    kinds: Vec<Member>,
    key_column: Option<usize>,
    /// The next row's number in the dataset (its key without `__key__`).
    row: u64,
    /// Readers group a tar's consecutive files by key: a key repeated on the next row
    /// would merge two samples into one (or fail), so it is refused.
    previous_key: Option<String>,
}

impl<W: Write> TarEncoder<W> {
    fn new(schema: &SchemaRef, first_row: u64, out: Out<W>) -> Self {
        Self {
            builder: tar::Builder::new(out),
            schema: schema.clone(),
            kinds: schema
                .fields()
                .iter()
                .map(|f| webdataset_kind(f).unwrap_or(Member::Skip))
                .collect(),
            key_column: schema.index_of(KEY_COLUMN).ok(),
            row: first_row,
            previous_key: None,
        }
    }

    /// The tar's end written, the sink.
    fn finish(self) -> Result<W> {
        self.builder
            .into_inner()
            .map_err(|e| failed("tar", e))?
            .finish()
    }

    fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        let (schema, kinds) = (&self.schema, &self.kinds);
        let keys = self
            .key_column
            .map(|i| arrow_cast::cast(batch.column(i), &DataType::LargeUtf8))
            .transpose()
            .map_err(|e| failed("keys", e))?;
        let texts: Vec<Option<ArrayFormatter>> = batch
            .columns()
            .iter()
            .zip(kinds)
            .map(|(column, kind)| {
                (*kind == Member::Number)
                    .then(|| ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default()))
                    .transpose()
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| failed("numbers", e))?;
        for i in 0..batch.num_rows() {
            let key = match &keys {
                Some(keys) if keys.is_valid(i) => {
                    let key = keys.as_string::<i64>().value(i);
                    let base = key.rsplit('/').next().unwrap_or(key);
                    if base.is_empty() || base.contains('.') {
                        return Err(Error::invalid_argument(format!(
                            "__key__ {key:?}: a WebDataset key's last part must be non-empty and hold no '.' \
                             (readers split a file name at its first dot)"
                        )));
                    }
                    key.to_string()
                }
                _ => format!("{:09}", self.row),
            };
            if self.previous_key.as_deref() == Some(key.as_str()) {
                return Err(Error::invalid_argument(format!(
                    "__key__ {key:?} is on two consecutive rows (rows {} and {}): WebDataset \
                     readers would take them for one sample; give every row its own key",
                    self.row - 1,
                    self.row
                )));
            }
            let members = (0..batch.num_columns())
                .filter(|&c| kinds[c] != Member::Skip && !batch.column(c).is_null(i))
                .count();
            if members == 0 {
                return Err(Error::invalid_argument(format!(
                    "row {} (key {key:?}) has no value to write: a WebDataset sample is its \
                     files, and one with none would vanish from the shard",
                    self.row
                )));
            }
            for (c, field) in schema.fields().iter().enumerate() {
                let column = batch.column(c);
                if kinds[c] == Member::Skip || column.is_null(i) {
                    continue;
                }
                let data: Vec<u8> = match kinds[c] {
                    Member::Bytes => binary_value(column, i),
                    Member::Text => string_value(column, i).into_bytes(),
                    Member::Number => match &texts[c] {
                        Some(f) => f.value(i).to_string().into_bytes(),
                        None => Vec::new(),
                    },
                    Member::Npy => npy_file(field, &column.slice(i, 1), true)?,
                    Member::Skip => continue,
                };
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                header.set_mtime(0);
                header.set_entry_type(tar::EntryType::Regular);
                self.builder
                    .append_data(
                        &mut header,
                        format!("{key}.{}", field.name()),
                        data.as_slice(),
                    )
                    .map_err(|e| failed("tar", e))?;
            }
            self.previous_key = Some(key);
            self.row += 1;
        }
        Ok(())
    }
}

fn binary_value(column: &ArrayRef, i: usize) -> Vec<u8> {
    match column.data_type() {
        DataType::Binary => column.as_binary::<i32>().value(i).to_vec(),
        DataType::LargeBinary => column.as_binary::<i64>().value(i).to_vec(),
        DataType::FixedSizeBinary(_) => column.as_fixed_size_binary().value(i).to_vec(),
        DataType::BinaryView => column.as_binary_view().value(i).to_vec(),
        _ => Vec::new(),
    }
}

fn string_value(column: &ArrayRef, i: usize) -> String {
    match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().value(i).to_string(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(i).to_string(),
        DataType::Utf8View => column.as_string_view().value(i).to_string(),
        _ => String::new(),
    }
}

// ---- TFRecord -------------------------------------------------------------------------

/// `tf.train.Feature`'s oneof: which list a column's values go into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExampleKind {
    Bytes = 1,
    Float = 2,
    Int64 = 3,
}

fn example_leaf(data_type: &DataType) -> Option<ExampleKind> {
    match data_type {
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64 => Some(ExampleKind::Int64),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => Some(ExampleKind::Int64),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => Some(ExampleKind::Float),
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_) => Some(ExampleKind::Bytes),
        _ => None,
    }
}

/// The Example list a column fills, and whether it is a list column (scalars are lists
/// of one value).
fn example_kind(data_type: &DataType) -> Option<(ExampleKind, bool)> {
    match data_type {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            example_leaf(f.data_type()).map(|k| (k, true))
        }
        other => example_leaf(other).map(|k| (k, false)),
    }
}

/// A column's values as the type Example stores, with each row's range of them.
enum ExampleValues {
    Int64(ArrayRef),
    Float(ArrayRef),
    Bytes(ArrayRef),
}

struct ExampleColumn {
    key: String,
    kind: ExampleKind,
    values: ExampleValues,
    /// Offsets into `values` per row, for list columns.
    offsets: Option<Vec<usize>>,
    /// The column itself, for its nulls.
    column: ArrayRef,
}

fn example_column(field: &Field, column: &ArrayRef) -> Result<ExampleColumn> {
    let (kind, is_list) = example_kind(field.data_type())
        .ok_or_else(|| failed("Example", format!("column {}", field.name())))?;
    let (leaf, offsets) = if is_list {
        let list = arrow_cast::cast(
            column,
            &DataType::LargeList(Arc::new(Field::new_list_field(
                match field.data_type() {
                    DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                        f.data_type().clone()
                    }
                    other => other.clone(),
                },
                true,
            ))),
        )
        .map_err(|e| failed("Example lists", e))?;
        let list = list.as_list::<i64>();
        let offsets = list.value_offsets().iter().map(|&o| o as usize).collect();
        (list.values().clone(), Some(offsets))
    } else {
        (column.clone(), None)
    };
    let cast = |to: &DataType| arrow_cast::cast(&leaf, to).map_err(|e| failed("Example values", e));
    let values = match kind {
        ExampleKind::Int64 => ExampleValues::Int64(cast(&DataType::Int64)?),
        ExampleKind::Float => ExampleValues::Float(cast(&DataType::Float32)?),
        ExampleKind::Bytes => ExampleValues::Bytes(cast(&DataType::LargeBinary)?),
    };
    Ok(ExampleColumn {
        key: field.name().clone(),
        kind,
        values,
        offsets,
        column: column.clone(),
    })
}

impl ExampleColumn {
    /// Appends row `i`'s `tf.train.Feature` to `out` (its list, possibly empty).
    fn feature(&self, i: usize, out: &mut Vec<u8>) {
        let range = match &self.offsets {
            Some(offsets) => offsets[i]..offsets[i + 1],
            None => i..i + 1,
        };
        let mut list = Vec::new();
        match &self.values {
            ExampleValues::Int64(values) => {
                let values = values.as_primitive::<Int64Type>();
                let mut packed = Vec::new();
                for j in range {
                    encode_varint(values.value(j) as u64, &mut packed);
                }
                encode_len_field(1, &packed, &mut list);
            }
            ExampleValues::Float(values) => {
                let values = values.as_primitive::<Float32Type>();
                let packed: Vec<u8> = range.flat_map(|j| values.value(j).to_le_bytes()).collect();
                encode_len_field(1, &packed, &mut list);
            }
            ExampleValues::Bytes(values) => {
                let values = values.as_binary::<i64>();
                for j in range {
                    encode_len_field(1, values.value(j), &mut list);
                }
            }
        }
        encode_len_field(self.kind as u64, &list, out);
    }
}

/// Appends a TFRecord of a `tf.train.Example` per row of `batch` to `out`.
fn append_tfrecords(batch: &RecordBatch, out: &mut impl Write) -> Result<()> {
    let columns: Vec<ExampleColumn> = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| example_column(field, column))
        .collect::<Result<_>>()?;
    let mut features = Vec::new();
    let mut entry = Vec::new();
    let mut feature = Vec::new();
    let mut example = Vec::new();
    for i in 0..batch.num_rows() {
        features.clear();
        for column in &columns {
            // A null is a feature the Example lacks (as tf.io.parse_example sees it).
            if column.column.is_null(i) {
                continue;
            }
            feature.clear();
            column.feature(i, &mut feature);
            entry.clear();
            encode_len_field(1, column.key.as_bytes(), &mut entry);
            encode_len_field(2, &feature, &mut entry);
            encode_len_field(1, &entry, &mut features);
        }
        example.clear();
        encode_len_field(1, &features, &mut example);
        let len = (example.len() as u64).to_le_bytes();
        out.write_all(&len)
            .and_then(|()| out.write_all(&masked_crc(&len).to_le_bytes()))
            .and_then(|()| out.write_all(&example))
            .and_then(|()| out.write_all(&masked_crc(&example).to_le_bytes()))
            .map_err(|e| failed("TFRecord", e))?;
    }
    Ok(())
}

// ---- NPZ ------------------------------------------------------------------------------

/// The numpy dtype a column's values take, and the shape of one row's value.
fn npy_elem(field: &Field) -> Option<(String, Vec<usize>)> {
    let leaf_descr = |t: &DataType| -> Option<&'static str> {
        Some(match t {
            DataType::Boolean => "|b1",
            DataType::Int8 => "|i1",
            DataType::Int16 => "<i2",
            DataType::Int32 => "<i4",
            DataType::Int64 => "<i8",
            DataType::UInt8 => "|u1",
            DataType::UInt16 => "<u2",
            DataType::UInt32 => "<u4",
            DataType::UInt64 => "<u8",
            DataType::Float16 => "<f2",
            DataType::Float32 => "<f4",
            DataType::Float64 => "<f8",
            _ => return None,
        })
    };
    match field.data_type() {
        DataType::FixedSizeList(child, width) => {
            let shape = tensor_shape(field).unwrap_or_else(|| vec![*width as usize]);
            leaf_descr(child.data_type()).map(|d| (d.to_string(), shape))
        }
        // A variable-length list is one row's array only (a `.npy` member of WebDataset).
        DataType::List(child) | DataType::LargeList(child) => {
            leaf_descr(child.data_type()).map(|d| (d.to_string(), vec![]))
        }
        // Strings and bytes are fixed-width in numpy; the width is found per shard.
        DataType::Utf8 | DataType::LargeUtf8 => Some(("<U".into(), vec![])),
        DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_) => {
            Some(("|S".into(), vec![]))
        }
        other => leaf_descr(other).map(|d| (d.to_string(), vec![])),
    }
}

fn refuse_nulls(array: &ArrayRef, what: &str) -> Result<()> {
    match array.null_count() {
        0 => Ok(()),
        _ => Err(Error::invalid_argument(format!(
            "{what} holds nulls, which numpy arrays cannot"
        ))),
    }
}

/// The raw little-endian bytes of a fixed-width array without nulls.
fn fixed_width_bytes(array: &ArrayRef, what: &str) -> Result<Vec<u8>> {
    refuse_nulls(array, what)?;
    if *array.data_type() == DataType::Boolean {
        let bools = array.as_boolean();
        return Ok(bools.values().iter().map(u8::from).collect());
    }
    let data = array.to_data();
    let width = array.data_type().primitive_width().unwrap_or(0);
    let start = data.offset() * width;
    Ok(data.buffers()[0].as_slice()[start..start + data.len() * width].to_vec())
}

/// A `.npy` file of a column's rows: `(rows, *shape)`; with `one_row`, the row's own
/// array (WebDataset's `.npy` members).
fn npy_file(field: &Field, column: &ArrayRef, one_row: bool) -> Result<Vec<u8>> {
    let what = format!("column {:?}", field.name());
    let (descr, row_shape) = npy_elem(field).ok_or_else(|| failed("npy", &what))?;
    let rows = column.len();
    let (descr, data, row_shape) = match column.data_type() {
        DataType::FixedSizeList(..) => {
            let list = column.as_fixed_size_list();
            let width = list.value_length() as usize;
            let values = list.values().slice(list.offset() * width, rows * width);
            (descr, fixed_width_bytes(&values, &what)?, row_shape)
        }
        DataType::List(_) | DataType::LargeList(_) => {
            // One row: its values, 1-D.
            let list = arrow_cast::cast(
                column,
                &DataType::LargeList(Arc::new(Field::new_list_field(
                    match field.data_type() {
                        DataType::List(f) | DataType::LargeList(f) => f.data_type().clone(),
                        other => other.clone(),
                    },
                    true,
                ))),
            )
            .map_err(|e| failed("npy", e))?;
            let list = list.as_list::<i64>();
            let values = list.value(0);
            let n = values.len();
            (descr, fixed_width_bytes(&values, &what)?, vec![n])
        }
        DataType::Utf8 | DataType::LargeUtf8 => {
            let texts =
                arrow_cast::cast(column, &DataType::LargeUtf8).map_err(|e| failed("npy", e))?;
            refuse_nulls(&texts, &what)?;
            let texts = texts.as_string::<i64>();
            let width = texts
                .iter()
                .map(|t| t.map_or(0, |t| t.chars().count()))
                .max()
                .unwrap_or(0)
                .max(1);
            let mut data = Vec::with_capacity(rows * width * 4);
            for text in texts.iter().flatten() {
                let mut n = 0;
                for c in text.chars() {
                    data.extend_from_slice(&(c as u32).to_le_bytes());
                    n += 1;
                }
                data.resize(data.len() + (width - n) * 4, 0);
            }
            (format!("<U{width}"), data, row_shape)
        }
        DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_) => {
            let blobs =
                arrow_cast::cast(column, &DataType::LargeBinary).map_err(|e| failed("npy", e))?;
            refuse_nulls(&blobs, &what)?;
            let blobs = blobs.as_binary::<i64>();
            let width = blobs
                .iter()
                .map(|b| b.map_or(0, <[u8]>::len))
                .max()
                .unwrap_or(0)
                .max(1);
            let mut data = Vec::with_capacity(rows * width);
            for blob in blobs.iter().flatten() {
                data.extend_from_slice(blob);
                data.resize(data.len() + width - blob.len(), 0);
            }
            (format!("|S{width}"), data, row_shape)
        }
        _ => (descr, fixed_width_bytes(column, &what)?, row_shape),
    };
    let shape: Vec<usize> = if one_row {
        row_shape
    } else {
        std::iter::once(rows).chain(row_shape).collect()
    };
    let shape = match shape.as_slice() {
        [one] => format!("({one},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Ok(npy::file_bytes(&descr, false, &shape, &data))
}

/// A zip archive as `np.savez` (stored) or `np.savez_compressed` (deflated) writes it:
/// one `<column>.npy` member per column, each holding the shard's rows.
fn npz_bytes(schema: &SchemaRef, batches: &[RecordBatch], deflate: bool) -> Result<Vec<u8>> {
    let batch =
        arrow_select::concat::concat_batches(schema, batches).map_err(|e| failed("npz", e))?;
    let mut zip = ZipWriter::default();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let npy = npy_file(field, column, false)?;
        zip.add(&format!("{}.npy", field.name()), &npy, deflate)?;
    }
    zip.finish()
}

/// Writes a zip archive in memory: local headers and data, then the central directory.
/// Archives stay below 4 GiB (no zip64): a shard that large should be split.
#[derive(Default)]
struct ZipWriter {
    out: Vec<u8>,
    central: Vec<u8>,
    entries: u16,
}

const ZIP_LIMIT: usize = u32::MAX as usize - 1;

impl ZipWriter {
    fn add(&mut self, name: &str, data: &[u8], deflate: bool) -> Result<()> {
        let crc = crc32fast::hash(data);
        let (method, stored): (u16, std::borrow::Cow<[u8]>) = if deflate {
            let mut encoder = DeflateEncoder::new(Vec::new(), GzLevel::default());
            encoder.write_all(data).map_err(|e| failed("deflate", e))?;
            (
                8,
                encoder.finish().map_err(|e| failed("deflate", e))?.into(),
            )
        } else {
            (0, data.into())
        };
        let offset = self.out.len();
        if offset + stored.len() + name.len() + 30 > ZIP_LIMIT || data.len() > ZIP_LIMIT {
            return Err(Error::invalid_argument(
                "an .npz shard would pass 4 GiB; set max_bytes_per_shard lower",
            ));
        }
        self.entries = self
            .entries
            .checked_add(1)
            .ok_or_else(|| Error::invalid_argument("an .npz shard holds at most 65535 columns"))?;
        let fields = |out: &mut Vec<u8>| {
            out.extend_from_slice(&20u16.to_le_bytes()); // version needed: 2.0
            out.extend_from_slice(&0u16.to_le_bytes()); // flags
            out.extend_from_slice(&method.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes()); // time
            out.extend_from_slice(&0x21u16.to_le_bytes()); // date: 1980-01-01
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(&(stored.len() as u32).to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes()); // extra length
        };
        self.out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        fields(&mut self.out);
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(&stored);
        self.central
            .extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        self.central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        fields(&mut self.central);
        self.central.extend_from_slice(&0u16.to_le_bytes()); // comment length
        self.central.extend_from_slice(&0u16.to_le_bytes()); // disk
        self.central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        self.central
            .extend_from_slice(&(0o644u32 << 16).to_le_bytes()); // external attributes
        self.central
            .extend_from_slice(&(offset as u32).to_le_bytes());
        self.central.extend_from_slice(name.as_bytes());
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<u8>> {
        let directory_at = self.out.len();
        if directory_at + self.central.len() > ZIP_LIMIT {
            return Err(Error::invalid_argument(
                "an .npz shard would pass 4 GiB; set max_bytes_per_shard lower",
            ));
        }
        self.out.extend_from_slice(&self.central);
        self.out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        self.out.extend_from_slice(&0u16.to_le_bytes()); // this disk
        self.out.extend_from_slice(&0u16.to_le_bytes()); // directory's disk
        self.out.extend_from_slice(&self.entries.to_le_bytes());
        self.out.extend_from_slice(&self.entries.to_le_bytes());
        self.out
            .extend_from_slice(&(self.central.len() as u32).to_le_bytes());
        self.out
            .extend_from_slice(&(directory_at as u32).to_le_bytes());
        self.out.extend_from_slice(&0u16.to_le_bytes()); // comment length
        Ok(self.out)
    }
}
