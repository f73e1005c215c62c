//! Arrow IPC, told apart by their first bytes: the file format (`.arrow`, `.feather`),
//! whose footer lists every record batch so each batch is a unit fetched by range and
//! decoded without copying, and the stream format (`.arrows`, `.ipc`), read front to
//! back. LZ4/ZSTD body compression is supported.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::{FileDecoder, StreamReader, read_footer_length};
use arrow_ipc::{Block, MetadataVersion};
use arrow_schema::{Schema, SchemaRef};

use super::{
    Decoded, EmitTask, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit, per_shard,
    whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta, Source};

const FORMAT: &str = "Arrow IPC";
/// The first (and last) bytes of the file format; streams start with a message.
const ARROW_MAGIC: &[u8; 6] = b"ARROW1";

fn check_options(options: &ReadOptions) -> Result<()> {
    options.format_options.reader("arrow").finish()?;
    if options.schema.is_some() || options.features.is_some() {
        return Err(Error::invalid_argument(
            "Arrow IPC data carries its own schema: schema= and features= have no use; columns= selects columns",
        ));
    }
    Ok(())
}

/// Indices of `columns` in `schema` (all columns when `None`).
fn projection(
    schema: &Schema,
    columns: Option<&[String]>,
    url: &str,
) -> Result<Option<Vec<usize>>> {
    let Some(columns) = columns else {
        return Ok(None);
    };
    columns
        .iter()
        .map(|name| {
            schema.index_of(name).map_err(|_| Error::Schema {
                url: url.to_string(),
                message: format!(
                    "no column {name:?}; the file has {:?}",
                    schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                ),
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
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
        check_options(options)?;
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
            prepare_files(shards, options, io)
        } else {
            prepare_streams(shards, options, io)
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
    projection: Option<Vec<usize>>,
}

struct PreparedFile {
    files: Vec<Arc<IpcFile>>,
    schema: SchemaRef,
}

fn block_range(block: &Block, size: u64) -> std::result::Result<std::ops::Range<u64>, String> {
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

async fn read_footer(source: &dyn Source, size: u64) -> Result<IpcFile> {
    let url = source.url();
    let corrupt = |m: String| Error::decode(url, FORMAT, Position::Unknown, m);
    if size < 18 {
        return Err(corrupt(format!(
            "file is {size} bytes, too small to be Arrow IPC"
        )));
    }
    let trailer = source.read_range(size - 10..size).await?;
    let mut last = [0u8; 10];
    last.copy_from_slice(&trailer);
    let footer_len = read_footer_length(last).map_err(|e| corrupt(e.to_string()))? as u64;
    let start = (size - 10)
        .checked_sub(footer_len)
        .ok_or_else(|| corrupt("footer longer than the file".into()))?;
    let footer_bytes = source.read_range(start..size - 10).await?;
    let footer = arrow_ipc::root_as_footer(&footer_bytes)
        .map_err(|e| corrupt(format!("bad footer: {e}")))?;
    let fb_schema = footer
        .schema()
        .ok_or_else(|| corrupt("the footer has no schema".into()))?;
    let schema = Arc::new(
        arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| corrupt(e.to_string()))?,
    );
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
    Ok(IpcFile {
        url: url.to_string(),
        schema,
        version: footer.version(),
        dictionaries: blocks(footer.dictionaries()).map_err(corrupt)?,
        batches: blocks(footer.recordBatches()).map_err(corrupt)?,
        projection: None,
    })
}

/// IPC files: footers read first (by range), then each record batch is a unit.
fn prepare_files(shards: Vec<ShardMeta>, options: &ReadOptions, io: &Io) -> Result<PreparedShards> {
    let footers = per_shard(&shards, io, FORMAT, |source, size| {
        Box::pin(async move { read_footer(source.as_ref(), size).await })
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
                rows: None,
            })
        })
        .collect();
    Ok(PreparedShards::new(
        FORMAT,
        schema.clone(),
        shards,
        units,
        PreparedFile { files, schema },
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
        let schema = self.schema.clone();
        UnitJob::Ranges {
            ranges,
            decode: Box::new(move |fetched: RangeSet| {
                let corrupt = |m: String| {
                    Error::decode(&file.url, FORMAT, Position::Byte(block.offset() as u64), m)
                };
                let bytes = |b: &Block| -> Result<Buffer> {
                    let range = block_range(b, u64::MAX).map_err(corrupt)?;
                    let data = fetched
                        .get(range.start, range.end - range.start)
                        .ok_or_else(|| corrupt("block not fetched".into()))?;
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
                    skipped: 0,
                })
            }),
        }
    }
}

// ---- stream format ---------------------------------------------------------------

struct PreparedStream {
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
}

/// IPC streams: the schema from the first stream's head, then each stream is one unit.
fn prepare_streams(
    shards: Vec<ShardMeta>,
    options: &ReadOptions,
    io: &Io,
) -> Result<PreparedShards> {
    let (schema, projection) = match shards.first() {
        None => (Arc::new(Schema::empty()), None),
        Some(first) => {
            let stream = io.open(first)?.open_stream()?;
            let reader = StreamReader::try_new(stream, None)
                .map_err(|e| Error::decode(&first.url, FORMAT, Position::Byte(0), e))?;
            let full = reader.schema();
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
    let units = whole_files(&shards);
    Ok(PreparedShards::new(
        FORMAT,
        schema.clone(),
        shards,
        units,
        PreparedStream { schema, projection },
    ))
}

impl UnitJobs for PreparedStream {
    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url = shard.url.clone();
        let (schema, projection) = (self.schema.clone(), self.projection.clone());
        UnitJob::Stream(Box::new(move |stream, emit: &mut EmitTask| {
            let corrupt =
                |e: arrow_schema::ArrowError| Error::decode(&url, FORMAT, Position::Unknown, e);
            let reader = StreamReader::try_new(stream, projection).map_err(corrupt)?;
            // Decoding a stream message is little more than slicing buffers, so it runs
            // here and the tasks just hand the batches on, in order.
            for batch in reader {
                let batch = batch.map_err(corrupt)?;
                if batch.schema().fields() != schema.fields() {
                    return Err(Error::Schema {
                        url: url.clone(),
                        message: "columns differ from the first file's".into(),
                    });
                }
                let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())
                    .map_err(corrupt)?;
                if !emit(Box::new(move || {
                    Ok(Decoded {
                        batches: vec![batch],
                        skipped: 0,
                    })
                })) {
                    break;
                }
            }
            Ok(())
        }))
    }
}
