//! Reader throughput for TFRecord (tf.train.Example), WebDataset tar and NPZ, through the
//! whole pipeline into batches of 256, on generated files. `cargo bench --bench formats`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shardflow::format::ReadOptions;
use shardflow::format::tfrecord::masked_crc;
use shardflow::options::{OptionValue, Options};
use shardflow::pipeline::Dataset;
use shardflow::pipeline::{RunOptions, Stats};
use shardflow::source::Storage;

const IMAGE: usize = 28 * 28;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field(num: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(num << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// An Example {"image": bytes, "label": int64} as protobuf serializes it.
fn example(image: &[u8], label: i64) -> Vec<u8> {
    let feature = |name: &str, kind: u64, list: &[u8], map: &mut Vec<u8>| {
        let mut value = Vec::new();
        field(kind, list, &mut value);
        let mut entry = Vec::new();
        field(1, name.as_bytes(), &mut entry);
        field(2, &value, &mut entry);
        field(1, &entry, map);
    };
    let mut map = Vec::new();
    let mut bytes_list = Vec::new();
    field(1, image, &mut bytes_list);
    feature("image", 1, &bytes_list, &mut map);
    let mut packed = Vec::new();
    varint(label as u64, &mut packed);
    let mut int_list = Vec::new();
    field(1, &packed, &mut int_list);
    feature("label", 3, &int_list, &mut map);
    let mut out = Vec::new();
    field(1, &map, &mut out);
    out
}

fn image(i: usize) -> Vec<u8> {
    (0..IMAGE).map(|j| ((i * 31 + j * 7) % 251) as u8).collect()
}

fn write_tfrecord(path: &std::path::Path, n: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        let record = example(&image(i), (i % 10) as i64);
        let len = (record.len() as u64).to_le_bytes();
        out.write_all(&len).unwrap();
        out.write_all(&masked_crc(&len).to_le_bytes()).unwrap();
        out.write_all(&record).unwrap();
        out.write_all(&masked_crc(&record).to_le_bytes()).unwrap();
    }
}

fn write_tar(path: &std::path::Path, n: usize) {
    let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        for (ext, data) in [
            ("jpg", vec![(i % 256) as u8; 8 * 1024]),
            ("cls", (i % 10).to_string().into_bytes()),
            (
                "json",
                format!("{{\"id\": {i}, \"tags\": [\"a\", \"b\"]}}").into_bytes(),
            ),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, format!("s/{i:06}.{ext}"), &data[..])
                .unwrap();
        }
    }
    builder.finish().unwrap();
}

fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    shardflow::format::npy::file_bytes(descr, false, shape, data)
}

/// A stored (uncompressed) .npz as `np.savez` writes it.
fn write_npz(path: &std::path::Path, n: usize) {
    let images: Vec<u8> = (0..n).flat_map(image).collect();
    let labels: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 10) as i64).to_le_bytes())
        .collect();
    let members = [
        ("image.npy", npy("|u1", &format!("({n}, 28, 28)"), &images)),
        ("label.npy", npy("<i8", &format!("({n},)"), &labels)),
    ];
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in &members {
        let offset = out.len() as u32;
        let crc = crc32fast::hash(data);
        let mut local = Vec::new();
        local.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        local.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        local.extend_from_slice(&crc.to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(data.len() as u32).to_le_bytes());
        local.extend_from_slice(&(name.len() as u16).to_le_bytes());
        local.extend_from_slice(&0u16.to_le_bytes());
        local.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&local);
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(data.len() as u32).to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 2, 0, 2, 0]);
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    std::fs::write(path, out).unwrap();
}

fn epoch(ds: &Dataset) -> usize {
    let run = RunOptions {
        batch_rows: Some(256),
        ..RunOptions::default()
    };
    ds.start(run, Arc::new(Stats::default()))
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rows_mode = ReadOptions {
        format_options: Options([("mode".to_string(), OptionValue::Str("rows".into()))].into()),
        ..ReadOptions::default()
    };
    let cases: Vec<(&str, usize, std::path::PathBuf, ReadOptions)> = vec![
        (
            "tfrecord_example",
            100_000,
            dir.path().join("b.tfrecord"),
            ReadOptions::default(),
        ),
        (
            "webdataset_tar",
            20_000,
            dir.path().join("b.tar"),
            ReadOptions::default(),
        ),
        ("npz_rows", 60_000, dir.path().join("b.npz"), rows_mode),
    ];
    write_tfrecord(&cases[0].2, cases[0].1);
    write_tar(&cases[1].2, cases[1].1);
    write_npz(&cases[2].2, cases[2].1);
    let mut group = c.benchmark_group("formats");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(6));
    for (name, rows, path, options) in cases {
        let ds = Dataset::open(
            &[path.display().to_string()],
            None,
            options,
            Storage::local_only(),
        )
        .unwrap();
        group.throughput(Throughput::Bytes(std::fs::metadata(&path).unwrap().len()));
        group.bench_function(format!("{name}/bytes"), |b| {
            b.iter(|| assert_eq!(epoch(&ds), rows))
        });
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_function(format!("{name}/records"), |b| {
            b.iter(|| assert_eq!(epoch(&ds), rows))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
