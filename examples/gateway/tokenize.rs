//! Text into token IDs: the model's Hugging Face `tokenizer.json` (the `tokenizers` crate)
//! and a cache of the token IDs of recurring segments.
//!
//! Glossary:
//! - a **boundary token** is a special added token that does not strip the whitespace before
//!   it, matches inside words and is matched before normalization (`<|im_start|>`,
//!   `<|im_end|>`, ...);
//! - a **segment** is a piece of a text that starts at a boundary token (or at the text's
//!   start) and runs to the next one;
//! - a **piece** is what the cache keeps: a segment, or for a tokenizer whose pieces may be
//!   cut ([`cuts_safely`]), a part of a segment cut at a **safe cut**: just before a space
//!   that follows a character other than whitespace and precedes a letter, the first such
//!   space at least [`PIECE_BYTES`] after the piece's start.
//!
//! The tokenizer cuts its input at added tokens before it normalizes or pre-tokenizes it, so
//! a text's token IDs are its segments' token IDs, concatenated (with the special tokens the
//! post-processor adds, when asked, around them). Rendered chats cut into segments at every
//! message, so the segments of a system prompt and of earlier turns recur from request to
//! request: the [`SegmentCache`] keeps their token IDs, and only new text is tokenized.
//!
//! A text completion is one segment. The byte-level pre-tokenizer's regex (GPT-2's:
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`) has no
//! alternative that matches a character other than whitespace followed by a space, so the
//! pre-token holding the character before a safe cut ends there, whole text or not; the next
//! match starts at the space in both, and the regex looks neither behind nor (but for
//! `(?!\S)`, which sees a space either way) past the cut. Byte-level BPE tokenizes each
//! pre-token alone, so a segment's token IDs are its pieces', concatenated: a prompt that
//! repeats an earlier one's text is tokenized from the piece where it departs from it.
//! `tests/gateway/prompts.rs` checks the equality with whole-text tokenization on a
//! byte-level and a metaspace tokenizer.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use prefix_router::TokenId;
use tokenizers::Tokenizer;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// A model's tokenizer and its segment cache.
pub(crate) struct Tokens {
    tokenizer: Tokenizer,
    boundaries: Boundaries,
    /// The token IDs the post-processor adds before and after a text's own, when it adds
    /// special tokens; `None` when they could not be told apart (then such texts are
    /// tokenized whole).
    affixes: Option<(Vec<TokenId>, Vec<TokenId>)>,
    /// Whether segments are cut into pieces at safe cuts ([`cuts_safely`]).
    pieces: bool,
    cache: SegmentCache,
}

/// The bytes a piece holds at least before a safe cut ends it.
pub(crate) const PIECE_BYTES: usize = 2_048;

impl Tokens {
    /// Loads a `tokenizer.json`; the cache keeps segments of `cache_bytes` bytes of text at
    /// most.
    ///
    /// # Errors
    /// When the file cannot be read or is not a tokenizer.
    pub(crate) fn load(path: &Path, cache_bytes: usize) -> Result<Self, String> {
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        Ok(Self {
            boundaries: boundaries(&tokenizer),
            affixes: affixes(&tokenizer),
            pieces: cuts_safely(&tokenizer),
            tokenizer,
            cache: SegmentCache::new(cache_bytes),
        })
    }

    /// The token IDs of `text`, with the special tokens the tokenizer's post-processor adds
    /// when `add_special_tokens` (vLLM adds them to text completions, not to chat prompts).
    pub(crate) fn tokenize(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, String> {
        let (prefix, suffix) = match (&self.affixes, add_special_tokens) {
            (_, false) => (&[][..], &[][..]),
            (Some((p, s)), true) => (&p[..], &s[..]),
            (None, true) => return self.encode(text, true),
        };
        let mut ids = prefix.to_vec();
        for segment in self.segments(text) {
            match self.cache.get(segment) {
                Some(cached) => ids.extend_from_slice(&cached),
                None => {
                    let fresh: Arc<[TokenId]> = self.encode(segment, false)?.into();
                    ids.extend_from_slice(&fresh);
                    self.cache.insert(segment, fresh);
                }
            }
        }
        ids.extend_from_slice(suffix);
        Ok(ids)
    }

    /// `text` tokenized whole, without the segment cache.
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, String> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("cannot tokenize the prompt: {e}"))
    }

    /// How many segments and bytes of text the cache holds.
    pub(crate) fn cached(&self) -> (usize, usize) {
        self.cache.size()
    }

    /// `text` cut into segments, and those into pieces when the tokenizer allows.
    fn segments<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut starts = self.segment_starts(text);
        starts.push(text.len());
        let mut from = 0;
        let mut pieces = Vec::with_capacity(starts.len());
        for end in starts {
            let segment = &text[from..end];
            from = end;
            if segment.is_empty() {
                continue;
            }
            if self.pieces {
                pieces.extend(Pieces { rest: segment });
            } else {
                pieces.push(segment);
            }
        }
        pieces
    }

    /// Where in `text` a boundary token begins, in order.
    fn segment_starts(&self, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match self.boundaries.at(&bytes[i..]) {
                Some(token) => {
                    starts.push(i);
                    i += token.len();
                }
                None => i += 1,
            }
        }
        starts
    }
}

/// A segment's pieces, in order: each ends at the first safe cut at least [`PIECE_BYTES`]
/// after its start, the last at the segment's end.
struct Pieces<'t> {
    rest: &'t str,
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        if self.rest.is_empty() {
            return None;
        }
        let cut = safe_cut(self.rest, PIECE_BYTES).unwrap_or(self.rest.len());
        let (piece, rest) = self.rest.split_at(cut);
        self.rest = rest;
        Some(piece)
    }
}

/// The first safe cut in `text` at or after byte `from`: the index of a space that follows
/// a character other than whitespace and precedes a letter.
fn safe_cut(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // A space is one byte, never part of another character's encoding: any index of one is
    // a character boundary.
    (from.max(1)..bytes.len()).find(|&at| {
        bytes[at] == b' '
            && text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| !c.is_whitespace())
            && text[at + 1..]
                .chars()
                .next()
                .is_some_and(char::is_alphabetic)
    })
}

/// Whether a segment's token IDs are its pieces', concatenated: the tokenizer has no
/// normalizer; its pre-tokenizer is byte-level with GPT-2's regex and adds no prefix
/// space; and no added token can match across a safe cut or reach past its own text
/// (none holds whitespace or strips it, and none matches as a single word only).
fn cuts_safely(tokenizer: &Tokenizer) -> bool {
    let byte_level = matches!(
        tokenizer.get_pre_tokenizer(),
        Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
    );
    let added_stay = tokenizer.get_added_tokens_decoder().values().all(|t| {
        !t.lstrip && !t.rstrip && !t.single_word && !t.content.chars().any(char::is_whitespace)
    });
    tokenizer.get_normalizer().is_none() && byte_level && added_stay
}

/// The boundary tokens, by their first byte, longest first.
struct Boundaries {
    /// By first byte: an index into `tokens` plus one; 0 for bytes no token starts with.
    first: [u16; 256],
    tokens: Vec<Vec<String>>,
}

impl Boundaries {
    /// The boundary token `text` starts with, the longest if several do.
    fn at(&self, text: &[u8]) -> Option<&str> {
        let slot = *self.first.get(usize::from(*text.first()?))?;
        let tokens = self.tokens.get(usize::from(slot).checked_sub(1)?)?;
        tokens
            .iter()
            .find(|t| text.starts_with(t.as_bytes()))
            .map(String::as_str)
    }
}

/// The tokenizer's boundary tokens.
fn boundaries(tokenizer: &Tokenizer) -> Boundaries {
    let mut by_byte: HashMap<u8, Vec<String>> = HashMap::new();
    for token in tokenizer.get_added_tokens_decoder().values() {
        if token.special
            && !token.lstrip
            && !token.single_word
            && !token.normalized
            && !token.content.is_empty()
        {
            by_byte
                .entry(token.content.as_bytes()[0])
                .or_default()
                .push(token.content.clone());
        }
    }
    let mut boundaries = Boundaries {
        first: [0; 256],
        tokens: Vec::new(),
    };
    for (byte, mut tokens) in by_byte {
        tokens.sort_by_key(|t| std::cmp::Reverse(t.len()));
        boundaries.tokens.push(tokens);
        boundaries.first[usize::from(byte)] = boundaries.tokens.len() as u16;
    }
    boundaries
}

/// What the post-processor adds before and after a prompt's tokens, found by tokenizing
/// one probe text with and without special tokens.
fn affixes(tokenizer: &Tokenizer) -> Option<(Vec<TokenId>, Vec<TokenId>)> {
    let probe = "routing probe";
    let with = tokenizer.encode_fast(probe, true).ok()?.get_ids().to_vec();
    let bare = tokenizer.encode_fast(probe, false).ok()?.get_ids().to_vec();
    let at = (0..=with.len().checked_sub(bare.len())?).find(|&i| with[i..].starts_with(&bare))?;
    Some((with[..at].to_vec(), with[at + bare.len()..].to_vec()))
}

/// Token IDs of segments, kept by the segment's text. Two generations approximate an LRU:
/// lookups search the young generation, then the old one (a hit there moves the entry back
/// to the young one); when the young generation passes half the byte budget, it becomes the
/// old one and the old one is dropped.
pub(crate) struct SegmentCache {
    inner: Mutex<Generations>,
    half_budget: usize,
}

#[derive(Default)]
struct Generations {
    young: HashMap<Box<str>, Arc<[TokenId]>, Xxh3DefaultBuilder>,
    old: HashMap<Box<str>, Arc<[TokenId]>, Xxh3DefaultBuilder>,
    young_bytes: usize,
    old_bytes: usize,
}

impl SegmentCache {
    fn new(budget_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Generations::default()),
            half_budget: budget_bytes / 2,
        }
    }

    fn get(&self, segment: &str) -> Option<Arc<[TokenId]>> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ids) = g.young.get(segment) {
            return Some(Arc::clone(ids));
        }
        let (key, ids) = g.old.remove_entry(segment)?;
        g.old_bytes -= key.len();
        g.admit(key, Arc::clone(&ids), self.half_budget);
        Some(ids)
    }

    fn insert(&self, segment: &str, ids: Arc<[TokenId]>) {
        if segment.len() > self.half_budget {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.admit(segment.into(), ids, self.half_budget);
    }

    /// Segments held, and their bytes of text.
    fn size(&self) -> (usize, usize) {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (g.young.len() + g.old.len(), g.young_bytes + g.old_bytes)
    }
}

impl Generations {
    fn admit(&mut self, key: Box<str>, ids: Arc<[TokenId]>, half_budget: usize) {
        if self.young.contains_key(&key) {
            return;
        }
        if self.young_bytes + key.len() > half_budget {
            self.old = std::mem::take(&mut self.young);
            self.old_bytes = std::mem::take(&mut self.young_bytes);
        }
        self.young_bytes += key.len();
        self.young.insert(key, ids);
    }
}
