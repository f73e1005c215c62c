//! Chat templates rendered as transformers renders them: Jinja2 with `trim_blocks` and
//! `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a `tojson` that is
//! `json.dumps`, and the `{% generation %}` block that marks the assistant's text.
//!
//! minijinja runs the template. Where it and Jinja2 differ on what templates use, the
//! environment is changed to Jinja2's meaning: values print as Python's `str()` does
//! (`None`, `True`, `['a']`, `1e-05`), `string`/`join`/`trim` and the string methods
//! `strip`/`split` follow Python, and the tests `sequence`, `iterable` and `number` are
//! Python's (a string is a sequence; a bool is a number).
//!
//! A generation block is rendered as a filter block whose filter wraps its text in two
//! Unicode noncharacters; after rendering they are taken out and their places kept as
//! the spans of assistant text (byte offsets in the text).

use std::ops::Range;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde_json::{Map, Value as Json};

use super::python;
use super::time::strftime;

/// Marks the start and the end of a generation block's text while rendering.
const OPEN: char = '\u{fdd0}';
const CLOSE: char = '\u{fdd1}';
const TEMPLATE: &str = "chat_template";
/// The name of the filter a generation block becomes.
const GENERATION_FILTER: &str = "__shardflow_generation";
/// The variable holding the time `strftime_now` formats (seconds since the Unix epoch).
const NOW: &str = "__shardflow_now";
/// The names a message's reasoning goes by (transformers' `_REASONING_FIELDS`): the first
/// is what templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
/// What transformers appends to the final message to find where to cut the rendered
/// text for `continue_final_message`.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    has_generation: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bytes", &self.source.len())
            .finish()
    }
}

/// How to render one conversation (transformers' `apply_chat_template` arguments).
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// Ends with the header of an assistant turn to come.
    pub add_generation_prompt: bool,
    /// `continue_final_message`: the final message's field to leave open (`"content"`).
    pub continue_final_message: Option<String>,
    /// The tools the template lists (JSON schemas), or None.
    pub tools: Option<Json>,
    /// Documents for retrieval-augmented templates, or None.
    pub documents: Option<Json>,
    /// The special tokens (`bos_token`, ...) and any other variables for the template.
    pub variables: Map<String, Json>,
    /// What `strftime_now` formats: seconds since the Unix epoch, UTC.
    pub now: i64,
    /// Whether to find the spans of generation blocks.
    pub track_generation: bool,
}

/// A rendered conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The text, generation marks taken out.
    pub text: String,
    /// The byte ranges of `text` that generation blocks rendered, in order.
    pub generation: Vec<Range<usize>>,
}

/// Why a conversation could not be rendered.
#[derive(Debug, Clone)]
pub enum RenderError {
    /// The template called `raise_exception(message)`.
    Raised(String),
    /// The conversation is not what templates take (no messages, a message that is not
    /// a mapping, ...) or the template failed on it.
    Invalid(String),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Raised(m) => write!(f, "the chat template refused it: {m}"),
            RenderError::Invalid(m) => f.write_str(m),
        }
    }
}

impl ChatTemplate {
    /// Compiles `source`; an error says what Jinja syntax it could not read.
    pub fn new(source: &str) -> Result<Self, String> {
        let (rewritten, has_generation) = generation_as_filter(source);
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| e.to_string())?,
        );
        env.set_formatter(|out, _state, value| {
            let mut text = String::new();
            python::str_of(value, &mut text)?;
            out.write_str(&text).map_err(Error::from)
        });
        env.set_unknown_method_callback(methods);
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: &Value| -> Result<Value, Error> {
            let mut text = String::new();
            python::str_of(value, &mut text)?;
            Ok(Value::from(text))
        });
        env.add_filter("trim", |value: &Value, chars: Option<&str>| -> Value {
            let mut text = String::new();
            let _ = python::str_of(value, &mut text);
            Value::from(strip(&text, chars, true, true))
        });
        env.add_filter("join", join);
        env.add_filter(GENERATION_FILTER, |body: &str| -> Value {
            Value::from(format!("{OPEN}{body}{CLOSE}"))
        });
        env.add_test("sequence", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Map
            )
        });
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
            )
        });
        env.add_test("number", |v: &Value| {
            matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
        });
        env.add_function(
            "strftime_now",
            |state: &State, format: &str| -> Result<String, Error> {
                let now = state.lookup(NOW).and_then(|v| v.as_i64()).unwrap_or(0);
                strftime(format, now).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
            },
        );
        env.add_function(
            "raise_exception",
            |message: &Value| -> Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{}", message.as_str().unwrap_or_default()),
                ))
            },
        );
        env.add_template_owned(TEMPLATE, rewritten)
            .map_err(|e| format!("the chat template is not valid Jinja: {e:#}"))?;
        Ok(Self {
            env,
            source: source.to_string(),
            has_generation,
        })
    }

    /// Whether the template marks the assistant's text with `{% generation %}`.
    pub fn has_generation(&self) -> bool {
        self.has_generation
    }

    /// Renders one conversation as transformers' `apply_chat_template(tokenize=False)`
    /// does: messages' keys whose value is null dropped, reasoning under each of its
    /// names, `tools`/`documents` given (None when not), and the special tokens.
    pub fn render(
        &self,
        messages: &[Json],
        options: &ChatOptions,
    ) -> Result<Rendered, RenderError> {
        let mut chat = normalized(messages)?;
        let mut continued = None;
        if let Some(field) = &options.continue_final_message {
            continued = Some(self.open_final_message(&mut chat, field)?);
        }
        let mut context = options.variables.clone();
        context.insert("messages".into(), Json::Array(chat));
        context.insert("tools".into(), options.tools.clone().unwrap_or(Json::Null));
        context.insert(
            "documents".into(),
            options.documents.clone().unwrap_or(Json::Null),
        );
        context.insert(
            "add_generation_prompt".into(),
            Json::Bool(options.add_generation_prompt),
        );
        context.insert(NOW.into(), Json::from(options.now));
        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| RenderError::Invalid(e.to_string()))?;
        let context = value_of_map(&context);
        let text = template.render(context).map_err(render_error)?;
        let (mut text, mut generation) = if text.contains([OPEN, CLOSE]) {
            take_marks(&text)?
        } else {
            (text, Vec::new())
        };
        if !options.track_generation {
            generation.clear();
        }
        if let Some(final_message) = continued {
            text = cut_after_final_message(text, &final_message)?;
        }
        Ok(Rendered { text, generation })
    }

    /// Appends transformers' tag to the final message's `field` (or to its last text
    /// part), returning the text to continue.
    fn open_final_message(&self, chat: &mut [Json], field: &str) -> Result<String, RenderError> {
        let invalid = |m: String| RenderError::Invalid(m);
        let Some(Json::Object(last)) = chat.last_mut() else {
            return Err(invalid(
                "continue_final_message is set but the conversation is empty".into(),
            ));
        };
        let Some(final_value) = last.get(field).cloned() else {
            return Err(invalid(format!(
                "continue_final_message is set but the final message has no {field:?} to continue"
            )));
        };
        let fields: Vec<String> = if REASONING_FIELDS.contains(&field) {
            REASONING_FIELDS
                .iter()
                .filter(|f| last.get(**f) == Some(&final_value))
                .map(|f| f.to_string())
                .collect()
        } else {
            vec![field.to_string()]
        };
        if !fields.iter().any(|f| self.source.contains(f.as_str())) {
            return Err(invalid(format!(
                "continue_final_message is set to {field:?} but this is not an accepted field in the chat template"
            )));
        }
        match final_value {
            Json::Array(mut parts) => {
                let Some(text) = parts.iter_mut().rev().find_map(|part| match part {
                    Json::Object(part) => match part.get_mut("text") {
                        Some(Json::String(text)) => Some(text),
                        _ => None,
                    },
                    _ => None,
                }) else {
                    return Err(invalid(
                        "continue_final_message is set but the final message has no text to continue"
                            .into(),
                    ));
                };
                let final_text = text.clone();
                text.push_str(CONTINUE_TAG);
                last.insert(field.to_string(), Json::Array(parts));
                Ok(final_text)
            }
            Json::String(text) => {
                for f in &fields {
                    last.insert(f.clone(), Json::String(format!("{text}{CONTINUE_TAG}")));
                }
                Ok(text)
            }
            other => Err(invalid(format!(
                "continue_final_message: the final message's {field:?} is {other}, not text"
            ))),
        }
    }
}

/// Prefix of a `raise_exception` error's text, to tell it from the template's own.
const RAISED: &str = "raise_exception: ";

fn render_error(e: Error) -> RenderError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cause {
        if let Some(err) = err.downcast_ref::<Error>()
            && let Some(message) = err.detail().and_then(|d| d.strip_prefix(RAISED))
        {
            return RenderError::Raised(message.to_string());
        }
        cause = err.source();
    }
    RenderError::Invalid(format!("the chat template failed: {e:#}"))
}

/// JSON as a template value (objects keep their keys' order).
fn value_of(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(value_of).collect::<Vec<_>>()),
        Json::Object(map) => value_of_map(map),
    }
}

fn value_of_map(map: &Map<String, Json>) -> Value {
    Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), value_of(v))))
}

/// The messages as templates see them (transformers' `_normalize_chat_messages` and
/// `_alias_reasoning_fields`): keys whose value is null dropped; a message's reasoning
/// under `thinking` (first) and `reasoning_content` (last) too.
fn normalized(messages: &[Json]) -> Result<Vec<Json>, RenderError> {
    if messages.is_empty() {
        return Err(RenderError::Invalid(
            "cannot apply a chat template to an empty conversation".into(),
        ));
    }
    messages
        .iter()
        .map(|message| {
            let Json::Object(message) = message else {
                return Err(RenderError::Invalid(format!(
                    "a chat message is a mapping (role, content, ...), not {message}"
                )));
            };
            let message: Map<String, Json> = message
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let Some(reasoning) = REASONING_FIELDS
                .iter()
                .find_map(|f| message.get(*f))
                .cloned()
            else {
                return Ok(Json::Object(message));
            };
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            for (k, v) in message {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), reasoning);
            Ok(Json::Object(aliased))
        })
        .collect()
}

/// Takes the generation marks out of `text`: the text without them, and the byte spans
/// they enclosed.
fn take_marks(text: &str) -> Result<(String, Vec<Range<usize>>), RenderError> {
    let mut out = String::with_capacity(text.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in text.chars() {
        match c {
            OPEN if open.is_none() => open = Some(out.len()),
            CLOSE if open.is_some() => {
                let start = open.take().unwrap_or_default();
                spans.push(start..out.len());
            }
            OPEN | CLOSE => {
                return Err(RenderError::Invalid(
                    "the text holds U+FDD0 or U+FDD1, which mark generation blocks while rendering, or a generation block is nested in another".into(),
                ));
            }
            c => out.push(c),
        }
    }
    if open.is_some() {
        return Err(RenderError::Invalid(
            "the text holds U+FDD0, which marks generation blocks while rendering".into(),
        ));
    }
    Ok((out, spans))
}

/// The rendered text cut where the continued final message ends (transformers' way).
fn cut_after_final_message(text: String, final_message: &str) -> Result<String, RenderError> {
    let tag = CONTINUE_TAG.trim();
    if !text.contains(python_strip(final_message)) || !text.contains(tag) {
        return Err(RenderError::Invalid(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template".into(),
        ));
    }
    let at = text.rfind(tag).unwrap_or(text.len());
    if text[at..].starts_with(CONTINUE_TAG) {
        Ok(text[..at].to_string())
    } else {
        Ok(text[..at].trim_end_matches(python::is_space).to_string())
    }
}

fn python_strip(s: &str) -> &str {
    s.trim_matches(python::is_space)
}

/// Python's `str.strip(chars)`, `lstrip` and `rstrip`.
fn strip(s: &str, chars: Option<&str>, start: bool, end: bool) -> String {
    let strip_char = |c: char| match chars {
        Some(chars) => chars.contains(c),
        None => python::is_space(c),
    };
    let mut s = s;
    if start {
        s = s.trim_start_matches(strip_char);
    }
    if end {
        s = s.trim_end_matches(strip_char);
    }
    s.to_string()
}

/// Python's `str.split(sep=None, maxsplit=-1)`.
fn split(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Value, Error> {
    let max = maxsplit.filter(|m| *m >= 0).map(|m| m as usize);
    let parts: Vec<Value> = match sep {
        Some("") => {
            return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
        }
        Some(sep) => match max {
            Some(max) => s.splitn(max + 1, sep).map(Value::from).collect(),
            None => s.split(sep).map(Value::from).collect(),
        },
        None => {
            // Runs of white space separate; none at either end gives an empty part.
            let mut parts = Vec::new();
            let mut rest = s.trim_start_matches(python::is_space);
            while !rest.is_empty() {
                if max.is_some_and(|max| parts.len() == max) {
                    parts.push(Value::from(rest.trim_end_matches(python::is_space)));
                    break;
                }
                let end = rest.find(python::is_space).unwrap_or(rest.len());
                parts.push(Value::from(&rest[..end]));
                rest = rest[end..].trim_start_matches(python::is_space);
            }
            parts
        }
    };
    Ok(Value::from(parts))
}

/// Python's string methods where minijinja's differ (white space is Python's), then
/// minijinja-contrib's Python methods.
fn methods(state: &mut State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let chars = || -> Result<Option<&str>, Error> {
            let (chars,): (Option<&str>,) = minijinja::value::from_args(args)?;
            Ok(chars)
        };
        match method {
            "strip" => return Ok(Value::from(strip(s, chars()?, true, true))),
            "lstrip" => return Ok(Value::from(strip(s, chars()?, true, false))),
            "rstrip" => return Ok(Value::from(strip(s, chars()?, false, true))),
            "split" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) =
                    minijinja::value::from_args(args)?;
                return split(s, sep, maxsplit);
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut json = python::Json::default();
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let mut given: Vec<(&str, Value)> = names.iter().copied().zip(args.iter().cloned()).collect();
    for name in names {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given.push((name, v));
        }
    }
    kwargs.assert_all_used()?;
    let mut separators = None;
    for (name, v) in given {
        match name {
            "ensure_ascii" => json.ensure_ascii = v.is_true(),
            "sort_keys" => json.sort_keys = v.is_true(),
            "indent" => {
                json.indent = match v.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
                    _ => Some(" ".repeat(v.as_usize().unwrap_or(0))),
                }
            }
            _ => {
                if !v.is_none() {
                    let parts: Vec<String> = v
                        .try_iter()?
                        .map(|p| p.as_str().unwrap_or_default().to_string())
                        .collect();
                    if let [item, key] = &parts[..] {
                        separators = Some((item.clone(), key.clone()));
                    }
                }
            }
        }
    }
    // Python's defaults: ", " between items on one line, "," before a line break.
    let (item, key) = separators.unwrap_or_else(|| {
        let item = if json.indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    json.item_separator = item;
    json.key_separator = key;
    Ok(Value::from(json.dumps(value)?))
}

/// Jinja2's `join(d="", attribute=None)`, each item written as Python's `str()`.
fn join(value: &Value, separator: Option<&str>, kwargs: Kwargs) -> Result<Value, Error> {
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if let Some(s) = value.as_str() {
        // A string joins its characters.
        let separator = separator.unwrap_or_default();
        return Ok(Value::from(
            s.chars()
                .map(String::from)
                .collect::<Vec<_>>()
                .join(separator),
        ));
    }
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(separator.unwrap_or_default());
        }
        let item = match &attribute {
            Some(attr) => item.get_item(attr)?,
            None => item,
        };
        python::str_of(&item, &mut out)?;
    }
    Ok(Value::from(out))
}

/// The template's source with `{% generation %}` … `{% endgeneration %}` made a filter
/// block (the same whitespace control), and whether it had one.
fn generation_as_filter(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut found = false;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The close is looked for after the open: in `{%}` the `%` is the open's.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            rest = "";
            break;
        };
        let inner = &tag[2..end];
        let (left, body) = match inner.strip_prefix(['-', '+']) {
            Some(body) => (&inner[..1], body),
            None => ("", inner),
        };
        let (body, right) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some(format!("{{%{left} filter {GENERATION_FILTER} {right}%}}")),
            "endgeneration" => Some(format!("{{%{left} endfilter {right}%}}")),
            _ => None,
        };
        match replacement {
            Some(r) => {
                found = true;
                out.push_str(&r);
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    (out, found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json, options: ChatOptions) -> Rendered {
        let template = ChatTemplate::new(source).unwrap();
        let Json::Array(messages) = messages else {
            panic!()
        };
        template.render(&messages, &options).unwrap()
    }

    #[test]
    fn generation_blocks_give_the_assistant_spans() {
        let source = "{% for m in messages %}{% if m.role == 'assistant' %}A: {% generation %}{{ m.content }}{% endgeneration %}\n{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}";
        let out = render(
            source,
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo"}]),
            ChatOptions {
                track_generation: true,
                ..Default::default()
            },
        );
        assert_eq!(out.text, "U: hi\nA: héllo");
        assert_eq!(&out.text[out.generation[0].clone()], "héllo");
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let out = render(
            "{{ messages[0].content }}|{{ tools }}|{{ add_generation_prompt }}|{{ messages[0] }}|{{ 1.5e-5 }}|{{ messages[0] | tojson }}",
            json!([{"role": "user", "content": [1, "a"], "x": null}]),
            ChatOptions::default(),
        );
        assert_eq!(
            out.text,
            r#"[1, 'a']|None|False|{'role': 'user', 'content': [1, 'a']}|1.5e-05|{"role": "user", "content": [1, "a"]}"#
        );
    }

    #[test]
    fn raise_exception_is_told_apart() {
        let template = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let err = template
            .render(
                &[json!({"role": "user", "content": "x"})],
                &ChatOptions::default(),
            )
            .unwrap_err();
        assert!(matches!(err, RenderError::Raised(m) if m == "no system role"));
    }
}
