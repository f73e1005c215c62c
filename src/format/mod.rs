//! HOW bytes become records. Each format turns a shard into Arrow `RecordBatch`es; the
//! pipeline only sees the [`Format`] / [`PreparedShards`] traits below.
//!
//! Adding a format: one file in this folder and one line in `REGISTRY`.

pub mod arrow_ipc;
pub mod audio;
mod blocks;
pub mod cells;
pub mod compression;
pub mod csv;
pub mod decoded_cache;
pub mod example;
pub mod hdf5;
pub mod hf_features;
pub mod image;
pub mod image_spec;
pub mod index;
mod json_infer;
pub mod jsonl;
pub mod memory;
pub mod npy;
pub mod npz;
pub mod parquet;
mod parquet_dictionary;
pub mod parquet_footers;
pub mod raw;
mod reader;
mod records;
mod tensor;
pub mod tfrecord;
mod unit;
pub mod webdataset;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::source::ShardMeta;

pub use hf_features::media_features;
pub use reader::{Format, HUGGINGFACE_KEY, PreparedShards, ReadOptions, UnitJobs};
pub use tensor::{
    DecodedTensor, EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY, TENSOR_EXTENSION,
    VARIABLE_TENSOR_EXTENSION, is_variable_tensor, shape_product, tensor_field, tensor_shape,
    variable_tensor_column, variable_tensor_field,
};
pub use unit::{
    BatchSink, DecodeRanges, DecodeTask, Decoded, EmitTask, OnError, StreamJob, UnitJob, WorkUnit,
    column_indices, field_names, per_shard, task, whole_file_job, whole_files,
};

struct Registration {
    name: &'static str,
    /// Extensions that select this format when `format=None`; `.gz` variants included.
    extensions: &'static [&'static str],
    make: fn() -> Arc<dyn Format>,
}

static REGISTRY: &[Registration] = &[
    Registration {
        name: "parquet",
        extensions: &[".parquet", ".pq"],
        make: || Arc::new(parquet::Parquet),
    },
    Registration {
        name: "jsonl",
        extensions: &[".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz"],
        make: || Arc::new(jsonl::JsonLines),
    },
    // `.json` files hold JSON Lines or one JSON array of records (`Dataset::open` reads
    // an array into memory; see `jsonl::json_arrays`), as `datasets`' json loader.
    Registration {
        name: "json",
        extensions: &[".json", ".json.gz"],
        make: || Arc::new(jsonl::JsonLines),
    },
    Registration {
        name: "npy",
        extensions: &[".npy"],
        make: || Arc::new(npy::Npy),
    },
    Registration {
        name: "npz",
        extensions: &[".npz"],
        make: || Arc::new(npz::Npz),
    },
    Registration {
        name: "arrow",
        extensions: &[".arrow", ".feather", ".arrows", ".ipc"],
        make: || Arc::new(arrow_ipc::ArrowIpc),
    },
    Registration {
        name: "csv",
        extensions: &[".csv", ".csv.gz"],
        make: || Arc::new(csv::Csv),
    },
    Registration {
        name: "raw",
        extensions: &[],
        make: || Arc::new(raw::Raw),
    },
    Registration {
        name: "webdataset",
        extensions: &[".tar", ".tar.gz", ".tgz"],
        make: || Arc::new(webdataset::WebDataset),
    },
    Registration {
        name: "hdf5",
        extensions: &[".h5", ".hdf5"],
        make: || Arc::new(self::hdf5::Hdf5),
    },
    Registration {
        name: "tfrecord",
        extensions: &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz"],
        make: || Arc::new(tfrecord::TfRecord),
    },
];

/// Looks a format up by the name users pass as `format=`.
pub fn by_name(name: &str) -> Result<Arc<dyn Format>> {
    registered(name).map(|r| (r.make)())
}

/// The registration of the format `format=` names (a reader may serve several names:
/// `json` reads with the JSON Lines reader, arrays aside).
fn registered(name: &str) -> Result<&'static Registration> {
    REGISTRY.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<_> = REGISTRY.iter().map(|r| r.name).collect();
        Error::invalid_argument(format!(
            "unknown format {name:?}; known formats: {}",
            known.join(", ")
        ))
    })
}

/// The format name implied by a file name's extension.
pub fn name_for_path(url: &str) -> Option<&'static str> {
    let lower = url.to_ascii_lowercase();
    REGISTRY
        .iter()
        .find(|r| r.extensions.iter().any(|ext| lower.ends_with(ext)))
        .map(|r| r.name)
}

/// Picks the format of a shard list and keeps the shards to read as that format.
///
/// `named(url)` says whether the user named the file itself, rather than it being found
/// by listing a directory, a prefix or a glob. A named file is always read, and without
/// `format=` its extension must name the format. A listing is read as a repository
/// holds data: its files of the format are kept and the rest (a README.md, a LICENSE, a
/// `.gitattributes`) are left out, as `datasets` leaves them out. A listing that holds
/// two data formats is still an error, and so is a format given whose extension no
/// listed file has — unless it has none (`raw`), or no listed file names a format
/// (Spark's `part-00000` files read with `format="parquet"`).
pub fn choose(
    shards: Vec<ShardMeta>,
    format: Option<&str>,
    named: impl Fn(&str) -> bool,
) -> Result<(&'static str, Vec<ShardMeta>)> {
    let mut found: Option<(&'static str, &str)> = None;
    for shard in &shards {
        let implied = name_for_path(&shard.url);
        let Some(name) = implied else {
            if named(&shard.url) && format.is_none() {
                return Err(Error::invalid_argument(format!(
                    "{}: cannot infer the format from the file name; pass format=",
                    shard.url
                )));
            }
            continue;
        };
        match found {
            Some((previous, example)) if previous != name && format.is_none() => {
                return Err(Error::invalid_argument(format!(
                    "the sources mix formats ({previous}, e.g. {example}, and {name}, e.g. {}); pass format= or narrow the pattern",
                    shard.url
                )));
            }
            None => found = Some((name, &shard.url)),
            _ => {}
        }
    }
    let name = match (format, found) {
        (Some(given), _) => registered(given)?.name,
        (None, Some((name, _))) => name,
        (None, None) => {
            return Err(match shards.first() {
                Some(shard) => Error::invalid_argument(format!(
                    "{}: cannot infer the format from the file names; pass format=",
                    shard.url
                )),
                None => Error::invalid_argument("no source given"),
            });
        }
    };
    // A file is of the format when its extension names it, or names another format of
    // the same reader (`.jsonl` files are read by format="json" too).
    let reader = by_name(name)?.name();
    let of_format = |url: &str| {
        name_for_path(url)
            .is_some_and(|n| n == name || by_name(n).is_ok_and(|f| f.name() == reader))
    };
    let any_of_format = shards.iter().any(|s| of_format(&s.url));
    let kept: Vec<ShardMeta> = shards
        .into_iter()
        .filter(|s| named(&s.url) || of_format(&s.url) || !any_of_format)
        .collect();
    if kept.is_empty() {
        return Err(Error::invalid_argument("no source given"));
    }
    Ok((name, kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infer(shards: &[ShardMeta]) -> Result<&'static str> {
        choose(shards.to_vec(), None, |_| true).map(|(name, _)| name)
    }

    fn shard(url: &str) -> ShardMeta {
        ShardMeta {
            url: url.into(),
            size: None,
            etag: None,
            rows: None,
        }
    }

    #[test]
    fn format_inferred_from_extension() {
        assert_eq!(infer(&[shard("a/b.parquet")]).unwrap(), "parquet");
        assert_eq!(
            infer(&[shard("x.JSONL.GZ"), shard("y.ndjson")]).unwrap(),
            "jsonl"
        );
        let listed = |_: &str| false;
        assert!(infer(&[shard("a.parquet"), shard("b.jsonl")]).is_err());
        assert!(infer(&[shard("a.bin")]).is_err());
        // A listing's README is left out; a named one is not.
        let (name, kept) = choose(
            vec![shard("d/README.md"), shard("d/a.parquet")],
            None,
            listed,
        )
        .unwrap();
        assert_eq!((name, kept), ("parquet", vec![shard("d/a.parquet")]));
        assert!(choose(vec![shard("README.md"), shard("a.parquet")], None, |_| true).is_err());
        // format= given: a listing's other files are left out, unless none has its extension.
        let (_, kept) = choose(
            vec![shard("d/README.md"), shard("d/b.csv")],
            Some("csv"),
            listed,
        )
        .unwrap();
        assert_eq!(kept, vec![shard("d/b.csv")]);
        // The name given is kept, not its reader's (json reads with the JSON Lines one),
        // and a listing's files of that reader are its files.
        assert_eq!(
            choose(vec![shard("a.json")], Some("json"), listed)
                .unwrap()
                .0,
            "json"
        );
        let listing = vec![shard("d/LICENSE"), shard("d/c.jsonl")];
        let (_, kept) = choose(listing, Some("json"), listed).unwrap();
        assert_eq!(kept, vec![shard("d/c.jsonl")]);
        let spark = vec![shard("d/part-00000"), shard("d/part-00001")];
        assert_eq!(
            choose(spark.clone(), Some("parquet"), listed).unwrap().1,
            spark
        );
        assert!(by_name("nope").is_err());
        assert_eq!(by_name("jsonl").unwrap().name(), "jsonl");
    }

    #[test]
    fn columns_resolve_in_the_order_asked() {
        let names = ["a", "b", "c"];
        let cols = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            column_indices(&names, &cols(&["c", "a"]), "u").unwrap(),
            vec![2, 0]
        );
        let missing = column_indices(&names, &cols(&["z"]), "f.csv").unwrap_err();
        assert!(matches!(missing, Error::Schema { .. }));
        assert!(
            missing.to_string().contains(r#"no column "z""#),
            "{missing}"
        );
        assert!(matches!(
            column_indices(&names, &cols(&["a", "a"]), "u"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(column_indices(&names, &[], "u").is_err());
    }
}
