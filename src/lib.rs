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
//! ## Errors
//!
//! Bad input never panics: it is an [`Error`] with a message that says what was wrong and
//! what is allowed, or a documented no-op.
//!
//! ## Crate features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sim` | yes | [`sim`]: workloads, Mooncake traces, the simulated cluster (adds `serde_json` to read traces) |
//! | `vllm` | no | [`sync::vllm::decode_batch`](crate::sync): decoding of vLLM's msgpack KV-event batches (adds `rmpv`) |
//!
//! Without features the crate depends only on `sha2`, `xxhash-rust`, `smallvec`,
//! `hashbrown` and `thiserror`: no async runtime, no I/O, no global state.

/// The README's code examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod error;
mod hash;
mod list;
mod router;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sync;
mod tree;

pub use crate::{
    error::Error,
    hash::{BlockHash, HashAlgorithm, PrefixHasher, TokenId},
    router::{
        AffinityConfig, AffinityRouter, BalancedConfig, BalancedRouter, CacheAwareConfig,
        CacheAwareRouter, CacheIndex, ConsistentHashConfig, ConsistentHashRouter,
        DEFAULT_BLOCK_SIZE, Fallback, IndexConfig, LeastLoadedRouter, PowerOfTwoConfig,
        PowerOfTwoRouter, ReportedLoad, RoundRobinRouter, RouteDecision, RouteGuard, RouteRequest,
        Router, Scoring, WorkerLoad,
    },
    sync::{CacheEvent, CacheSync, Sequence, SyncOutcome},
    tree::{PrefixMatch, RadixTree, TreeConfig, WorkerId},
};
