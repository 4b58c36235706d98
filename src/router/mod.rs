//! Routing: the [`Router`] trait a gateway holds, the policy seam ([`Policy`], `policy.rs`)
//! with its admission gate (`admission.rs`), and [`PolicyRouter`], which makes a router of
//! any policy (`policy_router.rs`, its route path in `route.rs` and `shortlist.rs`, its trait
//! implementations in `impls.rs`); receipts explain a route (`receipt.rs`); replica sync
//! records routes and applies peers' frames (`replica.rs`).
//!
//! Rule: the router reads the fleet model (`crate::fleet`), the mirror (`crate::index`) and
//! the request vocabulary (`crate::request`); none of them reads it. The built-in policies
//! (`crate::policies`) and the pair router (`crate::pd`) sit above it.

use std::time::Duration;

use crate::error::Error;
use crate::fleet::{EngineLoad, FleetSignals, WorkerLoad, WorkerProfile, WorkerSignals};
use crate::replica::{Drained, ReplicaOutcome, ReplicaStats};
use crate::request::{RouteDecision, RouteRequest};
use crate::tree::WorkerId;

mod admission;
mod impls;
mod observed_gates;
mod policy;
mod policy_router;
mod receipt;
mod replica;
mod route;
mod shortlist;

pub use self::policy::{Admit, CandidateSet, Policy, choose_min};
pub use self::policy_router::PolicyRouter;
pub use self::receipt::{Cost, CostTerm, Receipt, ReceiptLine};

pub(crate) use self::admission::Admission;

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
    /// to its first token as the host measured it: the router learns the worker's step terms
    /// from it (see [`LoadConfig::learning_rate`](crate::LoadConfig::learning_rate)). The
    /// default calls `first_token`.
    fn first_token_after(&self, decision: &RouteDecision, elapsed: std::time::Duration) {
        let _ = elapsed;
        self.first_token(decision);
    }

    /// The request of `decision` has generated `tokens` output tokens after its first, in
    /// `elapsed` from the first token to the last of them, as a host streaming its answer
    /// measures it. Both are cumulative: report as the stream goes, at any cadence (every 16
    /// tokens is a good default), and at its end. The router learns the worker's decode
    /// terms from the first report: the terms the policies price with, its time per output
    /// token against [`RouteDecision::predicted_tpot_s`]'s count at routing; the forecast
    /// terms admission predicts with, against the decode step and the prefill that shared
    /// it (the uncached prompts whose first token came after the request's own, at most what
    /// the worker prefills in that time). Admission's decode bound learns the worker's
    /// observed step from what each report adds to the furthest before it while the
    /// request runs. A report that does not go further than one before it (repeated, reordered), or
    /// that comes after [`complete`](Self::complete), or for a worker since removed, changes
    /// nothing; a request that generated one token teaches nothing. The default does
    /// nothing.
    fn tokens_after(&self, decision: &RouteDecision, tokens: u32, elapsed: std::time::Duration) {
        let _ = (decision, tokens, elapsed);
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
    fn cache_sync(&self) -> Option<&dyn crate::sync::CacheSync> {
        None
    }

    /// Replica sync, sending: replaces `out` with one frame (see
    /// [`replica`](crate::replica)) of the records of what this router routed, prefilled
    /// and completed since the last drain, oldest first, as many as fit in `max_bytes`
    /// (at least one; NATS's default limit is 1 MiB). Publish it to the peers; with no
    /// records it is a heartbeat, worth publishing at least every third of the
    /// [lease](crate::ReplicaConfig::lease). The default (a router without sync) leaves
    /// `out` empty and drains nothing.
    fn drain_replica_sync(&self, out: &mut Vec<u8>, max_bytes: usize) -> Drained {
        let _ = max_bytes;
        out.clear();
        Drained::default()
    }

    /// Replica sync, receiving: applies a peer's `frame`, heard at `now` (the clock
    /// requests' [`with_time`](RouteRequest::with_time) uses). Its routed prompts are
    /// predicted cached on their workers until the engines' events say otherwise, and its
    /// requests count in their workers' load until it says they completed or its lease
    /// runs out. Applying is idempotent: duplicates, reordered records and this router's
    /// own frames (echoes) change nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Decode`] for bytes that are not one whole frame; [`Error::ReplicaVersion`]
    /// for another layout version; [`Error::ReplicaLimit`] for a peer beyond
    /// [`ReplicaConfig::max_peers`](crate::ReplicaConfig::max_peers); nothing of the frame
    /// is applied then. [`Error::InvalidConfig`] (`replica_sync`) from a router without
    /// sync (the default).
    fn apply_replica_sync(&self, frame: &[u8], now: Duration) -> Result<ReplicaOutcome, Error> {
        let _ = (frame, now);
        Err(crate::config::invalid(
            "replica_sync",
            "off",
            "a router built with replica sync",
        ))
    }

    /// What replica sync did so far; `None` without sync (the default).
    fn replica_sync_stats(&self) -> Option<ReplicaStats> {
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
