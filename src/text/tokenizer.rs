//! A tokenizer as transformers loads one: `tokenizer.json` (the `tokenizers` crate, which
//! transformers' fast tokenizers are), the special tokens of `tokenizer_config.json`,
//! and its chat template (`chat_template.jinja`, else the config's `chat_template`).

use std::ops::Range;
use std::sync::Arc;

use serde_json::{Map, Value as Json};
use tokenizers::{Encoding, TruncationDirection};

use super::chat_template::{ChatOptions, ChatTemplate, RenderError};

/// The special tokens transformers passes to chat templates, by attribute name.
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// What went wrong loading or using a tokenizer.
pub type TokenizerError = String;

/// A loaded tokenizer. Cheap to clone (shared).
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Loaded>,
}

struct Loaded {
    tokenizer: tokenizers::Tokenizer,
    /// The files it was made from, to pickle it.
    files: TokenizerFiles,
    /// The special tokens, as the template sees them.
    special: Map<String, Json>,
    /// Its chat templates: one (named `"default"`), or several by name.
    templates: Vec<(String, Arc<ChatTemplate>)>,
    /// Whether the templates are named (a list in the config), so that a template given
    /// by name picks one.
    named: bool,
    /// Templates given as text, compiled (the latest few).
    given: std::sync::Mutex<Vec<(String, Arc<ChatTemplate>)>>,
}

/// Templates given as text kept compiled.
const GIVEN_TEMPLATES: usize = 8;

/// The texts a tokenizer is made from.
#[derive(Clone, Debug, Default)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: Arc<str>,
    /// `tokenizer_config.json`, if there is one.
    pub config_json: Option<Arc<str>>,
    /// A `chat_template.jinja` beside them, or one given: it wins over the config's.
    pub chat_template: Option<Arc<str>>,
}

/// A tokenized text: ids, and each token's byte range in the text.
pub struct Tokens {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Each token's byte range in the text.
    pub offsets: Vec<(usize, usize)>,
}

/// How `encode` treats a text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Whether the tokenizer's post-processor adds its special tokens (BOS, ...).
    pub add_special_tokens: bool,
    /// Truncate to this many tokens (specials included), as `truncation=True,
    /// max_length=n` does.
    pub max_length: Option<usize>,
}

impl TextTokenizer {
    /// Loads from the texts of `tokenizer.json`, `tokenizer_config.json` and a chat
    /// template.
    pub fn new(files: TokenizerFiles) -> Result<Self, TokenizerError> {
        // The tokenizer's own threads are never used (shardflow's pool encodes), so a
        // forked worker cannot inherit a pool that a parent had started.
        tokenizers::utils::parallelism::set_parallelism(false);
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes())
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        // transformers pads and truncates only when asked.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        let config: Map<String, Json> = match &files.config_json {
            Some(text) => match serde_json::from_str(text) {
                Ok(Json::Object(config)) => config,
                Ok(_) => return Err("tokenizer_config.json: not a JSON object".into()),
                Err(e) => return Err(format!("tokenizer_config.json: {e}")),
            },
            None => Map::new(),
        };
        let mut special = Map::new();
        for name in SPECIAL_TOKENS {
            if let Some(token) = token_text(config.get(name)) {
                special.insert(name.into(), Json::String(token));
            }
        }
        let named = files.chat_template.is_none()
            && matches!(config.get("chat_template"), Some(Json::Array(_)));
        let sources: Vec<(String, String)> =
            match (&files.chat_template, config.get("chat_template")) {
                (Some(text), _) => vec![("default".into(), text.to_string())],
                (None, Some(Json::String(text))) => vec![("default".into(), text.clone())],
                (None, Some(Json::Array(named))) => named
                    .iter()
                    .filter_map(|t| {
                        Some((
                            t.get("name")?.as_str()?.to_string(),
                            t.get("template")?.as_str()?.to_string(),
                        ))
                    })
                    .collect(),
                _ => Vec::new(),
            };
        let templates = sources
            .into_iter()
            .map(|(name, source)| {
                let template = ChatTemplate::new(&source)
                    .map_err(|e| format!("chat template {name:?}: {e}"))?;
                Ok((name, Arc::new(template)))
            })
            .collect::<Result<_, TokenizerError>>()?;
        Ok(Self {
            inner: Arc::new(Loaded {
                tokenizer,
                files,
                special,
                templates,
                named,
                given: Default::default(),
            }),
        })
    }

    /// The texts it was loaded from.
    pub fn files(&self) -> &TokenizerFiles {
        &self.inner.files
    }

    /// The special tokens the config names (`bos_token`, ...), as templates see them.
    pub fn special_tokens(&self) -> &Map<String, Json> {
        &self.inner.special
    }

    /// The chat template to use, as transformers' `get_chat_template` picks it: the one
    /// given (a name of the tokenizer's, or a template's text), else the tokenizer's
    /// single one, else its `"tool_use"` one when tools are given, else `"default"`.
    pub fn chat_template(
        &self,
        given: Option<&str>,
        with_tools: bool,
    ) -> Result<Arc<ChatTemplate>, TokenizerError> {
        let templates = &self.inner.templates;
        let named = |name: &str| {
            templates
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
        };
        if let Some(given) = given {
            if let Some(template) = named(given).filter(|_| self.inner.named) {
                return Ok(template);
            }
            return self.compiled(given);
        }
        if let [(_, only)] = &templates[..] {
            return Ok(only.clone());
        }
        if with_tools && let Some(template) = named("tool_use") {
            return Ok(template);
        }
        named("default").ok_or_else(|| {
            if templates.is_empty() {
                "this tokenizer has no chat template: pass chat_template=".to_string()
            } else {
                let names: Vec<&str> = templates.iter().map(|(n, _)| n.as_str()).collect();
                format!("this tokenizer has several chat templates ({names:?}) and no \"default\": pass chat_template= with one's name")
            }
        })
    }

    /// A template given as text, compiled once.
    fn compiled(&self, source: &str) -> Result<Arc<ChatTemplate>, TokenizerError> {
        let mut given = self.inner.given.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, template)) = given.iter().find(|(s, _)| s == source) {
            return Ok(template.clone());
        }
        let template = Arc::new(ChatTemplate::new(source)?);
        if given.len() == GIVEN_TEMPLATES {
            given.remove(0);
        }
        given.push((source.to_string(), template.clone()));
        Ok(template)
    }

    /// `text`'s tokens.
    pub fn encode(&self, text: &str, options: EncodeOptions) -> Result<Tokens, TokenizerError> {
        let tokenizer = &self.inner.tokenizer;
        let encoding = match options.max_length {
            None => tokenizer
                .encode(text, options.add_special_tokens)
                .map_err(|e| e.to_string())?,
            Some(max_length) => {
                // As the tokenizer's own truncation does: the text's tokens cut to leave
                // room for the special tokens, then those added.
                let mut encoding = tokenizer.encode(text, false).map_err(|e| e.to_string())?;
                let added = match (options.add_special_tokens, tokenizer.get_post_processor()) {
                    (true, Some(processor)) => {
                        tokenizers::tokenizer::PostProcessor::added_tokens(processor, false)
                    }
                    _ => 0,
                };
                encoding.truncate(
                    max_length.saturating_sub(added),
                    0,
                    TruncationDirection::Right,
                );
                if options.add_special_tokens {
                    tokenizer
                        .post_process(encoding, None, true)
                        .map_err(|e| e.to_string())?
                } else {
                    encoding
                }
            }
        };
        Ok(tokens(encoding))
    }

    /// Renders `messages` with `template` (`options.variables` holding the special tokens:
    /// [`TextTokenizer::template_variables`]) and tokenizes the text as transformers'
    /// `apply_chat_template(tokenize=True)` does (no special tokens added: the template
    /// writes them), with the assistant mask when `options.track_generation`: 1 for
    /// every token that overlaps a generation block's text.
    pub fn chat_tokens(
        &self,
        template: &ChatTemplate,
        messages: &[Json],
        options: &ChatOptions,
        max_length: Option<usize>,
    ) -> Result<ChatTokens, RenderError> {
        let rendered = template.render(messages, options)?;
        let tokens = self
            .encode(
                &rendered.text,
                EncodeOptions {
                    add_special_tokens: false,
                    max_length,
                },
            )
            .map_err(RenderError::Invalid)?;
        let mask = options
            .track_generation
            .then(|| assistant_mask(&tokens.offsets, &rendered.generation));
        Ok(ChatTokens {
            ids: tokens.ids,
            assistant_mask: mask,
        })
    }

    /// A template's variables: the special tokens, then `given` (which win over them, as
    /// in transformers). Merged once per call or verb, not per row.
    pub fn template_variables(&self, given: Map<String, Json>) -> Map<String, Json> {
        let mut variables = self.inner.special.clone();
        variables.extend(given);
        variables
    }
}

/// A conversation's tokens.
pub struct ChatTokens {
    /// Token ids.
    pub ids: Vec<u32>,
    /// 1 on the assistant's tokens, where asked.
    pub assistant_mask: Option<Vec<u8>>,
}

fn tokens(encoding: Encoding) -> Tokens {
    Tokens {
        ids: encoding.get_ids().to_vec(),
        offsets: encoding.get_offsets().to_vec(),
    }
}

/// 1 for each token whose text overlaps a span (transformers' single pass: spans and
/// offsets both in order), 0 elsewhere.
pub fn assistant_mask(offsets: &[(usize, usize)], spans: &[Range<usize>]) -> Vec<u8> {
    let mut mask = vec![0u8; offsets.len()];
    let mut span = 0;
    for (i, &(start, end)) in offsets.iter().enumerate() {
        while span < spans.len() && start >= spans[span].end {
            span += 1;
        }
        if span == spans.len() {
            break;
        }
        if end > spans[span].start {
            mask[i] = 1;
        }
    }
    mask
}

/// A special token in `tokenizer_config.json`: a string, or an `AddedToken` object.
fn token_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(token) => Some(token.get("content")?.as_str()?.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_overlapping_a_span_are_the_assistants() {
        let offsets = [(0, 3), (3, 5), (5, 9), (9, 9), (9, 12)];
        assert_eq!(assistant_mask(&offsets, &[4..6]), [0, 1, 1, 0, 0]);
        // A span that starts at the first token.
        assert_eq!(assistant_mask(&offsets, &[0..2, 10..11]), [1, 0, 0, 0, 1]);
        assert_eq!(assistant_mask(&offsets, &[]), [0, 0, 0, 0, 0]);
    }
}
