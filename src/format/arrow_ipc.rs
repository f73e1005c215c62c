//! Arrow IPC, told apart by their first bytes: the file format (`.arrow`, `.feather`),
//! whose footer lists every record batch so each batch is a unit fetched by range and
//! decoded without copying, and the stream format (`.arrows`, `.ipc`), read front to
//! back. LZ4/ZSTD body compression is supported, bounded by `max_decompressed_bytes`.

use std::io::Read;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::{FileDecoder, read_footer_length};
use arrow_ipc::{Block, CompressionType, MessageHeader, MetadataVersion};
use arrow_schema::{Schema, SchemaRef};

use super::blocks::read_full;
use super::compression::{limit_option, stream_error};
use super::{
    BatchSink, Decoded, EmitTask, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    column_indices, field_names, per_shard, task, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta, Source};

const FORMAT: &str = "Arrow IPC";
/// The first (and last) bytes of the file format; streams start with a message.
const ARROW_MAGIC: &[u8; 6] = b"ARROW1";
/// Starts each message since Arrow 0.15, before its metadata length.
const CONTINUATION_MARKER: [u8; 4] = [0xff; 4];
/// How far each codec can expand its input: LZ4 at most 255-fold (a length byte adds
/// 255 bytes of match), zstd at most 32768-fold (a 4-byte RLE block makes 128 KiB).
const LZ4_MAX_RATIO: u64 = 256;
const ZSTD_MAX_RATIO: u64 = 32 * 1024;

/// Returns `max_decompressed_bytes`.
fn check_options(options: &ReadOptions) -> Result<u64> {
    let mut opts = options.format_options.reader("arrow");
    let limit = limit_option(&mut opts)?;
    opts.finish()?;
    if options.schema.is_some() || options.features.is_some() {
        return Err(Error::invalid_argument(
            "Arrow IPC data carries its own schema: schema= and features= have no use; columns= selects columns",
        ));
    }
    Ok(limit)
}

/// The flatbuffer of an encapsulated message's metadata: after the continuation marker
/// and length, or (before Arrow 0.15) after the length alone.
fn message_flatbuffer(meta: &[u8]) -> std::result::Result<&[u8], String> {
    let start = if meta.get(..4) == Some(&CONTINUATION_MARKER[..]) {
        8
    } else {
        4
    };
    meta.get(start..)
        .filter(|fb| !fb.is_empty())
        .ok_or_else(|| "a message's metadata is truncated".to_string())
}

/// Checks a message before arrow-ipc decodes it, which trusts the message's numbers:
/// every buffer must lie within the body (arrow-ipc panics on one that does not), and
/// each compressed buffer starts with the length it claims once decompressed, which the
/// codec reserves up front: a lie of 2^46 would abort the process. The claim must be
/// one the codec could reach from the buffer's bytes, and the message's total must stay
/// within `limit`.
pub(super) fn check_message(
    flatbuffer: &[u8],
    body: &[u8],
    limit: u64,
) -> std::result::Result<(), String> {
    let message =
        arrow_ipc::root_as_message(flatbuffer).map_err(|e| format!("bad message: {e}"))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message
            .header_as_dictionary_batch()
            .and_then(|dict| dict.data()),
        _ => None,
    };
    let Some(batch) = batch else {
        return Ok(());
    };
    let ratio = batch.compression().map(|c| {
        if c.codec() == CompressionType::LZ4_FRAME {
            LZ4_MAX_RATIO
        } else {
            ZSTD_MAX_RATIO
        }
    });
    let mut total = 0u64;
    for buffer in batch.buffers().into_iter().flatten() {
        let (Ok(offset), Ok(len)) = (
            usize::try_from(buffer.offset()),
            usize::try_from(buffer.length()),
        ) else {
            return Err("a buffer has a negative offset or length".into());
        };
        // Empty buffers too: arrow-ipc slices the body at their offset.
        let data = offset
            .checked_add(len)
            .and_then(|end| body.get(offset..end))
            .ok_or_else(|| format!("a buffer at body offset {offset} runs past the body"))?;
        let (Some(ratio), false) = (ratio, data.is_empty()) else {
            continue;
        };
        let Some((prefix, compressed)) = data.split_first_chunk::<8>() else {
            return Err(format!(
                "the compressed buffer at body offset {offset} is shorter than its length prefix"
            ));
        };
        // -1 marks a buffer stored uncompressed.
        let Ok(claimed) = u64::try_from(i64::from_le_bytes(*prefix)) else {
            continue;
        };
        let reachable = (compressed.len() as u64).saturating_mul(ratio);
        if claimed > reachable {
            return Err(format!(
                "the compressed buffer at body offset {offset} claims {claimed} bytes once decompressed; its {} bytes can hold at most {reachable}",
                compressed.len()
            ));
        }
        total = total.saturating_add(claimed);
        if total > limit {
            return Err(format!(
                "the message claims more than {limit} bytes once decompressed (raise format_options={{\"max_decompressed_bytes\": ...}} if this file is genuine)"
            ));
        }
    }
    Ok(())
}

/// Indices of `columns` in `schema` (all columns when `None`).
fn projection(
    schema: &Schema,
    columns: Option<&[String]>,
    url: &str,
) -> Result<Option<Vec<usize>>> {
    columns
        .map(|columns| column_indices(&field_names(schema), columns, url))
        .transpose()
}

fn check_same_schema(first: (&str, &SchemaRef), other: (&str, &SchemaRef)) -> Result<()> {
    if first.1.fields() == other.1.fields() {
        return Ok(());
    }
    Err(Error::Schema {
        url: other.0.to_string(),
        message: format!("columns differ from those of {}", first.0),
    })
}

pub struct ArrowIpc;

impl Format for ArrowIpc {
    fn name(&self) -> &'static str {
        "arrow"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let limit = check_options(options)?;
        let kinds = per_shard(&shards, io, FORMAT, |source, size| {
            Box::pin(async move {
                Ok(size >= 6 && source.read_range(0..6).await?[..] == ARROW_MAGIC[..])
            })
        })?;
        let mut is_file = None;
        for (shard, kind) in shards.iter().zip(kinds) {
            let kind = kind?;
            if *is_file.get_or_insert(kind) != kind {
                return Err(Error::invalid_argument(format!(
                    "{} is an Arrow IPC {} while the first file is not; read the two kinds separately",
                    shard.url,
                    if kind { "file" } else { "stream" }
                )));
            }
        }
        if is_file.unwrap_or(true) {
            prepare_files(shards, options, io, limit)
        } else {
            prepare_streams(shards, options, io, limit)
        }
    }
}

// ---- file format ---------------------------------------------------------------

struct IpcFile {
    url: String,
    schema: SchemaRef,
    version: MetadataVersion,
    dictionaries: Vec<Block>,
    batches: Vec<Block>,
    /// Rows of each record batch, from its message header.
    batch_rows: Vec<u64>,
    projection: Option<Vec<usize>>,
}

struct PreparedFile {
    files: Vec<Arc<IpcFile>>,
    schema: SchemaRef,
    limit: u64,
}

pub(super) fn block_range(
    block: &Block,
    size: u64,
) -> std::result::Result<std::ops::Range<u64>, String> {
    let start = u64::try_from(block.offset()).map_err(|_| "negative block offset")?;
    let len = u64::try_from(block.metaDataLength()).map_err(|_| "negative metadata length")?
        + u64::try_from(block.bodyLength()).map_err(|_| "negative body length")?;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(format!(
            "a block spans past the end of the {size}-byte file"
        )),
    }
}

/// Rows of the record batch at `block` (checked by `block_range`), read from its
/// message header (a few hundred bytes), so lengths are known without fetching bodies.
async fn batch_rows(source: &dyn Source, block: &Block, size: u64) -> Result<u64> {
    let url = source.url();
    let corrupt = |at: u64, m: String| Error::decode(url, FORMAT, Position::Byte(at), m);
    let range = block_range(block, size).map_err(|m| corrupt(0, m))?;
    let meta_len = block.metaDataLength().max(0) as u64;
    let meta = source
        .read_range(range.start..range.start + meta_len)
        .await?;
    let corrupt = |m: String| corrupt(range.start, m);
    let flatbuffer = message_flatbuffer(&meta).map_err(corrupt)?;
    let message =
        arrow_ipc::root_as_message(flatbuffer).map_err(|e| corrupt(format!("bad message: {e}")))?;
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| corrupt("a record batch block holds another kind of message".into()))?;
    u64::try_from(batch.length())
        .map_err(|_| corrupt("a record batch has a negative length".into()))
}

/// Where the footer of an Arrow IPC file of `size` bytes lies, from its last 10 bytes.
pub(super) fn footer_range(
    trailer: &[u8],
    size: u64,
) -> std::result::Result<std::ops::Range<u64>, String> {
    let last: [u8; 10] = trailer
        .try_into()
        .map_err(|_| "the file's trailer is not 10 bytes".to_string())?;
    let footer_len = read_footer_length(last).map_err(|e| e.to_string())? as u64;
    let start = (size - 10)
        .checked_sub(footer_len)
        .ok_or_else(|| "footer longer than the file".to_string())?;
    Ok(start..size - 10)
}

/// What an IPC file's footer says: the schema, and the blocks of its messages, each
/// checked to lie within the file's `size` bytes.
pub(super) struct Footer {
    pub(super) schema: Schema,
    pub(super) version: MetadataVersion,
    pub(super) dictionaries: Vec<Block>,
    pub(super) batches: Vec<Block>,
}

pub(super) fn parse_footer(bytes: &[u8], size: u64) -> std::result::Result<Footer, String> {
    let footer = arrow_ipc::root_as_footer(bytes).map_err(|e| format!("bad footer: {e}"))?;
    let fb_schema = footer.schema().ok_or("the footer has no schema")?;
    let schema = arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| e.to_string())?;
    let blocks =
        |list: Option<flatbuffers::Vector<'_, Block>>| -> std::result::Result<Vec<Block>, String> {
            let blocks: Vec<Block> = list
                .map(|l| l.iter().copied().collect())
                .unwrap_or_default();
            for block in &blocks {
                block_range(block, size)?;
            }
            Ok(blocks)
        };
    Ok(Footer {
        schema,
        version: footer.version(),
        dictionaries: blocks(footer.dictionaries())?,
        batches: blocks(footer.recordBatches())?,
    })
}

/// Checks the message of `block`, whose bytes are `data`, before it is decoded (see
/// [`check_message`]).
pub(super) fn check_block(
    block: &Block,
    data: &[u8],
    limit: u64,
) -> std::result::Result<(), String> {
    let (meta, body) = usize::try_from(block.metaDataLength())
        .ok()
        .and_then(|n| data.split_at_checked(n))
        .ok_or("the metadata length exceeds the block")?;
    check_message(message_flatbuffer(meta)?, body, limit)
}

async fn read_footer(source: Arc<dyn Source>, size: u64) -> Result<IpcFile> {
    let url = source.url();
    let corrupt = |m: String| Error::decode(url, FORMAT, Position::Unknown, m);
    if size < 18 {
        return Err(corrupt(format!(
            "file is {size} bytes, too small to be Arrow IPC"
        )));
    }
    let trailer = source.read_range(size - 10..size).await?;
    let footer = footer_range(&trailer, size).map_err(corrupt)?;
    let footer = parse_footer(&source.read_range(footer).await?, size).map_err(corrupt)?;
    let (schema, version) = (Arc::new(footer.schema), footer.version);
    let (dictionaries, batches) = (footer.dictionaries, footer.batches);
    // The headers are small reads, one per batch: issue them all at once.
    let mut headers = tokio::task::JoinSet::new();
    for (i, block) in batches.iter().enumerate() {
        let (source, block) = (source.clone(), *block);
        headers.spawn(async move { (i, batch_rows(source.as_ref(), &block, size).await) });
    }
    let mut batch_rows = vec![0; batches.len()];
    while let Some(joined) = headers.join_next().await {
        let (i, rows) = joined.map_err(|e| Error::Internal(e.to_string()))?;
        batch_rows[i] = rows?;
    }
    Ok(IpcFile {
        url: url.to_string(),
        schema,
        version,
        dictionaries,
        batches,
        batch_rows,
        projection: None,
    })
}

/// IPC files: footers read first (by range), then each record batch is a unit.
fn prepare_files(
    shards: Vec<ShardMeta>,
    options: &ReadOptions,
    io: &Io,
    limit: u64,
) -> Result<PreparedShards> {
    let footers = per_shard(&shards, io, FORMAT, |source, size| {
        Box::pin(read_footer(source, size))
    })?;
    let mut files: Vec<Arc<IpcFile>> = Vec::with_capacity(shards.len());
    for footer in footers {
        let mut file = footer?;
        file.projection = projection(&file.schema, options.columns.as_deref(), &file.url)?;
        if let Some(first) = files.first() {
            check_same_schema((&first.url, &first.schema), (&file.url, &file.schema))?;
        }
        files.push(Arc::new(file));
    }
    let schema = match files.first() {
        Some(first) => match &first.projection {
            Some(p) => Arc::new(
                first
                    .schema
                    .project(p)
                    .map_err(|e| Error::Internal(e.to_string()))?,
            ),
            None => first.schema.clone(),
        },
        None => Arc::new(Schema::empty()),
    };
    let units = files
        .iter()
        .enumerate()
        .flat_map(|(shard, f)| {
            (0..f.batches.len()).map(move |part| WorkUnit {
                shard,
                part,
                rows: Some(f.batch_rows[part]),
            })
        })
        .collect();
    Ok(PreparedShards::new(
        FORMAT,
        schema.clone(),
        shards,
        units,
        PreparedFile {
            files,
            schema,
            limit,
        },
    ))
}

impl UnitJobs for PreparedFile {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let file = self.files[unit.shard].clone();
        let size = shard.size.unwrap_or(u64::MAX);
        let block = file.batches[unit.part];
        // Dictionaries come first in the file: fetch them with the batch that needs them.
        let ranges = file
            .dictionaries
            .iter()
            .chain(std::iter::once(&block))
            .filter_map(|b| block_range(b, size).ok())
            .collect();
        let (schema, limit) = (self.schema.clone(), self.limit);
        UnitJob::Ranges {
            ranges,
            decode: Box::new(move |fetched: RangeSet, _: &mut BatchSink| {
                let corrupt = |m: String| {
                    Error::decode(&file.url, FORMAT, Position::Byte(block.offset() as u64), m)
                };
                let bytes = |b: &Block| -> Result<Buffer> {
                    let range = block_range(b, u64::MAX).map_err(corrupt)?;
                    let data = fetched
                        .get(range.start, range.end - range.start)
                        .ok_or_else(|| corrupt("block not fetched".into()))?;
                    check_block(b, &data, limit).map_err(corrupt)?;
                    Ok(Buffer::from(data))
                };
                let mut decoder = FileDecoder::new(file.schema.clone(), file.version);
                if let Some(p) = &file.projection {
                    decoder = decoder.with_projection(p.clone());
                }
                for dict in &file.dictionaries {
                    decoder
                        .read_dictionary(dict, &bytes(dict)?)
                        .map_err(|e| corrupt(e.to_string()))?;
                }
                let batch = decoder
                    .read_record_batch(&block, &bytes(&block)?)
                    .map_err(|e| corrupt(e.to_string()))?
                    .ok_or_else(|| corrupt("the block holds no record batch".into()))?;
                let batch = RecordBatch::try_new(schema, batch.columns().to_vec())
                    .map_err(|e| corrupt(e.to_string()))?;
                Ok(Decoded {
                    batches: vec![batch],
                    skipped: Vec::new(),
                })
            }),
        }
    }
}

// ---- stream format ---------------------------------------------------------------

/// A message as read from a stream: its bytes (marker, length, metadata, body), where
/// the body starts, and what it holds.
struct Message {
    bytes: Buffer,
    block: Block,
    header: MessageHeader,
}

/// An IPC stream read message by message, each checked before arrow-ipc decodes it.
/// The stream's messages are decoded as a file's blocks are, so projection and the
/// compressed-length check work the same for both.
struct Messages<'a> {
    reader: Box<dyn Read + Send>,
    url: &'a str,
    limit: u64,
    /// Where the next message starts.
    offset: u64,
    decoder: Option<FileDecoder>,
}

impl<'a> Messages<'a> {
    fn new(reader: Box<dyn Read + Send>, url: &'a str, limit: u64) -> Self {
        Self {
            reader,
            url,
            limit,
            offset: 0,
            decoder: None,
        }
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> Error {
        Error::decode(self.url, FORMAT, Position::Byte(self.offset), message)
    }

    /// Appends exactly `len` bytes to `out`, growing it as they arrive so that a lying
    /// length costs no more memory than the stream really holds.
    fn read_exact(&mut self, out: &mut Vec<u8>, len: u64) -> Result<()> {
        let before = out.len();
        (&mut self.reader)
            .take(len)
            .read_to_end(out)
            .map_err(|e| stream_error(self.url, Position::Byte(self.offset), e))?;
        if ((out.len() - before) as u64) < len {
            return Err(self.corrupt("the stream ends inside a message"));
        }
        Ok(())
    }

    /// Fills `word`; false at a clean end of the stream.
    fn read_word(&mut self, word: &mut [u8; 4]) -> Result<bool> {
        let got = read_full(&mut self.reader, word)
            .map_err(|e| stream_error(self.url, Position::Byte(self.offset), e))?;
        match got {
            0 => Ok(false),
            4 => Ok(true),
            _ => Err(self.corrupt("the stream ends inside a message length")),
        }
    }

    /// The next message, checked; `None` at the end of the stream.
    fn next_message(&mut self) -> Result<Option<Message>> {
        let mut word = [0u8; 4];
        if !self.read_word(&mut word)? {
            return Ok(None);
        }
        // Before Arrow 0.15 a message started with its length alone.
        if word == CONTINUATION_MARKER && !self.read_word(&mut word)? {
            return Err(self.corrupt("the stream ends inside a message length"));
        }
        let meta_len = match i32::from_le_bytes(word) {
            0 => return Ok(None),
            n if n < 0 => return Err(self.corrupt(format!("message length {n}"))),
            n => n,
        };
        let mut bytes = Vec::with_capacity(8);
        bytes.extend_from_slice(&CONTINUATION_MARKER);
        bytes.extend_from_slice(&word);
        self.read_exact(&mut bytes, meta_len as u64)?;
        let (header, body_len) = {
            let parsed = arrow_ipc::root_as_message(&bytes[8..])
                .map_err(|e| self.corrupt(format!("bad message: {e}")))?;
            let body_len = u64::try_from(parsed.bodyLength())
                .map_err(|_| self.corrupt("negative body length"))?;
            (parsed.header_type(), body_len)
        };
        let meta_end = bytes.len();
        self.read_exact(&mut bytes, body_len)?;
        let (meta, body) = bytes.split_at(meta_end);
        check_message(&meta[8..], body, self.limit).map_err(|m| self.corrupt(m))?;
        self.offset += bytes.len() as u64;
        let block = Block::new(0, meta_end as i32, body_len as i64);
        Ok(Some(Message {
            bytes: Buffer::from_vec(bytes),
            block,
            header,
        }))
    }

    /// The stream's schema, from its first message; sets up decoding with `projection`.
    fn schema(&mut self, projection: Option<&[usize]>) -> Result<SchemaRef> {
        let start = self.offset;
        let url = self.url;
        let at_start = |e: String| Error::decode(url, FORMAT, Position::Byte(start), e);
        let message = self
            .next_message()?
            .filter(|m| m.header == MessageHeader::Schema)
            .ok_or_else(|| at_start("the stream does not start with a schema".into()))?;
        let parsed = arrow_ipc::root_as_message(&message.bytes[8..])
            .map_err(|e| at_start(format!("bad message: {e}")))?;
        let fb_schema = parsed
            .header_as_schema()
            .ok_or_else(|| at_start("bad schema message".into()))?;
        let schema = Arc::new(
            arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| at_start(e.to_string()))?,
        );
        let mut decoder = FileDecoder::new(schema.clone(), parsed.version());
        if let Some(p) = projection {
            decoder = decoder.with_projection(p.to_vec());
        }
        self.decoder = Some(decoder);
        Ok(schema)
    }

    /// The next record batch (projected); `None` at the end of the stream.
    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let start = self.offset;
            let Some(message) = self.next_message()? else {
                return Ok(None);
            };
            let url = self.url;
            let at =
                |e: arrow_schema::ArrowError| Error::decode(url, FORMAT, Position::Byte(start), e);
            let Some(decoder) = self.decoder.as_mut() else {
                return Err(Error::Internal("stream read before its schema".into()));
            };
            match message.header {
                MessageHeader::DictionaryBatch => decoder
                    .read_dictionary(&message.block, &message.bytes)
                    .map_err(at)?,
                MessageHeader::NONE => {}
                _ => {
                    if let Some(batch) = decoder
                        .read_record_batch(&message.block, &message.bytes)
                        .map_err(at)?
                    {
                        return Ok(Some(batch));
                    }
                }
            }
        }
    }
}

struct PreparedStream {
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
    limit: u64,
}

/// Rows of the IPC stream in `source`, from its messages' headers alone (a few hundred
/// bytes each), so that streams get exact shares like IPC files do. A stream whose
/// framing cannot be walked is left uncounted: reading it reports what is wrong.
async fn stream_rows(source: &dyn Source, size: u64) -> Result<Option<u64>> {
    let (mut at, mut rows) = (0u64, 0u64);
    while at + 4 <= size {
        let head = source.read_range(at..(at + 8).min(size)).await?;
        // Before Arrow 0.15 a message started with its length alone.
        let (prefix, word) = match head.get(..4) {
            Some(marker) if marker == CONTINUATION_MARKER && head.len() == 8 => (8, &head[4..8]),
            _ => (4, &head[..4]),
        };
        let meta_len = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        if meta_len == 0 {
            break;
        }
        let Ok(meta_len) = u64::try_from(meta_len) else {
            return Ok(None);
        };
        let meta_start = at + prefix;
        if meta_start + meta_len > size {
            return Ok(None);
        }
        let meta = source.read_range(meta_start..meta_start + meta_len).await?;
        let Ok(message) = arrow_ipc::root_as_message(&meta) else {
            return Ok(None);
        };
        let Ok(body_len) = u64::try_from(message.bodyLength()) else {
            return Ok(None);
        };
        if let Some(batch) = message.header_as_record_batch() {
            let Ok(length) = u64::try_from(batch.length()) else {
                return Ok(None);
            };
            rows += length;
        }
        at = meta_start + meta_len + body_len;
    }
    Ok(Some(rows))
}

/// IPC streams: the schema from the first stream's head, then each stream is one unit,
/// its rows counted from its message headers.
fn prepare_streams(
    shards: Vec<ShardMeta>,
    options: &ReadOptions,
    io: &Io,
    limit: u64,
) -> Result<PreparedShards> {
    let (schema, projection) = match shards.first() {
        None => (Arc::new(Schema::empty()), None),
        Some(first) => {
            let stream = io.open(first)?.open_stream()?;
            let full = Messages::new(stream, &first.url, limit).schema(None)?;
            let projection = projection(&full, options.columns.as_deref(), &first.url)?;
            let schema = match &projection {
                Some(p) => Arc::new(
                    full.project(p)
                        .map_err(|e| Error::Internal(e.to_string()))?,
                ),
                None => full,
            };
            (schema, projection)
        }
    };
    let counts = per_shard(&shards, io, FORMAT, |source, size| {
        Box::pin(async move { stream_rows(source.as_ref(), size).await })
    })?;
    let mut units = whole_files(&shards);
    for (unit, rows) in units.iter_mut().zip(counts) {
        unit.rows = unit.rows.or(rows.ok().flatten());
    }
    Ok(PreparedShards::new(
        FORMAT,
        schema.clone(),
        shards,
        units,
        PreparedStream {
            schema,
            projection,
            limit,
        },
    ))
}

impl UnitJobs for PreparedStream {
    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url = shard.url.clone();
        let (schema, projection, limit) =
            (self.schema.clone(), self.projection.clone(), self.limit);
        UnitJob::Stream(Box::new(move |stream, emit: &mut EmitTask| {
            let mut messages = Messages::new(stream, &url, limit);
            let full = messages.schema(projection.as_deref())?;
            let corrupt =
                |e: arrow_schema::ArrowError| Error::decode(&url, FORMAT, Position::Unknown, e);
            let projected = match &projection {
                Some(p) => Arc::new(full.project(p).map_err(corrupt)?),
                None => full,
            };
            if projected.fields() != schema.fields() {
                return Err(Error::Schema {
                    url: url.clone(),
                    message: "columns differ from the first file's".into(),
                });
            }
            // Decoding a stream message is little more than slicing buffers, so it runs
            // here and the tasks just hand the batches on, in order.
            while let Some(batch) = messages.next_batch()? {
                let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())
                    .map_err(corrupt)?;
                if !emit(task(move || {
                    Ok(Decoded {
                        batches: vec![batch],
                        skipped: Vec::new(),
                    })
                })) {
                    break;
                }
            }
            Ok(())
        }))
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};

    use super::*;

    const ROWS: i64 = 12_345;

    fn compressed_stream(codec: CompressionType) -> Vec<u8> {
        let batch = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from_iter_values(0..ROWS)) as _,
        )])
        .unwrap();
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(codec))
            .unwrap();
        let mut writer =
            StreamWriter::try_new_with_options(Vec::new(), &batch.schema(), options).unwrap();
        writer.write(&batch).unwrap();
        writer.into_inner().unwrap()
    }

    fn read(bytes: Vec<u8>, limit: u64) -> Result<Vec<RecordBatch>> {
        let mut messages = Messages::new(Box::new(std::io::Cursor::new(bytes)), "t.arrows", limit);
        messages.schema(None)?;
        let mut out = Vec::new();
        while let Some(batch) = messages.next_batch()? {
            out.push(batch);
        }
        Ok(out)
    }

    #[test]
    fn lying_uncompressed_lengths_are_refused_before_decompression() {
        for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
            let honest = compressed_stream(codec);
            let batches = read(honest.clone(), u64::MAX).unwrap();
            let values = batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            assert_eq!(values.values().to_vec(), (0..ROWS).collect::<Vec<_>>());
            let prefix = (ROWS as u64 * 8).to_le_bytes();
            let at = honest.windows(8).position(|w| w == prefix).unwrap();
            let mut lying = honest.clone();
            lying[at..at + 8].copy_from_slice(&(1u64 << 46).to_le_bytes());
            let err = read(lying, u64::MAX).unwrap_err().to_string();
            assert!(err.contains("claims 70368744177664 bytes"), "{err}");
            let err = read(honest, 1000).unwrap_err().to_string();
            assert!(err.contains("max_decompressed_bytes"), "{err}");
        }
    }

    #[test]
    fn truncated_and_lying_framing_is_an_error() {
        let honest = compressed_stream(CompressionType::LZ4_FRAME);
        for cut in [3, 7, 20, honest.len() / 2, honest.len() - 9] {
            assert!(
                read(honest[..cut].to_vec(), u64::MAX).is_err(),
                "cut at {cut}"
            );
        }
        // A metadata length of 2 GiB in a few bytes of stream.
        let mut huge = vec![0xff; 4];
        huge.extend_from_slice(&i32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 16]);
        let err = read(huge, u64::MAX).unwrap_err().to_string();
        assert!(err.contains("ends inside a message"), "{err}");
        assert!(message_flatbuffer(&[0xff; 8]).is_err());
    }
}
