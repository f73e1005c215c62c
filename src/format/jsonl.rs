//! JSON Lines (`.jsonl`, `.ndjson`, gzip-compressed or not): one JSON object per line.
//! A file is read front to back and cut into blocks at line ends; blocks are decoded in
//! parallel. The schema is given or inferred from the first records.

use std::io::{BufRead, BufReader};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_json::ReaderBuilder;
use arrow_schema::{ArrowError, Schema, SchemaRef};

use super::blocks::split_blocks;
use super::compression::{self, stream_error};
use super::index::{RecordCodec, ShardIndex, scan_lines};
use super::json_infer::SchemaInference;
use super::{
    Decoded, EmitTask, Format, OnError, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    task, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta};

const FORMAT: &str = "JSON";
/// Records read to infer a schema when none is given.
pub const INFER_RECORDS: usize = 1000;
/// Size of the blocks a file is cut into for parallel decoding.
const BLOCK_BYTES: usize = 4 * 1024 * 1024;
const DECODE_BATCH_ROWS: usize = 8192;

pub struct JsonLines;

struct PreparedJsonl {
    decoder: Arc<BlockDecoderConfig>,
}

/// Everything a block decode needs apart from the block; shared by a file's blocks.
struct BlockDecoderConfig {
    schema: SchemaRef,
    /// Unknown fields are an error (rather than silently dropped) unless the user chose
    /// the fields with `columns=` or `schema=`.
    strict: bool,
    /// Numbers and booleans may be read into text fields (inferred mixed-type fields).
    coerce: bool,
    inferred: bool,
    /// The inferred columns that hold integers, with every integer read as a float: a
    /// second reading of each block through it finds a later record whose number is not
    /// an integer, which the integer column alone would silently truncate (2.5 to 2).
    int_check: Option<SchemaRef>,
    on_error: OnError,
    /// Bound on each file's decompressed size.
    limit: u64,
}

/// Where a block starts, for naming a bad record: a line number when the file was read
/// from its start, a byte offset when the block was read by range.
#[derive(Clone, Copy)]
enum BlockStart {
    Line(u64),
    Byte(u64),
}

impl BlockStart {
    /// The position of the line `index` lines and `offset` bytes into the block.
    fn of_line(self, index: usize, offset: usize) -> Position {
        match self {
            BlockStart::Line(first) => Position::Line(first + index as u64),
            BlockStart::Byte(start) => Position::Byte(start + offset as u64),
        }
    }
}

impl Format for JsonLines {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("jsonl");
        let limit = compression::limit_option(&mut opts)?;
        opts.finish()?;
        if options.features.is_some() {
            return Err(Error::invalid_argument(
                "features= is for TFRecord; JSON Lines takes schema=",
            ));
        }
        let (full, coerce, inferred) = match &options.schema {
            Some(schema) => (schema.clone(), false, false),
            None => {
                let inference = infer_schema(&shards, options.on_error, io, limit)?;
                (
                    Arc::new(inference.schema()),
                    inference.needs_coercion(),
                    true,
                )
            }
        };
        let schema = match &options.columns {
            None => full,
            Some(columns) => project(&full, columns, &shards)?,
        };
        let units = whole_files(&shards);
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            PreparedJsonl {
                decoder: Arc::new(BlockDecoderConfig {
                    int_check: inferred.then(|| integers_as_floats(&schema)).flatten(),
                    schema,
                    strict: options.columns.is_none() && inferred,
                    coerce,
                    inferred,
                    on_error: options.on_error,
                    limit,
                }),
            },
        ))
    }
}

fn project(full: &Schema, columns: &[String], shards: &[ShardMeta]) -> Result<SchemaRef> {
    let url = shards.first().map_or("", |s| s.url.as_str());
    let indices = super::column_indices(&super::field_names(full), columns, url)?;
    Ok(Arc::new(Schema::new(
        indices
            .into_iter()
            .map(|i| full.field(i).clone())
            .collect::<Vec<_>>(),
    )))
}

/// Reads the first `INFER_RECORDS` records, across files in order.
fn infer_schema(
    shards: &[ShardMeta],
    on_error: OnError,
    io: &Io,
    limit: u64,
) -> Result<SchemaInference> {
    let mut inference = SchemaInference::default();
    for shard in shards {
        let url = shard.url.as_str();
        let reader = compression::auto_gzip(io.open(shard)?.open_stream()?, url, limit)?;
        for (idx, line) in BufReader::new(reader).split(b'\n').enumerate() {
            let line_no = idx as u64 + 1;
            let line = line.map_err(|e| stream_error(url, Position::Line(line_no), e))?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let added = serde_json::from_slice(&line)
                .map_err(|e| e.to_string())
                .and_then(|value| inference.add(&value));
            match added {
                Ok(()) => {}
                Err(_) if on_error == OnError::Skip => continue,
                Err(message) => {
                    return Err(Error::decode(url, FORMAT, Position::Line(line_no), message));
                }
            }
            if inference.records() >= INFER_RECORDS {
                return Ok(inference);
            }
        }
    }
    Ok(inference)
}

impl UnitJobs for PreparedJsonl {
    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        Some(self.decoder.clone())
    }

    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url: Arc<str> = shard.url.as_str().into();
        let config = self.decoder.clone();
        let limit = config.limit;
        UnitJob::Stream(Box::new(move |reader, emit: &mut EmitTask| {
            let mut reader = compression::auto_gzip(reader, &url, limit)?;
            split_blocks(
                &mut *reader,
                &url,
                FORMAT,
                BLOCK_BYTES,
                |data| memchr::memrchr(b'\n', data),
                &mut |block, first_line| {
                    let (config, url) = (config.clone(), url.clone());
                    emit(task(move || {
                        config.decode(&url, &block, BlockStart::Line(first_line))
                    }))
                },
            )
        }))
    }
}

impl RecordCodec for BlockDecoderConfig {
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn std::io::Read + Send>,
        key: String,
    ) -> Result<ShardIndex> {
        let url = shard.url.as_str();
        let (mut reader, gzip) = compression::sniff_gzip(stream, url, self.limit)?;
        let offsets = scan_lines(&mut reader, url, 0)?;
        Ok(ShardIndex::new(key, offsets, !gzip, Vec::new()))
    }

    fn decode_records(
        &self,
        shard: &ShardMeta,
        index: &ShardIndex,
        data: bytes::Bytes,
        first: u64,
    ) -> Result<Decoded> {
        let start = index.offsets.get(first as usize).copied().unwrap_or(0);
        self.decode(&shard.url, &data, BlockStart::Byte(start))
    }
}

/// The fields of `schema` that hold integers (at any depth), with each integer type
/// replaced by `Float64`; `None` when no field holds one.
fn integers_as_floats(schema: &Schema) -> Option<SchemaRef> {
    use arrow_schema::{DataType as T, Field};
    fn floats(t: &T) -> Option<T> {
        let field = |f: &Field| floats(f.data_type()).map(|t| f.clone().with_data_type(t));
        match t {
            T::Int8 | T::Int16 | T::Int32 | T::Int64 => Some(T::Float64),
            T::List(f) => field(f).map(|f| T::List(Arc::new(f))),
            T::LargeList(f) => field(f).map(|f| T::LargeList(Arc::new(f))),
            T::Struct(fields) if fields.iter().any(|f| floats(f.data_type()).is_some()) => {
                Some(T::Struct(
                    fields
                        .iter()
                        .map(|f| Arc::new(field(f).unwrap_or_else(|| f.as_ref().clone())))
                        .collect(),
                ))
            }
            _ => None,
        }
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .filter_map(|f| floats(f.data_type()).map(|t| f.as_ref().clone().with_data_type(t)))
        .collect();
    (!fields.is_empty()).then(|| Arc::new(Schema::new(fields)))
}

impl BlockDecoderConfig {
    fn builder(&self, batch_rows: usize) -> ReaderBuilder {
        ReaderBuilder::new(self.schema.clone())
            .with_batch_size(batch_rows)
            .with_strict_mode(self.strict)
            .with_coerce_primitive(self.coerce)
    }

    /// Checks that the integer columns of `batches` (decoded from `data`) hold every
    /// number of `data` exactly: read as floats, the same numbers must come out.
    fn check_integers(&self, data: &[u8], batches: &[RecordBatch]) -> Result<(), ArrowError> {
        let Some(check) = &self.int_check else {
            return Ok(());
        };
        let builder = ReaderBuilder::new(check.clone())
            .with_batch_size(DECODE_BATCH_ROWS)
            .with_coerce_primitive(self.coerce);
        let as_floats = decode_with(builder, data)?;
        let batches = arrow_select::concat::concat_batches(&self.schema, batches)?;
        let as_floats = arrow_select::concat::concat_batches(check, &as_floats)?;
        for field in check.fields() {
            let (Some(ints), Some(floats)) = (
                batches.column_by_name(field.name()),
                as_floats.column_by_name(field.name()),
            ) else {
                continue;
            };
            if arrow_cast::cast(ints, field.data_type())?.to_data() != floats.to_data() {
                return Err(ArrowError::JsonError(format!(
                    "column {:?} holds a number that is not an integer, but the column was \
                     inferred as {} (pass schema= with a float type for it)",
                    field.name(),
                    self.schema.field_with_name(field.name())?.data_type()
                )));
            }
        }
        Ok(())
    }

    fn decode(&self, url: &str, block: &[u8], start: BlockStart) -> Result<Decoded> {
        match self.decode_all(block) {
            Ok(batches) => Ok(Decoded {
                batches,
                skipped: Vec::new(),
            }),
            // Rare path: find the bad line(s) to name them, or to skip them.
            Err(_) => self.decode_line_by_line(url, block, start),
        }
    }

    fn decode_all(&self, data: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
        let batches = decode_with(self.builder(DECODE_BATCH_ROWS), data)?;
        self.check_integers(data, &batches)?;
        Ok(batches)
    }

    fn check_line(&self, line: &[u8]) -> Result<(), ArrowError> {
        let mut decoder = self.builder(1).build_decoder()?;
        let consumed = decoder.decode(line)?;
        if !line[consumed..].iter().all(u8::is_ascii_whitespace) {
            return Err(ArrowError::JsonError(
                "more than one JSON value on the line".into(),
            ));
        }
        if decoder.has_partial_record() {
            return Err(ArrowError::JsonError("the record is cut short".into()));
        }
        let batch = decoder.flush()?;
        self.check_integers(line, batch.as_slice())
    }

    fn decode_line_by_line(&self, url: &str, block: &[u8], start: BlockStart) -> Result<Decoded> {
        let mut good = Vec::with_capacity(block.len());
        let mut skipped = Vec::new();
        let mut offset = 0;
        // Records (non-blank lines) so far: a record's place in the task.
        let mut record = 0u64;
        for (idx, line) in block.split(|&b| b == b'\n').enumerate() {
            let line_offset = offset;
            offset += line.len() + 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            record += 1;
            match self.check_line(line) {
                Ok(()) => {
                    good.extend_from_slice(line);
                    good.push(b'\n');
                }
                Err(_) if self.on_error == OnError::Skip => skipped.push(record - 1),
                Err(e) => {
                    return Err(Error::decode(
                        url,
                        FORMAT,
                        start.of_line(idx, line_offset),
                        self.explain(e),
                    ));
                }
            }
        }
        let batches = self
            .decode_all(&good)
            .map_err(|e| Error::decode(url, FORMAT, start.of_line(0, 0), self.explain(e)))?;
        Ok(Decoded { batches, skipped })
    }

    fn explain(&self, e: ArrowError) -> String {
        let message = match e {
            ArrowError::JsonError(m) => m,
            other => other.to_string(),
        };
        if self.inferred {
            format!(
                "{message} (the schema was inferred from the first {INFER_RECORDS} records; pass schema= or columns= to read records that differ)"
            )
        } else {
            message
        }
    }
}

/// Decodes every record of `data` with a decoder `builder` makes.
fn decode_with(builder: ReaderBuilder, data: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    let mut decoder = builder.build_decoder()?;
    let mut batches = Vec::new();

    let mut pos = 0;
    while pos < data.len() {
        let consumed = decoder.decode(&data[pos..])?;
        pos += consumed;
        if pos < data.len() {
            // The decoder stops when a batch is full.
            match decoder.flush()? {
                Some(batch) => batches.push(batch),
                None if consumed == 0 => {
                    return Err(ArrowError::JsonError("decoder made no progress".into()));
                }
                None => {}
            }
        }
    }
    if decoder.has_partial_record() {
        return Err(ArrowError::JsonError("the record is cut short".into()));
    }
    if let Some(batch) = decoder.flush()? {
        batches.push(batch);
    }
    Ok(batches)
}

/// The records of `.json` files that hold a JSON array of objects each (as `datasets`'
/// json loader reads them), decoded in memory: the schema given, or inferred from every
/// record (so an integer field that later holds a float is a float column). `None` when
/// the files hold JSON Lines, which are read as such; files of both kinds are an error.
pub fn json_arrays(
    shards: &[ShardMeta],
    options: &ReadOptions,
    io: &Io,
) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
    use std::io::Read;
    let mut documents = Vec::with_capacity(shards.len());
    for shard in shards {
        let url = shard.url.as_str();
        let mut reader = compression::auto_gzip(
            io.open(shard)?.open_stream()?,
            url,
            compression::DEFAULT_MAX_DECOMPRESSED,
        )?;
        let mut text = Vec::new();
        reader
            .read_to_end(&mut text)
            .map_err(|e| stream_error(url, Position::Byte(text.len() as u64), e))?;
        let array = text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        documents.push((url, array, text));
    }
    match documents.iter().filter(|(_, array, _)| *array).count() {
        0 => return Ok(None),
        n if n < documents.len() => {
            let lines = documents
                .iter()
                .find(|(_, array, _)| !array)
                .map_or("a file", |(url, _, _)| url);
            return Err(Error::invalid_argument(format!(
                "{lines} holds JSON Lines, but other files a JSON array: read them apart"
            )));
        }
        _ => {}
    }
    let mut records = Vec::new();
    for &(url, _, ref text) in &documents {
        let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
            Error::decode(url, FORMAT, Position::Line(e.line() as u64), e.to_string())
        })?;
        let serde_json::Value::Array(items) = value else {
            return Err(Error::decode(
                url,
                FORMAT,
                Position::Unknown,
                "not a JSON array",
            ));
        };
        for (i, item) in items.into_iter().enumerate() {
            if !item.is_object() {
                return Err(Error::decode(
                    url,
                    FORMAT,
                    Position::Unknown,
                    format!("array element {i} is not an object (a record)"),
                ));
            }
            records.push(item);
        }
    }
    let (schema, coerce) = match &options.schema {
        Some(schema) => (schema.clone(), false),
        None => {
            let mut inference = SchemaInference::default();
            for record in &records {
                inference.add(record).map_err(|message| {
                    Error::decode(documents[0].0, FORMAT, Position::Unknown, message)
                })?;
            }
            (Arc::new(inference.schema()), inference.needs_coercion())
        }
    };
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(DECODE_BATCH_ROWS)
        .with_coerce_primitive(coerce)
        .build_decoder()
        .map_err(|e| Error::decode(documents[0].0, FORMAT, Position::Unknown, e.to_string()))?;
    let mut batches = Vec::new();
    for chunk in records.chunks(DECODE_BATCH_ROWS) {
        decoder
            .serialize(chunk)
            .and_then(|()| decoder.flush())
            .map_err(|e| Error::decode(documents[0].0, FORMAT, Position::Unknown, e.to_string()))?
            .into_iter()
            .for_each(|b| batches.push(b));
    }
    Ok(Some((schema, batches)))
}
