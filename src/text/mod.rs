//! Text for language models: chat templates rendered as transformers renders them,
//! Hugging Face tokenizers, and the dataset verbs `tokenize` and `apply_chat_template`
//! that run them on the loader's threads; `pack`, which packs their tokens into rows.

mod chat_template;
pub mod ops;
pub mod pack;
mod python;
mod time;
mod tokenizer;

pub use chat_template::{ChatOptions, ChatTemplate, RenderError, Rendered};
pub use tokenizer::{ChatTokens, EncodeOptions, TextTokenizer, TokenizerFiles, Tokens};
