//! The features `datasets` writes (the JSON of a Parquet or Arrow file's `huggingface`
//! metadata key) as they decide how media columns decode: which columns are `Image`s
//! and `Audio`s, and the features a cast gave columns over the files' own.

/// The features a dataset's media columns decode by: those its files were written with
/// (`huggingface`, `datasets`' JSON), with the features a cast gave some columns
/// (`cast`) over them. `None` where there are neither.
pub fn media_features(
    huggingface: Option<&str>,
    cast: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Option<String> {
    if cast.is_empty() {
        return huggingface.map(str::to_string);
    }
    let mut json: serde_json::Value = huggingface
        .and_then(|h| serde_json::from_str(h).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    let root = json.as_object_mut()?;
    let info = root
        .entry("info")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()?;
    let features = info
        .entry("features")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()?;
    for (column, feature) in cast {
        features.insert(column.clone(), feature.clone());
    }
    Some(json.to_string())
}

/// The columns of `schema` whose feature in `huggingface` (`datasets`' JSON of the
/// features) is a `kind` (`"Image"`, `"Audio"`) to decode (not `decode: false`), with
/// that feature.
pub(super) fn media_columns(
    huggingface: &str,
    schema: &arrow_schema::Schema,
    kind: &str,
) -> Vec<(String, serde_json::Value)> {
    let json: serde_json::Value = serde_json::from_str(huggingface).unwrap_or_default();
    let Some(features) = json
        .get("info")
        .and_then(|i| i.get("features"))
        .and_then(|f| f.as_object())
    else {
        return Vec::new();
    };
    features
        .iter()
        .filter(|(name, f)| {
            schema.index_of(name).is_ok()
                && f.get("_type").and_then(|t| t.as_str()) == Some(kind)
                && f.get("decode").and_then(|d| d.as_bool()) != Some(false)
        })
        .map(|(name, f)| (name.clone(), f.clone()))
        .collect()
}
