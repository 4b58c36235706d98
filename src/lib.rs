//! # prefix-router
//!
//! Cache-aware request routing for LLM serving. A gateway in front of N inference workers
//! asks which worker most likely already holds the KV cache for the longest prefix of a
//! prompt, while keeping load balanced.
//!
//! Data flows one way through the crate:
//!
//! ```text
//!  token IDs ──► hash ──► BlockHash chain ──► tree (mirror of worker caches) ──► router
//! ```
//!
//! ## Hashing prompts: [`PrefixHasher`]
//!
//! Engines cache KV in fixed-size blocks of tokens, and only full blocks. A
//! [`PrefixHasher`] cuts a prompt into blocks and gives each full block a [`BlockHash`] that
//! covers the block **and everything before it**, so equal hashes mean equal prefixes.
//!
//! ```
//! use prefix_router::PrefixHasher;
//!
//! let hasher = PrefixHasher::new(16)?;
//! let a: Vec<u32> = (0..48).collect();
//! let mut b = a.clone();
//! b[40] = 151_000; // differs in the third block
//! let (ha, hb) = (hasher.hash(&a), hasher.hash(&b));
//! assert_eq!(ha[..2], hb[..2]);
//! assert_ne!(ha[2], hb[2]);
//! # Ok::<(), prefix_router::Error>(())
//! ```
//!
//! ## Mirroring worker caches: [`RadixTree`]
//!
//! One tree holds every worker's cached prefixes (as block hashes); one walk tells how many
//! leading blocks of a prompt **each** worker holds. Per-worker capacity evicts least
//! recently used blocks, deepest first; [`TreeConfig`] bounds the whole tree.
//!
//! ```
//! use prefix_router::{PrefixHasher, RadixTree, WorkerId};
//!
//! let hasher = PrefixHasher::new(16)?;
//! let doc: Vec<u32> = (0..320).collect();
//! let mut tree = RadixTree::new();
//! tree.insert(WorkerId::new(2), &hasher.hash(&doc));
//! let m = tree.match_prefix(&hasher.hash(&doc[..200]));
//! assert_eq!(m.best(), Some((WorkerId::new(2), 12))); // 200 tokens = 12 full blocks
//! # Ok::<(), prefix_router::Error>(())
//! ```
//!
//! ## Routing: [`Router`]
//!
//! A gateway calls [`Router::route`] on a request's tokens and gets a [`RouteDecision`];
//! [`Router::first_token_after`] and [`Router::complete`] release its load, and engines'
//! load reports ([`EngineLoad`], [`Router::report_load`]) tell it what other routers sent.
//! The recommended policy is [`BalancedRouter`] (predicted time to first token and decode,
//! weighing recomputation against queueing, running batches and KV); the README's simulator
//! results compare every policy on real traces.
//!
//! ```
//! use prefix_router::{BalancedRouter, RouteRequest, Router};
//!
//! let router = BalancedRouter::new(8)?;
//! let prompt: Vec<u32> = (0..1_000).collect();
//! let now = std::time::Duration::from_secs(12); // the host's clock
//! let request = RouteRequest::new(&prompt).with_session("chat-7").with_time(now);
//! let decision = router.route(&request)?;
//! // ... forward the request to decision.worker(); its first token comes 80 ms later ...
//! router.first_token_after(&decision, std::time::Duration::from_millis(80));
//! router.complete(&decision);
//! # Ok::<(), prefix_router::Error>(())
//! ```
//!
//! ## Writing a policy: [`Policy`]
//!
//! Every router is a [`PolicyRouter`]: load tracking, the mirror and sync written once,
//! around a [`Policy`] that only chooses among [`Candidate`]s. A new scoring idea is a
//! policy of a dozen lines, and runs in the simulator and the benches like the built-in ones
//! (see [`Policy`] for its contract, and `examples/custom_policy.rs`).
//!
//! ## Several replicas: [`replica`]
//!
//! Router replicas that share a fleet exchange sync records of what each routed
//! ([`Router::drain_replica_sync`], [`Router::apply_replica_sync`]), carried by the host
//! over a bus such as NATS: see `docs/replicas.md`.
//!
//! ## Keeping the mirror true: [`CacheSync`]
//!
//! Engine KV events ([`CacheEvent`], and vLLM's wire format in [`sync::vllm`] with the `vllm`
//! feature), snapshots, and miss feedback; see the [`sync`] module.
//!
//! ## Comparing policies: [`sim`]
//!
//! Replays workloads or Mooncake traces through any router against modelled workers with
//! true caches and prefill queues: `cargo run --release --example simulate`.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use prefix_router::sim::{ClusterConfig, Simulation, Workload};
//! use prefix_router::{BalancedRouter, RoundRobinRouter};
//!
//! let (_, workload) = &Workload::builtin()[1]; // multi-turn conversations
//! let config = ClusterConfig::default().with_measure_decision_time(false);
//! let sim = Simulation::new(workload.generate(1), config)?;
//! let balanced = sim.run(&BalancedRouter::new(8)?)?;
//! let round_robin = sim.run(&RoundRobinRouter::new(8)?)?;
//! assert!(balanced.hit_ratio > 2.0 * round_robin.hit_ratio);
//! # }
//! # Ok::<(), prefix_router::Error>(())
//! ```
//!
//! ## Bad input
//!
//! Bad input never panics: it is an [`Error`] with a message that says what was wrong and
//! what is allowed, or a documented no-op. Each row has a test in `tests/bad_input.rs`.
//!
//! | entry point | bad input | result |
//! |---|---|---|
//! | `PrefixHasher::new`, `with_algorithm`, `IndexConfig::block_size` | block size 0 or above [`PrefixHasher::MAX_BLOCK_SIZE`] | [`Error::InvalidBlockSize`] |
//! | `PrefixHasher::hash*`, `Router::route` | empty, sub-block or 1M-token prompt | no hashes / 0 cached tokens; a 1M-token prompt is hashed and mirrored whole |
//! | `PrefixHasher::extend_chain` | a chain longer than the prompt | nothing appended |
//! | `RadixTree::insert`, `touch`, `set_capacity` | worker id ≥ [`RadixTree::MAX_WORKERS`], empty blocks | no-op |
//! | `RadixTree::remove`, `truncate`, `remove_worker` | unknown worker, blocks not held | no-op |
//! | `RadixTree` (through any router) | more distinct prompts than [`TreeConfig`] allows | least recently used leaves evicted: memory stays bounded |
//! | `X::new`, `X::with_config` (every router) | more than 4,096 workers | [`Error::WorkerOutOfRange`] |
//! | every `*Config` (its `validate()`, called by every constructor) | NaN, infinite or out-of-range values; a tree bound of 0 | [`Error::InvalidConfig`] naming the field and the allowed range |
//! | `Router::route` | no worker registered or available | [`Error::NoWorkers`] |
//! | `Router::route` on a [`PolicyRouter`] | its policy chooses an index outside the candidates | [`Error::InvalidChoice`]; nothing charged |
//! | `Router::complete`, `first_token` | twice, or after the worker was removed (and re-added) | no-op |
//! | `Router::add_worker` | a registered id; an id ≥ 4,096 | [`Error::WorkerExists`]; [`Error::WorkerOutOfRange`] |
//! | `Router::remove_worker`, `set_available`, `report_load`, `set_profile` | unknown worker | [`Error::UnknownWorker`] |
//! | `Router::report_load` | KV usage NaN or outside `0..=1` | [`Error::InvalidConfig`] |
//! | `Router::set_profile` | speed not positive and finite | [`Error::InvalidConfig`] |
//! | `CacheSync::*` on a router; on a `CacheIndex` | unknown worker; id ≥ 4,096 | [`Error::UnknownWorker`]; [`Error::WorkerOutOfRange`] |
//! | `CacheSync::apply_event` | tokens per block coarser than the router's, or finer and not dividing it; ragged tokens | [`Error::BlockSizeMismatch`] naming both; [`Error::InvalidEvent`] |
//! | `CacheSync::apply_event` | a group at or beyond [`IndexConfig::max_groups`]; a placeholder naming an unknown block | skipped and counted in [`SyncOutcome`] |
//! | `Tier::from_medium` | a medium it does not know | [`Tier::Remote`], the least credited tier |
//! | `RankLayout::target`, `sync::vllm::apply_batch` | a rank at or beyond the layout's | [`Error::InvalidRank`] |
//! | `CacheSync::apply_event` | duplicate, gapped or backwards sequence numbers | applied, reported as duplicates / [`Sequence::Gap`] / [`Sequence::Restart`] (mirror cleared) |
//! | `CacheSync::apply_event` | unknown parent; removal of an unknown block | skipped and counted in [`SyncOutcome`] |
//! | `sync::vllm::decode_batch` | truncated, wrong types, huge lengths, unknown tags, trailing bytes | [`Error::Decode`] |
//! | `Router::apply_replica_sync` | truncated or garbage bytes; another layout version; a peer beyond `ReplicaConfig::max_peers` | [`Error::Decode`]; [`Error::ReplicaVersion`]; [`Error::ReplicaLimit`]; nothing applied |
//! | `Router::apply_replica_sync` | a record naming an unknown target; duplicated, reordered or echoed records; an earlier incarnation's frame | skipped and counted in [`ReplicaOutcome`] |
//! | `Router::apply_replica_sync` on a router without sync | any frame | [`Error::InvalidConfig`] (`replica_sync`) |
//! | `sim::load_mooncake`, `parse_mooncake` | a malformed line; an unreadable file | [`Error::Trace`] with the line number (0 for the file) |
//! | `sim::Simulation::new`, `with_fleet`, `run` | 0 workers, NaN rates, capacity below one block, a batch budget of 0, event sync with the simple engine, a worker speed that is not positive; a router whose mirror hashes another block size; a router with more workers than the fleet | [`Error::InvalidConfig`]; [`Error::InvalidConfig`]; [`Error::UnknownWorker`] |
//! | `sim::ClusterConfig` (through `Simulation::new`) | event loss outside `0..=1`, a negative or non-finite event delay or scrape interval; a host tier smaller than one chunk, a chunk of 0 blocks, a reload bandwidth that is not positive; a replica sync delay that is negative or not finite, or replica sync with the simple engine | [`Error::InvalidConfig`] |
//! | `sim::Simulation::run_replicas` | no router | [`Error::InvalidConfig`] (`replicas`) |
//! | `sim::Fault::parse_schedule`, `Simulation::with_faults` | an entry that is not `W@DOWN-UP`; a worker outside the fleet, a return not after the leave, faults with the simple engine | [`Error::InvalidConfig`] (`faults`) |
//! | `sim::Simulation::run` with faults | every worker out at once when a request arrives | [`Error::NoWorkers`] |
//! | `sim::WorkerSpec::parse_fleet` | a group that is not `COUNTx[P\|D][SPEED][@CAPACITY]`, a count of 0, a speed that is not positive | [`Error::InvalidConfig`] naming the group |
//! | `sim::Simulation::run`, `run_replicas` | a fleet with prefill-only or decode-only workers | [`Error::InvalidConfig`] (`role`) |
//! | `sim::Simulation::run_pd` | the simple engine, faults, admission, a router whose roles or block size are not the fleet's | [`Error::InvalidConfig`] |
//! | `PdRouter::new`, `with_decider` | no worker that decodes; a stall weight, KV size or bandwidth out of range | [`Error::InvalidConfig`] |
//! | `PdRouter::route_pair` | a decider's plan with a prefill-only decode worker, a decode-only prefill worker, or one worker on both sides; an index outside the candidates; a target no plan is predicted to meet | [`Error::WrongRole`]; [`Error::InvalidChoice`]; [`Error::Shed`]; nothing charged |
//! | `Topology::place`, `with_level` | a level not added; a bandwidth that is not positive, a level named twice | [`Error::InvalidConfig`] |
//!
//! ## Hash flooding
//!
//! An attacker who knows the hash algorithm and seed can craft prompts whose blocks collide,
//! to steer traffic onto a worker or to degrade the mirror's maps. The defences: a secret
//! per-deployment seed ([`PrefixHasher::with_seed`], [`IndexConfig::seed`]; every router
//! replica sharing a mirror uses the same one), and [`HashAlgorithm::Sha256`] where tenants
//! may be hostile (a second preimage costs about 2^64 work; hashes are 64 bits, so finding
//! *some* pair of colliding prompts costs about 2^32). Internal maps use a fixed, seedless
//! hasher over values that are already hashes, so their behaviour is deterministic; with a
//! secret seed an attacker cannot aim at their buckets.
//!
//! ## Crate features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sim` | yes | [`sim`]: workloads, Mooncake traces, the simulated cluster (adds `serde_json` to read traces) |
//! | `vllm` | no | [`sync::vllm::decode_batch`](crate::sync): decoding of vLLM's msgpack KV-event batches (adds `rmpv`) |
//! | `zmq` | no | nothing in the library: lets `examples/vllm_events` subscribe to vLLM's ZMQ PUB sockets (adds `zeromq`, pure Rust, with `vllm`) |
//!
//! Without features the crate depends only on `sha2`, `xxhash-rust`, `smallvec`,
//! `hashbrown` and `thiserror`: no async runtime, no I/O, no global state.

/// The README's code examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guides' code examples run as doctests, so a guide cannot drift from the crate.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../docs/mirror-and-sync.md")]
    struct MirrorAndSync;
    #[doc = include_str!("../docs/admission.md")]
    struct Admission;
    #[doc = include_str!("../docs/disaggregation.md")]
    struct Disaggregation;
    #[doc = include_str!("../docs/simulator.md")]
    struct Simulator;
    #[doc = include_str!("../docs/gateway.md")]
    struct Gateway;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/replicas.md")]
    struct Replicas;
}

mod bits;
mod chunks;
mod config;
mod error;
mod fleet;
mod fold;
mod hash;
mod index;
mod list;
mod pd;
mod policies;
mod ranks;
pub mod replica;
mod request;
mod router;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sync;
mod tree;

pub use crate::{
    error::Error,
    fleet::{
        Candidate, EngineLoad, FleetRates, FleetSignals, LoadConfig, ObservedLoad, ReloadConfig,
        Staleness, StepModel, WorkerLoad, WorkerProfile, WorkerSignals,
    },
    hash::{BlockHash, BlockKey, HashAlgorithm, PrefixHasher, TokenId, namespace_salt},
    index::{CacheIndex, DEFAULT_BLOCK_SIZE, IndexConfig},
    pd::{
        AlwaysSplit, ByCost, Decide, NeverSplit, PairDecision, PairReceipt, PairView, PdConfig,
        PdRouter, Plan, PlanCost, PlanLine, Role, Topology,
    },
    policies::{
        Affinity, AffinityConfig, AffinityRouter, Balanced, BalancedConfig, BalancedRouter,
        CacheAware, CacheAwareConfig, CacheAwareRouter, ConsistentHash, ConsistentHashConfig,
        ConsistentHashRouter, Fallback, LeastLoaded, LeastLoadedRouter, MissWeight, PowerOfTwo,
        PowerOfTwoConfig, PowerOfTwoRouter, RoundRobin, RoundRobinRouter, Scoring,
    },
    ranks::RankLayout,
    replica::{Drained, ReplicaConfig, ReplicaOutcome, ReplicaStats},
    request::{
        AdmissionConfig, GATES, Gate, LIMITS, Limit, Priority, RouteDecision, RouteRequest, Shed,
    },
    router::{
        Admit, CandidateSet, Cost, CostTerm, Policy, PolicyRouter, Receipt, ReceiptLine,
        RouteGuard, Router, choose_min,
    },
    sync::{CacheEvent, CacheSync, EngineSettings, GroupKind, Sequence, SyncOutcome},
    tree::{PrefixMatch, RadixTree, Tier, TreeConfig, WorkerId},
};
