//! HDF5 files (`.h5`, `.hdf5`) through libhdf5: the `hdf5-metno` binding, with HDF5 built
//! from source into the extension, so nothing is needed on the system. Every layout
//! libhdf5 reads (contiguous, chunked, compact) and its built-in filters (gzip, shuffle,
//! fletcher32, n-bit, scale-offset) work, as libhdf5 applies them.
//!
//! Two modes, as for NPZ (`format_options={"mode": ...}`):
//! - `"sample"` (default): one file is one sample; each dataset is a column holding its
//!   whole array.
//! - `"rows"`: datasets are read along their first axis, a row per index;
//!   `format_options={"datasets": [...]}` chooses them, by default every dataset whose
//!   first dimension is the most common one.
//!
//! Datasets in groups are named by their path (`group/sub/x`). Values: integers and
//! floats of every width, booleans (h5py's enum), and fixed-length strings as bytes (as
//! numpy's `S` dtype). Variable-length strings and compound types are refused, naming
//! the dataset.
//!
//! libhdf5 reads files by path. A local file is opened where it is; a remote object is
//! fetched whole into a temporary file first (libhdf5 cannot read a stream), once for
//! its layout while preparing and once for its data: HDF5 over S3/HTTP suits files of
//! up to some hundreds of MB. libhdf5 serialises its calls, so files decode one at a time
//! across the decode threads.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ::hdf5::types::{FloatSize, IntSize, TypeDescriptor};
use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;

use super::npy::{self, Elem, Header, Mode};
use super::{
    Decoded, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit, column_indices,
    task, whole_file_job,
};
use crate::error::{Error, Position, Result};
use crate::source::{Io, ShardMeta, local_path, size_blocking};

const FORMAT: &str = "HDF5";

fn bad(url: &str, message: impl std::fmt::Display) -> Error {
    Error::decode(url, FORMAT, Position::Unknown, message)
}

/// A file libhdf5 can open: the local file, or a temporary copy of a remote one (removed
/// once opened: the open file keeps its data).
struct Opened {
    file: ::hdf5::File,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn open_path(url: &str, path: &str) -> Result<Opened> {
    let file = ::hdf5::File::open(path).map_err(|e| bad(url, format!("cannot open: {e}")))?;
    Ok(Opened { file })
}

/// Opens `bytes` (a remote file's content) through a temporary file.
fn open_bytes(url: &str, bytes: &[u8]) -> Result<Opened> {
    let temp: PathBuf = std::env::temp_dir().join(format!(
        ".shardflow-{}-{}.h5",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&temp, bytes)
        .map_err(|e| Error::io(temp.to_string_lossy(), Position::Unknown, e))?;
    let opened = open_path(url, &temp.to_string_lossy());
    let _ = std::fs::remove_file(&temp);
    opened
}

fn open_shard(shard: &ShardMeta, io: &Io) -> Result<Opened> {
    if let Some(path) = local_path(&shard.url) {
        return open_path(&shard.url, path);
    }
    let source = io.open(shard)?;
    let size = size_blocking(source.as_ref(), shard.size)?;
    let bytes = source.read_range_blocking(0..size)?;
    open_bytes(&shard.url, &bytes)
}

/// One dataset of a file: its path and how its values are laid out, or why they cannot
/// be read (kept, so that it is refused only if it is chosen).
#[derive(Debug, Clone, PartialEq)]
struct Array {
    path: String,
    header: std::result::Result<Header, String>,
}

impl Array {
    fn first_dim(&self) -> Option<usize> {
        self.header.as_ref().ok()?.shape.first().copied()
    }
}

/// The npy element of an HDF5 type, or why it has none.
fn elem_of(descriptor: &TypeDescriptor) -> std::result::Result<Elem, String> {
    let size = |s: &IntSize| *s as usize;
    Ok(match descriptor {
        TypeDescriptor::Integer(s) => Elem::Int(size(s)),
        TypeDescriptor::Unsigned(s) => Elem::UInt(size(s)),
        TypeDescriptor::Float(FloatSize::U4) => Elem::Float(4),
        TypeDescriptor::Float(FloatSize::U8) => Elem::Float(8),
        TypeDescriptor::Boolean => Elem::Bool,
        TypeDescriptor::FixedAscii(n) | TypeDescriptor::FixedUnicode(n) => Elem::Bytes(*n),
        other => return Err(format!("values of type {other} are not supported")),
    })
}

/// Every dataset below `group`, depth first, in name order, with paths from the root.
fn arrays(url: &str, group: &::hdf5::Group, prefix: &str, out: &mut Vec<Array>) -> Result<()> {
    let mut names = group.member_names().map_err(|e| {
        bad(
            url,
            format!(
                "cannot list {}: {e}",
                if prefix.is_empty() { "/" } else { prefix }
            ),
        )
    })?;
    names.sort();
    for name in names {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if let Ok(dataset) = group.dataset(&name) {
            let dtype = dataset
                .dtype()
                .map_err(|e| bad(url, format!("{path}: {e}")))?;
            let descriptor = dtype
                .to_descriptor()
                .map_err(|e| bad(url, format!("{path}: {e}")))?;
            let header = elem_of(&descriptor).map(|elem| Header {
                elem,
                big_endian: matches!(dtype.byte_order(), ::hdf5::datatype::ByteOrder::BigEndian),
                fortran: false,
                shape: dataset.shape(),
                data_offset: 0,
            });
            out.push(Array { path, header });
        } else if let Ok(sub) = group.group(&name) {
            arrays(url, &sub, &path, out)?;
        }
    }
    Ok(())
}

/// The raw bytes of a whole dataset, in its file type (byte order included).
/// At most `limit` bytes: a small file can declare a vast chunked dataset that its fill
/// value stands for, and reading it must not allocate that much.
fn read_raw(
    url: &str,
    file: &::hdf5::File,
    path: &str,
    header: &Header,
    limit: u64,
) -> Result<Bytes> {
    let dataset = file
        .dataset(path)
        .map_err(|e| bad(url, format!("{path}: {e}")))?;
    let dtype = dataset
        .dtype()
        .map_err(|e| bad(url, format!("{path}: {e}")))?;
    let len = header
        .data_len()
        .filter(|&n| n <= limit)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            bad(
                url,
                format!(
                    "dataset {path:?} holds more than max_decompressed_bytes ({limit}) bytes; raise it in format_options to read it"
                ),
            )
        })?;
    let mut buf = vec![0u8; len];
    if len > 0 {
        // libhdf5 applies the filters and copies into `buf`, which holds exactly the
        // dataset's elements in the memory type given (the file's own, so no conversion).
        let status = ::hdf5::sync::sync(|| unsafe {
            hdf5_sys::h5d::H5Dread(
                dataset.id(),
                dtype.id(),
                hdf5_sys::h5s::H5S_ALL,
                hdf5_sys::h5s::H5S_ALL,
                hdf5_sys::h5p::H5P_DEFAULT,
                buf.as_mut_ptr().cast(),
            )
        });
        if status < 0 {
            return Err(bad(
                url,
                format!("reading dataset {path:?} failed (a corrupt chunk or filter)"),
            ));
        }
    }
    Ok(Bytes::from(buf))
}

pub struct Hdf5;

struct PreparedHdf5 {
    schema: SchemaRef,
    mode: Mode,
    /// The datasets read, in column order, as the first file has them.
    arrays: Vec<Array>,
    /// `max_decompressed_bytes`: the most one dataset may hold.
    limit: u64,
}

impl Format for Hdf5 {
    fn name(&self) -> &'static str {
        "hdf5"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("hdf5");
        let (mode, limit) = npy::mode_options(&mut opts, options, "hdf5")?;
        let chosen = opts.strings("datasets")?;
        opts.finish()?;
        if chosen.is_some() && mode == Mode::Sample {
            return Err(Error::invalid_argument(
                "format_options[\"datasets\"] is for rows mode; in sample mode use columns=",
            ));
        }
        let first = shards
            .first()
            .ok_or_else(|| Error::invalid_argument("no HDF5 files"))?;
        // Rows mode needs every file's lengths (the units' rows); sample mode the first file.
        let listed: Vec<Vec<Array>> = match mode {
            Mode::Sample => vec![list(first, io)?],
            Mode::Rows => shards.iter().map(|s| list(s, io)).collect::<Result<_>>()?,
        };
        let all = &listed[0];
        let mut arrays: Vec<Array> = match (&chosen, mode) {
            (Some(names), _) => names
                .iter()
                .map(|name| {
                    let name = name.trim_start_matches('/');
                    all.iter()
                        .find(|a| a.path == name)
                        .cloned()
                        .ok_or_else(|| Error::Schema {
                            url: first.url.clone(),
                            message: format!(
                                "no dataset {name:?}; the datasets are {:?}",
                                paths(all)
                            ),
                        })
                })
                .collect::<Result<_>>()?,
            (None, Mode::Rows) => {
                // The datasets that share the most common first dimension.
                let mut counts: std::collections::BTreeMap<usize, usize> = Default::default();
                for n in all.iter().filter_map(Array::first_dim) {
                    *counts.entry(n).or_default() += 1;
                }
                let common = counts
                    .iter()
                    .max_by_key(|(n, c)| (**c, **n))
                    .map(|(n, _)| *n);
                all.iter()
                    .filter(|a| common.is_some() && a.first_dim() == common)
                    .cloned()
                    .collect()
            }
            (None, Mode::Sample) => all.clone(),
        };
        if let Some(columns) = &options.columns {
            let names: Vec<&str> = arrays.iter().map(|a| a.path.as_str()).collect();
            let indices = column_indices(&names, columns, &first.url)?;
            arrays = indices.iter().map(|&i| arrays[i].clone()).collect();
        }
        if arrays.is_empty() {
            return Err(Error::Schema {
                url: first.url.clone(),
                message: "no datasets to read".into(),
            });
        }
        let rows_mode = mode == Mode::Rows;
        let mut fields = Vec::with_capacity(arrays.len());
        for a in &arrays {
            let header = a.header.as_ref().map_err(|why| {
                bad(
                    &first.url,
                    format!("dataset {:?}: {why}; leave it out with columns=", a.path),
                )
            })?;
            if rows_mode && header.shape.is_empty() {
                return Err(bad(
                    &first.url,
                    format!(
                        "dataset {:?} is a scalar; rows mode needs a first axis",
                        a.path
                    ),
                ));
            }
            header
                .check(rows_mode)
                .map_err(|e| bad(&first.url, format!("dataset {:?}: {e}", a.path)))?;
            fields.push(header.field(&a.path, rows_mode));
        }
        let schema = Schema::new(fields);
        // Rows are planned from these shapes before any data is read: a dataset too large
        // to read is refused now, not when the plan has been sized by it.
        for (shard, listing) in shards.iter().zip(&listed) {
            for array in listing
                .iter()
                .filter(|a| arrays.iter().any(|c| c.path == a.path))
            {
                let size = array.header.as_ref().ok().and_then(Header::data_len);
                if size.is_none_or(|n| n > limit) {
                    return Err(bad(
                        &shard.url,
                        format!(
                            "dataset {:?} holds more than max_decompressed_bytes ({limit}) bytes; raise it in format_options to read it",
                            array.path
                        ),
                    ));
                }
            }
        }
        let units = shards
            .iter()
            .enumerate()
            .map(|(i, _)| WorkUnit {
                shard: i,
                part: 0,
                rows: Some(match mode {
                    Mode::Sample => 1,
                    // Every chosen dataset's first dimension in that file (checked there).
                    Mode::Rows => listed[i]
                        .iter()
                        .find(|a| a.path == arrays[0].path)
                        .and_then(Array::first_dim)
                        .unwrap_or(0) as u64,
                }),
            })
            .collect();
        let schema = Arc::new(schema);
        Ok(PreparedShards::new(
            FORMAT,
            schema.clone(),
            shards,
            units,
            Arc::new(PreparedHdf5 {
                schema,
                mode,
                arrays,
                limit,
            }),
        ))
    }
}

fn paths(arrays: &[Array]) -> Vec<&str> {
    arrays.iter().map(|a| a.path.as_str()).collect()
}

fn list(shard: &ShardMeta, io: &Io) -> Result<Vec<Array>> {
    let opened = open_shard(shard, io)?;
    let mut out = Vec::new();
    arrays(&shard.url, &opened.file, "", &mut out)?;
    Ok(out)
}

impl PreparedHdf5 {
    /// Reads the chosen datasets of one open file into one batch.
    fn decode(&self, url: &str, opened: &Opened) -> Result<Decoded> {
        let mut present = Vec::new();
        arrays(url, &opened.file, "", &mut present)?;
        let rows_mode = self.mode == Mode::Rows;
        let mut rows = None;
        let mut columns = Vec::with_capacity(self.arrays.len());
        for (expected, field) in self.arrays.iter().zip(self.schema.fields()) {
            let Some(array) = present.iter().find(|a| a.path == expected.path) else {
                return Err(Error::Schema {
                    url: url.to_string(),
                    message: format!("no dataset {:?}, which the first file has", expected.path),
                });
            };
            let header = match &array.header {
                Ok(h) if h.field(&array.path, rows_mode).data_type() == field.data_type() => h,
                _ => {
                    return Err(Error::Schema {
                        url: url.to_string(),
                        message: format!(
                            "dataset {:?} has another type or shape than in the first file",
                            array.path
                        ),
                    });
                }
            };
            header
                .check(rows_mode)
                .map_err(|e| bad(url, format!("dataset {:?}: {e}", array.path)))?;
            let n = if rows_mode {
                header.shape.first().copied().unwrap_or(0)
            } else {
                1
            };
            match rows {
                None => rows = Some(n),
                Some(r) if r != n => {
                    return Err(bad(
                        url,
                        format!("dataset {:?} has {n} rows, the others {r}", array.path),
                    ));
                }
                Some(_) => {}
            }
            let data = read_raw(url, &opened.file, &array.path, header, self.limit)?;
            let leaf = npy::leaf_array(header, data, header.count().unwrap_or(0))
                .map_err(|e| bad(url, format!("dataset {:?}: {e}", array.path)))?;
            columns.push(
                npy::column(field, leaf, n)
                    .map_err(|e| bad(url, format!("dataset {:?}: {e}", array.path)))?,
            );
        }
        let options = arrow_array::RecordBatchOptions::new().with_row_count(rows);
        let batch = RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
            .map_err(|e| bad(url, e))?;
        Ok(Decoded {
            batches: vec![batch],
            skipped: Vec::new(),
        })
    }
}

impl UnitJobs for Arc<PreparedHdf5> {
    fn job(&self, _unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let prepared = self.clone();
        let url = shard.url.clone();
        match local_path(&shard.url) {
            Some(path) => {
                let path = path.to_string();
                UnitJob::Ready(task(move || {
                    prepared.decode(&url, &open_path(&url, &path)?)
                }))
            }
            None => whole_file_job(shard, move |bytes| {
                prepared.decode(&url, &open_bytes(&url, &bytes)?)
            }),
        }
    }
}
