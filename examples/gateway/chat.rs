//! Chat messages into prompt text: the model's chat template from its
//! `tokenizer_config.json`, rendered by `minijinja` as Hugging Face's `transformers` renders
//! it (blocks trimmed, Python string methods such as `.strip()` available,
//! `raise_exception` for templates that reject a conversation).

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind};
use serde_json::Value;
use std::path::Path;

/// A chat template and the special tokens it may name.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The chat template of a `tokenizer_config.json`; `None` when it has none.
    ///
    /// # Errors
    /// When the file cannot be read, is not JSON, or its template does not compile.
    pub(crate) fn load(path: &Path) -> Result<Option<Self>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
        let source = match config.get("chat_template") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            // A list of named templates: the one named "default".
            Some(Value::Array(named)) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .ok_or_else(|| format!("{}: no chat template named \"default\"", path.display()))?
                .to_owned(),
            Some(_) => return Err(format!("{}: \"chat_template\" is not text", path.display())),
        };
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| format!("chat template syntax: {e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", source).map_err(|e| {
            format!(
                "{}: the chat template does not compile: {e}",
                path.display()
            )
        })?;
        Ok(Some(Self {
            env,
            bos_token: special(&config, "bos_token"),
            eos_token: special(&config, "eos_token"),
        }))
    }

    /// The text the chat template makes of a chat request's `messages`, with the request's
    /// `add_generation_prompt` (default true), `tools` and `chat_template_kwargs`.
    ///
    /// # Errors
    /// When the messages are not a list of role and text content, or
    /// the template fails (it may raise an exception on purpose).
    pub(crate) fn render(
        &self,
        request: &serde_json::Map<String, Value>,
    ) -> Result<String, String> {
        let messages = messages(request.get("messages"))?;
        let mut context = serde_json::Map::new();
        if let Some(Value::Object(extra)) = request.get("chat_template_kwargs") {
            context.extend(extra.clone());
        }
        context.insert("messages".into(), Value::Array(messages));
        let generation = request
            .get("add_generation_prompt")
            .and_then(Value::as_bool);
        context.insert(
            "add_generation_prompt".into(),
            Value::Bool(generation.unwrap_or(true)),
        );
        context.insert(
            "tools".into(),
            request.get("tools").cloned().unwrap_or(Value::Null),
        );
        context.insert("bos_token".into(), Value::String(self.bos_token.clone()));
        context.insert("eos_token".into(), Value::String(self.eos_token.clone()));
        let chat = self
            .env
            .get_template("chat")
            .map_err(|e| format!("chat template: {e}"))?;
        chat.render(minijinja::value::Serde(Value::Object(context)))
            .map_err(|e| format!("chat template: {e}"))
    }
}

/// A special token named in a tokenizer config: text, or an object with `content`.
fn special(config: &Value, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        _ => String::new(),
    }
}

/// A chat request's messages as the template sees them: content given as a list of text
/// parts is joined with newlines (as vLLM does for templates that take text).
fn messages(messages: Option<&Value>) -> Result<Vec<Value>, String> {
    let Some(Value::Array(messages)) = messages else {
        return Err("missing \"messages\": a list of {\"role\", \"content\"}".into());
    };
    if messages.is_empty() {
        return Err("\"messages\" is empty: send at least one message".into());
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut m = m
                .as_object()
                .cloned()
                .ok_or_else(|| format!("\"messages\"[{i}] is not an object"))?;
            if !m.get("role").is_some_and(Value::is_string) {
                return Err(format!("\"messages\"[{i}] has no \"role\""));
            }
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_parts(parts, i)?,
                Some(_) => return Err(format!("\"messages\"[{i}].content is not text")),
            };
            m.insert("content".into(), Value::String(content));
            Ok(Value::Object(m))
        })
        .collect()
}

/// Content parts joined with newlines; only text parts are understood.
fn text_parts(parts: &[Value], message: usize) -> Result<String, String> {
    let texts = parts
        .iter()
        .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
            (Some("text"), Some(text)) => Ok(text),
            _ => Err(format!(
                "\"messages\"[{message}].content: only text parts are supported by this gateway"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
}
