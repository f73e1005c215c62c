//! `shardflow.Tokenizer`: a Hugging Face tokenizer and its chat template, for single rows
//! (`encode`, `apply_chat_template`, returning what transformers returns) and for the
//! dataset verbs `tokenize` and `apply_chat_template`.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use serde_json::{Map, Value as Json};

use super::args::storage_from;
use crate::error::Error;
use crate::text::{
    ChatOptions, ChatTemplate, EncodeOptions, RenderError, TextTokenizer, TokenizerFiles,
};

/// A tokenizer saved as transformers saves one (`tokenizer.json`, its config and chat
/// template), run in Rust: `encode` and `apply_chat_template` on one row, and the
/// dataset verbs `tokenize` and `apply_chat_template` on the loader's threads.
#[pyclass(frozen, name = "Tokenizer", module = "shardflow")]
pub struct PyTokenizer {
    pub(crate) inner: TextTokenizer,
}

/// A Python value as JSON (through `json.dumps`, which is what templates can use).
pub(super) fn to_json(py: Python<'_>, value: &Bound<'_, PyAny>, what: &str) -> PyResult<Json> {
    if value.is_none() {
        return Ok(Json::Null);
    }
    let text: String = py
        .import("json")?
        .call_method1("dumps", (value,))
        .map_err(|e| {
            PyValueError::new_err(format!(
                "{what} must be JSON data (dicts, lists, strings, numbers): {e}"
            ))
        })?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// Seconds since the Unix epoch of `now` (a `datetime`, or a number of seconds), or of
/// the present moment.
pub(super) fn seconds(py: Python<'_>, now: Option<&Bound<'_, PyAny>>) -> PyResult<i64> {
    let seconds: f64 = match now {
        Some(now) if now.hasattr("timestamp")? => now.call_method0("timestamp")?.extract()?,
        Some(now) => now.extract()?,
        None => py.import("time")?.call_method0("time")?.extract()?,
    };
    Ok(seconds.floor() as i64)
}

pub(super) fn render_error(e: RenderError) -> PyErr {
    Error::Template(e.to_string()).into()
}

fn tokenizer_error(e: String) -> PyErr {
    Error::invalid_argument(e).into()
}

/// The template variables given as keyword arguments.
pub(super) fn variables(
    py: Python<'_>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Map<String, Json>> {
    match kwargs {
        Some(kwargs) => match to_json(py, kwargs.as_any(), "template variables")? {
            Json::Object(map) => Ok(map),
            _ => Ok(Map::new()),
        },
        None => Ok(Map::new()),
    }
}

/// `continue_final_message`: False, True (the `"content"` field) or a field's name.
pub(super) fn continue_field(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if let Ok(field) = value.cast::<PyString>() {
        return Ok(Some(field.to_str()?.to_string()));
    }
    Ok(value.is_truthy()?.then(|| "content".to_string()))
}

#[pymethods]
impl PyTokenizer {
    /// A tokenizer from its files' texts: `tokenizer.json`, `tokenizer_config.json` (or
    /// None) and a chat template (or None).
    #[staticmethod]
    #[pyo3(signature = (tokenizer_json, tokenizer_config=None, chat_template=None))]
    fn from_texts(
        py: Python<'_>,
        tokenizer_json: &str,
        tokenizer_config: Option<&str>,
        chat_template: Option<&str>,
    ) -> PyResult<Self> {
        let files = TokenizerFiles {
            tokenizer_json: tokenizer_json.into(),
            config_json: tokenizer_config.map(Into::into),
            chat_template: chat_template.map(Into::into),
        };
        let inner = py
            .detach(|| TextTokenizer::new(files))
            .map_err(tokenizer_error)?;
        Ok(Self { inner })
    }

    /// A tokenizer from a `tokenizer.json` file (a path or URL), with a chat template's
    /// text and a `tokenizer_config.json` (its special tokens, its template) if given.
    #[staticmethod]
    #[pyo3(signature = (path, chat_template=None, tokenizer_config=None, storage_options=None))]
    fn from_file(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        chat_template: Option<&str>,
        tokenizer_config: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage = storage_from(storage_options)?;
        let tokenizer_json = read_text(py, &path_text(path)?, &storage)?;
        let config_json = tokenizer_config
            .map(|p| read_text(py, &path_text(p)?, &storage))
            .transpose()?;
        Self::from_texts(py, &tokenizer_json, config_json.as_deref(), chat_template)
    }

    /// A tokenizer saved as transformers saves one, in a local folder, under a URL
    /// (`s3://bucket/tokenizer/`, `hf://org/name`) or in a Hub model repo (`org/name`,
    /// with `revision`): `tokenizer.json`, `tokenizer_config.json` (special tokens, and
    /// the chat template if no `chat_template.jinja` is beside it).
    #[staticmethod]
    #[pyo3(signature = (path, revision=None, storage_options=None))]
    fn from_pretrained(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        revision: Option<&str>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage = storage_from(storage_options)?;
        let path = path_text(path)?;
        let local = std::path::Path::new(&path).is_dir();
        let mut base = if local || path.contains("://") {
            path.trim_end_matches('/').to_string()
        } else {
            // A Hub repo id, as transformers takes one.
            format!("hf://{}", path.trim_matches('/'))
        };
        if let Some(revision) = revision {
            if !base.starts_with("hf://") {
                return Err(PyValueError::new_err(
                    "revision= is for Hub repos (hf://...)",
                ));
            }
            base = format!("{base}@{}", revision.replace('/', "%2F"));
        }
        let file = |name: &str| format!("{base}/{name}");
        let optional = |name: &str| -> PyResult<Option<String>> {
            match read_text(py, &file(name), &storage) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyFileNotFoundError>(py) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let tokenizer_json = read_text(py, &file("tokenizer.json"), &storage)?;
        let config_json = optional("tokenizer_config.json")?;
        let chat_template = optional("chat_template.jinja")?;
        Self::from_texts(
            py,
            &tokenizer_json,
            config_json.as_deref(),
            chat_template.as_deref(),
        )
    }

    /// `text`'s token ids, as `tokenizer.encode(text)` gives them.
    #[pyo3(signature = (text, add_special_tokens=true, truncation=false, max_length=None))]
    fn encode(
        &self,
        py: Python<'_>,
        text: &str,
        add_special_tokens: bool,
        truncation: bool,
        max_length: Option<usize>,
    ) -> PyResult<Vec<u32>> {
        let options = EncodeOptions {
            add_special_tokens,
            max_length: max_length.filter(|_| truncation),
        };
        let tokens = py
            .detach(|| self.inner.encode(text, options))
            .map_err(tokenizer_error)?;
        Ok(tokens.ids)
    }

    /// One conversation through the chat template, as transformers'
    /// `tokenizer.apply_chat_template` does: the text (`tokenize=False`), the token ids
    /// (`return_dict=False`), or a dict of `input_ids`, `attention_mask` and (with
    /// `return_assistant_tokens_mask`) `assistant_masks`. Other keyword arguments are
    /// variables for the template; `now` (a datetime or POSIX seconds, default the
    /// present) is the time `strftime_now` formats.
    #[pyo3(signature = (
        conversation, tools=None, documents=None, chat_template=None,
        add_generation_prompt=false, continue_final_message=None, tokenize=true,
        truncation=false, max_length=None, return_dict=true,
        return_assistant_tokens_mask=false, now=None, **kwargs
    ))]
    #[allow(clippy::too_many_arguments)]
    fn apply_chat_template<'py>(
        &self,
        py: Python<'py>,
        conversation: &Bound<'py, PyAny>,
        tools: Option<&Bound<'py, PyAny>>,
        documents: Option<&Bound<'py, PyAny>>,
        chat_template: Option<&str>,
        add_generation_prompt: bool,
        continue_final_message: Option<&Bound<'py, PyAny>>,
        tokenize: bool,
        truncation: bool,
        max_length: Option<usize>,
        return_dict: bool,
        return_assistant_tokens_mask: bool,
        now: Option<&Bound<'py, PyAny>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let continue_final_message = match continue_final_message {
            Some(v) => continue_field(v)?,
            None => None,
        };
        let return_dict = return_dict && tokenize;
        if return_assistant_tokens_mask && !return_dict {
            return Err(PyValueError::new_err(
                "return_assistant_tokens_mask=True requires return_dict=True and tokenize=True",
            ));
        }
        check_chat_options(
            continue_final_message.is_some(),
            add_generation_prompt,
            return_assistant_tokens_mask,
        )?;
        let template = self
            .inner
            .chat_template(chat_template, tools.is_some_and(|t| !t.is_none()))
            .map_err(tokenizer_error)?;
        if return_assistant_tokens_mask && !template.has_generation() {
            return Err(no_generation_block());
        }
        let messages = match to_json(py, conversation, "the conversation")? {
            Json::Array(messages) => messages,
            _ => {
                return Err(PyValueError::new_err(
                    "a conversation is a list of messages",
                ));
            }
        };
        let options = ChatOptions {
            add_generation_prompt,
            continue_final_message,
            tools: tools.map(|t| to_json(py, t, "tools")).transpose()?,
            documents: documents.map(|d| to_json(py, d, "documents")).transpose()?,
            variables: self.inner.template_variables(variables(py, kwargs)?),
            now: seconds(py, now)?,
            track_generation: return_assistant_tokens_mask,
        };
        if !tokenize {
            let rendered = py
                .detach(|| template.render(&messages, &options))
                .map_err(render_error)?;
            return Ok(PyString::new(py, &rendered.text).into_any());
        }
        let max_length = max_length.filter(|_| truncation);
        let tokens = py
            .detach(|| {
                self.inner
                    .chat_tokens(&template, &messages, &options, max_length)
            })
            .map_err(render_error)?;
        if !return_dict {
            return Ok(tokens.ids.into_pyobject(py)?.into_any());
        }
        let out = PyDict::new(py);
        // (Lists of ints, as transformers gives: a Vec<u8> would become bytes.)
        out.set_item("attention_mask", vec![1u32; tokens.ids.len()])?;
        out.set_item("input_ids", tokens.ids)?;
        if let Some(mask) = tokens.assistant_mask {
            out.set_item(
                "assistant_masks",
                mask.into_iter().map(u32::from).collect::<Vec<_>>(),
            )?;
        }
        Ok(out.into_any())
    }

    /// The special tokens its config names (`bos_token`, `eos_token`, ...).
    #[getter]
    fn special_tokens_map<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, token) in self.inner.special_tokens() {
            out.set_item(name, token.as_str())?;
        }
        Ok(out)
    }

    /// Whether it has a chat template.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.inner
            .files()
            .chat_template
            .as_deref()
            .map(str::to_string)
            .or_else(|| {
                let config: Json =
                    serde_json::from_str(self.inner.files().config_json.as_deref()?).ok()?;
                config.get("chat_template")?.as_str().map(str::to_string)
            })
    }

    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let files = self.inner.files();
        let from_texts = py.get_type::<PyTokenizer>().getattr("from_texts")?;
        let args = PyTuple::new(
            py,
            [
                Some(files.tokenizer_json.to_string()),
                files.config_json.as_deref().map(str::to_string),
                files.chat_template.as_deref().map(str::to_string),
            ],
        )?;
        Ok((from_texts, args))
    }

    fn __repr__(&self) -> String {
        format!(
            "Tokenizer(special_tokens={:?})",
            self.inner
                .special_tokens()
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
        )
    }
}

/// transformers' refusals of contradictory chat options.
pub(super) fn check_chat_options(
    continue_final_message: bool,
    add_generation_prompt: bool,
    masks: bool,
) -> PyResult<()> {
    if continue_final_message && add_generation_prompt {
        return Err(PyValueError::new_err(
            "continue_final_message and add_generation_prompt are not compatible: continue_final_message continues the final message, add_generation_prompt starts a new assistant message",
        ));
    }
    if continue_final_message && masks {
        return Err(PyValueError::new_err(
            "continue_final_message is not compatible with assistant masks",
        ));
    }
    Ok(())
}

/// Assistant masks asked of a template that marks no assistant text (transformers only
/// warns, and gives masks of zeros).
pub(super) fn no_generation_block() -> PyErr {
    Error::invalid_argument(
        "assistant masks need a chat template that marks the assistant's text with {% generation %} ... {% endgeneration %}, and this one has none (TRL's *_training.jinja templates do)",
    )
    .into()
}

/// A template of the tokenizer's, or given, that the verb will use.
pub(super) fn pick_template(
    tokenizer: &TextTokenizer,
    given: Option<&str>,
    with_tools: bool,
) -> PyResult<Arc<ChatTemplate>> {
    tokenizer
        .chat_template(given, with_tools)
        .map_err(tokenizer_error)
}

/// A path given as `str` or `os.PathLike`.
fn path_text(path: &Bound<'_, PyAny>) -> PyResult<String> {
    let path = path.py().import("os")?.call_method1("fspath", (path,))?;
    path.extract()
}

/// The text of the file at `url`.
fn read_text(py: Python<'_>, url: &str, storage: &Arc<crate::source::Storage>) -> PyResult<String> {
    let bytes = py.detach(|| crate::source::read_whole(url.to_string(), None, storage))?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Error::invalid_argument(format!("{url}: not UTF-8 text")).into())
}

/// The arguments of `Dataset.apply_chat_template`.
pub(super) struct ChatVerb<'a, 'py> {
    pub tokenizer: &'a Bound<'py, PyTokenizer>,
    pub column: &'a str,
    pub chat_template: Option<&'a str>,
    pub add_generation_prompt: bool,
    pub continue_final_message: Option<&'a Bound<'py, PyAny>>,
    pub tools: Option<&'a Bound<'py, PyAny>>,
    pub documents: Option<&'a Bound<'py, PyAny>>,
    pub max_length: Option<usize>,
    pub truncation: bool,
    pub return_assistant_tokens_mask: Option<bool>,
    pub labels: bool,
    pub remove_columns: Option<&'a Bound<'py, PyAny>>,
    pub now: Option<&'a Bound<'py, PyAny>>,
    pub on_error: &'a str,
    pub template_kwargs: Option<&'a Bound<'py, PyDict>>,
}
