//! A request of a workload or trace, its prompt, what a closed-loop request waits for, and
//! the random token IDs synthetic prompts are made of.

use super::rng::Rng;
use crate::hash::TokenId;

/// Vocabulary size token IDs are drawn from (Qwen2's, beyond 2^17).
const VOCAB: u64 = 151_936;

/// A prompt: explicit token IDs, or content blocks that are turned into tokens on demand
/// (traces hold tens of millions of tokens; materialising them one request at a time keeps
/// memory small).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Prompt {
    /// The token IDs.
    Tokens(Vec<TokenId>),
    /// `len` tokens made of content blocks of `tokens_per_id` tokens each: equal ids give
    /// equal tokens; the last block is cut to `len`.
    Blocks {
        /// Content ids, one per block.
        ids: Vec<u64>,
        /// Tokens per content id.
        tokens_per_id: usize,
        /// Tokens in the prompt.
        len: usize,
    },
}

impl Prompt {
    /// Tokens in the prompt.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Prompt::Tokens(t) => t.len(),
            Prompt::Blocks { len, .. } => *len,
        }
    }

    /// True for an empty prompt.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the prompt's token IDs into `out` (cleared first).
    pub fn tokens_into(&self, out: &mut Vec<TokenId>) {
        out.clear();
        match self {
            Prompt::Tokens(t) => out.extend_from_slice(t),
            Prompt::Blocks {
                ids,
                tokens_per_id,
                len,
            } => {
                out.resize(*len, 0);
                let mut at = 0;
                for &id in ids {
                    let mut rng = Rng::new(id ^ 0x7472_6163_6562_6c6b);
                    let take = (*len - at).min(*tokens_per_id);
                    for token in &mut out[at..at + take] {
                        *token = rng.below(VOCAB) as TokenId;
                        // Keeps the loop scalar: vectorised for the baseline x86-64 target,
                        // its 64-bit multiplies are emulated and take twice as long.
                        std::hint::black_box(());
                    }
                    at += take;
                    if at == *len {
                        break;
                    }
                }
                out.truncate(at);
            }
        }
    }
}

/// One request of a workload or trace.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Request {
    /// Arrival time in seconds from the start.
    pub arrival_s: f64,
    /// The prompt.
    pub prompt: Prompt,
    /// Output tokens to decode.
    pub output_tokens: u32,
    /// The conversation it belongs to, if any.
    pub session: Option<String>,
    /// What it waits for in a closed-loop workload: it arrives a gap after the requests it
    /// follows end, whatever its `arrival_s` (then only its place in the list's order).
    /// `None`: it arrives at `arrival_s`.
    pub follows: Option<Follows>,
}

/// The requests a closed-loop request waits for, and how long after them it arrives.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Follows {
    /// Indices in the request list of the requests whose ends (last token, or refusal) it
    /// waits for; each is earlier in the list than the request that follows it.
    pub requests: Vec<usize>,
    /// Seconds from the last of them ending to its arrival (at 1×: divided by the speedup,
    /// as arrival times are).
    pub gap_s: f64,
}

impl Follows {
    /// Waits for `requests`, arriving `gap_s` after the last of them ends.
    #[must_use]
    pub fn new(requests: Vec<usize>, gap_s: f64) -> Self {
        Self { requests, gap_s }
    }
}

impl Request {
    /// A request arriving at `arrival_s` with `tokens` and `output_tokens`.
    #[must_use]
    pub fn new(arrival_s: f64, tokens: Vec<TokenId>, output_tokens: u32) -> Self {
        Self {
            arrival_s,
            prompt: Prompt::Tokens(tokens),
            output_tokens,
            session: None,
            follows: None,
        }
    }

    /// The same request in `session`.
    #[must_use]
    pub fn with_session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// The same request arriving as `follows` says: a gap after the requests it waits for
    /// end.
    #[must_use]
    pub fn with_follows(mut self, follows: Follows) -> Self {
        self.follows = Some(follows);
        self
    }
}

/// `n` random token IDs.
pub(super) fn tokens(rng: &mut Rng, n: usize) -> Vec<TokenId> {
    (0..n).map(|_| rng.below(VOCAB) as TokenId).collect()
}

/// `prefix` followed by `n` random token IDs.
pub(super) fn prefixed(rng: &mut Rng, prefix: &[TokenId], n: usize) -> Vec<TokenId> {
    let mut p = prefix.to_vec();
    p.extend(tokens(rng, n));
    p
}
