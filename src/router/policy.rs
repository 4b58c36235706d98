//! The policy seam: a [`Policy`] chooses one worker among [`Candidate`]s, and may bring its
//! own admission rule ([`Admit`]); [`CandidateSet`] says which workers it is offered, and
//! [`choose_min`] breaks ties as every built-in policy does.

use crate::fleet::{Candidate, pick_min};
use crate::request::{Limit, RouteRequest};
use crate::router::Cost;
use crate::tree::WorkerId;

/// A routing policy: how one worker is chosen among the available ones. Everything else a
/// [`Router`](crate::Router) does ([`PolicyRouter`](crate::PolicyRouter) does it) is the same for every policy, so a policy of a
/// dozen lines gets load tracking, the cache mirror, event sync, the simulator and the
/// benches.
///
/// # Contract
///
/// - [`select`](Self::select) gets the available workers in id order (never empty), with
///   their load snapshot and, when [`reads_cache`](Self::reads_cache) is true, how much of
///   the prompt each holds. It returns an index into `candidates`; an index out of range
///   makes [`Router::route`](crate::Router::route) fail with [`Error::InvalidChoice`](crate::Error::InvalidChoice).
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
    /// [`Router::route_with_receipt`](crate::Router::route_with_receipt). The default: `None` (the policy does not explain).
    fn cost(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> Option<Cost> {
        let _ = (request, candidate);
        None
    }

    /// The policy's cost of each of `candidates` for `request`, in order, for
    /// [`Router::route_with_receipt`](crate::Router::route_with_receipt): for a policy whose
    /// cost of one candidate reads the others (a load relative to the busiest), the cost
    /// [`select`](Self::select) ranked them by. The default: [`cost`](Self::cost) of each.
    fn costs(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Vec<Option<Cost>> {
        candidates.iter().map(|c| self.cost(request, c)).collect()
    }

    /// What `candidate` costs `request` beyond its load ([`Candidate::load_ns`]), in whole
    /// nanoseconds, for a policy that chooses the least cost. With an answer,
    /// [`CandidateSet::LeastLoadedPerMatch`] offers every worker that could cost least, and
    /// the choice is the one [`select`](Self::select) would make among every worker. The
    /// default: `None` (the shortlist is each class's least loaded worker).
    ///
    /// # Contract
    ///
    /// A policy answering `Some` for a request answers it for every candidate, and:
    ///
    /// - its [`select`](Self::select) chooses the candidate of least `load_ns()` plus this,
    ///   equal ones going to the one handed the least prefill work
    ///   ([`Candidate::assigned_prefill_tokens`]), then as [`choose_min`] breaks ties; the
    ///   router may choose so itself, without calling `select`;
    /// - the answer depends on the request, what the candidate holds and its load figures
    ///   (requests, decodes, queued prefill, context, KV, speed, step terms), not on its id,
    ///   load, or counts of requests routed and prefill handed out; and it is least for an
    ///   idle worker with the fleet's least step terms and greatest speed holding the same:
    ///   [`Candidate::predicted_beyond_load_s`] is, and so is a reload time
    ///   ([`ReloadConfig::candidate_seconds`](crate::ReloadConfig::candidate_seconds)) over
    ///   [`Candidate::speed`]. [`BalancedRouter`](crate::BalancedRouter)'s predicted time is
    ///   their sum.
    fn cost_above_load_ns(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> Option<u64> {
        let _ = (request, candidate);
        None
    }

    /// The policy's own admission rule for `request`, which asks for admission (it carries
    /// a target, [`RouteRequest::asks_admission`]), over `candidates`: every available
    /// worker, or first, for a policy offered [`CandidateSet::LeastLoadedPerMatch`] whose
    /// [`cost_above_load_ns`](Self::cost_above_load_ns) answers, the workers the route
    /// scored (its shortlist, widened). There an answer of [`Admit::All`], or
    /// [`Admit::Predicted`] with the policy's choice predicted to meet the targets, stands
    /// without reading the other workers; any other answer is asked again over every
    /// available worker, so a refusal always holds for all of them. The default:
    /// [`Admit::Predicted`], the crate's rule. A policy that answers otherwise owns its
    /// refusals: [`Priority::Critical`](crate::Priority::Critical) requests are never
    /// refused only under the crate's rule.
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
    /// lowest load ([`Candidate::load_ns`]), then least prefill handed out, then fewest
    /// requests routed, then a per-request rotation (the rule [`choose_min`] breaks ties
    /// by); and, for a policy whose [`Policy::cost_above_load_ns`] answers, every other
    /// worker whose load leaves it able to cost less than the cheapest of those: its load
    /// plus what an idle worker with the fleet's least step terms would cost beyond it. The
    /// policy then chooses what it would among every worker, and a route reads every
    /// worker's load once and scores a handful: it costs about as much on 1,024 workers as
    /// on 16 while one worker's load stands out of its class's; a class of workers loaded
    /// alike but for their decodes or speeds is scored whole. A route asking for admission
    /// checks that choice alone, and reads every worker only when the choice is refused.
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
    pick_min(candidates, request.key(), |_, c| key(c)).unwrap_or(0)
}

/// A [`Policy`]'s own admission rule's verdict on a request asking for admission
/// ([`Policy::admit`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Admit {
    /// The crate's rule: the request goes to a worker predicted to meet its target, and is
    /// refused when none is (unless it is [`Priority::Critical`](crate::Priority::Critical)). The default.
    #[default]
    Predicted,
    /// The request is admitted, and the policy chooses among every candidate.
    All,
    /// The request is refused ([`Error::Shed`](crate::Error::Shed)), bound by this limit. The refusal reports
    /// the load model's best prediction all the same, so that hosts see one shape of
    /// refusal whichever rule made it.
    Refuse(Limit),
}
