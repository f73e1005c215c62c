//! NumPy `.npz` archives: zip files of `.npy` members, stored (`np.savez`) or deflated
//! (`np.savez_compressed`). Sizes come from the central directory: numpy writes zip64
//! local headers whose sizes are 0xFFFFFFFF. A member read whole (sample mode, and
//! deflated members in rows mode) has its CRC checked; rows of stored members are read
//! by range and are not, as that would mean reading the whole member. A deflated
//! member may not expand past its declared size or `max_decompressed_bytes`.

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;
use flate2::read::DeflateDecoder;

use super::npy::{self, Header, Mode};
use super::{
    BatchSink, Decoded, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit,
    column_indices, field_names, per_shard, whole_file_job,
};
use crate::error::{Error, Position, Result};
use crate::source::ranges::RangeSet;
use crate::source::{Io, ShardMeta, Source};

const FORMAT: &str = "NPZ";
const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
/// The end-of-directory record plus the longest possible comment.
const TAIL: u64 = 22 + 65535 + 20 + 56;
const STORED: u16 = 0;
const DEFLATED: u16 = 8;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// A member as the central directory describes it.
#[derive(Debug, Clone)]
struct Entry {
    /// The array name: the member name without `.npy`.
    name: String,
    method: u16,
    crc: u32,
    compressed: u64,
    uncompressed: u64,
    local_offset: u64,
}

/// Locates and parses the central directory from the file's last bytes.
fn directory_location(tail: &[u8], tail_start: u64) -> Result<(u64, u64), String> {
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(tail, i) == Some(EOCD_SIG))
        .ok_or("not a zip archive (no end of central directory)")?;
    let mut size = u64::from(u32_at(tail, eocd + 12).ok_or("truncated zip directory")?);
    let mut offset = u64::from(u32_at(tail, eocd + 16).ok_or("truncated zip directory")?);
    if size == 0xffff_ffff || offset == 0xffff_ffff || u16_at(tail, eocd + 10) == Some(0xffff) {
        let locator = eocd.checked_sub(20).ok_or("zip64 locator missing")?;
        if u32_at(tail, locator) != Some(ZIP64_LOCATOR_SIG) {
            return Err("zip64 locator missing".into());
        }
        let record = u64_at(tail, locator + 8).ok_or("truncated zip64 locator")?;
        let at = record
            .checked_sub(tail_start)
            .ok_or("zip64 directory record out of reach")? as usize;
        if u32_at(tail, at) != Some(ZIP64_EOCD_SIG) {
            return Err("bad zip64 directory record".into());
        }
        size = u64_at(tail, at + 40).ok_or("truncated zip64 record")?;
        offset = u64_at(tail, at + 48).ok_or("truncated zip64 record")?;
    }
    Ok((offset, size))
}

fn parse_directory(cd: &[u8]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at + 4 <= cd.len() && u32_at(cd, at) == Some(CENTRAL_SIG) {
        let field = |off: usize| u32_at(cd, at + off).ok_or("truncated zip directory entry");
        let method = u16_at(cd, at + 10).ok_or("truncated zip directory entry")?;
        let crc = field(16)?;
        let mut compressed = u64::from(field(20)?);
        let mut uncompressed = u64::from(field(24)?);
        let name_len = usize::from(u16_at(cd, at + 28).ok_or("truncated zip directory entry")?);
        let extra_len = usize::from(u16_at(cd, at + 30).ok_or("truncated zip directory entry")?);
        let comment_len = usize::from(u16_at(cd, at + 32).ok_or("truncated zip directory entry")?);
        let mut local_offset = u64::from(field(42)?);
        let name = cd
            .get(at + 46..at + 46 + name_len)
            .ok_or("truncated member name")?;
        let extra = cd
            .get(at + 46 + name_len..at + 46 + name_len + extra_len)
            .ok_or("truncated extra field")?;
        // The zip64 extra field holds, in order, the 64-bit values of maxed-out fields.
        let mut e = 0;
        while e + 4 <= extra.len() {
            let id = u16_at(extra, e).unwrap_or(0);
            let len = usize::from(u16_at(extra, e + 2).unwrap_or(0));
            if id == 0x0001 {
                let mut values = (0..len / 8).filter_map(|i| u64_at(extra, e + 4 + 8 * i));
                if uncompressed == 0xffff_ffff {
                    uncompressed = values.next().ok_or("short zip64 field")?;
                }
                if compressed == 0xffff_ffff {
                    compressed = values.next().ok_or("short zip64 field")?;
                }
                if local_offset == 0xffff_ffff {
                    local_offset = values.next().ok_or("short zip64 field")?;
                }
            }
            e += 4 + len;
        }
        let name = String::from_utf8_lossy(name);
        let Some(array) = name.strip_suffix(".npy") else {
            return Err(format!("member {name:?} is not an .npy array"));
        };
        entries.push(Entry {
            name: array.to_string(),
            method,
            crc,
            compressed,
            uncompressed,
            local_offset,
        });
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(entries)
}

/// Where a member's data starts, from its local header.
fn data_offset(entry: &Entry, local: &[u8]) -> Result<u64, String> {
    if u32_at(local, 0) != Some(LOCAL_SIG) {
        return Err(format!("member {:?}: bad local header", entry.name));
    }
    let n = u64::from(u16_at(local, 26).ok_or("truncated local header")?);
    let e = u64::from(u16_at(local, 28).ok_or("truncated local header")?);
    Ok(entry.local_offset + 30 + n + e)
}

/// The data a member's header promises must be the data the member holds: rows are
/// fetched by offsets computed from the shape.
fn check_member_size(entry: &Entry, header: &Header) -> Result<(), String> {
    let promised = header.data_len().ok_or("the shape overflows")?;
    let held = entry.uncompressed.saturating_sub(header.data_offset as u64);
    if promised != held {
        return Err(format!(
            "the header promises {promised} bytes of data, the member holds {held}"
        ));
    }
    Ok(())
}

/// A member's bytes, decompressed and checked.
fn member_bytes(entry: &Entry, raw: Bytes, limit: u64) -> Result<Bytes, String> {
    let data = match entry.method {
        STORED => raw,
        DEFLATED => {
            if entry.uncompressed > limit {
                return Err(format!(
                    "member {:?} claims {} bytes once decompressed, over the limit of {limit} (format_options max_decompressed_bytes)",
                    entry.name, entry.uncompressed
                ));
            }
            // Deflate expands at most 1032-fold: a size the member cannot reach is
            // never reserved. One no allocation can hold is not reserved at all (the
            // read grows the buffer as bytes come) instead of aborting the process.
            let reserve = entry
                .uncompressed
                .min((raw.len() as u64).saturating_mul(1032));
            let mut out = Vec::new();
            let _ = out.try_reserve_exact(usize::try_from(reserve).unwrap_or(usize::MAX));
            // One byte more than declared reveals a member that expands past its size.
            DeflateDecoder::new(&raw[..])
                .take(entry.uncompressed + 1)
                .read_to_end(&mut out)
                .map_err(|e| format!("member {:?}: {e}", entry.name))?;
            Bytes::from(out)
        }
        other => {
            return Err(format!(
                "member {:?} uses zip method {other}; numpy writes 0 or 8",
                entry.name
            ));
        }
    };
    if data.len() as u64 != entry.uncompressed {
        return Err(format!(
            "member {:?} holds {} bytes, the directory says {}",
            entry.name,
            data.len(),
            entry.uncompressed
        ));
    }
    if crc32fast::hash(&data) != entry.crc {
        return Err(format!("member {:?}: CRC mismatch", entry.name));
    }
    Ok(data)
}

/// One archive, parsed from its bytes in memory.
fn arrays(
    url: &str,
    whole: &Bytes,
    limit: u64,
    rows: bool,
) -> Result<Vec<(String, Header, Bytes)>> {
    let corrupt = |m: String| Error::decode(url, FORMAT, Position::Unknown, m);
    let size = whole.len() as u64;
    let tail_start = size.saturating_sub(TAIL);
    let (offset, len) =
        directory_location(&whole[tail_start as usize..], tail_start).map_err(corrupt)?;
    let cd = whole
        .get(offset as usize..offset.saturating_add(len) as usize)
        .ok_or_else(|| corrupt("central directory out of bounds".into()))?;
    let mut out = Vec::new();
    for entry in parse_directory(cd).map_err(corrupt)? {
        let local = whole.get(entry.local_offset as usize..).unwrap_or_default();
        let start = data_offset(&entry, local).map_err(corrupt)?;
        let end = start.checked_add(entry.compressed).filter(|&e| e <= size);
        let end = end.ok_or_else(|| {
            corrupt(format!(
                "member {:?} runs past the end of the file",
                entry.name
            ))
        })?;
        let data = member_bytes(&entry, whole.slice(start as usize..end as usize), limit)
            .map_err(corrupt)?;
        let header = npy::parse_header(&data)
            .and_then(|header| header.check(rows).map(|()| header))
            .map_err(|m| corrupt(format!("member {:?}: {m}", entry.name)))?;
        let body = data.slice(header.data_offset.min(data.len())..);
        out.push((entry.name, header, body));
    }
    Ok(out)
}

/// Archive directories read over ranges (rows mode needs each member's layout).
struct Layout {
    members: Vec<(Entry, u64, Header)>,
}

async fn read_layout(src: &dyn Source, size: u64, rows: bool) -> Result<Layout> {
    let url = src.url();
    let corrupt = |m: String| Error::decode(url, FORMAT, Position::Unknown, m);
    let tail_start = size.saturating_sub(TAIL);
    let tail = src.read_range(tail_start..size).await?;
    let (offset, len) = directory_location(&tail, tail_start).map_err(corrupt)?;
    if offset.saturating_add(len) > size {
        return Err(corrupt("central directory out of bounds".into()));
    }
    let cd = src.read_range(offset..offset + len).await?;
    let mut members = Vec::new();
    for entry in parse_directory(&cd).map_err(corrupt)? {
        if entry.local_offset.saturating_add(30) > size {
            return Err(corrupt(format!("member {:?} out of bounds", entry.name)));
        }
        let local = src
            .read_range(entry.local_offset..(entry.local_offset + 30 + 1024).min(size))
            .await?;
        let start = data_offset(&entry, &local).map_err(corrupt)?;
        if start.saturating_add(entry.compressed) > size {
            return Err(corrupt(format!(
                "member {:?} runs past the end of the file",
                entry.name
            )));
        }
        let header = if entry.method == STORED {
            let prefix = src
                .read_range(start..(start + 64 * 1024).min(start + entry.compressed))
                .await?;
            npy::parse_header(&prefix)
        } else {
            // Inflate just enough of the member to read its header.
            let raw = src
                .read_range(start..(start + 64 * 1024).min(start + entry.compressed))
                .await?;
            let mut prefix = Vec::new();
            let _ = DeflateDecoder::new(&raw[..])
                .take(64 * 1024)
                .read_to_end(&mut prefix);
            npy::parse_header(&prefix)
        }
        .and_then(|header| {
            header.check(rows)?;
            check_member_size(&entry, &header)?;
            Ok(header)
        })
        .map_err(|m| corrupt(format!("member {:?}: {m}", entry.name)))?;
        members.push((entry, start, header));
    }
    Ok(Layout { members })
}

pub struct Npz;

struct PreparedNpz {
    schema: SchemaRef,
    mode: Mode,
    limit: u64,
    /// Rows mode: each file's layout, and whether its rows can be read by range.
    layouts: Vec<Layout>,
    unit_rows: usize,
}

impl Format for Npz {
    fn name(&self) -> &'static str {
        "npz"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let (mode, limit) = npy::parse_mode(options, "npz")?;
        let rows_mode = mode == Mode::Rows;
        // Sample mode reads only the first archive's layout (for the schema); each
        // archive is parsed whole when its unit runs.
        let wanted = if rows_mode {
            &shards[..]
        } else {
            &shards[..shards.len().min(1)]
        };
        let layouts: Vec<Layout> = per_shard(wanted, io, FORMAT, move |source, size| {
            Box::pin(async move { read_layout(source.as_ref(), size, rows_mode).await })
        })?
        .into_iter()
        .collect::<Result<_>>()?;
        let schema: SchemaRef = match layouts.first() {
            Some(layout) => Arc::new(Schema::new(
                layout
                    .members
                    .iter()
                    .map(|(e, _, h)| h.field(&e.name, rows_mode))
                    .collect::<Vec<_>>(),
            )),
            None => Arc::new(Schema::empty()),
        };
        let schema = match (&options.columns, shards.first()) {
            (Some(columns), Some(first)) => {
                let indices = column_indices(&field_names(&schema), columns, &first.url)?;
                Arc::new(
                    schema
                        .project(&indices)
                        .map_err(|e| Error::Internal(e.to_string()))?,
                )
            }
            _ => schema,
        };
        let mut units = Vec::new();
        let mut unit_rows = 1;
        match mode {
            Mode::Sample => {
                units = (0..shards.len())
                    .map(|shard| WorkUnit {
                        shard,
                        part: 0,
                        rows: Some(1),
                    })
                    .collect()
            }
            Mode::Rows => {
                let row_bytes: u64 = layouts[0]
                    .members
                    .iter()
                    .map(|(_, _, h)| h.row_bytes() as u64)
                    .fold(0, u64::saturating_add);
                unit_rows = (8 * 1024 * 1024 / row_bytes.max(1)).max(1) as usize;
                for (shard, layout) in layouts.iter().enumerate() {
                    let rows = check_rows(&shards[shard].url, layout, &schema)?;
                    let step = if rangeable(layout) {
                        unit_rows
                    } else {
                        rows.max(1)
                    };
                    for (part, start) in (0..rows).step_by(step.max(1)).enumerate() {
                        units.push(WorkUnit {
                            shard,
                            part,
                            rows: Some(step.min(rows - start) as u64),
                        });
                    }
                }
            }
        }
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            PreparedNpz {
                schema,
                mode,
                limit,
                layouts,
                unit_rows,
            },
        ))
    }
}

/// All members must share their first dimension; returns it.
fn check_rows(url: &str, layout: &Layout, schema: &SchemaRef) -> Result<usize> {
    let mut rows = None;
    for (entry, _, header) in &layout.members {
        let Some(&n) = header.shape.first() else {
            return Err(Error::decode(
                url,
                FORMAT,
                Position::Unknown,
                format!(
                    "array {:?} is a scalar; rows mode needs a first axis",
                    entry.name
                ),
            ));
        };
        if *rows.get_or_insert(n) != n {
            return Err(Error::Schema {
                url: url.into(),
                message: format!(
                    "arrays have different lengths ({} and {n}, at {:?})",
                    rows.unwrap_or(0),
                    entry.name
                ),
            });
        }
        if let Ok(field) = schema.field_with_name(&entry.name)
            && field.data_type() != header.field(&entry.name, true).data_type()
        {
            return Err(Error::Schema {
                url: url.into(),
                message: format!(
                    "array {:?} has dtype/shape {:?} {:?}, unlike the first archive",
                    entry.name, header.elem, header.shape
                ),
            });
        }
    }
    Ok(rows.unwrap_or(0))
}

/// Whether rows can be fetched by byte range: every member stored and in C order.
fn rangeable(layout: &Layout) -> bool {
    layout
        .members
        .iter()
        .all(|(e, _, h)| e.method == STORED && !(h.fortran && h.shape.len() > 1))
}

impl UnitJobs for PreparedNpz {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let url = shard.url.clone();
        let schema = self.schema.clone();
        let limit = self.limit;
        let rows = unit.rows.unwrap_or(1) as usize;
        if self.mode == Mode::Rows && rangeable(&self.layouts[unit.shard]) {
            let layout = &self.layouts[unit.shard];
            let first_row = unit.part * self.unit_rows;
            let mut wanted: Vec<(Header, Range<u64>)> = Vec::new();
            for field in schema.fields() {
                let Some((_, start, header)) = layout
                    .members
                    .iter()
                    .find(|(e, _, _)| &e.name == field.name())
                else {
                    continue;
                };
                let row_bytes = header.row_bytes() as u64;
                let from = start + header.data_offset as u64 + first_row as u64 * row_bytes;
                wanted.push((header.clone(), from..from + rows as u64 * row_bytes));
            }
            let ranges = wanted.iter().map(|(_, r)| r.clone()).collect();
            return UnitJob::Ranges {
                ranges,
                decode: Box::new(move |fetched: RangeSet, _: &mut BatchSink| {
                    let mut columns = Vec::new();
                    for (field, (header, range)) in schema.fields().iter().zip(&wanted) {
                        let corrupt = |m: String| {
                            Error::decode(
                                &url,
                                FORMAT,
                                Position::Byte(range.start),
                                format!("array {:?}: {m}", field.name()),
                            )
                        };
                        let data = fetched
                            .get(range.start, range.end - range.start)
                            .ok_or_else(|| corrupt("range not fetched".into()))?;
                        let leaf = npy::leaf_array(header, data, rows * header.row_values())
                            .map_err(corrupt)?;
                        columns.push(npy::column(field, leaf, rows).map_err(corrupt)?);
                    }
                    let batch = RecordBatch::try_new(schema, columns)
                        .map_err(|e| Error::Internal(e.to_string()))?;
                    Ok(Decoded {
                        batches: vec![batch],
                        skipped: Vec::new(),
                    })
                }),
            };
        }
        let mode = self.mode;
        let decode = move |whole: Bytes| {
            let members = arrays(&url, &whole, limit, mode == Mode::Rows)?;
            let mut columns = Vec::new();
            for field in schema.fields() {
                let corrupt = |m: String| {
                    Error::decode(
                        &url,
                        FORMAT,
                        Position::Unknown,
                        format!("array {:?}: {m}", field.name()),
                    )
                };
                let Some((_, header, body)) =
                    members.iter().find(|(name, _, _)| name == field.name())
                else {
                    return Err(Error::Schema {
                        url: url.clone(),
                        message: format!("no array {:?} in this archive", field.name()),
                    });
                };
                if header.field(field.name(), mode == Mode::Rows).data_type() != field.data_type() {
                    return Err(Error::Schema {
                        url: url.clone(),
                        message: format!(
                            "array {:?} is {:?} {:?}, unlike the first archive",
                            field.name(),
                            header.elem,
                            header.shape
                        ),
                    });
                }
                let leaf = npy::leaf_array(header, body.clone(), header.count().unwrap_or(0))
                    .map_err(corrupt)?;
                columns.push(npy::column(field, leaf, rows).map_err(corrupt)?);
            }
            let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
            let batch = RecordBatch::try_new_with_options(schema, columns, &options)
                .map_err(|e| Error::Internal(e.to_string()))?;
            Ok(Decoded {
                batches: vec![batch],
                skipped: Vec::new(),
            })
        };
        whole_file_job(shard, decode)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn entry(method: u16, uncompressed: u64, data: &[u8]) -> Entry {
        Entry {
            name: "a".into(),
            method,
            crc: crc32fast::hash(data),
            compressed: 0,
            uncompressed,
            local_offset: 0,
        }
    }

    #[test]
    // zlib-rs frees its state while a protected reference to it lives (upstream issue
    // trifectatechfoundation/zlib-rs#491): Miri stops in its code, not ours.
    #[cfg_attr(miri, ignore = "zlib-rs#491: UB in zlib-rs's drop")]
    fn a_member_cannot_claim_more_than_it_holds() {
        let data = vec![7u8; 1000];
        let mut deflated = flate2::write::DeflateEncoder::new(Vec::new(), Default::default());
        deflated.write_all(&data).unwrap();
        let raw = Bytes::from(deflated.finish().unwrap());
        // Nearly 4 GiB declared, within the limit: refused once the data runs out.
        let lie = entry(DEFLATED, 0xFFFF_FFF0, &data);
        let err = member_bytes(&lie, raw.clone(), 64 << 30).unwrap_err();
        assert!(err.contains("holds 1000 bytes"), "{err}");
        let err = member_bytes(&lie, raw.clone(), 1 << 20).unwrap_err();
        assert!(err.contains("max_decompressed_bytes"), "{err}");
        let honest = entry(DEFLATED, 1000, &data);
        assert_eq!(member_bytes(&honest, raw, 64 << 30).unwrap(), data);
    }

    #[test]
    fn a_header_must_describe_the_member_it_heads() {
        let header = |shape: Vec<usize>| Header {
            elem: npy::Elem::Float(8),
            big_endian: false,
            fortran: false,
            shape,
            data_offset: 128,
        };
        let member = entry(STORED, 128 + 800, &[]);
        assert!(check_member_size(&member, &header(vec![100])).is_ok());
        for lie in [
            vec![101],
            vec![99],
            vec![1 << 31, 1 << 31],
            vec![usize::MAX, 2],
        ] {
            assert!(
                check_member_size(&member, &header(lie.clone())).is_err(),
                "{lie:?}"
            );
        }
    }

    #[test]
    fn hostile_directories_are_errors() {
        // A zip64 locator pointing anywhere, and end records cut short.
        let mut tail = vec![0u8; 20];
        tail[..4].copy_from_slice(&ZIP64_LOCATOR_SIG.to_le_bytes());
        tail[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut eocd = EOCD_SIG.to_le_bytes().to_vec();
        eocd.extend_from_slice(&[0xff; 18]);
        tail.extend_from_slice(&eocd);
        assert!(directory_location(&tail, 0).is_err());
        assert!(directory_location(&tail, u64::MAX - 5).is_err());
        assert!(directory_location(&eocd[..10], 0).is_err());
        let mut cd = CENTRAL_SIG.to_le_bytes().to_vec();
        cd.extend_from_slice(&[0xff; 60]);
        assert!(parse_directory(&cd).is_err());
    }
}
