//! CSV (`.csv`, `.csv.gz`) read the way `pyarrow.csv.read_csv` reads it by default: a
//! header row, `"` quoting (doubled quotes inside), types inferred from the first
//! records (null, int64, float64, bool, date32, timestamp, string), pyarrow's null
//! tokens ("", "NA", "null", "NaN", ...) as nulls except in string columns, where every
//! value is kept as written.
//!
//! Files are cut into blocks at record ends and blocks are decoded in parallel: each is
//! parsed as text, then converted to the inferred types. Record ends are found by the
//! parser that decodes them (see `RecordEnds`), so blocks and the record index cut a
//! file exactly where decoding it would, stray quotes and all.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow_csv::reader::Format as CsvFormat;
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::blocks::split_blocks;
use super::index::{RecordCodec, ShardIndex};
use super::{
    Decoded, EmitTask, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    column_indices, compression, field_names, task, whole_files,
};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta};

const FORMAT: &str = "CSV";
const BLOCK_BYTES: usize = 4 * 1024 * 1024;
/// Records read to infer column types.
pub const INFER_RECORDS: usize = 1000;
/// pyarrow's default `null_values`.
const NULL_TOKENS: &[&str] = &[
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null",
];
const TRUE_TOKENS: &[&str] = &["1", "True", "TRUE", "true"];
const FALSE_TOKENS: &[&str] = &["0", "False", "FALSE", "false"];

pub struct Csv;

struct Config {
    /// Column names and types of the output.
    schema: SchemaRef,
    limit: u64,
    /// Output columns that a file lacks are all nulls (`missing_columns="null"`) rather
    /// than an error.
    null_missing: bool,
}

/// How one file's columns map onto the output, from that file's own header: columns
/// are matched by name, as `pyarrow.dataset` does, never by position.
struct FileLayout {
    /// The file's header names, all text: what its blocks are parsed into first.
    text_schema: SchemaRef,
    /// For each output column, its position in the file (None: the file lacks it).
    projection: Vec<Option<usize>>,
}

impl FileLayout {
    /// Reads the header at the start of `head` (a file's first block).
    fn from_header(config: &Config, url: &str, head: &[u8]) -> Result<Self> {
        let (names, _) = CsvFormat::default()
            .with_header(true)
            .infer_schema(head, Some(0))
            .map_err(|e| Error::decode(url, FORMAT, Position::Line(1), e))?;
        let text_schema = text_schema(names.fields().iter().map(|f| f.name().clone()));
        let schema_error = |message: String| Error::Schema {
            url: url.to_string(),
            message,
        };
        let mut projection = Vec::with_capacity(config.schema.fields().len());
        for field in config.schema.fields() {
            match text_schema.index_of(field.name()) {
                Ok(i) => projection.push(Some(i)),
                Err(_) if config.null_missing => projection.push(None),
                Err(_) => {
                    return Err(schema_error(format!(
                        "the header has no column {:?} (it has {:?}); pass format_options={{\"missing_columns\": \"null\"}} to read it as nulls",
                        field.name(),
                        field_names(&text_schema)
                    )));
                }
            }
        }
        Ok(Self {
            text_schema,
            projection,
        })
    }
}

struct PreparedCsv {
    config: Arc<Config>,
}

impl Format for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("csv");
        let limit = compression::limit_option(&mut opts)?;
        let null_missing = match opts.string("missing_columns")? {
            None | Some("error") => false,
            Some("null") => true,
            Some(other) => {
                return Err(Error::invalid_argument(format!(
                    "format_options[\"missing_columns\"] must be \"error\" or \"null\", not {other:?}"
                )));
            }
        };
        opts.finish()?;
        if options.features.is_some() {
            return Err(Error::invalid_argument(
                "features= is for TFRecord; CSV takes schema= or infers types",
            ));
        }
        let Some(first) = shards.first() else {
            return Err(Error::invalid_argument("no CSV files"));
        };
        let url = first.url.as_str();
        // The first block of the first file: its header names the columns, its records
        // give the types.
        let mut stream = compression::auto_gzip(io.open(first)?.open_stream()?, url, limit)?;
        let mut head = None;
        split_blocks(
            &mut *stream,
            url,
            FORMAT,
            BLOCK_BYTES,
            last_record_end,
            &mut |block, _| {
                head = Some(block);
                false
            },
        )?;
        let head = head.unwrap_or_default();
        let (names, _) = CsvFormat::default()
            .with_header(true)
            .infer_schema(&head[..], Some(0))
            .map_err(|e| Error::decode(url, FORMAT, Position::Line(1), e))?;
        let text_schema = text_schema(names.fields().iter().map(|f| f.name().clone()));
        let types: Vec<DataType> = match &options.schema {
            Some(given) => names
                .fields()
                .iter()
                .map(|f| {
                    given
                        .field_with_name(f.name())
                        .map(|g| g.data_type().clone())
                        .unwrap_or(DataType::Utf8)
                })
                .collect(),
            None => {
                let sample = parse_text(&text_schema, &head, true, INFER_RECORDS)
                    .map_err(|e| Error::decode(url, FORMAT, Position::Line(1), e))?;
                (0..text_schema.fields().len())
                    .map(|i| infer_type(sample.column(i).as_string::<i32>()))
                    .collect()
            }
        };
        let projection: Vec<usize> = match &options.columns {
            None => (0..types.len()).collect(),
            Some(columns) => column_indices(&field_names(&text_schema), columns, url)?,
        };
        let schema = Arc::new(Schema::new(
            projection
                .iter()
                .map(|&i| Field::new(text_schema.field(i).name(), types[i].clone(), true))
                .collect::<Vec<_>>(),
        ));
        let units = whole_files(&shards);
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            PreparedCsv {
                config: Arc::new(Config {
                    schema,
                    limit,
                    null_missing,
                }),
            },
        ))
    }
}

fn text_schema(names: impl Iterator<Item = String>) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ))
}

/// Parses CSV text into all-string columns (empty fields as nulls), up to `max_rows`.
/// `data` with its last record ended by a line end, as csv-core ends it at the end of
/// the input (closing an open quote first). arrow-csv 60 mis-reads a last record left
/// open at the end of its input, with or without a final newline (inside quotes): it
/// returned bytes of another record for it (found by the fuzzer, with std's checks
/// showing an out-of-range `str::get_unchecked`).
fn line_ended(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // Whether the input's last record is still open at its end.
    let open = |bytes: &[u8]| {
        let mut parser = RecordEnds::new();
        parser.feed(bytes, &mut |_| {});
        let mut open = false;
        parser.finish(&mut |_| open = true);
        open
    };
    // Most blocks end at a line end outside quotes: with no quote in them at all, that
    // needs no second pass of the parser.
    let ended_unquoted =
        matches!(data.last(), Some(b'\n' | b'\r')) && memchr::memchr(b'"', data).is_none();
    if data.is_empty() || ended_unquoted || !open(data) {
        return std::borrow::Cow::Borrowed(data);
    }
    for ending in [&b"\n"[..], b"\"\n"] {
        let mut ended = data.to_vec();
        ended.extend_from_slice(ending);
        if !open(&ended) {
            return std::borrow::Cow::Owned(ended);
        }
    }
    std::borrow::Cow::Borrowed(data)
}

fn parse_text(
    schema: &SchemaRef,
    data: &[u8],
    header: bool,
    max_rows: usize,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let data = &*line_ended(data);
    let mut decoder = arrow_csv::ReaderBuilder::new(schema.clone())
        .with_header(header)
        .with_batch_size(max_rows.clamp(1, 8192))
        .build_decoder();
    let mut pos = 0;
    let mut rows = 0;
    let mut batches = Vec::new();
    loop {
        let n = decoder.decode(&data[pos..])?;
        pos += n;
        // `decode` stops when a batch is full, or has used all input (an empty call
        // then finishes a last record without a line end).
        if let Some(batch) = decoder.flush()? {
            rows += batch.num_rows();
            batches.push(batch);
        } else if n == 0 {
            break;
        }
        if rows >= max_rows {
            break;
        }
    }
    arrow_select::concat::concat_batches(schema, &batches)
}

fn is_null_token(s: &str) -> bool {
    NULL_TOKENS.contains(&s)
}

/// The narrowest type every non-null value fits, in pyarrow's order of preference.
fn infer_type(values: &StringArray) -> DataType {
    let tokens: Vec<&str> = values
        .iter()
        .flatten()
        .filter(|s| !is_null_token(s))
        .collect();
    if tokens.is_empty() {
        return DataType::Null;
    }
    let all = |f: fn(&str) -> bool| tokens.iter().all(|s| f(s));
    if all(|s| s.parse::<i64>().is_ok()) {
        DataType::Int64
    } else if all(|s| TRUE_TOKENS.contains(&s) || FALSE_TOKENS.contains(&s)) {
        DataType::Boolean
    } else if all(|s| s.parse::<f64>().is_ok()) {
        DataType::Float64
    } else if all(is_date) {
        DataType::Date32
    } else if all(|s| is_timestamp(s).is_some()) {
        let unit = tokens
            .iter()
            .filter_map(|s| is_timestamp(s))
            .max()
            .unwrap_or(0);
        DataType::Timestamp(
            if unit == 0 {
                TimeUnit::Second
            } else {
                TimeUnit::Nanosecond
            },
            None,
        )
    } else {
        DataType::Utf8
    }
}

/// `YYYY-MM-DD` naming a real day.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| {
        s.get(r)
            .filter(|p| p.bytes().all(|c| c.is_ascii_digit()))?
            .parse::<u32>()
            .ok()
    };
    let (Some(year), Some(month), Some(day)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    (1..=12).contains(&month) && day >= 1 && day <= days[month as usize - 1]
}

/// `YYYY-MM-DD[T ]hh:mm[:ss[.fff]]`: `Some(0)` without fractions, `Some(1)` with.
fn is_timestamp(s: &str) -> Option<u8> {
    // `get` rather than slicing: byte 10 or 11 may fall inside a multibyte character.
    let (date, time) = (s.get(..10)?, s.get(11..)?);
    if s.len() < 16 || !is_date(date) || !matches!(s.as_bytes()[10], b' ' | b'T') {
        return None;
    }
    let (time, zone_ok) = match time.strip_suffix('Z') {
        Some(t) => (t, true),
        None => (time, true),
    };
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (time, None),
    };
    let parts: Vec<&str> = hms.split(':').collect();
    let ok = zone_ok
        && (parts.len() == 2 || parts.len() == 3)
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_digit()))
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()));
    ok.then_some(u8::from(frac.is_some()))
}

/// Converts a parsed text column to `target`, pyarrow style.
fn convert(text: &StringArray, target: &DataType) -> std::result::Result<ArrayRef, String> {
    match target {
        // Strings keep every value as written; an empty field is "". Checked, not
        // asserted: the text's buffer held invalid UTF-8 in one fuzzed file.
        DataType::Utf8 => StringArray::try_new(text.offsets().clone(), text.values().clone(), None)
            .map(|strings| Arc::new(strings) as ArrayRef)
            .map_err(|e| e.to_string()),
        DataType::Null => match text.iter().flatten().find(|s| !is_null_token(s)) {
            Some(value) => Err(format!(
                "{value:?} in a column of nulls (pass schema= to type it)"
            )),
            None => Ok(Arc::new(arrow_array::NullArray::new(text.len()))),
        },
        DataType::Boolean => {
            let values = text
                .iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some(s) if is_null_token(s) => Ok(None),
                    Some(s) if TRUE_TOKENS.contains(&s) => Ok(Some(true)),
                    Some(s) if FALSE_TOKENS.contains(&s) => Ok(Some(false)),
                    Some(s) => Err(format!("{s:?} is not a boolean")),
                })
                .collect::<std::result::Result<BooleanArray, String>>()?;
            Ok(Arc::new(values))
        }
        other => {
            let cleaned: StringArray = text
                .iter()
                .map(|v| v.filter(|s| !is_null_token(s)))
                .collect();
            let options = arrow_cast::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow_cast::cast_with_options(&cleaned, other, &options).map_err(|e| e.to_string())
        }
    }
}

/// Finds where records end as csv-core, the parser arrow-csv decodes with, does in its
/// default settings (which are ours): quotes count only at the start of a field, `""`
/// inside quotes is a quote, `\r`, `\n` and `\r\n` end a record, blank lines are
/// passed over. Counting quotes instead would disagree with the decoder on a stray
/// quote (`5"3,x`), and cut a block or index a record where the decoder does not.
struct RecordEnds {
    parser: csv_core::Reader,
    /// Bytes fed so far.
    fed: u64,
}

impl RecordEnds {
    fn new() -> Self {
        Self {
            parser: csv_core::Reader::new(),
            fed: 0,
        }
    }

    /// Feeds the next bytes; `end` gets the offset just past each record ending in them.
    fn feed(&mut self, mut data: &[u8], end: &mut dyn FnMut(u64)) {
        // The fields' bytes are not needed, only the parser's state: scratch space.
        let (mut fields, mut field_ends) = ([0u8; 4096], [0usize; 64]);
        while !data.is_empty() {
            let (result, read, _, _) = self.parser.read_record(data, &mut fields, &mut field_ends);
            data = &data[read..];
            self.fed += read as u64;
            if matches!(result, csv_core::ReadRecordResult::Record) {
                end(self.fed);
            } else if read == 0 {
                break; // cannot happen with room for output; never spin
            }
        }
    }

    /// The end of the input: a last record without a line end ends here.
    fn finish(&mut self, end: &mut dyn FnMut(u64)) {
        let (mut fields, mut field_ends) = ([0u8; 4096], [0usize; 64]);
        loop {
            match self.parser.read_record(&[], &mut fields, &mut field_ends).0 {
                csv_core::ReadRecordResult::Record => end(self.fed),
                csv_core::ReadRecordResult::End | csv_core::ReadRecordResult::InputEmpty => {
                    return;
                }
                _ => {}
            }
        }
    }
}

/// The position of the last byte of the last whole record in `data` (which starts at a
/// record's start), for the block splitter.
fn last_record_end(data: &[u8]) -> Option<usize> {
    let mut last = None;
    RecordEnds::new().feed(data, &mut |end| last = Some(end));
    last.map(|end| end as usize - 1)
}

impl RecordCodec for Config {
    fn scan(
        &self,
        shard: &ShardMeta,
        stream: Box<dyn std::io::Read + Send>,
        key: String,
    ) -> Result<ShardIndex> {
        let url = shard.url.as_str();
        let (mut reader, gzip) = compression::sniff_gzip(stream, url, self.limit)?;
        // Record ends; the first record is the header, whose bytes the index keeps.
        let mut ends = Vec::new();
        let mut header = Vec::new();
        let mut parser = RecordEnds::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = super::blocks::read_full(&mut reader, &mut buf)
                .map_err(|e| compression::stream_error(url, Position::Byte(parser.fed), e))?;
            if n == 0 {
                break;
            }
            let (start, in_header) = (parser.fed, ends.is_empty());
            parser.feed(&buf[..n], &mut |end| ends.push(end));
            if in_header {
                let upto = ends.first().map_or(n, |&first| (first - start) as usize);
                header.extend_from_slice(&buf[..upto]);
            }
        }
        parser.finish(&mut |end| ends.push(end));
        if ends.is_empty() {
            ends.push(parser.fed);
        }
        Ok(ShardIndex::new(key, ends, !gzip, header))
    }

    fn decode_records(
        &self,
        shard: &ShardMeta,
        index: &ShardIndex,
        data: bytes::Bytes,
        first: u64,
    ) -> Result<Decoded> {
        let layout = FileLayout::from_header(self, &shard.url, &index.header)?;
        // Line numbers as if no record spanned lines: the header is line 1.
        decode_block(self, &layout, &shard.url, &data, first + 2)
    }
}

impl UnitJobs for PreparedCsv {
    fn record_codec(&self) -> Option<Arc<dyn RecordCodec>> {
        Some(self.config.clone())
    }

    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url: Arc<str> = shard.url.as_str().into();
        let config = self.config.clone();
        UnitJob::Stream(Box::new(move |stream, emit: &mut EmitTask| {
            let mut reader = compression::auto_gzip(stream, &url, config.limit)?;
            let mut layout: Option<Arc<FileLayout>> = None;
            let mut failed = None;
            split_blocks(
                &mut *reader,
                &url,
                FORMAT,
                BLOCK_BYTES,
                last_record_end,
                &mut |block, first_line| {
                    if first_line == 1 {
                        match FileLayout::from_header(&config, &url, &block) {
                            Ok(found) => layout = Some(Arc::new(found)),
                            Err(e) => {
                                failed = Some(e);
                                return false;
                            }
                        }
                    }
                    let Some(layout) = layout.clone() else {
                        return false;
                    };
                    let (config, url) = (config.clone(), url.clone());
                    emit(task(move || {
                        decode_block(&config, &layout, &url, &block, first_line)
                    }))
                },
            )?;
            failed.map_or(Ok(()), Err)
        }))
    }
}

fn decode_block(
    config: &Config,
    layout: &FileLayout,
    url: &str,
    block: &[u8],
    first_line: u64,
) -> Result<Decoded> {
    let header = first_line == 1;
    let at = |m: String| {
        Error::decode(
            url,
            FORMAT,
            Position::Line(first_line),
            format!("{m} (in the block of records from line {first_line})"),
        )
    };
    let text = parse_text(&layout.text_schema, block, header, usize::MAX)
        .map_err(|e| at(e.to_string()))?;
    let mut columns = Vec::with_capacity(layout.projection.len());
    for (&i, field) in layout.projection.iter().zip(config.schema.fields()) {
        let column = match i {
            Some(i) => convert(text.column(i).as_string::<i32>(), field.data_type())
                .map_err(|m| at(format!("column {:?}: {m}", field.name())))?,
            None => arrow_array::new_null_array(field.data_type(), text.num_rows()),
        };
        columns.push(column);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(text.num_rows()));
    let batch = RecordBatch::try_new_with_options(config.schema.clone(), columns, &options)
        .map_err(|e| at(e.to_string()))?;
    Ok(Decoded {
        batches: vec![batch],
        skipped: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_ends_are_the_decoders() {
        let ends = |data: &[u8]| {
            let mut out = Vec::new();
            let mut parser = RecordEnds::new();
            // Fed in pieces: a record may span them.
            for piece in data.chunks(3) {
                parser.feed(piece, &mut |e| out.push(e));
            }
            parser.finish(&mut |e| out.push(e));
            out
        };
        // A newline inside quotes is data; blank lines are passed over; `\r` ends a
        // record (and the `\n` of a CRLF is then a blank line).
        assert_eq!(ends(b"x,\"a\nb\"\n\ny,z\r\nw,v"), vec![8, 13, 17]);
        // Quotes count only at a field's start: `5"3` is a value, so the line ends.
        assert_eq!(ends(b"5\"3,x\n1,2\n"), vec![6, 10]);
        // After a closing quote the field goes on: `"i"d` is `id`, one field.
        assert_eq!(ends(b"\"i\"d,t\n0,\"\"\n"), vec![7, 12]);
        assert_eq!(last_record_end(b"a,b\n1,\"x\ny"), Some(3));
    }

    #[test]
    fn a_last_record_is_ended_as_csv_core_ends_it() {
        assert_eq!(&*line_ended(b"a\n1"), b"a\n1\n");
        assert_eq!(&*line_ended(b"a\n1\n"), b"a\n1\n");
        // An open quote is closed first; a closed one is not doubled.
        assert_eq!(&*line_ended(b"a\n\"x"), b"a\n\"x\"\n");
        assert_eq!(&*line_ended(b"a\n\"x\""), b"a\n\"x\"\n");
        // A final newline inside an open quote does not end the record.
        assert_eq!(&*line_ended(b"a\n\"x\n"), b"a\n\"x\n\"\n");
        assert_eq!(&*line_ended(b"a\n1\n\n"), b"a\n1\n\n");
        let schema = Arc::new(Schema::new(vec![Field::new("", DataType::Utf8, true)]));
        let batch = parse_text(
            &schema,
            b"\n\"\"\n\n:\"-id\"58l\n\x00\x01\x00\x00l\"",
            true,
            10,
        )
        .unwrap();
        let text = batch.column(0).as_string::<i32>();
        assert_eq!(text.value(1), "\u{0}\u{1}\u{0}\u{0}l\"");
    }

    #[test]
    fn record_ends_skip_quoted_newlines() {
        assert_eq!(last_record_end(b"a,b\n\"x\ny\",2\n\"open\n"), Some(11));
        assert_eq!(last_record_end(b"\"only\nquoted"), None);
    }

    #[test]
    fn infers_like_pyarrow() {
        let col = |v: &[Option<&str>]| StringArray::from(v.to_vec());
        assert_eq!(
            infer_type(&col(&[Some("1"), Some("-2"), None])),
            DataType::Int64
        );
        assert_eq!(
            infer_type(&col(&[Some("1.5"), Some("2"), Some("NA")])),
            DataType::Float64
        );
        assert_eq!(
            infer_type(&col(&[Some("true"), Some("False")])),
            DataType::Boolean
        );
        assert_eq!(infer_type(&col(&[Some("2020-01-31")])), DataType::Date32);
        assert_eq!(
            infer_type(&col(&[Some("2020-01-31 10:00:00")])),
            DataType::Timestamp(TimeUnit::Second, None)
        );
        assert_eq!(infer_type(&col(&[Some("x"), Some("1")])), DataType::Utf8);
        assert_eq!(infer_type(&col(&[None, None])), DataType::Null);
    }

    #[test]
    fn multibyte_text_near_dates_is_text() {
        for s in [
            "2024-01-0éT12:00:00",
            "2024-01-01éT12:00:00",
            "2024-01-01Té2:00:00",
            "é024-01-01T12:00:00",
            "2024-01-01T12:00:0é",
        ] {
            assert_eq!(is_timestamp(s), None, "{s}");
            assert_eq!(infer_type(&StringArray::from(vec![s])), DataType::Utf8);
        }
    }
}
