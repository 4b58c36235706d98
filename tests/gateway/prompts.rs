//! The gateway's text and chat prompts: chat templates rendered as Hugging Face renders
//! them, and segment-cached tokenization equal to whole-text tokenization, on the two small
//! tokenizers committed in `tests/data/tokenizer/` (byte-level and metaspace).

use super::fleet::prompt;

use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use prompt::{Endpoint, Prompts};

fn dir(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tokenizer")
        .join(kind)
}

/// The `kind` tokenizer with its chat template, caching `cache_bytes` of text.
fn prompts(kind: &str, cache_bytes: usize) -> Prompts {
    let d = dir(kind);
    Prompts::load(
        &d.join("tokenizer.json"),
        Some(&d.join("tokenizer_config.json")),
        cache_bytes,
    )
    .unwrap()
}

fn object(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn the_chat_template_renders_as_transformers_does() {
    let p = prompts("bytelevel", 1 << 20);
    let request = object(json!({"messages": [
        {"role": "user", "content": "  Where is my cache?  "},
        {"role": "assistant", "content": [{"type": "text", "text": "On"}, {"type": "text", "text": "worker 2."}]},
        {"role": "user", "content": "Thanks"},
    ]}));
    // The template adds the default system prompt, trims content, and the generation prompt
    // comes by default; text parts are joined with a newline.
    assert_eq!(
        p.render_chat(&request).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nWhere is my cache?<|im_end|>\n\
         <|im_start|>assistant\nOn\nworker 2.<|im_end|>\n\
         <|im_start|>user\nThanks<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let mut no_generation = request.clone();
    no_generation.insert("add_generation_prompt".into(), json!(false));
    assert!(
        p.render_chat(&no_generation)
            .unwrap()
            .ends_with("Thanks<|im_end|>\n")
    );
}

#[test]
fn bad_chat_requests_get_clear_errors() {
    let p = prompts("bytelevel", 1 << 20);
    let cases = [
        (json!({}), "missing \"messages\""),
        (json!({"messages": []}), "is empty"),
        (json!({"messages": [{"content": "x"}]}), "has no \"role\""),
        (
            json!({"messages": [{"role": "user", "content": 3}]}),
            "is not text",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "only text parts",
        ),
    ];
    for (request, needle) in cases {
        let e =
            prompt::request_tokens(Some(&p), Endpoint::Chat, &object(request.clone())).unwrap_err();
        assert!(e.contains(needle), "{request}: {e}");
    }
}

#[test]
fn a_template_that_raises_an_exception_rejects_the_request() {
    let config =
        std::env::temp_dir().join(format!("prefix-router-raise-{}.json", std::process::id()));
    std::fs::write(
        &config,
        json!({"chat_template": "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}x"}).to_string(),
    )
    .unwrap();
    let p = Prompts::load(
        &dir("bytelevel").join("tokenizer.json"),
        Some(&config),
        1 << 20,
    )
    .unwrap();
    let e = p
        .render_chat(&object(
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ))
        .unwrap_err();
    std::fs::remove_file(&config).unwrap();
    assert!(e.contains("a system message must come first"), "{e}");
}

#[test]
fn text_prompts_get_the_tokenizers_special_tokens_unless_told_otherwise() {
    let p = prompts("metaspace", 1 << 20);
    let text = "<|im_start|>user\nrouting<|im_end|>";
    let with = prompt::request_tokens(
        Some(&p),
        Endpoint::Completions,
        &object(json!({"prompt": text})),
    )
    .unwrap();
    assert_eq!(with, p.tokens().encode(text, true).unwrap());
    let without = prompt::request_tokens(
        Some(&p),
        Endpoint::Completions,
        &object(json!({"prompt": text, "add_special_tokens": false})),
    )
    .unwrap();
    assert_eq!(without, p.tokens().encode(text, false).unwrap());
    // The first token is the special token itself.
    assert_eq!(
        without[0],
        p.tokens().encode("<|im_start|>", false).unwrap()[0]
    );
}

/// Words to build messages from: plain, with spaces and newlines at their edges, non-ASCII,
/// and the special tokens themselves (as a user may type them).
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{1,8}",
        1 => Just(" ".to_owned()),
        1 => Just("\n".to_owned()),
        1 => Just("  \n\t".to_owned()),
        1 => Just("routing cache".to_owned()),
        1 => Just("é→日本".to_owned()),
        1 => Just("<|im_start|>".to_owned()),
        1 => Just("<|im_end|>".to_owned()),
        1 => Just("<|im".to_owned()),
        1 => Just("<".to_owned()),
    ]
}

fn message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("system"), Just("user"), Just("assistant")],
        prop::collection::vec(word(), 0..12),
    )
        .prop_map(|(role, words)| json!({"role": role, "content": words.concat()}))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Rendered chats, tokenized through the segment cache (twice, so that the second time
    /// comes from the cache), give the tokenizer's own token IDs for the whole text, with
    /// and without special tokens, on both tokenizers; a cache too small to keep everything
    /// changes nothing.
    #[test]
    fn segmented_tokenization_equals_whole_text_tokenization(
        conversations in prop::collection::vec(prop::collection::vec(message(), 1..6), 1..4),
        special in any::<bool>(),
        small_cache in any::<bool>(),
    ) {
        let budget = if small_cache { 64 } else { 1 << 20 };
        for kind in ["bytelevel", "metaspace"] {
            let p = prompts(kind, budget);
            for messages in &conversations {
                let text = p.render_chat(&object(json!({"messages": messages}))).unwrap();
                let whole = p.tokens().encode(&text, special).unwrap();
                prop_assert_eq!(&p.tokens().tokenize(&text, special).unwrap(), &whole, "{}: {:?}", kind, text);
                prop_assert_eq!(&p.tokens().tokenize(&text, special).unwrap(), &whole, "{} (cached): {:?}", kind, text);
            }
            let (_, bytes) = p.tokens().cached();
            prop_assert!(bytes <= budget, "{} > {}", bytes, budget);
        }
    }

    /// Plain text, special tokens anywhere, tokenizes the same way.
    #[test]
    fn segmented_text_equals_whole_text(words in prop::collection::vec(word(), 0..40), special in any::<bool>()) {
        let text = words.concat();
        for kind in ["bytelevel", "metaspace"] {
            let p = prompts(kind, 1 << 20);
            let whole = p.tokens().encode(&text, special).unwrap();
            prop_assert_eq!(&p.tokens().tokenize(&text, special).unwrap(), &whole, "{}: {:?}", kind, text);
        }
    }
}

/// What sits around the safe cuts of long texts: words, runs of spaces, newlines and tabs,
/// punctuation, contractions, digits, non-ASCII letters and spaces, and the special tokens.
fn long_text_word() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => "[a-z]{1,8}",
        10 => Just(" ".to_owned()),
        2 => Just("  ".to_owned()),
        2 => Just("\n".to_owned()),
        1 => Just("\n\n ".to_owned()),
        1 => Just(" \t".to_owned()),
        2 => "[.,;:!?\"()-]{1,3}",
        1 => Just("'s".to_owned()),
        1 => Just("'ll".to_owned()),
        1 => Just(" '".to_owned()),
        1 => "[0-9]{1,4}",
        1 => Just("é→日本".to_owned()),
        1 => Just("\u{a0}".to_owned()),
        1 => Just("\u{3000}".to_owned()),
        1 => Just("<|im_start|>".to_owned()),
        1 => Just("<|im_end|>".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Long texts (2 to 8 KB), cut into pieces on the byte-level tokenizer, tokenize as the
    /// whole text does, with and without special tokens, on both tokenizers; so does a
    /// longer text that starts with one of them, partly from the cache.
    #[test]
    fn pieces_of_long_texts_tokenize_as_the_whole_text(
        words in prop::collection::vec(long_text_word(), 700..2_800),
        split in 0.0..1.0f64,
        special in any::<bool>(),
        small_cache in any::<bool>(),
    ) {
        let budget = if small_cache { 4_096 } else { 1 << 20 };
        let shorter = words[..(words.len() as f64 * split) as usize].concat();
        let text = words.concat();
        for kind in ["bytelevel", "metaspace"] {
            let p = prompts(kind, budget);
            for t in [&shorter, &text] {
                let whole = p.tokens().encode(t, special).unwrap();
                prop_assert_eq!(&p.tokens().tokenize(t, special).unwrap(), &whole, "{}: {:?}", kind, t);
            }
        }
    }
}

/// A text prompt that repeats an earlier one's first 10 KB adds only its own tail's text to
/// the byte-level tokenizer's cache: the prefix's pieces come from the cache. The metaspace
/// tokenizer keeps whole segments.
#[test]
fn a_prompt_repeating_an_earlier_ones_prefix_tokenizes_only_its_tail() {
    // 1,280 distinct words of 8 bytes, a space, a letter and 6 digits: a safe cut every
    // `PIECE_BYTES` (2,048) bytes, the last where the prefix ends and a tail begins.
    assert_eq!(super::fleet::tokenize::PIECE_BYTES, 2_048);
    let prefix: String = (0..1_280).map(|i| format!(" r{i:06}")).collect();
    assert_eq!(prefix.len(), 10_240);
    let first = format!("{prefix} and a first question about it");
    let tail = " then another question entirely";
    let second = format!("{prefix}{tail}");
    let p = prompts("bytelevel", 1 << 20);
    for text in [&first, &second] {
        let ids = p.tokens().tokenize(text, true).unwrap();
        assert_eq!(ids, p.tokens().encode(text, true).unwrap());
    }
    let p = prompts("bytelevel", 1 << 20);
    p.tokens().tokenize(&first, true).unwrap();
    assert_eq!(
        p.tokens().cached(),
        (6, first.len()),
        "5 pieces and the tail"
    );
    p.tokens().tokenize(&second, true).unwrap();
    assert_eq!(p.tokens().cached(), (7, first.len() + tail.len()));

    let p = prompts("metaspace", 1 << 20);
    p.tokens().tokenize(&first, false).unwrap();
    p.tokens().tokenize(&second, false).unwrap();
    assert_eq!(p.tokens().cached(), (2, first.len() + second.len()));
}

#[test]
fn earlier_turns_come_from_the_cache() {
    let p = prompts("bytelevel", 1 << 20);
    let mut messages = vec![json!({"role": "system", "content": "You route requests to caches."})];
    let mut segments = Vec::new();
    for turn in 0..4 {
        messages.push(json!({"role": "user", "content": format!("question {turn}")}));
        let text = p
            .render_chat(&object(json!({"messages": messages})))
            .unwrap();
        p.tokens().tokenize(&text, false).unwrap();
        segments.push(p.tokens().cached().0);
        messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
    }
    // The first request: system, its end, the user turn, its end, the generation prompt
    // ("<|im_end|>\n" recurs, so 4 distinct segments). Each later turn adds its user
    // message and the previous answer (the answer's "<|im_start|>assistant\n..." segment).
    assert_eq!(segments, [4, 6, 8, 10]);
}

#[test]
fn missing_or_broken_files_are_clear_errors() {
    let d = dir("bytelevel");
    let missing = d.join("no-such-tokenizer.json");
    let e = Prompts::load(&missing, None, 1 << 20).err().unwrap();
    assert!(
        e.contains("cannot load") && e.contains("no-such-tokenizer.json"),
        "{e}"
    );
    let config =
        std::env::temp_dir().join(format!("prefix-router-bad-{}.json", std::process::id()));
    for (text, needle) in [
        ("{not json", "is not JSON"),
        (r#"{"chat_template": 3}"#, "is not text"),
        (r#"{"chat_template": "{% for %}"}"#, "does not compile"),
        (
            r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#,
            "no chat template named \"default\"",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let e = Prompts::load(&d.join("tokenizer.json"), Some(&config), 1 << 20)
            .err()
            .unwrap();
        assert!(e.contains(needle), "{text}: {e}");
    }
    std::fs::remove_file(&config).unwrap();
    // A config without a template loads; chats then say what is missing.
    std::fs::write(&config, "{}").unwrap();
    let p = Prompts::load(&d.join("tokenizer.json"), Some(&config), 1 << 20).unwrap();
    std::fs::remove_file(&config).unwrap();
    let e = p
        .render_chat(&object(
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ))
        .unwrap_err();
    assert!(e.contains("no chat template"), "{e}");
}
