//! What the gateway routes on: a request's prompt as token IDs, whichever way the client
//! sent it (token IDs, text, or chat messages).

use std::path::Path;

use prefix_router::TokenId;
use serde_json::{Map, Value};

use super::chat::ChatTemplate;
use super::tokenize::Tokens;

/// The OpenAI endpoints the gateway serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /v1/completions`: a prompt of token IDs or text.
    Completions,
    /// `POST /v1/chat/completions`: chat messages.
    Chat,
}

impl Endpoint {
    /// The endpoint's path, on the gateway and on the upstreams alike.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Completions => "/v1/completions",
            Self::Chat => "/v1/chat/completions",
        }
    }
}

/// A model's prompt processing: its tokenizer and, when it has one, its chat template.
pub(crate) struct Prompts {
    tokens: Tokens,
    chat: Option<ChatTemplate>,
}

impl Prompts {
    /// The tokenizer of `tokenizer` (a `tokenizer.json`) and the chat template of `config`
    /// (a `tokenizer_config.json`), if given; `cache_bytes` bounds the text whose token IDs
    /// are kept.
    ///
    /// # Errors
    /// When a file cannot be read or parsed, or the template does not compile.
    pub(crate) fn load(
        tokenizer: &Path,
        config: Option<&Path>,
        cache_bytes: usize,
    ) -> Result<Self, String> {
        Ok(Self {
            tokens: Tokens::load(tokenizer, cache_bytes)?,
            chat: match config {
                Some(path) => ChatTemplate::load(path)?,
                None => None,
            },
        })
    }

    /// The tokenizer.
    pub(crate) fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The prompt text of a chat request.
    ///
    /// # Errors
    /// When the model has no chat template or the template fails on these messages.
    pub(crate) fn render_chat(&self, request: &Map<String, Value>) -> Result<String, String> {
        match &self.chat {
            Some(chat) => chat.render(request),
            None => {
                Err("this gateway has no chat template: start it with --tokenizer-config".into())
            }
        }
    }
}

/// The token IDs of the prompt of `request`, sent to `endpoint`. Text is tokenized as vLLM
/// does: text completions get the tokenizer's special tokens and rendered chats do not,
/// unless the request's `add_special_tokens` says otherwise.
///
/// # Errors
/// A message for the client when the prompt is missing, malformed, empty, or is text and
/// there is no tokenizer.
pub(crate) fn request_tokens(
    prompts: Option<&Prompts>,
    endpoint: Endpoint,
    request: &Map<String, Value>,
) -> Result<Vec<TokenId>, String> {
    let special = |default| {
        request
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(default)
    };
    let tokens = match (endpoint, request.get("prompt")) {
        (Endpoint::Chat, _) => {
            let prompts = needed(prompts, "chat messages")?;
            let text = prompts.render_chat(request)?;
            prompts.tokens.tokenize(&text, special(false))?
        }
        (Endpoint::Completions, None) => {
            return Err("missing \"prompt\": text or an array of token IDs".into());
        }
        (Endpoint::Completions, Some(Value::String(text))) => needed(prompts, "a text prompt")?
            .tokens
            .tokenize(text, special(true))?,
        (Endpoint::Completions, Some(Value::Array(items))) => token_ids(items)?,
        (Endpoint::Completions, Some(_)) => {
            return Err("\"prompt\" must be text or an array of token IDs".into());
        }
    };
    if tokens.is_empty() {
        return Err("the prompt is empty: send at least one token".into());
    }
    Ok(tokens)
}

/// The prompt of `request`, sent to `endpoint`, checked as [`request_tokens`] checks it
/// but not tokenized: for a router that routes on load alone. Its token IDs when the client
/// sent them; none for text and chats.
///
/// # Errors
/// As [`request_tokens`]'s.
pub(crate) fn untokenized_request(
    prompts: Option<&Prompts>,
    endpoint: Endpoint,
    request: &Map<String, Value>,
) -> Result<Vec<TokenId>, String> {
    // An empty text (whose tokens may be the tokenizer's special tokens alone) is
    // tokenized: that costs nothing and checks it as `request_tokens` does.
    let nonempty = match (endpoint, request.get("prompt")) {
        (Endpoint::Chat, _) => {
            let prompts = needed(prompts, "chat messages")?;
            !prompts.render_chat(request)?.is_empty()
        }
        (Endpoint::Completions, Some(Value::String(text))) => {
            needed(prompts, "a text prompt")?;
            !text.is_empty()
        }
        _ => false,
    };
    if nonempty {
        Ok(Vec::new())
    } else {
        request_tokens(prompts, endpoint, request)
    }
}

fn needed<'p>(prompts: Option<&'p Prompts>, what: &str) -> Result<&'p Prompts, String> {
    prompts.ok_or_else(|| {
        format!(
            "this gateway has no tokenizer for {what}: start it with --tokenizer, or send \
             \"prompt\" as an array of token IDs"
        )
    })
}

/// A prompt given as token IDs.
fn token_ids(items: &[Value]) -> Result<Vec<TokenId>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|t| TokenId::try_from(t).ok())
                .ok_or_else(|| {
                    format!("\"prompt\"[{i}] = {t} is not a token ID (an integer 0..=4294967295)")
                })
        })
        .collect()
}
