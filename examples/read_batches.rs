//! Reads batches through shardflow's Rust API: from a local glob and, when
//! `SHARDFLOW_EXAMPLE_S3` names an `s3://` prefix, from S3.
//!
//! ```text
//! cargo run --release --example read_batches [-- DIR]
//! SHARDFLOW_EXAMPLE_S3=s3://bucket/example AWS_ENDPOINT_URL=http://127.0.0.1:8333 \
//!     cargo run --release --example read_batches
//! ```
//!
//! It first writes a small dataset (10,000 rows in ten Parquet shards) into `DIR` (a
//! temporary directory by default) and, for S3, under the prefix, so it needs no data
//! of its own. S3 credentials come from the usual AWS environment variables or profile.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use shardflow::Dataset;

const ROWS: i64 = 10_000;

/// `id` 0..ROWS and a caption per row.
fn sample_data() -> shardflow::Result<Dataset> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("caption", DataType::Utf8, false),
    ]));
    let ids = Int64Array::from_iter_values(0..ROWS);
    let captions = StringArray::from_iter_values((0..ROWS).map(|i| format!("sample {i}")));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(captions)])
        .map_err(|e| shardflow::Error::Internal(e.to_string()))?;
    Ok(Dataset::from_batches(schema, vec![batch]))
}

/// Reads one shuffled epoch; prints and returns (rows, sum of ids).
fn read_epoch(name: &str, ds: &Dataset) -> shardflow::Result<(usize, i64)> {
    let loader = ds.loader(256).shuffle(7);
    let (mut rows, mut id_sum) = (0, 0);
    for batch in loader.epoch(0)? {
        let batch = batch?;
        rows += batch.num_rows();
        if let Some(ids) = batch.column_by_name("id") {
            id_sum += ids.as_primitive::<Int64Type>().values().iter().sum::<i64>();
        }
    }
    let stats = loader.stats();
    println!(
        "{name}: {rows} rows in {} shards, sum of ids {id_sum}, {} bytes read",
        ds.shards().len(),
        stats.bytes_read
    );
    Ok((rows, id_sum))
}

fn main() -> shardflow::Result<()> {
    let dir = match std::env::args().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("shardflow-example-{}", std::process::id())),
    };
    let dir = dir.to_string_lossy().into_owned();
    let data = sample_data()?;

    data.write(&dir, "parquet")
        .max_rows_per_shard(1_000)
        .overwrite(true)
        .run()?;
    let local = Dataset::open(format!("{dir}/part-*.parquet"))?;
    read_epoch("local glob", &local)?;

    if let Ok(prefix) = std::env::var("SHARDFLOW_EXAMPLE_S3") {
        let mut writer = data
            .write(&prefix, "parquet")
            .max_rows_per_shard(2_500)
            .overwrite(true);
        let mut builder = Dataset::builder(&prefix);
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            writer = writer.storage_option("endpoint_url", endpoint.as_str());
            builder = builder.storage_option("endpoint_url", endpoint);
        }
        let manifest = writer.run()?;
        println!("wrote {} shards to {prefix}", manifest.shards.len());
        read_epoch("s3", &builder.open()?)?;
    }
    Ok(())
}
