//! `tf.train.Example` protobufs decoded straight into Arrow columns, by a spec in the
//! spirit of `tf.io.parse_example` (fixed length with shape and default, variable
//! length) or by one inferred from the records.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, LargeBinaryArray, LargeListArray,
    RecordBatch, RecordBatchOptions,
};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::tensor_field;

/// The three value lists an Example feature can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bytes,
    Float,
    Int64,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bytes => "bytes",
            Kind::Float => "float32",
            Kind::Int64 => "int64",
        }
    }

    /// Bytes and list offsets are 64-bit: a block's values may pass 2 GiB.
    fn data_type(self) -> DataType {
        match self {
            Kind::Bytes => DataType::LargeBinary,
            Kind::Float => DataType::Float32,
            Kind::Int64 => DataType::Int64,
        }
    }
}

/// Default values of a fixed-length feature, flattened.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Bytes(Vec<Vec<u8>>),
    Float(Vec<f32>),
    Int64(Vec<i64>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Exactly `prod(dims)` values per record; `dims == []` is a scalar.
    Fixed(Vec<usize>),
    /// Any number of values: a list column.
    Var,
}

/// What a record without the feature gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Missing {
    /// Null (inferred schemas).
    Null,
    /// An empty list (`VarLenFeature`).
    Empty,
    /// These values (`FixedLenFeature(default_value=...)`), repeated to fill the shape
    /// when a single value is given.
    Default(Values),
    /// An error (`FixedLenFeature` without a default).
    Error,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSpec {
    pub name: String,
    pub kind: Kind,
    pub shape: Shape,
    pub missing: Missing,
}

impl FeatureSpec {
    fn width(&self) -> Option<usize> {
        match &self.shape {
            Shape::Fixed(dims) => Some(dims.iter().product()),
            Shape::Var => None,
        }
    }

    pub fn field(&self) -> Field {
        let nullable = matches!(self.missing, Missing::Null);
        let leaf = self.kind.data_type();
        match &self.shape {
            Shape::Fixed(dims) if dims.is_empty() => Field::new(&self.name, leaf, nullable),
            Shape::Fixed(dims) => tensor_field(&self.name, leaf, dims, nullable),
            Shape::Var => Field::new(
                &self.name,
                DataType::LargeList(Arc::new(Field::new_list_field(leaf, false))),
                nullable,
            ),
        }
    }
}

pub fn schema(specs: &[FeatureSpec]) -> SchemaRef {
    Arc::new(Schema::new(
        specs.iter().map(FeatureSpec::field).collect::<Vec<_>>(),
    ))
}

// ---- protobuf wire format -------------------------------------------------------

/// Appends `v` as a protobuf varint (for tests and fuzzing, which write Examples).
pub fn encode_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length-delimited field `number` holding `body`.
pub fn encode_len_field(number: u64, body: &[u8], out: &mut Vec<u8>) {
    encode_varint(number << 3 | 2, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Wire<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn key(&mut self) -> Result<(u64, u8), String> {
        let key = self.varint()?;
        Ok((key >> 3, (key & 7) as u8))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or("truncated field")?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], String> {
        let n = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
        self.bytes(n)
    }

    fn skip(&mut self, wire: u8) -> Result<(), String> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.bytes(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.bytes(4).map(drop),
            other => Err(format!("unsupported wire type {other}")),
        }
    }
}

/// One feature of one record: its name and the body of its value list.
struct Feature<'a> {
    name: &'a [u8],
    /// `None` for a Feature with no list set.
    value: Option<(Kind, &'a [u8])>,
}

/// Calls `f` for every feature in a serialized Example.
fn for_each_feature<'a>(
    record: &'a [u8],
    mut f: impl FnMut(Feature<'a>) -> Result<(), String>,
) -> Result<(), String> {
    let mut example = Wire::new(record);
    while !example.done() {
        let (field, wire) = example.key()?;
        if !(field == 1 && wire == LEN) {
            example.skip(wire)?;
            continue;
        }
        let mut features = Wire::new(example.len_delimited()?);
        while !features.done() {
            let (field, wire) = features.key()?;
            if !(field == 1 && wire == LEN) {
                features.skip(wire)?;
                continue;
            }
            let mut entry = Wire::new(features.len_delimited()?);
            let (mut name, mut body) = (&[][..], &[][..]);
            while !entry.done() {
                match entry.key()? {
                    (1, LEN) => name = entry.len_delimited()?,
                    (2, LEN) => body = entry.len_delimited()?,
                    (_, wire) => entry.skip(wire)?,
                }
            }
            let mut feature = Wire::new(body);
            let mut value = None;
            while !feature.done() {
                match feature.key()? {
                    (1, LEN) => value = Some((Kind::Bytes, feature.len_delimited()?)),
                    (2, LEN) => value = Some((Kind::Float, feature.len_delimited()?)),
                    (3, LEN) => value = Some((Kind::Int64, feature.len_delimited()?)),
                    (_, wire) => feature.skip(wire)?,
                }
            }
            f(Feature { name, value })?;
        }
    }
    Ok(())
}

/// Appends a value list's contents; returns how many values it held.
fn decode_list(kind: Kind, body: &[u8], sink: &mut ValueSink) -> Result<usize, String> {
    let mut list = Wire::new(body);
    let mut count = 0;
    while !list.done() {
        let (field, wire) = list.key()?;
        if field != 1 {
            list.skip(wire)?;
            continue;
        }
        match (kind, wire) {
            (Kind::Bytes, LEN) => {
                sink.push_bytes(list.len_delimited()?);
                count += 1;
            }
            (Kind::Float, LEN) => {
                let packed = list.len_delimited()?;
                if packed.len() % 4 != 0 {
                    return Err("packed float list length is not a multiple of 4".into());
                }
                for chunk in packed.chunks_exact(4) {
                    sink.floats
                        .push(f32::from_le_bytes(chunk.try_into().unwrap_or_default()));
                }
                count += packed.len() / 4;
            }
            (Kind::Float, FIXED32) => {
                let b = list.bytes(4)?;
                sink.floats
                    .push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                count += 1;
            }
            (Kind::Int64, LEN) => {
                let mut packed = Wire::new(list.len_delimited()?);
                while !packed.done() {
                    sink.ints.push(packed.varint()? as i64);
                    count += 1;
                }
            }
            (Kind::Int64, VARINT) => {
                sink.ints.push(list.varint()? as i64);
                count += 1;
            }
            (_, wire) => {
                return Err(format!(
                    "unexpected wire type {wire} in a {} list",
                    kind.name()
                ));
            }
        }
    }
    Ok(count)
}

#[derive(Default)]
struct ValueSink {
    floats: Vec<f32>,
    ints: Vec<i64>,
    bytes: Vec<u8>,
    /// End offset of each bytes value in `bytes`.
    byte_ends: Vec<i64>,
}

impl ValueSink {
    fn push_bytes(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
        self.byte_ends.push(self.bytes.len() as i64);
    }

    fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Bytes => self.byte_ends.len(),
            Kind::Float => self.floats.len(),
            Kind::Int64 => self.ints.len(),
        }
    }

    fn truncate(&mut self, kind: Kind, len: usize) {
        match kind {
            Kind::Bytes => {
                self.byte_ends.truncate(len);
                self.bytes
                    .truncate(self.byte_ends.last().copied().unwrap_or(0) as usize);
            }
            Kind::Float => self.floats.truncate(len),
            Kind::Int64 => self.ints.truncate(len),
        }
    }

    fn extend(&mut self, values: &Values) {
        match values {
            Values::Bytes(v) => v.iter().for_each(|b| self.push_bytes(b)),
            Values::Float(v) => self.floats.extend_from_slice(v),
            Values::Int64(v) => self.ints.extend_from_slice(v),
        }
    }
}

/// Builds one column over a block of records.
struct Column {
    spec: FeatureSpec,
    values: ValueSink,
    /// End (in values) of each row, for list columns.
    row_ends: Vec<i64>,
    valid: Vec<bool>,
    seen: bool,
}

impl Column {
    fn new(spec: FeatureSpec) -> Self {
        Self {
            spec,
            values: ValueSink::default(),
            row_ends: Vec::new(),
            valid: Vec::new(),
            seen: false,
        }
    }

    fn add(&mut self, value: Option<(Kind, &[u8])>) -> Result<(), String> {
        let name = &self.spec.name;
        if self.seen {
            return Err(format!("feature {name:?} appears twice"));
        }
        self.seen = true;
        let kind = self.spec.kind;
        let before = self.values.len(kind);
        let count = match value {
            None => 0,
            Some((found, _)) if found != kind => {
                return Err(format!(
                    "feature {name:?} holds {} values, the spec says {}",
                    found.name(),
                    kind.name()
                ));
            }
            Some((_, body)) => decode_list(kind, body, &mut self.values)?,
        };
        if let Some(width) = self.spec.width()
            && count != width
        {
            self.values.truncate(kind, before);
            return Err(format!(
                "feature {name:?} has {count} values, expected {width} for shape {:?}",
                self.spec.shape
            ));
        }
        self.end_row(true);
        Ok(())
    }

    fn add_missing(&mut self) -> Result<(), String> {
        let fill = |values: &mut ValueSink, n: usize| match self.spec.kind {
            Kind::Bytes => (0..n).for_each(|_| values.push_bytes(b"")),
            Kind::Float => values.floats.extend(std::iter::repeat_n(0.0, n)),
            Kind::Int64 => values.ints.extend(std::iter::repeat_n(0, n)),
        };
        match &self.spec.missing {
            Missing::Error => {
                return Err(format!("required feature {:?} is missing", self.spec.name));
            }
            Missing::Null => {
                // Placeholder values keep fixed-width columns aligned; they are masked.
                fill(&mut self.values, self.spec.width().unwrap_or(0));
                self.end_row(false);
            }
            Missing::Empty => self.end_row(true),
            Missing::Default(values) => {
                let width = self.spec.width().unwrap_or(0);
                let given = match values {
                    Values::Bytes(v) => v.len(),
                    Values::Float(v) => v.len(),
                    Values::Int64(v) => v.len(),
                };
                if given == width {
                    self.values.extend(values);
                } else {
                    // A single default fills the whole shape, as in TensorFlow.
                    for _ in 0..width {
                        self.values.extend(values);
                    }
                }
                self.end_row(true);
            }
        }
        Ok(())
    }

    fn end_row(&mut self, valid: bool) {
        self.row_ends.push(self.values.len(self.spec.kind) as i64);
        self.valid.push(valid);
    }

    fn finish(self) -> Result<ArrayRef, String> {
        let rows = self.valid.len();
        let nulls = NullBuffer::from(self.valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let kind = self.spec.kind;
        let leaf: ArrayRef = match kind {
            Kind::Float => Arc::new(Float32Array::new(
                ScalarBuffer::from(self.values.floats),
                None,
            )),
            Kind::Int64 => Arc::new(Int64Array::new(ScalarBuffer::from(self.values.ints), None)),
            Kind::Bytes => {
                let mut offsets = Vec::with_capacity(self.values.byte_ends.len() + 1);
                offsets.push(0);
                offsets.extend_from_slice(&self.values.byte_ends);
                Arc::new(
                    LargeBinaryArray::try_new(
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        Buffer::from_vec(self.values.bytes),
                        None,
                    )
                    .map_err(|e| e.to_string())?,
                )
            }
        };
        let item = Arc::new(Field::new_list_field(kind.data_type(), false));
        let err = |e: arrow_schema::ArrowError| e.to_string();
        Ok(match &self.spec.shape {
            Shape::Fixed(dims) if dims.is_empty() => match nulls {
                None => leaf,
                Some(nulls) => arrow_array::make_array(
                    leaf.to_data()
                        .into_builder()
                        .nulls(Some(nulls))
                        .build()
                        .map_err(err)?,
                ),
            },
            Shape::Fixed(dims) => {
                let width = dims.iter().product::<usize>() as i32;
                Arc::new(
                    FixedSizeListArray::try_new_with_length(item, width, leaf, nulls, rows)
                        .map_err(err)?,
                )
            }
            Shape::Var => {
                let mut offsets = Vec::with_capacity(rows + 1);
                offsets.push(0);
                offsets.extend_from_slice(&self.row_ends);
                Arc::new(
                    LargeListArray::try_new(
                        item,
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        leaf,
                        nulls,
                    )
                    .map_err(err)?,
                )
            }
        })
    }
}

/// Decodes serialized Examples into record batches of a fixed schema.
pub struct ExampleDecoder {
    columns: Vec<Column>,
    index: HashMap<Vec<u8>, usize>,
    schema: SchemaRef,
    /// Whether a feature outside the spec is an error (inferred schemas) or ignored
    /// (user specs, as `tf.io.parse_example` does).
    strict: bool,
    rows: usize,
}

impl ExampleDecoder {
    pub fn new(specs: &[FeatureSpec], strict: bool) -> Self {
        Self {
            index: specs
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.as_bytes().to_vec(), i))
                .collect(),
            columns: specs.iter().cloned().map(Column::new).collect(),
            schema: schema(specs),
            strict,
            rows: 0,
        }
    }

    /// Adds one record; on error the decoder is unchanged.
    pub fn add(&mut self, record: &[u8]) -> Result<(), String> {
        let marks: Vec<(usize, usize, usize)> = self
            .columns
            .iter()
            .map(|c| {
                (
                    c.values.len(c.spec.kind),
                    c.row_ends.len(),
                    c.values.bytes.len(),
                )
            })
            .collect();
        let result = self.add_inner(record);
        for column in &mut self.columns {
            column.seen = false;
        }
        if result.is_err() {
            for (column, &(values, rows, _)) in self.columns.iter_mut().zip(&marks) {
                column.values.truncate(column.spec.kind, values);
                column.row_ends.truncate(rows);
                column.valid.truncate(rows);
            }
        } else {
            self.rows += 1;
        }
        result
    }

    fn add_inner(&mut self, record: &[u8]) -> Result<(), String> {
        let (index, columns, strict) = (&self.index, &mut self.columns, self.strict);
        for_each_feature(record, |feature| match index.get(feature.name) {
            Some(&i) => columns[i].add(feature.value),
            None if strict => Err(format!(
                "feature {:?} is not in the schema inferred from the first records; pass features= to read it",
                String::from_utf8_lossy(feature.name)
            )),
            None => Ok(()),
        })?;
        for column in columns.iter_mut().filter(|c| !c.seen) {
            column.add_missing()?;
        }
        Ok(())
    }

    pub fn finish(self) -> Result<RecordBatch, String> {
        let arrays = self
            .columns
            .into_iter()
            .map(Column::finish)
            .collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        RecordBatch::try_new_with_options(self.schema, arrays, &options).map_err(|e| e.to_string())
    }
}

/// Infers a spec from records: one column per feature name (sorted), scalar where every
/// record holding it has exactly one value, a list otherwise; missing features are null.
#[derive(Default)]
pub struct SpecInference {
    seen: HashMap<String, (Kind, bool)>,
}

impl SpecInference {
    pub fn add(&mut self, record: &[u8]) -> Result<(), String> {
        let mut found: Vec<(String, Kind, bool)> = Vec::new();
        for_each_feature(record, |feature| {
            let name = String::from_utf8(feature.name.to_vec())
                .map_err(|_| "feature name is not UTF-8")?;
            if let Some((kind, body)) = feature.value {
                let mut sink = ValueSink::default();
                let count = decode_list(kind, body, &mut sink)?;
                found.push((name, kind, count == 1));
            }
            Ok(())
        })?;
        for (name, kind, single) in found {
            match self.seen.get_mut(&name) {
                Some((known, all_single)) => {
                    if *known != kind {
                        return Err(format!(
                            "feature {name:?} holds both {} and {} values",
                            known.name(),
                            kind.name()
                        ));
                    }
                    *all_single &= single;
                }
                None => {
                    self.seen.insert(name, (kind, single));
                }
            }
        }
        Ok(())
    }

    pub fn specs(&self) -> Vec<FeatureSpec> {
        let mut specs: Vec<FeatureSpec> = self
            .seen
            .iter()
            .map(|(name, &(kind, single))| FeatureSpec {
                name: name.clone(),
                kind,
                shape: if single {
                    Shape::Fixed(vec![])
                } else {
                    Shape::Var
                },
                missing: Missing::Null,
            })
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        specs
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;

    use super::{encode_len_field as field, encode_varint as varint};

    /// Serializes an Example the way protobuf does (packed numeric lists).
    pub fn example(features: &[(&str, Values)]) -> Vec<u8> {
        let mut map = Vec::new();
        for (name, values) in features {
            let mut list = Vec::new();
            let kind_field = match values {
                Values::Bytes(v) => {
                    v.iter().for_each(|b| field(1, b, &mut list));
                    1
                }
                Values::Float(v) => {
                    let packed: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                    field(1, &packed, &mut list);
                    2
                }
                Values::Int64(v) => {
                    let mut packed = Vec::new();
                    v.iter().for_each(|&i| varint(i as u64, &mut packed));
                    field(1, &packed, &mut list);
                    3
                }
            };
            let mut feature = Vec::new();
            field(kind_field, &list, &mut feature);
            let mut entry = Vec::new();
            field(1, name.as_bytes(), &mut entry);
            field(2, &feature, &mut entry);
            field(1, &entry, &mut map);
        }
        let mut out = Vec::new();
        field(1, &map, &mut out);
        out
    }

    #[test]
    fn infers_and_decodes_scalars_lists_and_nulls() {
        let records = [
            example(&[
                ("label", Values::Int64(vec![3])),
                ("img", Values::Bytes(vec![b"ab".to_vec()])),
                ("v", Values::Float(vec![1.0, 2.0])),
            ]),
            example(&[
                ("label", Values::Int64(vec![-1])),
                ("v", Values::Float(vec![])),
            ]),
        ];
        let mut inference = SpecInference::default();
        records.iter().for_each(|r| inference.add(r).unwrap());
        let specs = inference.specs();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["img", "label", "v"]);
        assert_eq!(specs[1].shape, Shape::Fixed(vec![]));
        assert_eq!(specs[2].shape, Shape::Var);
        let mut decoder = ExampleDecoder::new(&specs, true);
        records.iter().for_each(|r| decoder.add(r).unwrap());
        let batch = decoder.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let label = batch
            .column(1)
            .as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(label.values().to_vec(), vec![3, -1]);
        assert!(batch.column(0).is_null(1));
        assert_eq!(batch.column(2).as_list::<i64>().value(0).len(), 2);
    }

    #[test]
    fn fixed_length_spec_checks_counts_and_fills_defaults() {
        let spec = |missing| FeatureSpec {
            name: "x".into(),
            kind: Kind::Float,
            shape: Shape::Fixed(vec![2, 2]),
            missing,
        };
        let mut decoder =
            ExampleDecoder::new(&[spec(Missing::Default(Values::Float(vec![7.0])))], false);
        decoder
            .add(&example(&[
                ("x", Values::Float(vec![1.0, 2.0, 3.0, 4.0])),
                ("other", Values::Int64(vec![1])),
            ]))
            .unwrap();
        decoder.add(&example(&[])).unwrap();
        let err = decoder
            .add(&example(&[("x", Values::Float(vec![1.0]))]))
            .unwrap_err();
        assert!(err.contains("expected 4"), "{err}");
        let err = decoder
            .add(&example(&[("x", Values::Int64(vec![1, 2, 3, 4]))]))
            .unwrap_err();
        assert!(err.contains("int64"), "{err}");
        let batch = decoder.finish().unwrap();
        let values = batch
            .column(0)
            .as_fixed_size_list()
            .values()
            .as_primitive::<arrow_array::types::Float32Type>()
            .values()
            .to_vec();
        assert_eq!(values, vec![1.0, 2.0, 3.0, 4.0, 7.0, 7.0, 7.0, 7.0]);
        let mut required = ExampleDecoder::new(&[spec(Missing::Error)], false);
        assert!(required.add(&example(&[])).unwrap_err().contains("missing"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = example(&[("a", Values::Bytes(vec![vec![1; 300]]))]);
        for cut in 0..good.len() {
            let mut inference = SpecInference::default();
            let _ = inference.add(&good[..cut]);
        }
        let mut inference = SpecInference::default();
        assert!(
            inference
                .add(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f])
                .is_err()
        );
    }
}
