//! Parquet: footers are read once when the dataset is prepared; each row group is a
//! work unit whose projected column chunks are fetched as byte ranges and decoded.
//! A file is never loaded whole.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, GenericBinaryArray, OffsetSizeTrait, RecordBatch, RecordBatchReader};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Schema, SchemaRef};
use bytes::{Buf, Bytes};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelectionPolicy, RowSelector,
};
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    ColumnChunkMetaData, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader,
};
use parquet::file::reader::{ChunkReader, Length};

use super::parquet_dictionary::{DictionaryColumn, MIN_DICTIONARY_BYTES};
use super::parquet_footers;
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
    /// By row group, for each of `leaves`: where its rows are, if its values sit in an
    /// uncompressed dictionary page read value by value (see `parquet_dictionary`).
    dictionaries: Mutex<HashMap<usize, Arc<Vec<Option<DictionaryColumn>>>>>,
}

/// Row groups whose dictionary columns are remembered per file, at most.
const DICTIONARIES_KEPT: usize = 4096;

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
        let huggingface = first
            .metadata
            .schema()
            .metadata()
            .get(super::HUGGINGFACE_KEY)
            .cloned();
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
        .with_huggingface(huggingface)
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
    // A footer carried by a pickled dataset, read by the process that pickled it.
    let mut given = parquet_footers::given(url, size);
    loop {
        let carried = given.take();
        let tail = match &carried {
            Some(tail) => tail.clone(),
            None => source.read_range(size - want..size).await?,
        };
        let mut reader = ParquetMetaDataReader::new().with_offset_index_policy(offset_index);
        match reader.try_parse_sized(&tail, size) {
            Ok(()) => {
                let metadata = reader.finish().map_err(corrupt)?;
                if carried.is_none() {
                    parquet_footers::remember(url, size, footer_bytes(&tail, size, &metadata));
                }
                return ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
                    .map_err(corrupt);
            }
            // (A carried footer that does not parse is read from the file instead.)
            Err(_) if carried.is_some() => {}
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

/// The end of `tail` (the last bytes of a file of `size` bytes) that its metadata was
/// parsed from: the footer and the offset index before it, not the rest of the guess.
fn footer_bytes(tail: &Bytes, size: u64, metadata: &ParquetMetaData) -> Bytes {
    let read_from = size - tail.len() as u64;
    let Some(length) = tail
        .len()
        .checked_sub(8)
        .and_then(|at| tail.get(at..at + 4))
    else {
        return tail.clone();
    };
    let length = u32::from_le_bytes([length[0], length[1], length[2], length[3]]) as u64;
    let offset_index = metadata
        .row_groups()
        .iter()
        .flat_map(|group| group.columns())
        .filter_map(|column| column.offset_index_offset())
        .filter_map(|offset| u64::try_from(offset).ok());
    let start = offset_index.fold(size.saturating_sub(length + 8), u64::min);
    match start.checked_sub(read_from) {
        Some(skip) if (skip as usize) < tail.len() => tail.slice(skip as usize..),
        _ => tail.clone(),
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
        dictionaries: Mutex::new(HashMap::new()),
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

/// What reading one row of a row group alone fetches, as a multiple of the bytes the row
/// is stored in, by the file's offset index: per projected column, what comes before its
/// first page (a dictionary page) and the page holding the row (a row falls in a page
/// with the share of the rows it holds). `None` without an offset index.
fn row_read_share(file: &ParquetFile, row_group: usize) -> Option<f64> {
    let metadata = file.metadata.metadata();
    let index = metadata.page_index_for_row_group(row_group);
    let rg = metadata.row_group(row_group);
    let rows = rg.num_rows().max(1);
    let (mut read, mut stored) = (0.0, 0.0);
    for &leaf in &file.leaves {
        let pages = index.offset_index(leaf)?.page_locations();
        let chunk = chunk_range(file.size, rg.column(leaf)).ok()?;
        let first = u64::try_from(pages.first()?.offset).ok()?;
        read += first.saturating_sub(chunk.start) as f64;
        let ends = pages
            .iter()
            .skip(1)
            .map(|p| p.first_row_index)
            .chain([rows]);
        for (page, end) in pages.iter().zip(ends) {
            let page_rows = end.saturating_sub(page.first_row_index) as f64;
            read += page.compressed_page_size.max(0) as f64 * page_rows / rows as f64;
        }
        stored += (chunk.end - chunk.start) as f64 / rows as f64;
    }
    (stored > 0.0).then(|| read / stored)
}

/// Rows per decoded batch of a row group, so that batches hold about
/// `TARGET_BATCH_BYTES`.
fn batch_rows(file: &ParquetFile, row_group: usize) -> usize {
    batch_rows_of(file, row_group, TARGET_BATCH_BYTES)
}

/// Rows per decoded batch of a row group, so that batches hold about `target` bytes.
fn batch_rows_of(file: &ParquetFile, row_group: usize, target: u64) -> usize {
    let rg = file.metadata.metadata().row_group(row_group);
    let projected_bytes: i64 = file
        .leaves
        .iter()
        .map(|&l| rg.column(l).uncompressed_size())
        .fold(0, i64::saturating_add);
    let row_bytes = (projected_bytes.max(1) as u64 / (rg.num_rows().max(1) as u64)).max(1);
    (target / row_bytes).clamp(1, MAX_BATCH_ROWS) as usize
}

impl UnitJobs for PreparedParquet {
    fn job(&self, unit: &WorkUnit, _shard: &ShardMeta) -> UnitJob {
        self.row_group_job(unit, None)
    }

    /// With an offset index (pages read as wanted), or where the wide columns are read
    /// value by value from their dictionary pages and the rest is small.
    fn reads_rows_alone(&self, unit: &WorkUnit, shard: &ShardMeta, io: &Io) -> Result<bool> {
        let file = &self.files[unit.shard];
        let rows = unit.rows.unwrap_or(0) as usize;
        let every_row = RowSelection::from(vec![RowSelector::select(rows)]);
        if selected_pages(file, unit.part, &every_row).is_some() {
            return Ok(true);
        }
        if crate::source::local_path(&shard.url).is_none() {
            return Ok(false);
        }
        let dictionaries = file.dictionary_columns(unit.part, &*io.open(shard)?)?;
        let rg = file.metadata.metadata().row_group(unit.part);
        let read_whole: u64 = file
            .leaves
            .iter()
            .zip(dictionaries.iter())
            .filter(|(_, d)| d.is_none())
            .map(|(&leaf, _)| u64::try_from(rg.column(leaf).compressed_size()).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        Ok(dictionaries.iter().any(Option::is_some) && read_whole < MIN_DICTIONARY_BYTES)
    }

    fn row_read_share(&self, unit: &WorkUnit, _shard: &ShardMeta) -> Option<f64> {
        row_read_share(&self.files[unit.shard], unit.part)
    }

    /// A local file read where the decoder asks, page by page, in batches of a quarter
    /// of the usual bytes: a wide value is then a batch of its own, not one of several
    /// that the decoder's buffer grows by doubling to hold, copied at each step (a tenth
    /// of the spill's first pass over rows of 256 KiB).
    fn streamed_job(&self, unit: &WorkUnit, shard: &ShardMeta, io: &Io) -> Option<UnitJob> {
        crate::source::local_path(&shard.url)?;
        let (file, shard, row_group, io) = (
            self.files[unit.shard].clone(),
            shard.clone(),
            unit.part,
            io.clone(),
        );
        let batch_rows = batch_rows_of(&file, row_group, TARGET_BATCH_BYTES / 4);
        Some(UnitJob::Ready(Box::new(move |sink: &mut BatchSink| {
            let reader = SourceChunks {
                source: io.open(&shard)?,
                size: file.size,
            };
            decode_row_group(&file, row_group, batch_rows, None, reader, sink)
        })))
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
            let rows = rows.to_vec();
            return Some(UnitJob::Ready(Box::new(move |sink: &mut BatchSink| {
                let source = io.open(&shard)?;
                let dictionaries = file.dictionary_columns(row_group, &*source)?;
                let reader = SourceChunks {
                    source: source.clone(),
                    size: file.size,
                };
                if dictionaries.iter().all(Option::is_none) {
                    return decode_row_group(
                        &file,
                        row_group,
                        batch_rows,
                        Some(selection),
                        reader,
                        sink,
                    );
                }
                let batch = decode_with_dictionaries(
                    &file,
                    row_group,
                    selection,
                    &rows,
                    &dictionaries,
                    reader,
                    &*source,
                )?;
                sink(batch);
                Ok(Decoded::default())
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
    let expected = match &selection {
        Some(selection) => selection.row_count() as i64,
        None => file.metadata.metadata().row_group(row_group).num_rows(),
    };
    let reader = row_group_reader(
        file,
        row_group,
        file.mask.clone(),
        batch_rows,
        selection,
        bytes,
    )?;
    let mut rows = 0;
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(file, row_group, &e))?;
        let batch = in_user_order(file, row_group, batch.columns().to_vec())?;
        rows += batch.num_rows();
        sink(batch);
    }
    check_rows(file, row_group, rows, expected)
}

fn corrupt(file: &ParquetFile, row_group: usize, e: &dyn std::fmt::Display) -> Error {
    Error::decode(&file.url, FORMAT, Position::RowGroup(row_group), e)
}

fn check_rows(file: &ParquetFile, row_group: usize, rows: usize, expected: i64) -> Result<Decoded> {
    if rows as i64 != expected {
        return Err(corrupt(
            file,
            row_group,
            &format!("decoded {rows} rows, the footer says {expected}"),
        ));
    }
    Ok(Decoded::default())
}

/// The arrow reader of `mask`'s columns of a row group, its `selection`'s rows or all.
fn row_group_reader(
    file: &ParquetFile,
    row_group: usize,
    mask: ProjectionMask,
    batch_rows: usize,
    selection: Option<RowSelection>,
    bytes: impl ChunkReader + 'static,
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader> {
    let mut builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, file.metadata.clone())
            .with_row_groups(vec![row_group])
            .with_projection(mask)
            .with_batch_size(batch_rows);
    if let Some(selection) = selection {
        // Selectors, not a mask: with a mask the decoder reads every page and filters;
        // selectors let it pass over pages that hold no wanted row (and, with the
        // offset index, never read them).
        builder = builder
            .with_row_selection(selection)
            .with_row_selection_policy(RowSelectionPolicy::Selectors);
    }
    builder.build().map_err(|e| corrupt(file, row_group, &e))
}

/// Decoded columns (in file order) as a batch of the user's columns, in their order.
fn in_user_order(
    file: &ParquetFile,
    row_group: usize,
    columns: Vec<ArrayRef>,
) -> Result<RecordBatch> {
    let columns = match file.reorder.as_deref() {
        Some(order) => order.iter().map(|&i| columns[i].clone()).collect(),
        None => columns,
    };
    RecordBatch::try_new(file.schema.clone(), columns).map_err(|e| corrupt(file, row_group, &e))
}

impl ParquetFile {
    /// For each projected leaf of `row_group`, where its rows are, if its values sit in an
    /// uncompressed dictionary page of a flat binary or string column (found once per
    /// row group).
    fn dictionary_columns(
        &self,
        row_group: usize,
        source: &dyn Source,
    ) -> Result<Arc<Vec<Option<DictionaryColumn>>>> {
        if let Some(found) = self
            .dictionaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&row_group)
        {
            return Ok(found.clone());
        }
        let metadata = self.metadata.metadata();
        let descr = metadata.file_metadata().schema_descr();
        let rg = metadata.row_group(row_group);
        let rows = usize::try_from(rg.num_rows()).unwrap_or(0);
        let mut found = Vec::with_capacity(self.leaves.len());
        for &leaf in &self.leaves {
            let column = descr.column(leaf);
            let chunk = rg.column(leaf);
            let arrow_type = self
                .metadata
                .schema()
                .field(descr.get_column_root_idx(leaf))
                .data_type();
            let readable = column.path().parts().len() == 1
                && column.max_rep_level() == 0
                && column.max_def_level() <= 1
                && column.physical_type() == PhysicalType::BYTE_ARRAY
                && matches!(
                    arrow_type,
                    DataType::Binary | DataType::LargeBinary | DataType::Utf8 | DataType::LargeUtf8
                )
                && chunk.compression() == Compression::UNCOMPRESSED
                && chunk.dictionary_page_offset().is_some()
                && u64::try_from(chunk.compressed_size()).unwrap_or(0) >= MIN_DICTIONARY_BYTES;
            let range = chunk_range(self.size, chunk).ok().filter(|_| readable);
            found.push(match range {
                Some(range) => DictionaryColumn::find(source, range, rows, column.max_def_level())?,
                None => None,
            });
        }
        let found = Arc::new(found);
        let mut kept = self.dictionaries.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= DICTIONARIES_KEPT {
            kept.clear();
        }
        kept.insert(row_group, found.clone());
        Ok(found)
    }
}

/// Rows `rows` (ascending offsets, `selection` as a selection) of a row group: the
/// columns in `dictionaries` read value by value, the rest by the arrow reader from
/// `bytes`.
fn decode_with_dictionaries(
    file: &ParquetFile,
    row_group: usize,
    selection: RowSelection,
    rows: &[u64],
    dictionaries: &[Option<DictionaryColumn>],
    bytes: impl ChunkReader + 'static,
    source: &dyn Source,
) -> Result<RecordBatch> {
    let descr = file.metadata.parquet_schema();
    let rest: Vec<usize> = file
        .leaves
        .iter()
        .zip(dictionaries)
        .filter(|(_, d)| d.is_none())
        .map(|(&leaf, _)| leaf)
        .collect();
    let mut decoded = Vec::new().into_iter();
    if !rest.is_empty() {
        let mask = ProjectionMask::leaves(descr, rest.iter().copied());
        let reader = row_group_reader(
            file,
            row_group,
            mask,
            rows.len().max(1),
            Some(selection),
            bytes,
        )?;
        let schema = reader.schema();
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| corrupt(file, row_group, &e))?;
        let batch = arrow_select::concat::concat_batches(&schema, &batches)
            .map_err(|e| corrupt(file, row_group, &e))?;
        check_rows(file, row_group, batch.num_rows(), rows.len() as i64)?;
        decoded = batch.columns().to_vec().into_iter();
    }
    let mut columns = Vec::with_capacity(file.leaves.len());
    for (&leaf, dictionary) in file.leaves.iter().zip(dictionaries) {
        let column = match dictionary {
            Some(dictionary) => {
                let field = file
                    .metadata
                    .schema()
                    .field(descr.get_column_root_idx(leaf));
                let (values, ends, present) = dictionary.read(source, rows)?;
                let binary = match field.data_type() {
                    DataType::LargeBinary | DataType::LargeUtf8 => {
                        binary_array::<i64>(values, &ends, present)
                    }
                    _ => binary_array::<i32>(values, &ends, present),
                }
                .map_err(|e| corrupt(file, row_group, &e))?;
                // Strings are checked as UTF-8 here, as the arrow reader checks them.
                arrow_cast::cast(&binary, field.data_type())
                    .map_err(|e| corrupt(file, row_group, &e))?
            }
            None => decoded.next().ok_or_else(|| {
                corrupt(
                    file,
                    row_group,
                    &"a column is missing from the decoded rows",
                )
            })?,
        };
        columns.push(column);
    }
    in_user_order(file, row_group, columns)
}
/// Values laid end to end in `values` (each ending at `ends`, null where not `present`)
/// as a binary array with offsets of type `O`.
fn binary_array<O: OffsetSizeTrait>(
    values: Vec<u8>,
    ends: &[usize],
    present: Vec<bool>,
) -> std::result::Result<ArrayRef, arrow_schema::ArrowError> {
    let mut offsets = Vec::with_capacity(ends.len() + 1);
    offsets.push(O::usize_as(0));
    for &end in ends {
        offsets.push(O::from_usize(end).ok_or_else(|| {
            arrow_schema::ArrowError::InvalidArgumentError(format!(
                "{end} bytes of values overflow the offsets"
            ))
        })?);
    }
    let nulls = present.contains(&false).then(|| NullBuffer::from(present));
    let array = GenericBinaryArray::<O>::try_new(
        OffsetBuffer::new(offsets.into()),
        Buffer::from_vec(values),
        nulls,
    )?;
    Ok(Arc::new(array))
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
