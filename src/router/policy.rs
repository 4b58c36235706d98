//! The policy seam: [`Policy`] chooses among [`Candidate`]s; [`PolicyRouter`] does
//! everything else once, for every policy (load tracking, the mirror, event sync, worker
//! registration).

use super::admission::{Admission, Admit, Gate, Open};
use super::estimate::Estimate;
use super::fleet::{Candidates, Fleet, NO_CLASS};
use super::load::{EngineLoad, LoadConfig, WorkerProfile};
use smallvec::SmallVec;

use super::index::{Blocks, CacheIndex, IndexConfig};
use super::signals::{FleetSignals, WorkerSignals};
use super::{Cost, Receipt, ReceiptLine, RouteDecision, RouteRequest, Router, WorkerLoad};
use crate::sync::{CacheEvent, CacheSync, SyncOutcome};
use crate::tree::Held;
use crate::{Error, RankLayout, Tier, TokenId, WorkerId};

/// A worker the router offers a [`Policy`], with the load figures and the cache prediction
/// it may score on.
///
/// Loads are a snapshot taken just before the policy runs: other threads may route to the
/// same workers meanwhile, so they are estimates, as a worker's own report is. Where the
/// engine reports its load ([`Router::report_load`]), the figures are its last report
/// reconciled with this router's own counts since (see [`EngineLoad`]); a report past its
/// age counts as [`LoadConfig::staleness`] says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub(crate) worker: WorkerId,
    pub(crate) epoch: u64,
    pub(crate) in_flight: u64,
    pub(crate) routed: u64,
    pub(crate) assigned_prefill: u64,
    pub(crate) estimate: Estimate,
    pub(crate) matched_blocks: u32,
    pub(crate) cached_tokens: u32,
    /// Cached tokens by [`Tier::index`].
    pub(crate) cached_by_tier: [u32; 4],
}

impl Candidate {
    /// Counts the whole prompt of `tokens` cached: a decode worker receiving it from a
    /// prefill worker prefills none of it.
    pub(crate) fn assume_cached(&mut self, tokens: usize) {
        self.cached_tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
    }

    /// Turns the blocks written by [`fill`] into tokens: `block_size` a block, at most the
    /// prompt's `tokens`.
    fn set_cached(&mut self, block_size: usize, tokens: usize) {
        let cached = (self.matched_blocks as usize * block_size).min(tokens);
        self.cached_tokens = u32::try_from(cached).unwrap_or(u32::MAX);
        let size = u32::try_from(block_size).unwrap_or(u32::MAX);
        self.cached_by_tier = self.cached_by_tier.map(|b| b.saturating_mul(size));
    }

    /// The worker.
    #[inline]
    #[must_use]
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Requests routed to it by this router and not completed.
    #[inline]
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Requests on the worker, waiting or running: this router's in-flight count, or the
    /// engine's reported count with this router's since when that is larger (it includes
    /// other routers' traffic).
    #[inline]
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.estimate.requests
    }

    /// Of [`requests`](Self::requests), those decoding (past their first token).
    #[inline]
    #[must_use]
    pub fn decoding(&self) -> u64 {
        self.estimate.decoding
    }

    /// Of [`requests`](Self::requests), those waiting for or in their prefill.
    #[inline]
    #[must_use]
    pub fn waiting(&self) -> u64 {
        self.estimate.requests - self.estimate.decoding
    }

    /// Uncached prompt tokens to prefill on the worker before a new request's: this
    /// router's requests whose first token has not come (see [`Router::first_token`]), or
    /// the engine's reported pending prefill with this router's routes since, when larger;
    /// with [`LoadConfig::prefill_from_report`](crate::LoadConfig::prefill_from_report), a
    /// fresh report's figure alone (it counts the progress of prefills under way).
    #[inline]
    #[must_use]
    pub fn prefill_tokens(&self) -> u64 {
        self.estimate.prefill_tokens
    }

    /// Tokens of context the worker's requests hold: this router's in-flight prompts, or
    /// the reported KV usage times the worker's capacity when known and larger.
    #[inline]
    #[must_use]
    pub fn context_tokens(&self) -> u64 {
        self.estimate.context_tokens
    }

    /// The fraction of KV in use the engine last reported (0 without a fresh report).
    #[inline]
    #[must_use]
    pub fn kv_usage(&self) -> f64 {
        f64::from(self.estimate.kv_usage)
    }

    /// The worker's speed relative to the configured one
    /// ([`LoadConfig::prefill_tokens_per_s`]): its [`WorkerProfile`]'s, corrected by the
    /// timings the host reported ([`Router::first_token_after`]).
    #[inline]
    #[must_use]
    pub fn speed(&self) -> f64 {
        f64::from(self.estimate.speed)
    }

    /// Whether the engine's report is past its age and counts as saturation
    /// ([`Staleness::Saturated`](crate::Staleness::Saturated)).
    #[inline]
    #[must_use]
    pub fn saturated(&self) -> bool {
        self.estimate.saturated
    }

    /// The load model's predicted time to first token, in seconds, for a request of
    /// `prompt` tokens, `miss` of them uncached here, each weighing `miss_weight`,
    /// generating `output` tokens (see [`BalancedRouter`](crate::BalancedRouter)).
    #[must_use]
    pub fn predicted_ttft_s(
        &self,
        config: &LoadConfig,
        prompt: usize,
        miss: usize,
        output: u32,
        miss_weight: f64,
    ) -> f64 {
        self.predicted_times(config, prompt, miss, output, miss_weight)
            .0
    }

    /// [`predicted_ttft_s`](Self::predicted_ttft_s) and
    /// [`predicted_decode_s`](Self::predicted_decode_s), computed together.
    #[must_use]
    pub fn predicted_times(
        &self,
        config: &LoadConfig,
        prompt: usize,
        miss: usize,
        output: u32,
        miss_weight: f64,
    ) -> (f64, f64) {
        let request = (prompt as u64, miss as u64, output);
        self.estimate
            .times(config, request, miss_weight, self.speed())
    }

    /// The load model's time, in seconds, for a request of `prompt` tokens to decode
    /// `output` tokens in this worker's batch, beyond the fixed part of its steps (see
    /// [`BalancedRouter`](crate::BalancedRouter)).
    #[must_use]
    pub fn predicted_decode_s(&self, config: &LoadConfig, prompt: usize, output: u32) -> f64 {
        self.estimate
            .decode_s(config, prompt as u64, output, self.speed())
    }

    /// Requests routed to it since it was added.
    #[inline]
    #[must_use]
    pub fn routed(&self) -> u64 {
        self.routed
    }

    /// Uncached prompt tokens of every request routed to it since it was added: the prefill
    /// work it was handed in all.
    #[inline]
    #[must_use]
    pub fn assigned_prefill_tokens(&self) -> u64 {
        self.assigned_prefill
    }

    /// Leading blocks of the prompt the mirror believes the worker holds (0 unless the
    /// policy [reads the cache](Policy::reads_cache)).
    #[inline]
    #[must_use]
    pub fn matched_blocks(&self) -> usize {
        self.matched_blocks as usize
    }

    /// Prompt tokens the worker is predicted to have cached: its matched blocks, at most the
    /// prompt (0 unless the policy [reads the cache](Policy::reads_cache)).
    #[inline]
    #[must_use]
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens as usize
    }

    /// Of [`cached_tokens`](Self::cached_tokens), those the worker holds at `tier` (each
    /// block counted at the best tier holding it).
    #[inline]
    #[must_use]
    pub fn cached_tokens_at(&self, tier: Tier) -> usize {
        self.cached_by_tier[tier.index()] as usize
    }
}

/// A routing policy: how one worker is chosen among the available ones. Everything else a
/// [`Router`] does ([`PolicyRouter`] does it) is the same for every policy, so a policy of a
/// dozen lines gets load tracking, the cache mirror, event sync, the simulator and the
/// benches.
///
/// # Contract
///
/// - [`select`](Self::select) gets the available workers in id order (never empty), with
///   their load snapshot and, when [`reads_cache`](Self::reads_cache) is true, how much of
///   the prompt each holds. It returns an index into `candidates`; an index out of range
///   makes [`Router::route`] fail with [`Error::InvalidChoice`].
/// - `select` runs on the caller's thread, concurrently with itself, and for policies that
///   read the cache under the mirror's lock: it must not block, and should take
///   microseconds. State it keeps (counters, tables) needs interior mutability.
/// - After `select`, a router whose policy reads the cache records the prompt as held by
///   the chosen worker (it will be once the request runs), under the same lock, so a
///   concurrent request with the same prefix already sees it.
/// - Ties should spread work rather than favour low ids: [`choose_min`] breaks them by the
///   requests routed so far, then by a per-request rotation.
///
/// ```
/// use prefix_router::{Candidate, Policy, PolicyRouter, RouteRequest, Router, choose_min};
///
/// /// The worker with the most cached tokens, unless it has 4 more requests than the least
/// /// loaded.
/// struct CacheWithin4;
///
/// impl Policy for CacheWithin4 {
///     fn name(&self) -> &'static str {
///         "cache_within_4"
///     }
///     fn reads_cache(&self) -> bool {
///         true
///     }
///     fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
///         let least = candidates.iter().map(Candidate::requests).min().unwrap_or(0);
///         choose_min(request, candidates, |c| {
///             let overloaded = c.requests() > least + 4;
///             (overloaded, std::cmp::Reverse(c.cached_tokens()))
///         })
///     }
/// }
///
/// let router = PolicyRouter::with_policy(4, CacheWithin4, Default::default())?;
/// let prompt: Vec<u32> = (0..64).collect();
/// let first = router.route(&RouteRequest::new(&prompt))?;
/// let second = router.route(&RouteRequest::new(&prompt))?;
/// assert_eq!(second.worker(), first.worker());
/// assert_eq!(second.cached_tokens(), 64);
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub trait Policy: Send + Sync {
    /// The policy's name, for reports.
    fn name(&self) -> &'static str;

    /// Whether [`select`](Self::select) reads the candidates' cached tokens. Only then does
    /// the router hash the prompt, match it against the mirror and record it for the chosen
    /// worker. The default: `false`.
    fn reads_cache(&self) -> bool {
        false
    }

    /// Chooses one of `candidates` (never empty) for `request`: an index into it.
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize;

    /// Which workers [`select`](Self::select) is offered. The default:
    /// [`CandidateSet::All`].
    fn candidates(&self) -> CandidateSet {
        CandidateSet::All
    }

    /// The policy's cost of `candidate` for `request`, term by term (lower wins), for
    /// [`Router::route_with_receipt`]. The default: `None` (the policy does not explain).
    fn cost(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> Option<Cost> {
        let _ = (request, candidate);
        None
    }

    /// The policy's own admission rule for `request`, which asks for admission (it carries
    /// a target, [`RouteRequest::asks_admission`]), over every available worker. The
    /// default: [`Admit::Predicted`], the crate's rule. A policy that answers otherwise
    /// owns its refusals: [`Priority::Critical`](crate::Priority::Critical) requests are
    /// never refused only under the crate's rule.
    fn admit(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Admit {
        let _ = (request, candidates);
        Admit::Predicted
    }

    /// `worker` was registered (also called for each initial worker). The default: nothing.
    fn worker_added(&self, worker: WorkerId) {
        let _ = worker;
    }

    /// `worker` was unregistered. The default: nothing.
    fn worker_removed(&self, worker: WorkerId) {
        let _ = worker;
    }
}

/// Which workers a [`Policy`] is offered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CandidateSet {
    /// Every available worker (the cost of a route grows with the fleet).
    #[default]
    All,
    /// Of the available workers holding the same part of the prompt (as many blocks, at the
    /// same tiers), and of those holding none of it, the one the least loaded rule picks:
    /// lowest load key (the load model's time to first token of a request with nothing of
    /// its own), then least prefill handed out, then fewest requests routed, then a
    /// per-request rotation (the rule [`choose_min`] breaks ties by). A route then reads every
    /// worker's load once and scores a handful, and costs about as much on 1,024 workers as
    /// on 16. For [`BalancedRouter`](crate::BalancedRouter) it is an approximation: a
    /// request's own uncached tokens weigh more on a worker with more requests waiting, and
    /// its decode time differs with the worker's decodes, so another worker holding alike can
    /// cost less: a holder whose decodes are long can rank first in its class and lose to
    /// a worker holding nothing, while another holder would have cost less than both
    /// (`tests/policy.rs` bounds the choice's cost at five times the best; its random
    /// fleets reach four).
    LeastLoadedPerMatch,
}

/// The index of the candidate with the smallest `key`. Equal keys go to the worker routed
/// the fewest requests so far, then to a per-request rotation, never to the lowest id; 0 for
/// no candidates.
pub fn choose_min<K: PartialOrd>(
    request: &RouteRequest<'_>,
    candidates: &[Candidate],
    mut key: impl FnMut(&Candidate) -> K,
) -> usize {
    super::fleet::pick_min(candidates, request.key(), |_, c| key(c)).unwrap_or(0)
}

/// A [`Router`] made of a [`Policy`]: the crate's routers are all `PolicyRouter`s
/// ([`BalancedRouter`](crate::BalancedRouter) is `PolicyRouter<Balanced>`), and a
/// policy written outside the crate becomes a router the same way.
///
/// It keeps the workers' registry and load, and a [`CacheIndex`] mirror that it consults and
/// updates only when the policy [reads the cache](Policy::reads_cache). [`CacheSync`] feeds
/// that mirror (engine events, snapshots, miss feedback) whatever the policy;
/// [`Router::cache_sync`] offers it to hosts only when the policy reads it.
#[derive(Debug)]
pub struct PolicyRouter<P> {
    fleet: Fleet,
    index: CacheIndex,
    policy: P,
    layout: RankLayout,
}

impl<P: Policy> PolicyRouter<P> {
    /// A router over workers `0..num_workers` choosing with `policy`, its mirror configured
    /// by `index` (used only when the policy reads the cache).
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS); [`Error::InvalidConfig`]
    /// or [`Error::InvalidBlockSize`] when `index` does not
    /// [validate](IndexConfig::validate).
    pub fn with_policy(num_workers: u32, policy: P, index: IndexConfig) -> Result<Self, Error> {
        Self::with_policy_and_load(num_workers, policy, index, LoadConfig::default())
    }

    /// Like [`with_policy`](Self::with_policy), reading load as `load` says.
    ///
    /// # Errors
    ///
    /// As [`with_policy`](Self::with_policy); [`Error::InvalidConfig`] when `load` does not
    /// [validate](LoadConfig::validate).
    pub fn with_policy_and_load(
        num_workers: u32,
        policy: P,
        index: IndexConfig,
        load: LoadConfig,
    ) -> Result<Self, Error> {
        let router = Self {
            fleet: Fleet::new(num_workers, load, index.block_size)?,
            index: CacheIndex::new(index)?,
            policy,
            layout: RankLayout::default(),
        };
        for worker in router.fleet.workers() {
            router.index.reset_worker(worker);
            router.policy.worker_added(worker);
        }
        Ok(router)
    }

    /// The same router with its targets laid out as `layout` says (endpoint, data-parallel
    /// rank), so that its decisions name their rank ([`RouteDecision::rank`]).
    #[must_use]
    pub fn with_rank_layout(mut self, layout: RankLayout) -> Self {
        self.layout = layout;
        self
    }

    /// How the router's targets map to endpoints and ranks.
    #[must_use]
    pub fn rank_layout(&self) -> RankLayout {
        self.layout
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The cache index (the mirror of every worker's cache).
    #[must_use]
    pub fn index(&self) -> &CacheIndex {
        &self.index
    }

    /// How the router reads load.
    #[must_use]
    pub fn load_config(&self) -> &LoadConfig {
        self.fleet.config()
    }

    /// The policy's choice among `candidates`, checked.
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Result<usize, Error> {
        let chosen = self.policy.select(request, candidates);
        if chosen < candidates.len() {
            Ok(chosen)
        } else {
            Err(Error::InvalidChoice {
                policy: self.policy.name(),
                index: chosen,
                candidates: candidates.len(),
            })
        }
    }

    /// One choice: the candidates the policy asks for, with the mirror's prediction filled
    /// in when it reads the cache; those admission keeps when the request carries a target;
    /// the policy's choice, checked, and the blocks the deepest holder holds.
    #[inline]
    fn choose(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        candidates: &mut Candidates,
    ) -> Result<(usize, u32), Error> {
        if !request.asks_admission() {
            return self.choose_gated(request, blocks, candidates, &Open);
        }
        let admission = self.admission(request);
        let choice = self.choose_gated(request, blocks, candidates, &admission);
        if let Err(Error::Shed(shed)) = &choice {
            self.fleet.shed(shed);
        }
        choice
    }

    /// [`choose`](Self::choose) with the candidates passed through `gate`.
    #[inline]
    fn choose_gated<G: Gate>(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        candidates: &mut Candidates,
        gate: &G,
    ) -> Result<(usize, u32), Error> {
        if blocks.is_empty() {
            self.fleet.candidates(candidates);
            if candidates.is_empty() {
                return Err(Error::NoWorkers);
            }
            gate.filter(self.fleet.config(), (&self.policy, request), candidates)?;
            return Ok((self.select(request, candidates)?, 0));
        }
        let block_size = self.index.hasher().block_size();
        let tokens = request.tokens().len();
        // Admission reads every worker: a refusal must hold for all of them.
        let shortlist =
            G::SHORTLIST && self.policy.candidates() == CandidateSet::LeastLoadedPerMatch;
        if !shortlist {
            // Every worker: the snapshot is taken before the mirror's lock.
            self.fleet.candidates(candidates);
        }
        self.index.match_choose_insert(blocks, |holders| {
            if shortlist {
                Classes::of(holders).shortlist(&self.fleet, request.key(), candidates);
            } else {
                fill(candidates, holders);
            }
            if candidates.is_empty() {
                return Err(Error::NoWorkers);
            }
            for c in candidates.iter_mut() {
                c.set_cached(block_size, tokens);
            }
            gate.filter(self.fleet.config(), (&self.policy, request), candidates)?;
            let chosen = self.select(request, candidates)?;
            // Holders come shallowest first.
            let deepest = holders.last().map_or(0, |h| h.1.blocks);
            Ok(((chosen, deepest), candidates[chosen].worker))
        })
    }

    /// The admission of a request asking for it.
    #[cold]
    pub(crate) fn admission(&self, request: &RouteRequest<'_>) -> Admission {
        let config = self.fleet.config();
        let priority = request.priority();
        let target_s = |target: Option<std::time::Duration>| {
            target.map_or(f64::INFINITY, |t| {
                config.admission.target_of(priority, t).as_secs_f64()
            })
        };
        Admission {
            priority,
            target_s: target_s(request.ttft_target()),
            tpot_target_s: target_s(request.tpot_target()),
            oversized_share: config.admission.oversized_wait_share,
            prompt: request.tokens().len() as u64,
            output: request
                .expected_output()
                .unwrap_or(config.default_output_tokens),
        }
    }
}

/// Writes what each holder holds, in blocks, into its candidate (candidates are in id
/// order).
fn fill(candidates: &mut [Candidate], holders: &[(WorkerId, Held)]) {
    for &(worker, held) in holders {
        // Usually one candidate per id from 0.
        let slot = match candidates.get(worker.index()) {
            Some(c) if c.worker == worker => Some(worker.index()),
            _ => candidates.binary_search_by_key(&worker, |c| c.worker).ok(),
        };
        if let Some(c) = slot.map(|i| &mut candidates[i]) {
            c.matched_blocks = held.blocks;
            c.cached_by_tier = held.by_tier;
        }
    }
}

/// Workers [`Classes`] holds on the stack.
const CLASSES_INLINE: usize = 256;

/// A class for each worker [`Classes`] holds on the stack: none.
static NO_CLASSES: [u16; CLASSES_INLINE] = [NO_CLASS; CLASSES_INLINE];

/// The holders of a prompt grouped by what they hold: workers holding alike are scored alike
/// under [`CandidateSet::LeastLoadedPerMatch`].
struct Classes {
    /// Class by worker index ([`NO_CLASS`]: holds nothing).
    class_of: SmallVec<[u16; CLASSES_INLINE]>,
    /// What the workers of each class hold.
    held: SmallVec<[Held; 8]>,
}

impl Classes {
    fn of(holders: &[(WorkerId, Held)]) -> Classes {
        let len = holders.iter().map(|h| h.0.index() + 1).max().unwrap_or(0);
        let mut classes = Classes {
            class_of: SmallVec::new(),
            held: SmallVec::new(),
        };
        // One copy from a filled array, where `resize` writes element by element.
        match NO_CLASSES.get(..len) {
            Some(vacant) => classes.class_of.extend_from_slice(vacant),
            None => classes.class_of.resize(len, NO_CLASS),
        }
        for &(worker, held) in holders {
            // Holders come shallowest first, so equal holdings are mostly consecutive.
            let class = match classes.held.iter().rposition(|h| *h == held) {
                Some(c) => c,
                None => {
                    classes.held.push(held);
                    classes.held.len() - 1
                }
            };
            classes.class_of[worker.index()] = u16::try_from(class).unwrap_or(NO_CLASS);
        }
        classes
    }

    /// The least loaded worker of each class and of the workers holding nothing, with what
    /// they hold (in blocks).
    fn shortlist(&self, fleet: &Fleet, salt: u64, out: &mut Candidates) {
        fleet.least_of_each(&self.class_of, self.held.len(), salt, out);
        for c in out.iter_mut() {
            let class = self
                .class_of
                .get(c.worker.index())
                .copied()
                .unwrap_or(NO_CLASS);
            if let Some(held) = self.held.get(usize::from(class)) {
                c.matched_blocks = held.blocks;
                c.cached_by_tier = held.by_tier;
            }
        }
    }
}

impl<P: Policy> PolicyRouter<P> {
    /// Every available worker as a candidate for `request` (its blocks `blocks`, hashed by
    /// [`hash`](Self::hash); its time moves the router's clock, as a route's does) with what
    /// the mirror predicts it holds, passed to `choose`,
    /// which returns its answer and the worker the prompt is recorded for.
    pub(crate) fn with_candidates<T>(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        choose: impl FnOnce(&mut Candidates, u32) -> Result<(T, WorkerId), Error>,
    ) -> Result<T, Error> {
        if let Some(at) = request.time() {
            self.fleet.observe_time(at);
        }
        let mut candidates = Candidates::new();
        self.fleet.candidates(&mut candidates);
        if candidates.is_empty() {
            return Err(Error::NoWorkers);
        }
        let block_size = self.index.hasher().block_size();
        let tokens = request.tokens().len();
        self.index.match_choose_insert(blocks, |holders| {
            fill(&mut candidates, holders);
            for c in candidates.iter_mut() {
                c.set_cached(block_size, tokens);
            }
            let deepest = holders.last().map_or(0, |h| h.1.blocks);
            choose(&mut candidates, deepest)
        })
    }

    /// The blocks of `request`'s prompt, as the mirror hashes them.
    pub(crate) fn hash(&self, request: &RouteRequest<'_>) -> Blocks {
        let mut blocks = Blocks::new();
        self.index.hash_request(request, &mut blocks);
        blocks
    }

    /// Charges `candidate`'s worker with `request` (see [`Fleet::commit`]), with its rank.
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
        deepest: u32,
    ) -> Option<RouteDecision> {
        let decision = self.fleet.commit(candidate, request, deepest)?;
        Some(decision.with_rank(self.layout.rank(candidate.worker)))
    }

    /// Counts a refusal made outside the route path (pair routing's admission).
    pub(crate) fn count_shed(&self, shed: &crate::Shed) {
        self.fleet.shed(shed);
    }

    /// Records that `worker` now holds `blocks`.
    pub(crate) fn credit(&self, worker: WorkerId, blocks: &[crate::BlockHash]) {
        self.index.credit(worker, blocks);
    }

    /// Routes `request`, leaving in `candidates` what the policy chose from.
    fn route_among(
        &self,
        request: &RouteRequest<'_>,
        candidates: &mut Candidates,
    ) -> Result<RouteDecision, Error> {
        if let Some(at) = request.time() {
            self.fleet.observe_time(at);
        }
        let mut blocks = Blocks::new();
        if self.policy.reads_cache() {
            self.index.hash_request(request, &mut blocks);
        }
        // A chosen worker can be removed before it is charged; choose again (bounded).
        for _ in 0..4 {
            let (chosen, deepest) = self.choose(request, &blocks, candidates)?;
            if let Some(decision) = self.fleet.commit(&candidates[chosen], request, deepest) {
                return Ok(decision.with_rank(self.layout.rank(candidates[chosen].worker)));
            }
        }
        Err(Error::NoWorkers)
    }
}

impl<P: Policy> Router for PolicyRouter<P> {
    fn route(&self, request: &RouteRequest<'_>) -> Result<RouteDecision, Error> {
        self.route_among(request, &mut Candidates::new())
    }

    fn route_with_receipt(
        &self,
        request: &RouteRequest<'_>,
    ) -> Result<(RouteDecision, Receipt), Error> {
        let mut candidates = Candidates::new();
        let decision = self.route_among(request, &mut candidates)?;
        let lines = candidates
            .iter()
            .map(|c| ReceiptLine {
                worker: c.worker,
                requests: c.requests(),
                prefill_tokens: c.prefill_tokens(),
                cached_tokens: Tier::ALL.map(|t| c.cached_tokens_at(t)),
                cost: self.policy.cost(request, c),
            })
            .collect();
        let receipt = Receipt {
            policy: self.policy.name(),
            chosen: decision.worker(),
            prompt_tokens: request.tokens().len(),
            candidates: lines,
        };
        Ok((decision, receipt))
    }

    fn complete(&self, decision: &RouteDecision) {
        self.fleet.release(decision);
    }

    fn first_token(&self, decision: &RouteDecision) {
        self.fleet.prefilled(decision, None);
    }

    fn first_token_after(&self, decision: &RouteDecision, elapsed: std::time::Duration) {
        self.fleet.prefilled(decision, Some(elapsed));
    }

    fn set_profile(&self, worker: WorkerId, profile: WorkerProfile) -> Result<(), Error> {
        self.fleet.set_profile(worker, profile)
    }

    fn add_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.fleet.add(worker)?;
        self.index.reset_worker(worker);
        self.policy.worker_added(worker);
        Ok(())
    }

    fn remove_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.fleet.remove(worker)?;
        self.index.reset_worker(worker);
        self.policy.worker_removed(worker);
        Ok(())
    }

    fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        self.fleet.set_available(worker, available)
    }

    fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        self.fleet.report_load(worker, load)
    }

    fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.fleet.load(worker)
    }

    fn fleet_signals(&self) -> FleetSignals {
        let (at, shed) = self.fleet.clock_and_shed();
        let workers = self
            .fleet
            .workers()
            .into_iter()
            .filter_map(|w| Some(WorkerSignals::of(w, &self.fleet.load(w)?)))
            .collect();
        FleetSignals::new(at, workers, shed)
    }

    fn workers(&self) -> Vec<WorkerId> {
        self.fleet.workers()
    }

    fn name(&self) -> &'static str {
        self.policy.name()
    }

    fn block_size(&self) -> Option<usize> {
        self.policy
            .reads_cache()
            .then(|| self.index.hasher().block_size())
    }

    fn cache_sync(&self) -> Option<&dyn CacheSync> {
        self.policy.reads_cache().then_some(self as &dyn CacheSync)
    }
}

/// Checks that the worker is registered, then feeds the mirror.
impl<P: Policy> CacheSync for PolicyRouter<P> {
    fn apply_event(
        &self,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error> {
        self.fleet.check(worker)?;
        self.index.apply_event(worker, seq, event)
    }

    fn replace_worker_cache(&self, worker: WorkerId, prefixes: &[&[TokenId]]) -> Result<(), Error> {
        self.fleet.check(worker)?;
        self.index.replace_worker_cache(worker, prefixes)
    }

    fn report_cached(
        &self,
        worker: WorkerId,
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        self.report_cached_salted(worker, &[], tokens, cached_tokens)
    }

    fn report_cached_salted(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        self.fleet.check(worker)?;
        let (predicted, reported) = self.index.report(worker, salt, tokens, cached_tokens)?;
        self.fleet.reported(worker, predicted, reported);
        Ok(())
    }
}
