//! What a request asks of a router and what it is told: the [`RouteRequest`] (its prompt,
//! session, namespace, targets and priority), the [`RouteDecision`] that charges a worker,
//! or a refusal ([`Shed`], bound by a [`Limit`]). The vocabulary every layer above speaks:
//! the fleet model predicts for a request, admission refuses one, policies choose for one.

mod decision;
mod priority;
pub(crate) mod refusal;

pub use self::decision::RouteDecision;
pub use self::priority::AdmissionConfig;
pub use self::refusal::{GATES, Gate, LIMITS, Limit, Priority, Shed};

use crate::fold::mix64;
use crate::hash::TokenId;

/// A request to route: its prompt's token IDs and what else the policies may use.
///
/// ```
/// use prefix_router::RouteRequest;
///
/// let tokens = [1u32, 2, 3];
/// let req = RouteRequest::new(&tokens)
///     .with_session("conversation-42")
///     .with_salt(b"llama-3-70b/lora:finance")
///     .with_expected_output(256);
/// assert_eq!(req.session(), Some("conversation-42"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    tokens: &'a [TokenId],
    session: Option<&'a str>,
    salt: &'a [u8],
    keys: &'a [crate::hash::BlockKey],
    expected_output: Option<u32>,
    time: Option<std::time::Duration>,
    ttft_target: Option<std::time::Duration>,
    tpot_target: Option<std::time::Duration>,
    priority: Priority,
    /// [`key`](Self::key) without a session, computed once.
    token_key: u64,
    /// The session's key, computed once.
    session_key: Option<u64>,
}

impl<'a> RouteRequest<'a> {
    /// A request for a prompt of `tokens`.
    #[must_use]
    pub fn new(tokens: &'a [TokenId]) -> Self {
        Self {
            tokens,
            session: None,
            salt: &[],
            keys: &[],
            expected_output: None,
            time: None,
            ttft_target: None,
            tpot_target: None,
            priority: Priority::Standard,
            token_key: token_key(tokens, &[]),
            session_key: None,
        }
    }

    /// The time the request is routed at, on the host's clock (the one its
    /// [`EngineLoad::measured_at`](crate::EngineLoad::measured_at) reports use): engine reports older than
    /// [`LoadConfig::max_report_age`](crate::LoadConfig::max_report_age) against it are stale. Without it, the newest report's
    /// time is the router's clock.
    ///
    /// The router's clock never goes back, and moves by more than a minute at once only
    /// when a second time confirms the first: pass one clock (a monotonic one) for every
    /// request, report and frame. Admission's decode bound reads the prefill admitted to a
    /// worker as a rate over this clock: a router never told a time (no request time, no
    /// timed report, no replica frame) counts no such rate, and its observed gates read the
    /// factors alone, with no wait for a first token as evidence. Routing and the model's
    /// check are the same with or without a time.
    #[must_use]
    pub fn with_time(self, at: std::time::Duration) -> Self {
        Self {
            time: Some(at),
            ..self
        }
    }

    /// A time-to-first-token target: the request asks for admission. It is routed only to
    /// a worker the load model predicts meets the target (held to
    /// [`AdmissionConfig::sheddable_share`] of it when [`Priority::Sheddable`]), or refused
    /// with [`Error::Shed`](crate::Error::Shed) when none does, unless it is [`Priority::Critical`]. Routers
    /// without a load model ([`PolicyRouter`](crate::PolicyRouter)s all have one) ignore it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use prefix_router::{BalancedRouter, EngineLoad, Error, Priority, RouteRequest, Router, WorkerId};
    ///
    /// let router = BalancedRouter::new(2)?;
    /// // Both workers report 200 requests waiting: far more than two seconds of prefill.
    /// for w in 0..2 {
    ///     let load = EngineLoad::new(200, 8, Duration::ZERO).with_prefill_tokens(400_000);
    ///     router.report_load(WorkerId::new(w), load)?;
    /// }
    /// let tokens = vec![7u32; 2_048];
    /// let request = RouteRequest::new(&tokens)
    ///     .with_ttft_target(Duration::from_secs(2))
    ///     .with_priority(Priority::Sheddable);
    /// match router.route(&request) {
    ///     Err(Error::Shed(shed)) => assert!(shed.retry_after.is_some()),
    ///     other => panic!("expected a shed, got {other:?}"),
    /// }
    /// // A critical request is routed all the same.
    /// let critical = request.with_priority(Priority::Critical);
    /// assert!(router.route(&critical).is_ok());
    /// # Ok::<(), Error>(())
    /// ```
    #[must_use]
    pub fn with_ttft_target(self, target: std::time::Duration) -> Self {
        Self {
            ttft_target: Some(target),
            ..self
        }
    }

    /// The time-to-first-token target, if given.
    #[must_use]
    pub fn ttft_target(&self) -> Option<std::time::Duration> {
        self.ttft_target
    }

    /// A time-per-output-token target: the request asks for admission, as with
    /// [`with_ttft_target`](Self::with_ttft_target) (the two may be given together). A worker
    /// meets it when the load model predicts its decode steps, with this request in the
    /// batch of the decodes running there, take no longer (the prefill queued there runs
    /// before this request's first token); a refusal it binds says [`Limit::Decode`].
    #[must_use]
    pub fn with_tpot_target(self, target: std::time::Duration) -> Self {
        Self {
            tpot_target: Some(target),
            ..self
        }
    }

    /// The time-per-output-token target, if given.
    #[must_use]
    pub fn tpot_target(&self) -> Option<std::time::Duration> {
        self.tpot_target
    }

    /// Whether the request asks for admission: it carries a target.
    #[inline]
    #[must_use]
    pub fn asks_admission(&self) -> bool {
        self.ttft_target.is_some() || self.tpot_target.is_some()
    }

    /// The request's priority under admission (default [`Priority::Standard`]).
    #[must_use]
    pub fn with_priority(self, priority: Priority) -> Self {
        Self { priority, ..self }
    }

    /// The request's priority.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The request's time, if given.
    #[must_use]
    pub fn time(&self) -> Option<std::time::Duration> {
        self.time
    }

    /// The conversation or session this request belongs to (sticky policies use it).
    #[must_use]
    pub fn with_session(self, session: &'a str) -> Self {
        Self {
            session: Some(session),
            session_key: Some(xxhash_rust::xxh3::xxh3_64(session.as_bytes())),
            ..self
        }
    }

    /// A cache namespace: model, LoRA adapter or tenant cache salt. Requests with different
    /// salts never share cached prefixes. For a LoRA adapter or a cache salt that engines
    /// report in their events, use [`namespace_salt`](crate::namespace_salt), the convention
    /// event sync follows.
    #[must_use]
    pub fn with_salt(self, salt: &'a [u8]) -> Self {
        Self {
            salt,
            token_key: token_key(self.tokens, salt),
            ..self
        }
    }

    /// Per-block extra keys (multimodal inputs and the like, see
    /// [`BlockKey`](crate::BlockKey)): two prompts with equal tokens but other keys share no
    /// block from the first keyed one on.
    #[must_use]
    pub fn with_keys(self, keys: &'a [crate::hash::BlockKey]) -> Self {
        Self { keys, ..self }
    }

    /// The per-block extra keys (empty when none).
    #[must_use]
    pub fn keys(&self) -> &'a [crate::hash::BlockKey] {
        self.keys
    }

    /// The expected number of output tokens, where the host knows it (a hint: the decode
    /// load the request adds, for policies that weigh it).
    #[must_use]
    pub fn with_expected_output(self, tokens: u32) -> Self {
        Self {
            expected_output: Some(tokens),
            ..self
        }
    }

    /// The prompt's token IDs.
    #[must_use]
    pub fn tokens(&self) -> &'a [TokenId] {
        self.tokens
    }

    /// The session id, if any.
    #[must_use]
    pub fn session(&self) -> Option<&'a str> {
        self.session
    }

    /// The salt (empty when none).
    #[must_use]
    pub fn salt(&self) -> &'a [u8] {
        self.salt
    }

    /// The expected output length, if given.
    #[must_use]
    pub fn expected_output(&self) -> Option<u32> {
        self.expected_output
    }

    /// A 64-bit key of the request for tie-breaks and hashing policies: the session when
    /// there is one, else the prompt's length and first 8 tokens with the salt (computed
    /// when the request is built).
    #[inline]
    pub(crate) fn key(&self) -> u64 {
        self.session_key.unwrap_or(self.token_key)
    }
}

/// The key of a request of `tokens` salted with `salt`, without a session: its length and
/// first 8 tokens, with the salt.
fn token_key(tokens: &[TokenId], salt: &[u8]) -> u64 {
    let mut key = tokens.len() as u64 ^ 0x5EED;
    if !salt.is_empty() {
        key ^= xxhash_rust::xxh3::xxh3_64(salt);
    }
    // The first 8 tokens as four 64-bit words, each folded in by a multiply and a
    // rotation; one finalising mix spreads them over every bit.
    for pair in tokens[..tokens.len().min(8)].chunks(2) {
        let high = pair.get(1).map_or(0, |&t| u64::from(t) << 32);
        key = (key ^ u64::from(pair[0]) ^ high)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
    mix64(key)
}
