//! Arrow schema inference for JSON records, fields in the order they first appear.
//! arrow-json infers schemas too, but it quietly turns a field that is a scalar in one
//! record and a list in another into a list, and its conflict errors do not say which
//! field; this one refuses such records naming the field, and marks fields of mixed
//! scalar kinds so that the reader reads them as text.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// Only nulls seen so far.
    Null,
    Bool,
    Int,
    Float,
    Str,
    /// Scalars of different kinds: read as text.
    MixedScalar,
    List(Box<Kind>),
    Object(Vec<(String, Kind)>),
}

impl Kind {
    fn of(value: &Value) -> Kind {
        match value {
            Value::Null => Kind::Null,
            Value::Bool(_) => Kind::Bool,
            Value::Number(n) if n.is_i64() => Kind::Int,
            Value::Number(_) => Kind::Float,
            Value::String(_) => Kind::Str,
            Value::Array(items) => {
                let mut item = Kind::Null;
                for v in items {
                    // A conflict inside a list is reported when the record is merged.
                    item = merge(item.clone(), Kind::of(v)).unwrap_or(Kind::MixedScalar);
                }
                Kind::List(Box::new(item))
            }
            Value::Object(map) => {
                Kind::Object(map.iter().map(|(k, v)| (k.clone(), Kind::of(v))).collect())
            }
        }
    }

    fn is_scalar(&self) -> bool {
        matches!(
            self,
            Kind::Bool | Kind::Int | Kind::Float | Kind::Str | Kind::MixedScalar
        )
    }

    fn describe(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "boolean",
            Kind::Int => "integer",
            Kind::Float => "number",
            Kind::Str => "string",
            Kind::MixedScalar => "mixed scalars",
            Kind::List(_) => "list",
            Kind::Object(_) => "object",
        }
    }

    fn data_type(&self) -> DataType {
        match self {
            Kind::Null => DataType::Null,
            Kind::Bool => DataType::Boolean,
            Kind::Int => DataType::Int64,
            Kind::Float => DataType::Float64,
            Kind::Str | Kind::MixedScalar => DataType::Utf8,
            Kind::List(item) => {
                DataType::List(Arc::new(Field::new_list_field(item.data_type(), true)))
            }
            Kind::Object(fields) => DataType::Struct(to_fields(fields)),
        }
    }

    fn has_mixed_scalars(&self) -> bool {
        match self {
            Kind::MixedScalar => true,
            Kind::List(item) => item.has_mixed_scalars(),
            Kind::Object(fields) => fields.iter().any(|(_, k)| k.has_mixed_scalars()),
            _ => false,
        }
    }
}

fn to_fields(fields: &[(String, Kind)]) -> Fields {
    fields
        .iter()
        .map(|(name, kind)| Field::new(name, kind.data_type(), true))
        .collect()
}

fn merge(a: Kind, b: Kind) -> Result<Kind, String> {
    Ok(match (a, b) {
        (Kind::Null, k) | (k, Kind::Null) => k,
        (a, b) if a == b => a,
        (Kind::Int, Kind::Float) | (Kind::Float, Kind::Int) => Kind::Float,
        (a, b) if a.is_scalar() && b.is_scalar() => Kind::MixedScalar,
        (Kind::List(a), Kind::List(b)) => Kind::List(Box::new(merge(*a, *b)?)),
        (Kind::Object(mut a), Kind::Object(b)) => {
            for (name, kind) in b {
                match a.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, existing)) => {
                        let merged =
                            merge(existing.clone(), kind).map_err(|e| format!("{name}: {e}"))?;
                        *existing = merged;
                    }
                    None => a.push((name, kind)),
                }
            }
            Kind::Object(a)
        }
        (a, b) => return Err(format!("both {} and {} values", a.describe(), b.describe())),
    })
}

/// Accumulates records and produces their common schema.
#[derive(Debug, Default)]
pub struct SchemaInference {
    fields: Vec<(String, Kind)>,
    records: usize,
}

impl SchemaInference {
    pub fn records(&self) -> usize {
        self.records
    }

    /// Adds one record; an error describes a record that is not an object or a field whose
    /// type conflicts with earlier records.
    pub fn add(&mut self, record: &Value) -> Result<(), String> {
        let fields = match Kind::of(record) {
            Kind::Object(fields) => fields,
            other => {
                return Err(format!(
                    "expected a JSON object per line, found {}",
                    other.describe()
                ));
            }
        };
        let merged = merge(
            Kind::Object(std::mem::take(&mut self.fields)),
            Kind::Object(fields),
        );
        match merged {
            Ok(Kind::Object(fields)) => self.fields = fields,
            Ok(other) => return Err(format!("objects merged to {}", other.describe())),
            Err(e) => return Err(format!("field {e}; pass schema= to choose the type")),
        }
        self.records += 1;
        Ok(())
    }

    pub fn schema(&self) -> Schema {
        Schema::new(to_fields(&self.fields))
    }

    /// Whether some field mixes scalar kinds and must be read as text.
    pub fn needs_coercion(&self) -> bool {
        self.fields.iter().any(|(_, k)| k.has_mixed_scalars())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_first_seen_field_order_and_widens() {
        let mut inf = SchemaInference::default();
        inf.add(&json!({"z": 1, "a": null, "m": {"y": [1, 2], "b": "s"}}))
            .unwrap();
        inf.add(&json!({"a": 2.5, "z": 3, "new": true, "m": {"y": [], "c": 1}}))
            .unwrap();
        let schema = inf.schema();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["z", "a", "m", "new"]);
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert_eq!(schema.field(1).data_type(), &DataType::Float64);
        let DataType::Struct(inner) = schema.field(2).data_type() else {
            panic!()
        };
        let inner: Vec<_> = inner.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(inner, ["y", "b", "c"]);
        assert!(!inf.needs_coercion());
    }

    #[test]
    fn mixed_scalars_become_text_and_shape_conflicts_fail() {
        let mut inf = SchemaInference::default();
        inf.add(&json!({"v": 1})).unwrap();
        inf.add(&json!({"v": "x"})).unwrap();
        assert_eq!(inf.schema().field(0).data_type(), &DataType::Utf8);
        assert!(inf.needs_coercion());
        let err = inf.add(&json!({"v": [1]})).unwrap_err();
        assert!(err.contains("v:"), "{err}");
        assert!(inf.add(&json!([1, 2])).is_err());
    }
}
