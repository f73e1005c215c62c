//! Raw files: one file is one sample `{"__key__", "bytes"}`, the image-folder layout.
//! `__key__` is the path below the dataset's common directory, without its extension.
//! With `format_options={"label": True}` each sample also gets `label`, the name of its
//! parent directory, and `label_id`, that name's index among the sorted distinct names
//! (as torchvision's `ImageFolder` numbers classes), or its index in `label_names` where
//! given (the names of every split, as `datasets`' folder builders number them).

use std::sync::Arc;

use arrow_array::{Int64Array, LargeBinaryArray, RecordBatch, StringArray};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{
    Decoded, Format, PreparedShards, ReadOptions, UnitJob, UnitJobs, WorkUnit, column_indices,
    field_names, whole_file_job,
};
use crate::error::{Error, Result};
use crate::source::{Io, ShardMeta};

pub struct Raw;

struct PreparedRaw {
    schema: SchemaRef,
    keys: Vec<String>,
    /// (label, label_id) per shard when labels are on.
    labels: Option<Vec<(String, i64)>>,
}

/// The longest directory prefix (ending in `/`) shared by every path.
fn common_dir(paths: &[&str]) -> usize {
    let Some(first) = paths.first() else { return 0 };
    let mut len = first.rfind('/').map_or(0, |i| i + 1);
    for path in &paths[1..] {
        while len > 0 && !(path.len() >= len && path.as_bytes()[..len] == first.as_bytes()[..len]) {
            len = first[..len - 1].rfind('/').map_or(0, |i| i + 1);
        }
    }
    len
}

fn strip_extension(path: &str) -> &str {
    let base = path.rfind('/').map_or(0, |i| i + 1);
    match path[base..].find('.') {
        Some(dot) if dot > 0 => &path[..base + dot],
        _ => path,
    }
}

fn parent_name(path: &str) -> &str {
    let dir = &path[..path.rfind('/').unwrap_or(0)];
    &dir[dir.rfind('/').map_or(0, |i| i + 1)..]
}

impl Format for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn prepare(
        &self,
        shards: Vec<ShardMeta>,
        options: &ReadOptions,
        _io: &Io,
    ) -> Result<PreparedShards> {
        let mut opts = options.format_options.reader("raw");
        let with_labels = opts.bool("label", false)?;
        let given_names = opts.strings("label_names")?;
        opts.finish()?;
        if options.schema.is_some() || options.features.is_some() {
            return Err(Error::invalid_argument(
                "raw files have fixed fields: schema= and features= have no use",
            ));
        }
        let paths: Vec<&str> = shards.iter().map(|s| s.url.as_str()).collect();
        let prefix = common_dir(&paths);
        let keys = paths
            .iter()
            .map(|p| strip_extension(&p[prefix..]).to_string())
            .collect();
        let mut fields = vec![
            Field::new("__key__", DataType::Utf8, false),
            // 64-bit offsets: a file, or a batch of them, may pass 2 GiB.
            Field::new("bytes", DataType::LargeBinary, false),
        ];
        let labels = match with_labels {
            false => None,
            true => {
                let mut names: Vec<&str> = match &given_names {
                    Some(given) => given.iter().map(String::as_str).collect(),
                    None => paths.iter().map(|p| parent_name(p)).collect(),
                };
                if given_names.is_none() {
                    names.sort_unstable();
                    names.dedup();
                }
                let ids: std::collections::HashMap<&str, usize> =
                    names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
                let labels = paths
                    .iter()
                    .map(|p| {
                        let name = parent_name(p);
                        let id = *ids.get(name).ok_or_else(|| {
                            Error::invalid_argument(format!(
                                "{p}: its folder {name:?} is not one of label_names {names:?}"
                            ))
                        })?;
                        Ok((name.to_string(), id as i64))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(labels)
            }
        };
        if with_labels {
            fields.push(Field::new("label", DataType::Utf8, false));
            fields.push(Field::new("label_id", DataType::Int64, false));
        }
        let mut schema = Schema::new(fields);
        if let Some(columns) = &options.columns {
            let url = paths.first().copied().unwrap_or_default();
            let indices = column_indices(&field_names(&schema), columns, url)?;
            schema = schema
                .project(&indices)
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        let units = (0..shards.len())
            .map(|shard| WorkUnit {
                shard,
                part: 0,
                rows: Some(1),
            })
            .collect();
        let schema = Arc::new(schema);
        Ok(PreparedShards::new(
            "raw",
            schema.clone(),
            shards,
            units,
            PreparedRaw {
                schema,
                keys,
                labels,
            },
        ))
    }
}

impl UnitJobs for PreparedRaw {
    fn job(&self, unit: &WorkUnit, shard: &ShardMeta) -> UnitJob {
        let schema = self.schema.clone();
        let key = self.keys[unit.shard].clone();
        let label = self.labels.as_ref().map(|l| l[unit.shard].clone());
        whole_file_job(shard, move |bytes| {
            let columns = schema
                .fields()
                .iter()
                .map(|f| -> arrow_array::ArrayRef {
                    match f.name().as_str() {
                        "__key__" => Arc::new(StringArray::from(vec![key.as_str()])),
                        // The file's bytes themselves, not a copy.
                        "bytes" => Arc::new(LargeBinaryArray::new(
                            OffsetBuffer::new(ScalarBuffer::from(vec![0, bytes.len() as i64])),
                            Buffer::from(bytes.clone()),
                            None,
                        )),
                        "label" => Arc::new(StringArray::from(vec![
                            label.as_ref().map_or("", |l| l.0.as_str()),
                        ])),
                        _ => Arc::new(Int64Array::from(vec![label.as_ref().map_or(0, |l| l.1)])),
                    }
                })
                .collect();
            let batch = RecordBatch::try_new(schema, columns)
                .map_err(|e| Error::Internal(e.to_string()))?;
            Ok(Decoded {
                batches: vec![batch],
                skipped: Vec::new(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_labels() {
        assert_eq!(common_dir(&["/d/cat/1.jpg", "/d/dog/2.jpg"]), 3);
        assert_eq!(common_dir(&["/d/cat/1.jpg"]), 7);
        assert_eq!(strip_extension("cat/1.tar.gz"), "cat/1");
        assert_eq!(strip_extension("cat/.hidden"), "cat/.hidden");
        assert_eq!(parent_name("/d/cat/1.jpg"), "cat");
    }
}
