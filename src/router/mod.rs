//! Routing: the [`Router`] trait, requests and decisions, load tracking, and every policy.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::{Error, TokenId, WorkerId};

mod admission;
mod affinity;
mod balanced;
mod baseline;
mod cache_aware;
mod consistent;
mod estimate;
mod fleet;
mod index;
mod load;
mod pd;
mod policy;
mod predict;
mod ranks;
mod receipt;
mod reload;
mod signals;

pub use self::admission::{AdmissionConfig, Admit, Limit, Priority, Shed};
pub use self::affinity::{Affinity, AffinityConfig, AffinityRouter, Fallback};
pub use self::balanced::{Balanced, BalancedConfig, BalancedRouter, Scoring};
pub use self::baseline::{
    LeastLoaded, LeastLoadedRouter, PowerOfTwo, PowerOfTwoConfig, PowerOfTwoRouter, RoundRobin,
    RoundRobinRouter,
};
pub use self::cache_aware::{CacheAware, CacheAwareConfig, CacheAwareRouter};
pub use self::consistent::{ConsistentHash, ConsistentHashConfig, ConsistentHashRouter};
pub use self::fleet::WorkerLoad;
pub use self::index::{CacheIndex, IndexConfig};
pub use self::load::{EngineLoad, LoadConfig, Staleness, StepModel, WorkerProfile};
pub use self::pd::{
    AlwaysSplit, ByCost, Decide, NeverSplit, PairDecision, PairReceipt, PairView, PdConfig,
    PdRouter, Plan, PlanCost, PlanLine, Role, Topology,
};
pub use self::policy::{Candidate, CandidateSet, Policy, PolicyRouter, choose_min};
pub use self::ranks::RankLayout;
pub use self::receipt::{Cost, CostTerm, Receipt, ReceiptLine};
pub use self::reload::ReloadConfig;
pub use self::signals::{FleetRates, FleetSignals, LIMITS, WorkerSignals};

pub(crate) use self::fleet::{mix64, pick_min};

/// Block size the routers hash with unless configured otherwise: vLLM's default.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

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
    keys: &'a [crate::BlockKey],
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
    /// [`EngineLoad::measured_at`] reports use): engine reports older than
    /// [`LoadConfig::max_report_age`] against it are stale. Without it, the newest report's
    /// time is the router's clock.
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
    /// with [`Error::Shed`] when none does, unless it is [`Priority::Critical`]. Routers
    /// without a load model ([`PolicyRouter`]s all have one) ignore it.
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
    /// batch and the prefill queued there shared over the request's output, take no longer;
    /// a refusal it binds says [`Limit::Decode`].
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
    pub fn with_keys(self, keys: &'a [crate::BlockKey]) -> Self {
        Self { keys, ..self }
    }

    /// The per-block extra keys (empty when none).
    #[must_use]
    pub fn keys(&self) -> &'a [crate::BlockKey] {
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
    let mut key = mix64(tokens.len() as u64 ^ 0x5EED);
    if !salt.is_empty() {
        key ^= xxhash_rust::xxh3::xxh3_64(salt);
    }
    for &t in tokens.iter().take(8) {
        key = mix64(key ^ u64::from(t));
    }
    key
}

/// Where a request went, what the router predicted, and the load it charged.
///
/// Release the load exactly once with [`Router::complete`] (or hold a [`RouteGuard`], which
/// releases on drop); completing again is a no-op. Not `Clone`, so one decision is one
/// charge.
#[derive(Debug)]
#[non_exhaustive]
pub struct RouteDecision {
    worker: WorkerId,
    epoch: u64,
    prompt_tokens: usize,
    matched_blocks: usize,
    cached_tokens: usize,
    /// Cached tokens by [`Tier::index`](crate::Tier::index).
    cached_by_tier: [u32; 4],
    /// The worker's data-parallel rank in its endpoint.
    rank: u32,
    /// Seconds to first token the load model predicted at the worker's configured speed.
    predicted_ttft_s: f64,
    /// Output tokens the request was charged with (its expected output).
    output_tokens: u32,
    /// `RELEASED` and `PREFILLED` bits: each set once, by one atomic operation.
    state: AtomicU8,
}

const RELEASED: u8 = 1;
const PREFILLED: u8 = 2;

impl RouteDecision {
    pub(crate) fn new(
        worker: WorkerId,
        epoch: u64,
        prompt_tokens: usize,
        matched_blocks: usize,
        cached_tokens: usize,
        cached_by_tier: [u32; 4],
    ) -> Self {
        Self {
            worker,
            epoch,
            prompt_tokens,
            matched_blocks,
            cached_tokens,
            cached_by_tier,
            rank: 0,
            predicted_ttft_s: 0.0,
            output_tokens: 0,
            state: AtomicU8::new(0),
        }
    }

    /// The same decision with the load model's prediction, charging the worker with
    /// `output_tokens` to generate.
    pub(crate) fn with_prediction(mut self, ttft_s: f64, output_tokens: u32) -> Self {
        self.predicted_ttft_s = ttft_s;
        self.output_tokens = output_tokens;
        self
    }

    /// Output tokens the decision charged its worker with.
    pub(crate) fn output_tokens(&self) -> u32 {
        self.output_tokens
    }

    /// Seconds to first token the router's load model predicted, at the worker's configured
    /// speed: [`Router::first_token_after`] compares the time measured with it.
    #[must_use]
    pub fn predicted_ttft_s(&self) -> f64 {
        self.predicted_ttft_s
    }

    /// The same decision for a worker at data-parallel rank `rank`.
    pub(crate) fn with_rank(mut self, rank: u32) -> Self {
        self.rank = rank;
        self
    }

    /// The chosen worker's data-parallel rank within its endpoint (see
    /// [`RankLayout`](crate::RankLayout); 0 with one rank per endpoint): what a host sends
    /// as vLLM's `X-data-parallel-rank` header.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Of [`cached_tokens`](Self::cached_tokens), those the worker is predicted to hold at
    /// `tier` (each block at the best tier holding it).
    #[must_use]
    pub fn cached_tokens_at(&self, tier: crate::Tier) -> usize {
        self.cached_by_tier[tier.index()] as usize
    }

    /// The chosen worker.
    #[must_use]
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Prompt tokens the router predicts the worker has cached (0 for policies without a
    /// cache index).
    #[must_use]
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Leading blocks of the prompt the router believes the worker holds.
    #[must_use]
    pub fn matched_blocks(&self) -> usize {
        self.matched_blocks
    }

    /// Tokens in the prompt.
    #[must_use]
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Tokens the worker is predicted to prefill: prompt minus cached.
    #[must_use]
    pub fn prefill_tokens(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }

    /// Whether the load of this decision was already released.
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.state.load(Ordering::Acquire) & RELEASED != 0
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Marks the decision released (and so prefilled). `None` if it already was released,
    /// else whether the prefill was still outstanding.
    pub(crate) fn mark_released(&self) -> Option<bool> {
        let before = self.state.fetch_or(RELEASED | PREFILLED, Ordering::AcqRel);
        (before & RELEASED == 0).then_some(before & PREFILLED == 0)
    }

    /// Marks the prefill done; false if it already was (or the decision was released).
    pub(crate) fn mark_prefilled(&self) -> bool {
        self.state.fetch_or(PREFILLED, Ordering::AcqRel) & (PREFILLED | RELEASED) == 0
    }
}

/// A routing policy with load tracking: the crate's front door.
///
/// `Send + Sync` and object safe: a gateway holds an `Arc<dyn Router>` (or a concrete
/// router) and calls [`route`](Self::route) from many threads. To try a new way of choosing
/// a worker, write a [`Policy`] and wrap it in a [`PolicyRouter`], which implements this
/// trait; a router written from scratch implements the four required methods, and the
/// others have defaults.
///
/// ```
/// use std::sync::Arc;
/// use prefix_router::{BalancedRouter, RouteRequest, Router};
///
/// let router: Arc<dyn Router> = Arc::new(BalancedRouter::new(4)?);
/// let system: Vec<u32> = (0..2_000).collect();
/// let first = router.route(&RouteRequest::new(&system))?;
/// router.complete(&first);
/// let second = router.route(&RouteRequest::new(&system))?;
/// assert_eq!(second.worker(), first.worker()); // the prefix is cached there
/// assert_eq!(second.cached_tokens(), 2_000);   // 125 full blocks of 16
/// router.complete(&second);
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub trait Router: Send + Sync {
    /// Chooses a worker for `request` and charges it with the request's load.
    ///
    /// # Errors
    ///
    /// [`Error::NoWorkers`] when no worker is registered and available.
    fn route(&self, request: &RouteRequest<'_>) -> Result<RouteDecision, Error>;

    /// Releases the load `decision` charged. Completing twice, or after the worker was
    /// removed, is a no-op.
    fn complete(&self, decision: &RouteDecision);

    /// The request's prefill is done (its first token arrived): its prompt tokens leave the
    /// worker's outstanding prefill work, which the TTFT-predicting policies queue behind.
    /// Optional: [`complete`](Self::complete) does it too if it was not done. Calling it
    /// twice is a no-op. The default does nothing.
    fn first_token(&self, decision: &RouteDecision) {
        let _ = decision;
    }

    /// Like [`first_token`](Self::first_token), with the time from forwarding the request
    /// to its first token as the host measured it: the router learns the worker's effective
    /// speed from it (how much slower or faster than predicted its first tokens come, over
    /// about the last `1 / learning_rate` of them, see [`LoadConfig::learning_rate`]). The
    /// default calls `first_token`.
    fn first_token_after(&self, decision: &RouteDecision, elapsed: std::time::Duration) {
        let _ = elapsed;
        self.first_token(decision);
    }

    /// Tells the router what the host knows of `worker` (its relative speed, its KV
    /// capacity). Optional: without it the worker runs at the configured speed until
    /// timings say otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when it is not registered; [`Error::InvalidConfig`] for a
    /// speed that is not positive. The default ignores the profile.
    fn set_profile(&self, worker: WorkerId, profile: WorkerProfile) -> Result<(), Error> {
        let _ = (worker, profile);
        Ok(())
    }

    /// Registers `worker` (available, with no load and an empty cache mirror).
    ///
    /// # Errors
    ///
    /// [`Error::WorkerExists`] when it is registered; [`Error::WorkerOutOfRange`] when its
    /// id is at or above [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    fn add_worker(&self, worker: WorkerId) -> Result<(), Error>;

    /// Unregisters `worker` and forgets its cache mirror. Decisions routed to it before stay
    /// valid to complete (a no-op).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when it is not registered.
    fn remove_worker(&self, worker: WorkerId) -> Result<(), Error>;

    /// Marks `worker` unavailable (draining, failed health check) or available again. An
    /// unavailable worker gets no new requests but keeps its cache mirror and its load.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when it is not registered. The default (for routers written
    /// outside this crate) refuses with [`Error::UnknownWorker`].
    fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        let _ = available;
        Err(Error::UnknownWorker(worker))
    }

    /// Pushes load the worker's engine reported (its metrics endpoint, a load event): the
    /// report replaces what the router counted before it; see [`EngineLoad`].
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when it is not registered; [`Error::InvalidConfig`] when
    /// `kv_usage` is not a fraction in `0.0..=1.0`. The default ignores the report.
    fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        let _ = (worker, load);
        Ok(())
    }

    /// A snapshot of `worker`'s load; `None` when it is not registered (the default).
    fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        let _ = worker;
        None
    }

    /// What an autoscaler needs of the fleet, in one snapshot: reuse counters, uncached
    /// prefill demand, each worker's saturation and the refusals by reason (see
    /// [`FleetSignals`]). The default: each of [`workers`](Self::workers)' [`load`](Self::load)
    /// at time zero, no refusals counted.
    fn fleet_signals(&self) -> FleetSignals {
        let workers = self
            .workers()
            .into_iter()
            .filter_map(|w| Some(WorkerSignals::of(w, &self.load(w)?)))
            .collect();
        FleetSignals::new(Duration::ZERO, workers, ([0; 5], [0; 3]))
    }

    /// Registered workers, available or not, in id order (the default: none known).
    fn workers(&self) -> Vec<WorkerId> {
        Vec::new()
    }

    /// The policy's name, for reports (the default: `"custom"`).
    fn name(&self) -> &'static str {
        "custom"
    }

    /// The block size of the router's cache mirror, for routers that keep one and read it
    /// (a simulator or a host checks it against the engines'). The default: `None`.
    fn block_size(&self) -> Option<usize> {
        None
    }

    /// Like [`route`](Self::route), with a [`Receipt`]: every candidate the policy saw, its
    /// load, its predicted cached tokens by tier and the policy's cost of it. Costs more than
    /// `route` (it allocates); meant for logging a sample of decisions. The default (for
    /// routers written from scratch) gives a receipt naming only the chosen worker.
    ///
    /// # Errors
    ///
    /// As [`route`](Self::route).
    fn route_with_receipt(
        &self,
        request: &RouteRequest<'_>,
    ) -> Result<(RouteDecision, Receipt), Error> {
        let decision = self.route(request)?;
        let receipt = Receipt {
            policy: self.name(),
            chosen: decision.worker(),
            prompt_tokens: request.tokens().len(),
            candidates: Vec::new(),
        };
        Ok((decision, receipt))
    }

    /// The router's mirror sync, for routers that keep one
    /// ([`BalancedRouter`](crate::BalancedRouter), [`CacheAwareRouter`](crate::CacheAwareRouter)),
    /// so that a host holding an `Arc<dyn Router>` can feed events and feedback to it.
    /// The default: `None`.
    fn cache_sync(&self) -> Option<&dyn crate::CacheSync> {
        None
    }
}

/// A decision that releases its load when dropped.
///
/// ```
/// use prefix_router::{RoundRobinRouter, RouteGuard, RouteRequest, Router, WorkerId};
///
/// let router = RoundRobinRouter::new(2)?;
/// {
///     let guard = RouteGuard::route(&router, &RouteRequest::new(&[1, 2, 3]))?;
///     assert_eq!(router.load(guard.worker()).unwrap().in_flight, 1);
/// } // released here
/// assert_eq!(router.load(WorkerId::new(0)).unwrap().in_flight, 0);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Debug)]
pub struct RouteGuard<'r, R: Router + ?Sized> {
    router: &'r R,
    decision: RouteDecision,
}

impl<'r, R: Router + ?Sized> RouteGuard<'r, R> {
    /// Routes `request` with `router` and wraps the decision.
    ///
    /// # Errors
    ///
    /// As [`Router::route`].
    pub fn route(router: &'r R, request: &RouteRequest<'_>) -> Result<Self, Error> {
        let decision = router.route(request)?;
        Ok(Self { router, decision })
    }
}

impl<R: Router + ?Sized> core::ops::Deref for RouteGuard<'_, R> {
    type Target = RouteDecision;
    fn deref(&self) -> &RouteDecision {
        &self.decision
    }
}

impl<R: Router + ?Sized> Drop for RouteGuard<'_, R> {
    fn drop(&mut self) {
        self.router.complete(&self.decision);
    }
}

#[cfg(test)]
mod tests;
