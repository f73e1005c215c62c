//! The dataset verbs `tokenize` and `apply_chat_template`: row-preserving transforms
//! that run off the GIL on the loader's batch threads, several batches at once.

use std::sync::Arc;

use arrow_array::builder::{Int8Builder, Int32Builder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde_json::{Map, Number, Value as Json};

use super::chat_template::{ChatOptions, ChatTemplate};
use super::tokenizer::{EncodeOptions, TextTokenizer};
use crate::error::{Error, Result};
use crate::pipeline::BatchTransform;

/// The label of a token the loss skips, as transformers and TRL write it.
const IGNORE_INDEX: i32 = -100;

/// `ds.tokenize(tok, column, ...)`: an `input_ids` column of each text's tokens.
pub struct Tokenize {
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    /// The column of texts.
    pub column: String,
    /// Special tokens and truncation.
    pub options: EncodeOptions,
    /// Rows it fails on are skipped and counted (`on_error="skip"`), not raised.
    pub skip_failed: bool,
}

/// `ds.apply_chat_template(tok, column, ...)`: `input_ids` of each conversation, and
/// `assistant_masks` (and `labels`) where asked.
pub struct ApplyChatTemplate {
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    /// The template it renders with.
    pub template: Arc<ChatTemplate>,
    /// The column of conversations.
    pub column: String,
    /// How each conversation is rendered (`track_generation`: the masks are made).
    pub options: ChatOptions,
    /// Truncate to this many tokens.
    pub max_length: Option<usize>,
    /// Whether to add `labels`.
    pub labels: bool,
    /// Columns left out of the output.
    pub remove_columns: Vec<String>,
    /// Rows it fails on are skipped and counted (`on_error="skip"`), not raised.
    pub skip_failed: bool,
    /// What the verb was called with, for `describe`.
    pub call: String,
}

fn list_field(name: &str, item: DataType) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", item, true))),
        true,
    )
}

/// `input` without `remove`, with `added` replacing columns of the same name in place
/// and the others after, as `datasets`' `map` merges its output.
fn merged_schema(input: &Schema, remove: &[String], added: &[Field]) -> SchemaRef {
    let mut fields: Vec<Field> = input
        .fields()
        .iter()
        .filter(|f| !remove.contains(f.name()))
        .map(|f| match added.iter().find(|a| a.name() == f.name()) {
            Some(a) => a.clone(),
            None => f.as_ref().clone(),
        })
        .collect();
    for a in added {
        if !fields.iter().any(|f| f.name() == a.name()) {
            fields.push(a.clone());
        }
    }
    Arc::new(Schema::new(fields))
}

/// `batch`'s columns under `schema` (from [`merged_schema`]), the new ones given.
fn merged_batch(
    batch: &RecordBatch,
    schema: SchemaRef,
    added: Vec<(String, ArrayRef)>,
) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            added
                .iter()
                .find(|(name, _)| name == f.name())
                .map(|(_, c)| c.clone())
                .or_else(|| batch.column_by_name(f.name()).cloned())
                .ok_or_else(|| Error::Internal(format!("no column {:?}", f.name())))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(schema, columns, &options)
        .map_err(|e| Error::Internal(format!("adding token columns: {e}")))
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| Error::Schema {
        url: String::new(),
        message: format!(
            "no column {name:?}; the columns are {:?}",
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        ),
    })
}

/// The error for row `row` of a batch, whose value begins as `value` shows.
fn row_error(verb: &str, column: &str, value: &str, message: impl std::fmt::Display) -> Error {
    let mut shown: String = value.chars().take(120).collect();
    if shown.len() < value.len() {
        shown.push_str("...");
    }
    Error::Template(format!(
        "{verb}: the row whose {column:?} is {shown}: {message}"
    ))
}

/// The rows of a batch a verb failed on, where they are skipped (`on_error="skip"`).
struct Failures {
    skip: bool,
    rows: Vec<usize>,
}

impl Failures {
    fn new(skip: bool) -> Self {
        Self {
            skip,
            rows: Vec::new(),
        }
    }

    /// Row `i`'s outcome: its value, or `None` where it failed and is skipped.
    fn of<T>(&mut self, i: usize, outcome: Result<T>) -> Result<Option<T>> {
        match outcome {
            Ok(value) => Ok(Some(value)),
            Err(_) if self.skip => {
                self.rows.push(i);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `batch`'s rows that did not fail, with the `added` columns (made for those rows
    /// alone), and which rows they are when some failed.
    fn merged(
        self,
        batch: &RecordBatch,
        schema: SchemaRef,
        added: Vec<(String, ArrayRef)>,
    ) -> Result<(RecordBatch, Option<BooleanArray>)> {
        if self.rows.is_empty() {
            return Ok((merged_batch(batch, schema, added)?, None));
        }
        let mut keep = vec![true; batch.num_rows()];
        self.rows.iter().for_each(|&i| keep[i] = false);
        let keep = BooleanArray::from(keep);
        let kept = arrow_select::filter::filter_record_batch(batch, &keep)
            .map_err(|e| Error::Internal(format!("dropping failed rows: {e}")))?;
        Ok((merged_batch(&kept, schema, added)?, Some(keep)))
    }
}

impl Tokenize {
    fn run(&self, batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
        let texts = column(&batch, &self.column)?;
        let texts = arrow_cast::cast(texts, &DataType::LargeUtf8).map_err(|e| Error::Schema {
            url: String::new(),
            message: format!("tokenize: column {:?} is not text: {e}", self.column),
        })?;
        let texts = texts.as_string::<i64>();
        let mut ids = ListBuilder::new(Int32Builder::new());
        let mut failures = Failures::new(self.skip_failed);
        for i in 0..texts.len() {
            let tokens = if texts.is_null(i) {
                Err(row_error(
                    "tokenize",
                    &self.column,
                    "None",
                    "no text to tokenize",
                ))
            } else {
                let text = texts.value(i);
                self.tokenizer
                    .encode(text, self.options)
                    .map_err(|e| row_error("tokenize", &self.column, text, e))
            };
            if let Some(tokens) = failures.of(i, tokens)? {
                ids.values().append_slice(bytemuck_i32(&tokens.ids));
                ids.append(true);
            }
        }
        let added = [list_field("input_ids", DataType::Int32)];
        let schema = merged_schema(&batch.schema(), &[], &added);
        failures.merged(
            &batch,
            schema,
            vec![("input_ids".into(), Arc::new(ids.finish()))],
        )
    }
}

impl BatchTransform for Tokenize {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        Ok(vec![self.run(batch)?.0])
    }

    fn skips_failed_rows(&self) -> bool {
        self.skip_failed
    }

    fn apply_skipping(&self, batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
        self.run(batch)
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn parallel(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "tokenize(column={:?}, add_special_tokens={}, max_length={:?}, on_error={:?})",
            self.column,
            self.options.add_special_tokens,
            self.options.max_length,
            if self.skip_failed { "skip" } else { "raise" }
        )
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        input.index_of(&self.column).ok()?;
        Some(merged_schema(
            input,
            &[],
            &[list_field("input_ids", DataType::Int32)],
        ))
    }
}

/// Token ids as `i32` (vocabularies are far below 2^31).
fn bytemuck_i32(ids: &[u32]) -> &[i32] {
    // SAFETY: u32 and i32 have the same size and alignment, and every bit pattern is
    // valid for both.
    unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<i32>(), ids.len()) }
}

impl ApplyChatTemplate {
    fn added_fields(&self) -> Vec<Field> {
        let mut fields = vec![list_field("input_ids", DataType::Int32)];
        if self.options.track_generation {
            fields.push(list_field("assistant_masks", DataType::Int8));
        }
        if self.labels {
            fields.push(list_field("labels", DataType::Int32));
        }
        fields
    }
}

impl ApplyChatTemplate {
    fn run(&self, batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
        let conversations = column(&batch, &self.column)?;
        let mut ids = ListBuilder::new(Int32Builder::new());
        let mut masks = ListBuilder::new(Int8Builder::new());
        let mut labels = ListBuilder::new(Int32Builder::new());
        let mut failures = Failures::new(self.skip_failed);
        for i in 0..batch.num_rows() {
            let Some(tokens) = failures.of(i, self.row_tokens(conversations.as_ref(), i))? else {
                continue;
            };
            ids.values().append_slice(bytemuck_i32(&tokens.ids));
            ids.append(true);
            if let Some(mask) = &tokens.assistant_mask {
                masks.values().append_slice(bytemuck_i8(mask));
                masks.append(true);
                if self.labels {
                    for (&id, &m) in tokens.ids.iter().zip(mask) {
                        labels
                            .values()
                            .append_value(if m == 1 { id as i32 } else { IGNORE_INDEX });
                    }
                    labels.append(true);
                }
            }
        }
        let mut added: Vec<(String, ArrayRef)> = vec![("input_ids".into(), Arc::new(ids.finish()))];
        if self.options.track_generation {
            added.push(("assistant_masks".into(), Arc::new(masks.finish())));
        }
        if self.labels {
            added.push(("labels".into(), Arc::new(labels.finish())));
        }
        let schema = merged_schema(&batch.schema(), &self.remove_columns, &self.added_fields());
        failures.merged(&batch, schema, added)
    }

    /// The tokens of row `i`'s conversation, or the error naming it.
    fn row_tokens(
        &self,
        conversations: &dyn Array,
        i: usize,
    ) -> Result<super::tokenizer::ChatTokens> {
        let messages = match json_of(conversations, i) {
            Json::String(text) => serde_json::from_str(&text).unwrap_or(Json::String(text)),
            other => other,
        };
        let shown = || messages.to_string();
        let Json::Array(list) = &messages else {
            return Err(row_error(
                "apply_chat_template",
                &self.column,
                &shown(),
                "a conversation is a list of messages",
            ));
        };
        self.tokenizer
            .chat_tokens(&self.template, list, &self.options, self.max_length)
            .map_err(|e| row_error("apply_chat_template", &self.column, &shown(), e))
    }
}

impl BatchTransform for ApplyChatTemplate {
    fn apply(&self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        Ok(vec![self.run(batch)?.0])
    }

    fn skips_failed_rows(&self) -> bool {
        self.skip_failed
    }

    fn apply_skipping(&self, batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
        self.run(batch)
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn parallel(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        self.call.clone()
    }

    fn output_schema(&self, input: &SchemaRef) -> Option<SchemaRef> {
        input.index_of(&self.column).ok()?;
        Some(merged_schema(
            input,
            &self.remove_columns,
            &self.added_fields(),
        ))
    }
}

fn bytemuck_i8(mask: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment; the mask holds 0 and 1.
    unsafe { std::slice::from_raw_parts(mask.as_ptr().cast::<i8>(), mask.len()) }
}

/// Row `i` of `array` as JSON: what `datasets` gives a Python function for it (structs
/// as objects with every field, nulls as null).
pub fn json_of(array: &dyn Array, i: usize) -> Json {
    if array.is_null(i) {
        return Json::Null;
    }
    let float = |x: f64| Number::from_f64(x).map_or(Json::Null, Json::Number);
    match array.data_type() {
        DataType::Null => Json::Null,
        DataType::Boolean => Json::Bool(array.as_boolean().value(i)),
        DataType::Int8 => Json::from(array.as_primitive::<Int8Type>().value(i)),
        DataType::Int16 => Json::from(array.as_primitive::<Int16Type>().value(i)),
        DataType::Int32 => Json::from(array.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => Json::from(array.as_primitive::<Int64Type>().value(i)),
        DataType::UInt8 => Json::from(array.as_primitive::<UInt8Type>().value(i)),
        DataType::UInt16 => Json::from(array.as_primitive::<UInt16Type>().value(i)),
        DataType::UInt32 => Json::from(array.as_primitive::<UInt32Type>().value(i)),
        DataType::UInt64 => Json::from(array.as_primitive::<UInt64Type>().value(i)),
        DataType::Float16 => float(array.as_primitive::<Float16Type>().value(i).to_f64()),
        DataType::Float32 => float(array.as_primitive::<Float32Type>().value(i).into()),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => Json::String(array.as_string::<i32>().value(i).to_string()),
        DataType::LargeUtf8 => Json::String(array.as_string::<i64>().value(i).to_string()),
        DataType::Utf8View => Json::String(array.as_string_view().value(i).to_string()),
        DataType::List(_) => items(array.as_list::<i32>().value(i).as_ref()),
        DataType::LargeList(_) => items(array.as_list::<i64>().value(i).as_ref()),
        DataType::FixedSizeList(..) => items(array.as_fixed_size_list().value(i).as_ref()),
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut object = Map::new();
            for (field, column) in fields.iter().zip(s.columns()) {
                object.insert(field.name().clone(), json_of(column.as_ref(), i));
            }
            Json::Object(object)
        }
        _ => match arrow_cast::display::ArrayFormatter::try_new(
            array,
            &arrow_cast::display::FormatOptions::default(),
        ) {
            Ok(formatter) => Json::String(formatter.value(i).to_string()),
            Err(_) => Json::Null,
        },
    }
}

fn items(values: &dyn Array) -> Json {
    Json::Array((0..values.len()).map(|j| json_of(values, j)).collect())
}
