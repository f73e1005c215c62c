//! Parquet: footers are read once when the dataset is prepared; each row group is a
//! work unit whose projected column chunks are fetched as byte ranges and decoded.
//! A file is never loaded whole.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use bytes::{Buf, Bytes};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelectionPolicy, RowSelector,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageIndexPolicy, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use super::{
    BatchSink, Decoded, Format, OnError, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    per_shard,
};
use crate::error::{Error, Position, Result, panic_message};
use crate::source::ranges::{RangeSet, coalesce};
use crate::source::{Io, ShardMeta, Source};

const FORMAT: &str = "Parquet";
/// First guess at the footer size; one more read fetches the rest when it is larger.
const FOOTER_GUESS: u64 = 64 * 1024;
/// Column chunks closer than this are fetched in one read: a few wasted bytes cost less
/// than another request, but a wide gap would read unprojected columns.
const COALESCE_GAP: u64 = 64 * 1024;
/// Decoded batches aim at about this many bytes, so wide rows give short batches.
const TARGET_BATCH_BYTES: u64 = 1024 * 1024;
const MAX_BATCH_ROWS: u64 = 64 * 1024;

pub struct Parquet;

struct ParquetFile {
    url: String,
    size: u64,
    metadata: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// Leaf column indices read under `mask`.
    leaves: Vec<usize>,
    /// Reorders decoded columns (file order) into the order the user asked for.
    reorder: Option<Vec<usize>>,
    /// The projected columns in the user's order; every batch is stamped with it so
    /// batches from different files concatenate.
    schema: SchemaRef,
}

struct PreparedParquet {
    files: Vec<Arc<ParquetFile>>,
}

impl Format for Parquet {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        options.format_options.reader("parquet").finish()?;
        if options.schema.is_some() || options.features.is_some() {
            return Err(Error::invalid_argument(
                "Parquet files carry their own schema: schema= and features= have no use; columns= selects columns",
            ));
        }
        let footers = per_shard(&shards, io, FORMAT, |source, size| {
            Box::pin(async move { Ok((size, read_metadata(source.as_ref(), size).await?)) })
        })?;
        let mut kept_shards = Vec::new();
        let mut files = Vec::new();
        let mut skipped_shards = 0;
        // With every file skipped there is nothing to read: the first file's error says why.
        let mut first_error = None;
        for (shard, footer) in shards.into_iter().zip(footers) {
            let file = footer.and_then(|(size, metadata)| {
                // The parquet crate asserts on some corrupt metadata; that is the file's
                // fault, so it is reported (or skipped) as such.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    project(&shard.url, size, metadata, options.columns.as_deref())
                }))
                .unwrap_or_else(|panic| {
                    Err(Error::decode(
                        &shard.url,
                        FORMAT,
                        Position::Unknown,
                        panic_message(&*panic),
                    ))
                })
            });
            match file {
                Ok(file) => {
                    kept_shards.push(shard);
                    files.push(Arc::new(file));
                }
                Err(e) if options.on_error == OnError::Skip && e.is_data_error() => {
                    skipped_shards += 1;
                    first_error.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if files.is_empty() {
            return Err(first_error.unwrap_or_else(|| Error::invalid_argument("no Parquet files")));
        }
        // Files without rows add nothing, so their (often degenerate) schema is not held
        // against the others.
        let has_rows = |f: &&Arc<ParquetFile>| f.metadata.metadata().file_metadata().num_rows() > 0;
        let first = files.iter().find(has_rows).unwrap_or(&files[0]);
        let schema = first.schema.clone();
        for file in files.iter().filter(has_rows) {
            let other = &file.schema;
            if other.fields() != schema.fields() {
                return Err(Error::Schema {
                    url: file.url.clone(),
                    message: format!(
                        "columns {} differ from {} in {}",
                        describe(other),
                        describe(&schema),
                        first.url
                    ),
                });
            }
        }
        let units = files
            .iter()
            .enumerate()
            .flat_map(|(shard, file)| {
                file.metadata
                    .metadata()
                    .row_groups()
                    .iter()
                    .enumerate()
                    .filter(|(_, rg)| rg.num_rows() > 0)
                    .map(move |(part, rg)| WorkUnit {
                        shard,
                        part,
                        rows: Some(rg.num_rows() as u64),
                    })
            })
            .collect();
        Ok(PreparedShards::new(
            FORMAT,
            schema,
            kept_shards,
            units,
            PreparedParquet { files },
        )
        .with_skipped_shards(skipped_shards))
    }
}

fn describe(schema: &Schema) -> String {
    let cols: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("[{}]", cols.join(", "))
}

async fn read_metadata(source: &dyn Source, size: u64) -> Result<ArrowReaderMetadata> {
    let url = source.url();
    let corrupt =
        |e: ParquetError| Error::decode(url, FORMAT, Position::Unknown, footer_message(e));
    if size < 12 {
        return Err(Error::decode(
            url,
            FORMAT,
            Position::Unknown,
            format!("file is {size} bytes, too small to be Parquet"),
        ));
    }
    let mut want = size.min(FOOTER_GUESS);
    // The offset index (where each page starts, and its first row) lets a read of a few
    // rows fetch and decode only their pages. Files that have none, or a broken one, are
    // read without it: a row group's column chunks whole, as before.
    let mut offset_index = PageIndexPolicy::Optional;
    loop {
        let tail = source.read_range(size - want..size).await?;
        let mut reader = ParquetMetaDataReader::new().with_offset_index_policy(offset_index);
        match reader.try_parse_sized(&tail, size) {
            Ok(()) => {
                let metadata = reader.finish().map_err(corrupt)?;
                return ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
                    .map_err(corrupt);
            }
            Err(ParquetError::NeedMoreData(needed))
                if (needed as u64) > want && (needed as u64) <= size =>
            {
                want = needed as u64;
            }
            Err(_) if offset_index != PageIndexPolicy::Skip => {
                offset_index = PageIndexPolicy::Skip;
            }
            Err(e) => return Err(corrupt(e)),
        }
    }
}

fn footer_message(e: impl std::fmt::Display) -> String {
    format!("cannot read the footer: {e}")
}

/// Resolves `columns` against the file's schema.
fn project(
    url: &str,
    size: u64,
    metadata: ArrowReaderMetadata,
    columns: Option<&[String]>,
) -> Result<ParquetFile> {
    let descr = metadata.parquet_schema();
    let roots = descr.root_schema().get_fields();
    let (mask, roots, reorder) = match columns {
        None => (ProjectionMask::all(), (0..roots.len()).collect(), None),
        Some(columns) => {
            let names: Vec<&str> = roots.iter().map(|f| f.name()).collect();
            let wanted = super::column_indices(&names, columns, url)?;
            let mut sorted = wanted.clone();
            sorted.sort_unstable();
            let reorder: Vec<usize> = wanted
                .iter()
                .map(|idx| sorted.iter().position(|s| s == idx).unwrap_or(0))
                .collect();
            let identity = reorder.iter().enumerate().all(|(i, &r)| i == r);
            (
                ProjectionMask::roots(descr, sorted.iter().copied()),
                sorted,
                (!identity).then_some(reorder),
            )
        }
    };
    let leaves = (0..descr.num_columns())
        .filter(|&i| mask.leaf_included(i))
        .collect();
    // Parquet root fields map one to one onto the Arrow schema's top-level fields.
    let mut fields: Vec<_> = roots
        .iter()
        .map(|&i| metadata.schema().field(i).clone())
        .collect();
    if let Some(order) = &reorder {
        fields = order.iter().map(|&i| fields[i].clone()).collect();
    }
    let schema = Arc::new(Schema::new(fields));
    let file = ParquetFile {
        url: url.to_string(),
        size,
        metadata,
        mask,
        leaves,
        reorder,
        schema,
    };
    check_chunk_bounds(&file)?;
    Ok(file)
}

/// The byte range of a column chunk, checked against the file: corrupt metadata can hold
/// negative offsets (which the parquet crate asserts on) or point past the end (which
/// would make us allocate for bytes that are not there).
fn chunk_range(
    file_size: u64,
    column: &ColumnChunkMetaData,
) -> std::result::Result<Range<u64>, String> {
    let start = column
        .dictionary_page_offset()
        .filter(|&offset| offset > 0)
        .unwrap_or_else(|| column.data_page_offset());
    let len = column.compressed_size();
    let (Ok(start), Ok(len)) = (u64::try_from(start), u64::try_from(len)) else {
        return Err(format!(
            "column chunk has a negative offset ({start}) or size ({len})"
        ));
    };
    match start.checked_add(len) {
        Some(end) if end <= file_size => Ok(start..end),
        _ => Err(format!(
            "column chunk spans bytes {start}..{} beyond the end of the {file_size}-byte file",
            start.saturating_add(len)
        )),
    }
}

fn check_chunk_bounds(file: &ParquetFile) -> Result<()> {
    for (rg_idx, rg) in file.metadata.metadata().row_groups().iter().enumerate() {
        let corrupt =
            |message: String| Error::decode(&file.url, FORMAT, Position::RowGroup(rg_idx), message);
        if rg.num_rows() < 0 {
            return Err(corrupt(format!("negative row count {}", rg.num_rows())));
        }
        for &leaf in &file.leaves {
            chunk_range(file.size, rg.column(leaf)).map_err(corrupt)?;
        }
    }
    Ok(())
}

impl PreparedParquet {
    /// Fetches the row group's projected column chunks and decodes them, all its rows or
    /// only `selection`'s (the decoder then passes over pages that hold none of them).
    fn row_group_job(&self, unit: &WorkUnit, selection: Option<RowSelection>) -> UnitJob {
        let file = self.files[unit.shard].clone();
        let row_group = unit.part;
        let rg = file.metadata.metadata().row_group(row_group);
        // Checked when the file was prepared.
        let ranges: Vec<Range<u64>> = file
            .leaves
            .iter()
            .filter_map(|&leaf| chunk_range(file.size, rg.column(leaf)).ok())
            .collect();
        let ranges = match &selection {
            Some(selection) => selected_pages(&file, row_group, selection).unwrap_or(ranges),
            None => ranges,
        };
        let batch_rows = batch_rows(&file, row_group);
        UnitJob::Ranges {
            ranges: coalesce(ranges, COALESCE_GAP),
            decode: Box::new(move |fetched, sink: &mut BatchSink| {
                let fetched = FetchedChunks(fetched);
                decode_row_group(&file, row_group, batch_rows, selection, fetched, sink)
            }),
        }
    }
}

/// The byte ranges of the pages holding `selection`'s rows (and of each column's
/// dictionary page) of a row group, from the file's offset index; `None` without one.
fn selected_pages(
    file: &ParquetFile,
    row_group: usize,
    selection: &RowSelection,
) -> Option<Vec<Range<u64>>> {
    let metadata = file.metadata.metadata();
    let index = metadata.page_index_for_row_group(row_group);
    let rg = metadata.row_group(row_group);
    let mut ranges = Vec::new();
    for &leaf in &file.leaves {
        let pages = index.offset_index(leaf)?.page_locations();
        let chunk = chunk_range(file.size, rg.column(leaf)).ok()?;
        let first = u64::try_from(pages.first()?.offset).ok()?;
        if chunk.start < first {
            ranges.push(chunk.start..first);
        }
        for page in selection.scan_ranges(pages) {
            // The footer's offsets are checked against the column chunk: a page outside
            // it would have the decoder read bytes never fetched.
            if page.start < chunk.start || page.end > chunk.end {
                return None;
            }
            ranges.push(page);
        }
    }
    Some(ranges)
}

/// Rows per decoded batch of a row group, so that batches hold about
/// `TARGET_BATCH_BYTES`.
fn batch_rows(file: &ParquetFile, row_group: usize) -> usize {
    let rg = file.metadata.metadata().row_group(row_group);
    let projected_bytes: i64 = file
        .leaves
        .iter()
        .map(|&l| rg.column(l).uncompressed_size())
        .fold(0, i64::saturating_add);
    let row_bytes = (projected_bytes.max(1) as u64 / (rg.num_rows().max(1) as u64)).max(1);
    (TARGET_BATCH_BYTES / row_bytes).clamp(1, MAX_BATCH_ROWS) as usize
}

impl UnitJobs for PreparedParquet {
    fn job(&self, unit: &WorkUnit, _shard: &ShardMeta) -> UnitJob {
        self.row_group_job(unit, None)
    }

    fn rows_job(
        &self,
        unit: &WorkUnit,
        shard: &ShardMeta,
        rows: &[u64],
        io: &Io,
    ) -> Option<UnitJob> {
        let mut selectors = Vec::new();
        let mut next = 0u64;
        for &row in rows {
            if row < next {
                return None; // not ascending and distinct
            }
            if row > next {
                selectors.push(RowSelector::skip((row - next) as usize));
            }
            selectors.push(RowSelector::select(1));
            next = row + 1;
        }
        let selection = RowSelection::from(selectors);
        let file = &self.files[unit.shard];
        // With an offset index, only the pages holding wanted rows are fetched.
        if selected_pages(file, unit.part, &selection).is_some() {
            return Some(self.row_group_job(unit, Some(selection)));
        }
        // Without one, a local file is read where the decoder asks: each page's header,
        // and the body only of pages that hold wanted rows (fetching the column chunks
        // first would read every page, however few rows are wanted).
        if crate::source::local_path(&shard.url).is_some() {
            let (file, shard, row_group, io) = (
                self.files[unit.shard].clone(),
                shard.clone(),
                unit.part,
                io.clone(),
            );
            let batch_rows = batch_rows(&file, row_group);
            return Some(UnitJob::Ready(Box::new(move |sink: &mut BatchSink| {
                let reader = SourceChunks {
                    source: io.open(&shard)?,
                    size: file.size,
                };
                decode_row_group(&file, row_group, batch_rows, Some(selection), reader, sink)
            })));
        }
        Some(self.row_group_job(unit, Some(selection)))
    }
}

/// Decodes a row group (its `selection`'s rows, or all) from `bytes`: the fetched column
/// chunks, or the file itself.
fn decode_row_group(
    file: &ParquetFile,
    row_group: usize,
    batch_rows: usize,
    selection: Option<RowSelection>,
    bytes: impl ChunkReader + 'static,
    sink: &mut BatchSink,
) -> Result<Decoded> {
    let corrupt = |e: &dyn std::fmt::Display| {
        Error::decode(&file.url, FORMAT, Position::RowGroup(row_group), e)
    };
    let expected = match &selection {
        Some(selection) => selection.row_count() as i64,
        None => file.metadata.metadata().row_group(row_group).num_rows(),
    };
    let mut builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, file.metadata.clone())
            .with_row_groups(vec![row_group])
            .with_projection(file.mask.clone())
            .with_batch_size(batch_rows);
    if let Some(selection) = selection {
        // Selectors, not a mask: with a mask the decoder reads every page and filters;
        // selectors let it pass over pages that hold no wanted row (and, with the
        // offset index, never read them).
        builder = builder
            .with_row_selection(selection)
            .with_row_selection_policy(RowSelectionPolicy::Selectors);
    }
    let reader = builder.build().map_err(|e| corrupt(&e))?;
    let mut rows = 0;
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(&e))?;
        let batch = match file.reorder.as_deref() {
            Some(order) => batch.project(order),
            None => Ok(batch),
        }
        .and_then(|b| RecordBatch::try_new(file.schema.clone(), b.columns().to_vec()))
        .map_err(|e| corrupt(&e))?;
        rows += batch.num_rows();
        sink(batch);
    }
    if rows as i64 != expected {
        return Err(corrupt(&format!(
            "decoded {rows} rows, the footer says {expected}"
        )));
    }
    Ok(Decoded::default())
}

/// A file read where the decoder asks, through its source (so the reads are counted):
/// page bodies whole, page headers by a few small reads.
struct SourceChunks {
    source: Arc<dyn Source>,
    size: u64,
}

impl Length for SourceChunks {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for SourceChunks {
    type T = HeaderReader;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(HeaderReader {
            source: self.source.clone(),
            at: start,
            end: self.size,
            next_read: HEADER_FIRST_READ,
            buffered: Bytes::new(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.source
            .read_range_blocking(start..start.saturating_add(length as u64))
            .map_err(|e| ParquetError::External(Box::new(e)))
    }
}

/// First read for a page header: most are tens of bytes; one holding the statistics of
/// wide values takes more reads, each twice the last.
const HEADER_FIRST_READ: u64 = 512;

/// Reads forward from a position in a source, in reads that grow, for the decoder's
/// page headers (it reads the body through `get_bytes`).
struct HeaderReader {
    source: Arc<dyn Source>,
    at: u64,
    end: u64,
    next_read: u64,
    buffered: Bytes,
}

impl std::io::Read for HeaderReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buffered.is_empty() && self.at < self.end {
            let end = self.end.min(self.at.saturating_add(self.next_read));
            self.buffered = self
                .source
                .read_range_blocking(self.at..end)
                .map_err(std::io::Error::other)?;
            self.at = end;
            self.next_read = self.next_read.saturating_mul(2);
        }
        let n = out.len().min(self.buffered.len());
        out[..n].copy_from_slice(&self.buffered[..n]);
        self.buffered.advance(n);
        Ok(n)
    }
}

/// The fetched column chunks of one row group, read by the Parquet decoder as if they
/// were the whole file.
struct FetchedChunks(RangeSet);

impl Length for FetchedChunks {
    fn len(&self) -> u64 {
        self.0.total_len()
    }
}

impl ChunkReader for FetchedChunks {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.0.tail_from(start).map(Buf::reader).ok_or_else(|| {
            ParquetError::General(format!(
                "read at byte {start} outside the fetched column chunks"
            ))
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.0.get(start, length as u64).ok_or_else(|| {
            ParquetError::General(format!(
                "read of {length} bytes at byte {start} outside the fetched column chunks"
            ))
        })
    }
}
