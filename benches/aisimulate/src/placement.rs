//! The crate's routers as a placement policy of NVIDIA's replay (`aisimulate-core`).
//!
//! The policy sees what a gateway in front of the engines sees, and nothing else:
//!
//! - each request's prompt tokens, its `max_tokens` and its session header (authored
//!   session IDs only: the replay withholds the IDs its loader synthesised);
//! - the engines' KV events (`Stored` with the blocks' token IDs, as vLLM publishes them,
//!   and `Removed`), applied to the router's mirror through [`CacheSync::apply_event`];
//! - a request's first token (the replay's prefill completion), as
//!   [`Router::first_token_after`] with the time since it was forwarded;
//! - its end (the replay's termination): the output tokens it streamed, as
//!   [`Router::tokens_after`], then [`Router::complete`].
//!
//! No engine queue, batch or KV usage reaches it: the router's load is what it routed and
//! has not yet heard finish, as in a gateway with no load reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aisimulate_core::engine::{KvEvent, KvEventData, KvEventTier};
use aisimulate_core::replay::loadgen::ReplayRequestPayload;
use aisimulate_core::replay::{
    EngineEventBatch, NoReplayMetadata, Placement, PlacementDecision, PlacementEffects,
    PlacementPolicy, ReplayComposition, ReplayEngineObservation, RequestIdentity, WorkerStage,
    WorkerTopology,
};
use anyhow::{Context, Result, anyhow, bail};
use prefix_router::{CacheEvent, RouteDecision, RouteRequest, Router, WorkerId};
use uuid::Uuid;

/// The engines' KV events of one pass, with the logical worker that published each.
#[derive(Debug, Default)]
pub struct GatewayEvents(Vec<(usize, KvEvent)>);

impl EngineEventBatch for GatewayEvents {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn append(&mut self, mut other: Self) {
        self.0.append(&mut other.0);
    }
}

/// Asks the engines for their KV events, each with the logical worker that published it
/// (the replay turns the engines' event publishing on for it; `replay::run_crate` has them
/// put the blocks' token IDs in the events).
#[derive(Debug, Default)]
pub struct GatewayObservation;

impl ReplayEngineObservation for GatewayObservation {
    type Batch = GatewayEvents;

    const CAPTURE_ENGINE_KV_EVENTS: bool = true;

    fn observe_engine_events(
        _stage: WorkerStage,
        worker_id: usize,
        _dp_rank: u32,
        events: Vec<KvEvent>,
    ) -> Self::Batch {
        GatewayEvents(events.into_iter().map(|e| (worker_id, e)).collect())
    }
}

/// Counts of what the mirror did with the engines' events, and what the router ended the
/// replay believing of each worker, for the report's footnotes.
#[derive(Clone, Debug, Default)]
pub struct SyncCounts {
    /// Per router worker at the end: requests routed there, and the speed the router learned
    /// for it from the timings (1: the configured speed).
    pub workers: Vec<(u64, f64)>,
    /// Events applied.
    pub events: u64,
    /// Blocks stored in the mirror.
    pub stored_blocks: u64,
    /// Blocks removed from the mirror.
    pub removed_blocks: u64,
    /// Blocks skipped because their parent was unknown to the mirror.
    pub unknown_parent_blocks: u64,
    /// Events the mirror refused (an error), or events at a tier other than the device.
    pub refused: u64,
}

/// One request in flight: what the router decided and when.
struct Flight {
    decision: RouteDecision,
    forwarded_ms: f64,
    first_token_ms: Option<f64>,
    output_tokens: u32,
}

/// The composition handing the replay a [`CratePlacement`] around `router`.
pub struct CrateComposition {
    router: Option<Arc<dyn Router>>,
    counts: Arc<std::sync::Mutex<SyncCounts>>,
}

impl CrateComposition {
    /// A composition placing with `router` (built for the fleet's worker count); its mirror's
    /// event counts land in `counts` when the replay drops the placement.
    pub fn new(router: Arc<dyn Router>, counts: Arc<std::sync::Mutex<SyncCounts>>) -> Self {
        Self {
            router: Some(router),
            counts,
        }
    }
}

impl ReplayComposition for CrateComposition {
    type Metadata = NoReplayMetadata;
    type Observation = GatewayObservation;
    type AggregatedPlacement = CratePlacement;
    type DisaggregatedPlacement = CratePlacement;

    fn create_aggregated_placement(
        &mut self,
        dp_size: u32,
        topology: Vec<WorkerTopology>,
    ) -> Result<Self::AggregatedPlacement> {
        if dp_size != 1 {
            bail!("the crate's routers are placed over attention-DP 1 workers, got {dp_size}");
        }
        let router = self
            .router
            .take()
            .context("the composition places one replay only")?;
        CratePlacement::new(router, topology, Arc::clone(&self.counts))
    }

    fn create_disaggregated_placements(
        &mut self,
        _prefill_dp_size: u32,
        _prefill_topology: Vec<WorkerTopology>,
        _decode_dp_size: u32,
        _decode_topology: Vec<WorkerTopology>,
    ) -> Result<(Self::DisaggregatedPlacement, Self::DisaggregatedPlacement)> {
        bail!("the harness runs aggregated workers only")
    }
}

/// A crate router placing the replay's requests (see the module's documentation).
pub struct CratePlacement {
    router: Arc<dyn Router>,
    /// Logical worker id → the router's worker and the replay's scheduler.
    workers: BTreeMap<usize, (WorkerId, usize)>,
    flights: HashMap<Uuid, Flight>,
    /// The next event sequence number of each router worker.
    seqs: Vec<u64>,
    counts: SyncCounts,
    sink: Arc<std::sync::Mutex<SyncCounts>>,
}

impl CratePlacement {
    fn new(
        router: Arc<dyn Router>,
        topology: Vec<WorkerTopology>,
        sink: Arc<std::sync::Mutex<SyncCounts>>,
    ) -> Result<Self> {
        let mut placement = Self {
            router,
            workers: BTreeMap::new(),
            flights: HashMap::new(),
            seqs: Vec::new(),
            counts: SyncCounts::default(),
            sink,
        };
        for worker in topology {
            placement.add(&worker)?;
        }
        Ok(placement)
    }

    /// Registers `worker` as the next router worker (the router was built with as many
    /// workers as the fleet starts with; later ones are added).
    fn add(&mut self, worker: &WorkerTopology) -> Result<()> {
        if self.workers.contains_key(&worker.worker_id) {
            return Ok(());
        }
        let scheduler = *worker
            .scheduler_ids
            .first()
            .ok_or_else(|| anyhow!("worker {} has no scheduler", worker.worker_id))?;
        let id = WorkerId::new(u32::try_from(self.workers.len())?);
        if !self.router.workers().contains(&id) {
            self.router.add_worker(id)?;
        }
        self.router.set_available(id, true)?;
        self.workers.insert(worker.worker_id, (id, scheduler));
        if self.seqs.len() <= id.index() {
            self.seqs.resize(id.index() + 1, 0);
        }
        Ok(())
    }

    fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        let Some(sync) = self.router.cache_sync() else {
            return;
        };
        if event.tier != KvEventTier::Device {
            self.counts.refused += 1;
            return;
        }
        let cache_event = match &event.data {
            KvEventData::Stored(stored) => {
                let mut tokens = Vec::new();
                for block in &stored.blocks {
                    match &block.token_ids {
                        Some(ids) => tokens.extend_from_slice(ids),
                        None => {
                            self.counts.refused += 1;
                            return;
                        }
                    }
                }
                CacheEvent::stored(
                    stored.parent_hash,
                    stored.blocks.iter().map(|b| b.block_hash).collect(),
                    tokens,
                )
            }
            KvEventData::Removed { block_hashes } => CacheEvent::removed(block_hashes.clone()),
        };
        let seq = &mut self.seqs[worker.index()];
        *seq += 1;
        match sync.apply_event(worker, *seq, &cache_event) {
            Ok(outcome) => {
                self.counts.events += 1;
                self.counts.stored_blocks += outcome.stored_blocks as u64;
                self.counts.removed_blocks += outcome.removed_blocks as u64;
                self.counts.unknown_parent_blocks += outcome.unknown_parent_blocks as u64;
            }
            Err(_) => self.counts.refused += 1,
        }
    }
}

impl Drop for CratePlacement {
    fn drop(&mut self) {
        let mut counts = std::mem::take(&mut self.counts);
        counts.workers = self
            .workers
            .values()
            .map(|&(id, _)| {
                self.router
                    .load(id)
                    .map_or((0, f64::NAN), |load| (load.routed, load.speed))
            })
            .collect();
        if let Ok(mut sink) = self.sink.lock() {
            *sink = counts;
        }
    }
}

fn host_time(ms: f64) -> Duration {
    Duration::from_secs_f64((ms / 1_000.0).max(0.0))
}

impl PlacementPolicy<ReplayRequestPayload> for CratePlacement {
    type Metadata = NoReplayMetadata;
    type Observation = GatewayEvents;

    fn place(
        &mut self,
        request: &ReplayRequestPayload,
        _metadata: Self::Metadata,
        session_id: Option<String>,
        now_ms: f64,
    ) -> Result<PlacementEffects> {
        let request_id = request
            .request_id()
            .context("the replay gives every request a UUID")?;
        let tokens = request.prompt_tokens();
        let output = u32::try_from(request.metadata().max_output_tokens).unwrap_or(u32::MAX);
        let mut route = RouteRequest::new(&tokens)
            .with_time(host_time(now_ms))
            .with_expected_output(output);
        if let Some(session) = session_id.as_deref() {
            route = route.with_session(session);
        }
        let decision = self.router.route(&route)?;
        let worker = decision.worker();
        let scheduler = self
            .workers
            .values()
            .find(|(id, _)| *id == worker)
            .map(|&(_, scheduler)| scheduler)
            .ok_or_else(|| anyhow!("the router chose {worker:?}, not in the fleet"))?;
        let placement = Placement {
            request_id,
            scheduler_id: scheduler,
            reported_overlap_tokens: decision.cached_tokens(),
            cache_sample: None,
            placement_replica_id: None,
        };
        self.flights.insert(
            request_id,
            Flight {
                decision,
                forwarded_ms: now_ms,
                first_token_ms: None,
                output_tokens: output,
            },
        );
        Ok(PlacementEffects {
            decision: PlacementDecision::Immediate(placement),
            released: Vec::new(),
        })
    }

    fn observe(&mut self, observation: GatewayEvents, _now_ms: f64) -> Result<Vec<Placement>> {
        for (logical, event) in &observation.0 {
            if let Some(&(worker, _)) = self.workers.get(logical) {
                self.apply(worker, event);
            }
        }
        Ok(Vec::new())
    }

    fn cancel_pending(&mut self, _request_id: Uuid) -> bool {
        false
    }

    fn request_terminal(&mut self, request_id: Uuid, now_ms: f64) -> Result<Vec<Placement>> {
        if let Some(flight) = self.flights.remove(&request_id) {
            if let Some(first) = flight.first_token_ms {
                let after_first = flight.output_tokens.saturating_sub(1);
                self.router
                    .tokens_after(&flight.decision, after_first, host_time(now_ms - first));
            }
            self.router.complete(&flight.decision);
        }
        Ok(Vec::new())
    }

    fn prefill_completed(&mut self, request_id: Uuid, now_ms: f64) -> Result<Vec<Placement>> {
        if let Some(flight) = self.flights.get_mut(&request_id)
            && flight.first_token_ms.is_none()
        {
            flight.first_token_ms = Some(now_ms);
            self.router
                .first_token_after(&flight.decision, host_time(now_ms - flight.forwarded_ms));
        }
        Ok(Vec::new())
    }

    fn pending_count(&self) -> usize {
        0
    }

    fn worker_ready(&mut self, worker: WorkerTopology, _now_ms: f64) -> Result<Vec<Placement>> {
        self.add(&worker)?;
        Ok(Vec::new())
    }

    fn worker_draining(&mut self, worker: WorkerTopology, _now_ms: f64) -> Result<Vec<Placement>> {
        if let Some(&(id, _)) = self.workers.get(&worker.worker_id) {
            self.router.set_available(id, false)?;
        }
        Ok(Vec::new())
    }

    fn worker_removed(&mut self, worker: WorkerTopology, now_ms: f64) -> Result<Vec<Placement>> {
        self.worker_draining(worker, now_ms)
    }

    fn topology_settled(&mut self, _now_ms: f64) -> Result<Vec<Placement>> {
        Ok(Vec::new())
    }
}
