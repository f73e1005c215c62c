//! The dataset verbs `tokenize`, `apply_chat_template` and `pack`: their arguments
//! checked, the op built (`crate::text::ops`, `crate::text::pack`) and recorded in the
//! recipe.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::name_list;
use super::dataset::PyDataset;
use super::tokenizer::{
    ChatVerb, PyTokenizer, check_chat_options, continue_field, no_generation_block, pick_template,
    seconds, to_json, variables,
};
use crate::format::OnError;
use crate::pipeline::Op;

/// The dataset verbs `Dataset.tokenize`, `Dataset.apply_chat_template` and `Dataset.pack`.
impl PyDataset {
    pub(super) fn tokenized(
        &self,
        py: Python<'_>,
        tokenizer: &Bound<'_, PyTokenizer>,
        column: &str,
        (max_length, truncation): (Option<usize>, bool),
        add_special_tokens: bool,
        on_error: &str,
    ) -> PyResult<PyDataset> {
        let op = crate::text::ops::Tokenize {
            tokenizer: tokenizer.get().inner.clone(),
            column: column.to_string(),
            options: crate::text::EncodeOptions {
                add_special_tokens,
                max_length: max_length.filter(|_| truncation),
            },
            skip_failed: OnError::parse(on_error)? == OnError::Skip,
        };
        self.check_column(py, column)?;
        let args = PyDict::new(py);
        args.set_item("tokenizer", tokenizer)?;
        args.set_item("column", column)?;
        args.set_item("max_length", max_length)?;
        args.set_item("truncation", truncation)?;
        args.set_item("add_special_tokens", add_special_tokens)?;
        args.set_item("on_error", on_error)?;
        let op = Op::Transform(Arc::new(op));
        Ok(self.derived(self.inner.with_op(op), "tokenize", args.into_any()))
    }

    pub(super) fn chat_tokens(
        &self,
        py: Python<'_>,
        verb: ChatVerb<'_, '_>,
    ) -> PyResult<PyDataset> {
        let ChatVerb {
            tokenizer,
            column,
            chat_template,
            add_generation_prompt,
            continue_final_message,
            tools,
            documents,
            max_length,
            truncation,
            return_assistant_tokens_mask,
            labels,
            remove_columns,
            now,
            on_error,
            template_kwargs,
        } = verb;
        let skip_failed = OnError::parse(on_error)? == OnError::Skip;
        let text = &tokenizer.get().inner;
        let with_tools = tools.is_some_and(|t| !t.is_none());
        let template = pick_template(text, chat_template, with_tools)?;
        let continue_final_message = continue_final_message
            .map(continue_field)
            .transpose()?
            .flatten();
        let masks = match return_assistant_tokens_mask {
            Some(true) if !template.has_generation() => return Err(no_generation_block()),
            Some(asked) => asked,
            None => template.has_generation(),
        };
        if labels && !masks {
            return Err(if template.has_generation() {
                PyValueError::new_err(
                    "labels=True needs the assistant masks (return_assistant_tokens_mask=False was given)",
                )
            } else {
                no_generation_block()
            });
        }
        check_chat_options(
            continue_final_message.is_some(),
            add_generation_prompt,
            masks,
        )?;
        let remove = match remove_columns {
            Some(names) if !names.is_none() => name_list(names)?,
            _ => Vec::new(),
        };
        let now = seconds(py, now)?;
        let variables = text.template_variables(variables(py, template_kwargs)?);
        let truncate_to = max_length.filter(|_| truncation);
        let call = format!(
            "apply_chat_template(column={column:?}, add_generation_prompt={add_generation_prompt}, max_length={truncate_to:?}, masks={masks}, labels={labels}, on_error={on_error:?})",
        );
        let op = crate::text::ops::ApplyChatTemplate {
            tokenizer: text.clone(),
            template,
            column: column.to_string(),
            options: crate::text::ChatOptions {
                add_generation_prompt,
                continue_final_message: continue_final_message.clone(),
                tools: tools.map(|t| to_json(py, t, "tools")).transpose()?,
                documents: documents.map(|d| to_json(py, d, "documents")).transpose()?,
                variables,
                now,
                track_generation: masks,
            },
            max_length: truncate_to,
            labels,
            remove_columns: remove.clone(),
            skip_failed,
            call,
        };
        self.check_column(py, column)?;
        let args = PyDict::new(py);
        if let Some(kwargs) = template_kwargs {
            args.update(kwargs.as_mapping())?;
        }
        args.set_item("tokenizer", tokenizer)?;
        args.set_item("column", column)?;
        args.set_item("chat_template", chat_template)?;
        args.set_item("add_generation_prompt", add_generation_prompt)?;
        args.set_item("continue_final_message", continue_final_message)?;
        args.set_item("tools", tools)?;
        args.set_item("documents", documents)?;
        args.set_item("max_length", max_length)?;
        args.set_item("truncation", truncation)?;
        args.set_item("return_assistant_tokens_mask", masks)?;
        args.set_item("labels", labels)?;
        args.set_item("remove_columns", remove)?;
        args.set_item("now", now)?;
        args.set_item("on_error", on_error)?;
        let op = Op::Transform(Arc::new(op));
        Ok(self.derived(
            self.inner.with_op(op),
            "apply_chat_template",
            args.into_any(),
        ))
    }

    pub(super) fn packed(
        &self,
        py: Python<'_>,
        seq_length: usize,
        strategy: &str,
        columns: Option<&Bound<'_, PyAny>>,
        buffer_rows: usize,
        on_too_long: &str,
    ) -> PyResult<PyDataset> {
        use crate::text::pack::{Pack, Strategy, TooLong};
        if seq_length == 0 || buffer_rows == 0 {
            return Err(PyValueError::new_err(
                "seq_length and buffer_rows must be at least 1",
            ));
        }
        let too_long = match on_too_long {
            "truncate" => TooLong::Truncate,
            "split" => TooLong::Split,
            "error" => TooLong::Error,
            other => {
                return Err(PyValueError::new_err(format!(
                    "on_too_long must be \"truncate\", \"split\" or \"error\", not {other:?}"
                )));
            }
        };
        let strategy_name = strategy;
        let strategy = match strategy {
            "bfd" => Strategy::BestFit(too_long),
            "wrapped" if on_too_long == "truncate" => Strategy::Wrapped,
            "wrapped" => {
                return Err(PyValueError::new_err(
                    "on_too_long is for strategy=\"bfd\"; \"wrapped\" cuts every sequence where the row ends",
                ));
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "strategy must be \"bfd\" or \"wrapped\", not {other:?}"
                )));
            }
        };
        let names = match columns {
            Some(names) if !names.is_none() => Some(name_list(names)?),
            _ => None,
        };
        let op = Pack {
            seq_length,
            strategy,
            columns: names.clone(),
            window_rows: buffer_rows,
        };
        for name in names.iter().flatten() {
            self.check_column(py, name)?;
        }
        let args = PyDict::new(py);
        args.set_item("seq_length", seq_length)?;
        args.set_item("strategy", strategy_name)?;
        args.set_item("columns", names)?;
        args.set_item("buffer_rows", buffer_rows)?;
        args.set_item("on_too_long", on_too_long)?;
        Ok(self.derived(
            self.inner.with_op(Op::Transform(Arc::new(op))),
            "pack",
            args.into_any(),
        ))
    }

    /// Checks that `column` exists, where the columns are known without reading.
    fn check_column(&self, py: Python<'_>, column: &str) -> PyResult<()> {
        if self.inner.keeps_source_schema() {
            let schema = py.detach(|| self.inner.source_schema())?;
            if schema.index_of(column).is_err() {
                let names: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
                return Err(crate::error::Error::Schema {
                    url: String::new(),
                    message: format!("no column {column:?}; the columns are {names:?}"),
                }
                .into());
            }
        }
        Ok(())
    }
}
