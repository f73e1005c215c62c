//! JSON Lines (`.jsonl`, `.ndjson`, gzip-compressed or not): one JSON object per line.
//! A file is read front to back and cut into blocks at line ends; blocks are decoded in
//! parallel. The schema is given or inferred from the first records.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_json::ReaderBuilder;
use arrow_schema::{ArrowError, Schema, SchemaRef};
use bytes::Bytes;

use super::compression::{self, stream_error};
use super::json_infer::SchemaInference;
use super::{
    Decoded, EmitTask, Format, OnError, PreparedShards, ReadOptions, UnitJob, WorkUnit, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::{self, IoCounters, ShardMeta};

const FORMAT: &str = "JSON";
/// Records read to infer a schema when none is given.
pub const INFER_RECORDS: usize = 1000;
/// Size of the blocks a file is cut into for parallel decoding.
const BLOCK_BYTES: usize = 4 * 1024 * 1024;
/// A "line" longer than this is treated as corrupt input rather than buffered forever.
const MAX_LINE_BYTES: usize = 512 * 1024 * 1024;
const DECODE_BATCH_ROWS: usize = 8192;

pub struct JsonLines;

struct PreparedJsonl {
    shards: Vec<ShardMeta>,
    units: Vec<WorkUnit>,
    /// Bound on each file's decompressed size.
    limit: u64,
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
    on_error: OnError,
}

impl Format for JsonLines {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        counters: &Arc<IoCounters>,
    ) -> Result<Arc<dyn PreparedShards>> {
        let mut opts = options.format_options.reader("jsonl");
        let limit = opts.u64(
            "max_decompressed_bytes",
            compression::DEFAULT_MAX_DECOMPRESSED,
        )?;
        opts.finish()?;
        if options.features.is_some() {
            return Err(Error::invalid_argument(
                "features= is for TFRecord; JSON Lines takes schema=",
            ));
        }
        let (full, coerce, inferred) = match &options.schema {
            Some(schema) => (schema.clone(), false, false),
            None => {
                let inference = infer_schema(&shards, options.on_error, counters, limit)?;
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
        Ok(Arc::new(PreparedJsonl {
            units: whole_files(&shards),
            shards,
            limit,
            decoder: Arc::new(BlockDecoderConfig {
                schema,
                strict: options.columns.is_none() && inferred,
                coerce,
                inferred,
                on_error: options.on_error,
            }),
        }))
    }
}

fn project(full: &Schema, columns: &[String], shards: &[ShardMeta]) -> Result<SchemaRef> {
    if columns.is_empty() {
        return Err(Error::invalid_argument(
            "columns= must name at least one column",
        ));
    }
    let mut fields = Vec::with_capacity(columns.len());
    for name in columns {
        let field = full.field_with_name(name).map_err(|_| {
            let names: Vec<_> = full.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Schema {
                url: shards.first().map(|s| s.url.clone()).unwrap_or_default(),
                message: format!("no column {name:?}; the records have {names:?}"),
            }
        })?;
        fields.push(field.clone());
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Reads the first `INFER_RECORDS` records, across files in order.
fn infer_schema(
    shards: &[ShardMeta],
    on_error: OnError,
    counters: &Arc<IoCounters>,
    limit: u64,
) -> Result<SchemaInference> {
    let mut inference = SchemaInference::default();
    for shard in shards {
        let url = shard.url.as_str();
        let reader = compression::auto_gzip(
            source::open(url, counters.clone())?.open_stream()?,
            url,
            limit,
        )?;
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

impl PreparedShards for PreparedJsonl {
    fn format(&self) -> &'static str {
        FORMAT
    }

    fn schema(&self) -> SchemaRef {
        self.decoder.schema.clone()
    }

    fn shards(&self) -> &[ShardMeta] {
        &self.shards
    }

    fn units(&self) -> &[WorkUnit] {
        &self.units
    }

    fn job(&self, unit: &WorkUnit) -> UnitJob {
        let url: Arc<str> = self.shards[unit.shard].url.as_str().into();
        let config = self.decoder.clone();
        let limit = self.limit;
        UnitJob::Stream(Box::new(move |reader, emit: &mut EmitTask| {
            let mut reader = compression::auto_gzip(reader, &url, limit)?;
            split_lines(&mut reader, &url, BLOCK_BYTES, &mut |block, first_line| {
                let (config, url) = (config.clone(), url.clone());
                emit(Box::new(move || config.decode(&url, &block, first_line)))
            })
        }))
    }
}

/// Cuts a stream into blocks of about `block_bytes` that end at a line end, calling
/// `f(block, number of its first line)`; stops early when `f` returns false.
fn split_lines(
    reader: &mut dyn Read,
    url: &str,
    block_bytes: usize,
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
        } else if let Some(pos) = memchr::memrchr(b'\n', &buf) {
            pos + 1
        } else if want >= MAX_LINE_BYTES {
            return Err(Error::decode(
                url,
                FORMAT,
                Position::Line(line),
                format!("line longer than {MAX_LINE_BYTES} bytes"),
            ));
        } else {
            want = (want * 2).min(MAX_LINE_BYTES);
            continue;
        };
        let rest = buf.split_off(cut);
        let block = Bytes::from(std::mem::replace(&mut buf, rest));
        let lines_in_block = memchr::memchr_iter(b'\n', &block).count() as u64;
        if !f(block, line) {
            return Ok(());
        }
        line += lines_in_block;
        want = block_bytes.max(buf.len() + 1);
        if eof && buf.is_empty() {
            return Ok(());
        }
    }
}

impl BlockDecoderConfig {
    fn builder(&self, batch_rows: usize) -> ReaderBuilder {
        ReaderBuilder::new(self.schema.clone())
            .with_batch_size(batch_rows)
            .with_strict_mode(self.strict)
            .with_coerce_primitive(self.coerce)
    }

    fn decode(&self, url: &str, block: &[u8], first_line: u64) -> Result<Decoded> {
        match self.decode_all(block) {
            Ok(batches) => Ok(Decoded {
                batches,
                skipped: 0,
            }),
            // Rare path: find the bad line(s) to name them, or to skip them.
            Err(_) => self.decode_line_by_line(url, block, first_line),
        }
    }

    fn decode_all(&self, data: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
        let mut decoder = self.builder(DECODE_BATCH_ROWS).build_decoder()?;
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
        decoder.flush().map(|_| ())
    }

    fn decode_line_by_line(&self, url: &str, block: &[u8], first_line: u64) -> Result<Decoded> {
        let mut good = Vec::with_capacity(block.len());
        let mut skipped = 0;
        for (idx, line) in block.split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.check_line(line) {
                Ok(()) => {
                    good.extend_from_slice(line);
                    good.push(b'\n');
                }
                Err(_) if self.on_error == OnError::Skip => skipped += 1,
                Err(e) => {
                    return Err(Error::decode(
                        url,
                        FORMAT,
                        Position::Line(first_line + idx as u64),
                        self.explain(e),
                    ));
                }
            }
        }
        let batches = self
            .decode_all(&good)
            .map_err(|e| Error::decode(url, FORMAT, Position::Line(first_line), self.explain(e)))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(data: &[u8], block_bytes: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        split_lines(&mut &data[..], "t", block_bytes, &mut |b, line| {
            out.push((String::from_utf8(b.to_vec()).unwrap(), line));
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn blocks_end_at_line_ends_and_count_lines() {
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
        // A line longer than a block grows the block instead of splitting the line.
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
