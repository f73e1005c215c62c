//! TFRecord (`.tfrecord`, `.tfrecords`, GZIP or ZLIB compressed as
//! `tf.io.TFRecordOptions` writes them). Each record is framed as
//! `u64 length | masked crc32c(length) | data | masked crc32c(data)`. Records are
//! `tf.train.Example`s decoded into columns, or passed through raw.
//!
//! Options (`format_options`): `verify_crc` (default True), `compression`
//! ("auto", "none", "gzip", "zlib"), `raw` (yield each record's bytes as `record`),
//! `max_decompressed_bytes`.

use std::io::Read;
use std::sync::Arc;

use arrow_array::{ArrayRef, LargeBinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::blocks::read_full;
use super::compression::{self, Compression, looks_like_zlib};
use super::example::{ExampleDecoder, FeatureSpec, SpecInference};
use super::index::{RecordCodec, ShardIndex};
use super::{
    Decoded, EmitTask, Format, OnError, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    task, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta};

const FORMAT: &str = "TFRecord";
const BLOCK_BYTES: usize = 4 * 1024 * 1024;
/// Records read to infer columns when no `features=` is given.
pub const INFER_RECORDS: usize = 1000;
const HEADER: usize = 12;

/// TFRecord's checksum: CRC32C, rotated and offset so that checksums of data holding
/// checksums stay well distributed.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

pub struct TfRecord;

#[derive(Clone)]
struct Config {
    compression: Option<Compression>,
    verify: bool,
    limit: u64,
    on_error: OnError,
    /// `None`: raw records.
    specs: Option<Vec<FeatureSpec>>,
    strict: bool,
    schema: SchemaRef,
}

struct PreparedTfRecord {
    config: Arc<Config>,
}

/// 64-bit offsets: one record, or a block of them, may pass 2 GiB.
fn raw_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "record",
        DataType::LargeBinary,
        false,
    )]))
}

impl Format for TfRecord {
    fn name(&self) -> &'static str {
        "tfrecord"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("tfrecord");
        let verify = opts.bool("verify_crc", true)?;
        let raw = opts.bool("raw", false)?;
        let compression =
            match opts.choice("compression", "auto", &["auto", "none", "gzip", "zlib"])? {
                "none" => Some(Compression::None),
                "gzip" => Some(Compression::Gzip),
                "zlib" => Some(Compression::Zlib),
                _ => None,
            };
        let limit = compression::limit_option(&mut opts)?;
        opts.finish()?;
        if options.schema.is_some() {
            return Err(Error::invalid_argument(
                "TFRecord takes features= (a tf.io.parse_example-style spec), not schema=",
            ));
        }
        let mut config = Config {
            compression,
            verify,
            limit,
            on_error: options.on_error,
            specs: None,
            strict: false,
            schema: raw_schema(),
        };
        if raw {
            if options.features.is_some() {
                return Err(Error::invalid_argument(
                    "features= has no use with format_options={\"raw\": True}",
                ));
            }
            if let Some(columns) = &options.columns
                && columns != &["record"]
            {
                return Err(Error::invalid_argument(
                    "raw TFRecord reading has one column, \"record\"",
                ));
            }
        } else {
            let (specs, inferred) = match &options.features {
                Some(specs) => (specs.clone(), false),
                None => (infer(&shards, &config, io)?, true),
            };
            let specs = match &options.columns {
                None => specs,
                Some(columns) => project(specs, columns, &shards)?,
            };
            config.strict = inferred && options.columns.is_none();
            config.schema = super::example::schema(&specs);
            config.specs = Some(specs);
        }
        let units = whole_files(&shards);
        Ok(PreparedShards::new(
            FORMAT,
            config.schema.clone(),
            shards,
            units,
            PreparedTfRecord {
                config: Arc::new(config),
            },
        ))
    }
}

fn project(
    specs: Vec<FeatureSpec>,
    columns: &[String],
    shards: &[ShardMeta],
) -> Result<Vec<FeatureSpec>> {
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let url = shards.first().map_or("", |s| s.url.as_str());
    let indices = super::column_indices(&names, columns, url)?;
    Ok(indices.into_iter().map(|i| specs[i].clone()).collect())
}

fn infer(shards: &[ShardMeta], config: &Config, io: &Io) -> Result<Vec<FeatureSpec>> {
    let mut inference = SpecInference::default();
    let mut records = 0;
    'shards: for shard in shards {
        let url: Arc<str> = shard.url.as_str().into();
        let stream = io.open(shard)?.open_stream()?;
        let mut reader = RecordReader::open(stream, url.clone(), config)?;
        let mut data = Vec::new();
        while let Some(meta) = reader.next_into(&mut data)? {
            let record = &data[meta.start..];
            let checked = if config.verify && masked_crc(record) != meta.crc {
                Err("data checksum mismatch".to_string())
            } else {
                inference.add(record)
            };
            match checked {
                Ok(()) => records += 1,
                Err(_) if config.on_error == OnError::Skip => {}
                Err(message) => return Err(meta.error(&url, &message)),
            }
            data.clear();
            if records >= INFER_RECORDS {
                break 'shards;
            }
        }
    }
    Ok(inference.specs())
}

/// Where a record sits, in its block and in the (decompressed) file.
struct RecordMeta {
    start: usize,
    end: usize,
    crc: u32,
    offset: u64,
    index: u64,
}

impl RecordMeta {
    fn error(&self, url: &str, message: &str) -> Error {
        Error::decode(
            url,
            FORMAT,
            Position::Byte(self.offset),
            format!("record {}: {message}", self.index),
        )
    }
}

struct RecordReader {
    inner: Box<dyn Read + Send>,
    url: Arc<str>,
    verify: bool,
    offset: u64,
    index: u64,
}

impl RecordReader {
    fn open(stream: Box<dyn Read + Send>, url: Arc<str>, config: &Config) -> Result<Self> {
        let mut buffered = compression::buffered(stream);
        let compression = match config.compression {
            Some(c) => c,
            None => detect(
                compression::peek(&mut buffered, &url, HEADER)?,
                &url,
                config.verify,
            )?,
        };
        Ok(Self {
            inner: compression::decoder(buffered, compression, config.limit),
            url,
            verify: config.verify,
            offset: 0,
            index: 0,
        })
    }

    fn truncated(&self, what: &str) -> Error {
        Error::decode(
            &*self.url,
            FORMAT,
            Position::Byte(self.offset),
            format!("record {}: the file ends inside the {what}", self.index),
        )
    }

    /// Appends the next record's data to `data`; `None` at a clean end of file.
    fn next_into(&mut self, data: &mut Vec<u8>) -> Result<Option<RecordMeta>> {
        let mut header = [0u8; HEADER];
        let got = read_full(&mut self.inner, &mut header).map_err(|e| self.io_error(e))?;
        if got == 0 {
            return Ok(None);
        }
        if got < HEADER {
            return Err(self.truncated("record header"));
        }
        let len = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        if self.verify
            && masked_crc(&header[..8])
                != u32::from_le_bytes(header[8..].try_into().unwrap_or_default())
        {
            return Err(Error::decode(
                &*self.url,
                FORMAT,
                Position::Byte(self.offset),
                format!("record {}: length checksum mismatch", self.index),
            ));
        }
        let start = data.len();
        // `take` + `read_to_end` grows the buffer only as bytes arrive, so a corrupt
        // length cannot make us allocate it up front.
        let read = (&mut self.inner)
            .take(len)
            .read_to_end(data)
            .map_err(|e| self.io_error(e))?;
        if (read as u64) < len {
            return Err(self.truncated("record data"));
        }
        let mut crc = [0u8; 4];
        if read_full(&mut self.inner, &mut crc).map_err(|e| self.io_error(e))? < 4 {
            return Err(self.truncated("record checksum"));
        }
        let meta = RecordMeta {
            start,
            end: data.len(),
            crc: u32::from_le_bytes(crc),
            offset: self.offset,
            index: self.index,
        };
        self.offset += HEADER as u64 + len + 4;
        self.index += 1;
        Ok(Some(meta))
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        compression::stream_error(&self.url, Position::Byte(self.offset), e)
    }
}

/// Plain TFRecord starts with a header whose checksum holds; otherwise look for gzip or
/// zlib, as written by `tf.io.TFRecordOptions(compression_type=...)`.
fn detect(head: &[u8], url: &str, verify: bool) -> Result<Compression> {
    if head.is_empty() {
        return Ok(Compression::None);
    }
    if head.len() == HEADER
        && masked_crc(&head[..8]) == u32::from_le_bytes(head[8..].try_into().unwrap_or_default())
    {
        return Ok(Compression::None);
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        return Ok(Compression::Gzip);
    }
    if looks_like_zlib(head) {
        return Ok(Compression::Zlib);
    }
    if !verify {
        return Ok(Compression::None);
    }
    Err(Error::decode(
        url,
        FORMAT,
        Position::Byte(0),
        "not TFRecord data: the first header's checksum does not match, and it is not gzip or zlib compressed",
    ))
}

/// Records read from a file, waiting to be decoded together.
struct Block {
    data: Vec<u8>,
    records: Vec<RecordMeta>,
}

impl RecordCodec for Config {
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn Read + Send>,
        key: String,
    ) -> Result<ShardIndex> {
        let url: Arc<str> = shard.url.as_str().into();
        let mut buffered = compression::buffered(stream);
        let compression = match self.compression {
            Some(c) => c,
            None => detect(
                compression::peek(&mut buffered, &url, HEADER)?,
                &url,
                self.verify,
            )?,
        };
        let mut reader = RecordReader {
            inner: compression::decoder(buffered, compression, self.limit),
            url,
            verify: self.verify,
            offset: 0,
            index: 0,
        };
        // Only the framing is read here: record data goes through a reused buffer.
        let mut offsets = Vec::new();
        let mut data = Vec::new();
        loop {
            let at = reader.offset;
            data.clear();
            if reader.next_into(&mut data)?.is_none() {
                offsets.push(at);
                break;
            }
            offsets.push(at);
        }
        Ok(ShardIndex::new(
            key,
            offsets,
            compression == Compression::None,
            Vec::new(),
        ))
    }

    fn decode_records(
        &self,
        shard: &ShardMeta,
        index: &ShardIndex,
        data: bytes::Bytes,
        first: u64,
    ) -> Result<Decoded> {
        let url: Arc<str> = shard.url.as_str().into();
        let mut reader = RecordReader {
            inner: Box::new(std::io::Cursor::new(data)),
            url: url.clone(),
            verify: self.verify,
            offset: index.offsets.get(first as usize).copied().unwrap_or(0),
            index: first,
        };
        let mut block = Block {
            data: Vec::new(),
            records: Vec::new(),
        };
        while let Some(meta) = reader.next_into(&mut block.data)? {
            block.records.push(meta);
        }
        decode_block(self, &url, block)
    }
}

impl UnitJobs for PreparedTfRecord {
    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        Some(self.config.clone())
    }

    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url: Arc<str> = shard.url.as_str().into();
        let config = self.config.clone();
        UnitJob::Stream(Box::new(move |stream, emit: &mut EmitTask| {
            let mut reader = RecordReader::open(stream, url.clone(), &config)?;
            loop {
                let mut block = Block {
                    data: Vec::with_capacity(BLOCK_BYTES),
                    records: Vec::new(),
                };
                while block.data.len() < BLOCK_BYTES {
                    match reader.next_into(&mut block.data)? {
                        Some(meta) => block.records.push(meta),
                        None => break,
                    }
                }
                if block.records.is_empty() {
                    return Ok(());
                }
                let last = block.data.len() < BLOCK_BYTES;
                let (config, url) = (config.clone(), url.clone());
                if !emit(task(move || decode_block(&config, &url, block))) || last {
                    return Ok(());
                }
            }
        }))
    }
}

fn decode_block(config: &Config, url: &str, block: Block) -> Result<Decoded> {
    let mut skipped = Vec::new();
    // A bad record is skipped and counted (by its place in the block), or fails it.
    let mut reject = |i: usize, meta: &RecordMeta, message: &str| match config.on_error {
        OnError::Skip => {
            skipped.push(i as u64);
            Ok(())
        }
        OnError::Raise => Err(meta.error(url, message)),
    };
    let mut good = Vec::with_capacity(block.records.len());
    for (i, meta) in block.records.iter().enumerate() {
        if config.verify && masked_crc(&block.data[meta.start..meta.end]) != meta.crc {
            reject(i, meta, "data checksum mismatch")?;
        } else {
            good.push(i);
        }
    }
    let batch = match &config.specs {
        None => raw_batch(&config.schema, block, &good)?,
        Some(specs) => {
            let mut decoder = ExampleDecoder::new(specs, config.strict);
            for &i in &good {
                let meta = &block.records[i];
                if let Err(message) = decoder.add(&block.data[meta.start..meta.end]) {
                    reject(i, meta, &message)?;
                }
            }
            decoder
                .finish()
                .map_err(|e| Error::Internal(format!("{url}: {e}")))?
        }
    };
    // (Checksum failures first, then records the decoder refused.)
    skipped.sort_unstable();
    Ok(Decoded {
        batches: vec![batch],
        skipped,
    })
}

/// The records' bytes as a binary column; without skips, the block buffer itself.
fn raw_batch(schema: &SchemaRef, block: Block, good: &[usize]) -> Result<RecordBatch> {
    let mut offsets = vec![0i64];
    let values = if good.len() == block.records.len() {
        offsets.extend(block.records.iter().map(|m| m.end as i64));
        Buffer::from_vec(block.data)
    } else {
        let mut data = Vec::new();
        for &i in good {
            let meta = &block.records[i];
            data.extend_from_slice(&block.data[meta.start..meta.end]);
            offsets.push(data.len() as i64);
        }
        Buffer::from_vec(data)
    };
    let column: ArrayRef = Arc::new(LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        values,
        None,
    ));
    RecordBatch::try_new(schema.clone(), vec![column]).map_err(|e| Error::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // From TensorFlow's crc32c tests: masking is its own inverse once unrotated.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let masked = masked_crc(b"123456789");
        let unmasked = masked.wrapping_sub(0xa282_ead8).rotate_left(15);
        assert_eq!(unmasked, 0xe306_9283);
    }
}
