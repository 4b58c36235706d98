//! A deterministic simulator that compares routing policies on workloads and traces
//! (feature `sim`, on by default).
//!
//! [`Workload`]s are seeded synthetic traffic (shared system prompts, conversations,
//! few-shot templates, document QA, a mix); [`load_mooncake`] reads the public Mooncake
//! traces. A [`Simulation`] replays requests through any [`Router`](crate::Router) against
//! modelled workers; what a request finds cached is the worker's true cache, not the
//! router's belief. Two engines model a worker ([`Engine`]): [`Engine::Simple`] (a finite
//! LRU cache over blocks, a FIFO prefill queue, decoding free beside it) and
//! [`Engine::Batched`] (vLLM's iteration-level scheduler over a block pool: continuous
//! batching, chunked prefill, running requests holding their blocks, preemption, a step-time
//! model, and engine KV events for [`SyncMode::Events`]). Each run gives a [`SimReport`]: hit
//! ratio against the infinite and the pooled references, prefill imbalance, TTFT, TPOT and
//! end-to-end latency, goodput, preemptions, throughput.
//!
//! The fleet around the engines: [`Simulation::run_replicas`] routes through several router
//! replicas behind a front ([`Front`]); batched workers report their load every
//! [`ClusterConfig::scrape_interval_s`], so routers see it as stale as a metrics scrape
//! leaves it; batched workers can keep a host tier of CPU copies
//! ([`BatchConfig::host_capacity_tokens`]), reported as host-tier events and loaded back at
//! their reload time; engine events can arrive late ([`ClusterConfig::event_delay_s`]) or not at
//! all ([`ClusterConfig::event_loss`], repaired by replay or not,
//! [`ClusterConfig::event_replay`]); [`WorkerSpec`] mixes GPUs; [`Fault`]s take workers out
//! and bring them back empty ([`Simulation::with_faults`]).
//!
//! A disaggregated fleet ([`WorkerSpec::role`]: `2xP,6xD`) runs through a
//! [`PdRouter`](crate::PdRouter) with [`Simulation::run_pd`], on the batched engine, as
//! vLLM's NIXL connector runs a disaggregated request: a split request's prefill leg (its
//! prompt with one output token) runs on its prefill worker; when it finishes, the prompt's
//! KV the decode worker's pool lacks (never its last token) moves for its bytes
//! ([`ClusterConfig::kv_bytes_per_token`]) over [`ClusterConfig::kv_transfer_bytes_per_s`],
//! counted from the decode worker's true cache, not the router's predicted
//! [`PlanCost::transfer_bytes`](crate::PlanCost::transfer_bytes); then the host calls
//! [`PdRouter::prefill_done`](crate::PdRouter::prefill_done) and the decode leg is admitted
//! with the KV present: its cached prefix as hits, the rest as loaded blocks, cached (and
//! published as engine events) at the end of its first step, which computes only the
//! prompt's last token and samples the first output token. Time to first token runs from
//! arrival to that token; time per output token and end to end come from the decode leg.
//! Left out: NIXL's asynchronous load (vLLM takes the decode leg's blocks and pins its hits
//! before the transfer and keeps stepping meanwhile; here it takes them after, so hits lost
//! during the transfer count as loaded), the prefill worker holding the prompt's blocks
//! until they are pulled (here they are freed, still cached, at once), contention on a link
//! and any topology (every transfer at the full bandwidth, no setup latency), the decode
//! worker's host tier for the pulled prompt, and faults and admission in such a run.
//!
//! What is modelled and what is left out, against the engines it imitates (vLLM's v1
//! scheduler and block pool, llm-d's `inference-sim`, Dynamo's mocker): see the
//! `scheduler` and `pool` module docs for the engine; the fleet leaves out network time
//! between the gateway and workers, a replay's size (it takes one event delay whatever it
//! carries), health-check lag (a worker is removed the moment it fails), and disk or remote
//! tiers (the host tier's own limits are in the `host` module docs).
//!
//! `cargo run --release --example simulate` runs every policy on the built-in workloads.

mod agents;
mod batched;
mod chain_lru;
mod clock;
mod config;
mod events;
mod follow;
mod host;
mod pool;
mod profile;
mod publish;
mod references;
mod replica_bus;
mod replicas;
mod report;
mod request;
mod rng;
mod run;
mod scheduler;
mod simple;
mod simulation;
mod tally;
mod trace;
mod warmup;
mod workload;

pub use self::config::{
    Arrivals, BatchConfig, ClusterConfig, Engine, Fault, Front, PriorityMix, PriorityScope,
    SlowSpell, SyncMode, WorkerSpec,
};
pub use self::profile::{ENGINE_PROFILES, EngineProfile, StepProfile};
pub use self::report::{RequestRecord, SimReport};
pub use self::request::{Follows, Prompt, Request};
pub use self::simulation::Simulation;
pub use self::tally::{LONG_ANSWER_TOKENS, PREDICTION_WARMUP};
pub use self::trace::{MOONCAKE_BLOCK_TOKENS, load_mooncake, parse_mooncake};
pub use self::workload::Workload;
