//! Parquet decode throughput through the whole pipeline (fetch, decode on the thread
//! pool, ordered re-batching), on a generated file. `cargo bench --bench parquet_decode`.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use shardflow::format::ReadOptions;
use shardflow::pipeline::Dataset;
use shardflow::pipeline::{RunOptions, Stats, Tuning, default_num_threads};
use shardflow::source::Storage;

const ROWS: usize = 1_000_000;
const CHUNK: usize = 100_000;

fn write_file(path: &std::path::Path) {
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float32, false),
        Field::new("text", DataType::Utf8, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(item.clone(), 16),
            false,
        ),
    ]));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(CHUNK))
        .build();
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        schema.clone(),
        Some(props),
    )
    .unwrap();
    for start in (0..ROWS).step_by(CHUNK) {
        let ids: Vec<i64> = (start as i64..(start + CHUNK) as i64).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(Float32Array::from_iter_values(
                    ids.iter().map(|&i| (i % 1000) as f32 / 7.0),
                )),
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("sample text number {i}")),
                )),
                Arc::new(FixedSizeListArray::new(
                    item.clone(),
                    16,
                    Arc::new(Float32Array::from_iter_values(
                        (0..CHUNK * 16).map(|i| (i % 97) as f32),
                    )),
                    None,
                )),
            ],
        )
        .unwrap();
        writer.write(&batch).unwrap();
    }
    writer.close().unwrap();
}

fn epoch(ds: &Dataset, threads: usize) -> usize {
    let run = RunOptions {
        batch_rows: Some(1024),
        tuning: Arc::new(Tuning::fixed(threads, 4)),
        ..RunOptions::default()
    };
    ds.start(run, Arc::new(Stats::default()))
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.parquet");
    write_file(&path);
    let bytes = std::fs::metadata(&path).unwrap().len();
    let ds = Dataset::open(
        &[path.display().to_string()],
        None,
        ReadOptions::default(),
        Storage::local_only(),
    )
    .unwrap();
    let threads = default_num_threads();
    let mut group = c.benchmark_group("parquet_decode");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function(format!("rows/{threads}_threads"), |b| {
        b.iter(|| assert_eq!(epoch(&ds, threads), ROWS))
    });
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function(format!("file_bytes/{threads}_threads"), |b| {
        b.iter(|| assert_eq!(epoch(&ds, threads), ROWS))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
