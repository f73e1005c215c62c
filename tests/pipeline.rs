//! End-to-end through the Rust API: files on disk -> Dataset -> shuffled, batched epochs.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use shardflow::Error;
use shardflow::format::{OnError, ReadOptions};
use shardflow::pipeline::Dataset;
use shardflow::pipeline::{BufferBounds, Op, RunOptions, Stats, Tuning};
use shardflow::source::Storage;

fn write_parquet(path: &std::path::Path, ids: std::ops::Range<i64>, row_group: usize) {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from_iter_values(ids))],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group))
        .build();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn ids(ds: &Dataset, run: RunOptions) -> Vec<i64> {
    let receiver = ds.start(run, Arc::new(Stats::default())).unwrap();
    receiver
        .flat_map(|b| {
            let b = b.unwrap();
            b.column(0).as_primitive::<Int64Type>().values().to_vec()
        })
        .collect()
}

fn run(epoch: u64, batch: usize, threads: usize) -> RunOptions {
    RunOptions {
        epoch,
        batch_rows: Some(batch),
        tuning: Arc::new(Tuning::fixed(threads, 2)),
        ..RunOptions::default()
    }
}

#[test]
fn shuffled_epochs_are_complete_deterministic_and_differ() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("a.parquet"), 0..1000, 70);
    write_parquet(&dir.path().join("b.parquet"), 1000..1500, 33);
    let mut jsonl = std::fs::File::create(dir.path().join("c.jsonl")).unwrap();
    for i in 0..10 {
        writeln!(jsonl, "{{\"id\": {i}}}").unwrap();
    }
    let pattern = format!("{}/*.parquet", dir.path().display());
    let ds = Dataset::open(
        &[pattern],
        None,
        ReadOptions::default(),
        Storage::local_only(),
    )
    .unwrap();
    assert_eq!(ds.num_rows().unwrap(), Some(1500));
    assert_eq!(ids(&ds, run(0, 64, 2)), (0..1500).collect::<Vec<_>>());

    let shuffled = ds.with_op(Op::Shuffle {
        seed: 9,
        buffer: BufferBounds {
            rows: 200,
            bytes: u64::MAX,
        },
    });
    let epoch0 = ids(&shuffled, run(0, 64, 1));
    assert_eq!(epoch0, ids(&shuffled, run(0, 100, 8)));
    assert_ne!(epoch0, ids(&shuffled, run(1, 64, 1)));
    let unique: BTreeSet<i64> = epoch0.iter().copied().collect();
    assert_eq!(unique.len(), 1500);
    assert_eq!(epoch0.len(), 1500);

    let json = Dataset::open(
        &[format!("{}/c.jsonl", dir.path().display())],
        None,
        ReadOptions::default(),
        Storage::local_only(),
    )
    .unwrap();
    assert_eq!(json.num_rows().unwrap(), None);
    assert_eq!(
        ids(
            &json.with_op(Op::Skip(3)).with_op(Op::Take(4)),
            run(0, 3, 1)
        ),
        vec![3, 4, 5, 6]
    );
}

#[test]
fn corrupt_file_is_an_error_or_a_counted_skip() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("a.parquet"), 0..10, 5);
    std::fs::write(dir.path().join("b.parquet"), b"garbage that is not parquet").unwrap();
    let pattern = format!("{}/*.parquet", dir.path().display());
    let ds = Dataset::open(
        std::slice::from_ref(&pattern),
        None,
        ReadOptions::default(),
        Storage::local_only(),
    )
    .unwrap();
    match ds.num_rows() {
        Err(Error::Decode { url, .. }) => assert!(url.ends_with("b.parquet")),
        other => panic!("expected a decode error, got {other:?}"),
    }
    let options = ReadOptions {
        on_error: OnError::Skip,
        ..ReadOptions::default()
    };
    let ds = Dataset::open(&[pattern], None, options, Storage::local_only()).unwrap();
    let stats = Arc::new(Stats::default());
    let rows: usize = ds
        .start(run(0, 4, 1), stats.clone())
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(rows, 10);
    assert_eq!(stats.snapshot().skipped_units, 1);
}
