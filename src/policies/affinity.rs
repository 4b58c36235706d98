//! Session stickiness with a bounded LRU session table.

use std::sync::{Mutex, PoisonError};

use super::baseline::least_loaded;
use super::consistent::Ring;
use crate::config::{float, int};
use crate::error::Error;
use crate::fleet::Candidate;
use crate::fold::FoldMap;
use crate::index::IndexConfig;
use crate::list::{List, Slot, link_before, unlink};
use crate::policies::ConsistentHashConfig;
use crate::request::RouteRequest;
use crate::router::{Policy, PolicyRouter};
use crate::tree::WorkerId;

/// How [`AffinityRouter`] places a session it has not seen (or must move).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fallback {
    /// The least loaded worker. The default: spreads new sessions evenly.
    #[default]
    LeastLoaded,
    /// The session id's point on a consistent-hash ring with bounded loads: placement
    /// survives router restarts and agrees across router replicas.
    ConsistentHash,
}

/// Configuration of [`AffinityRouter`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AffinityConfig {
    /// Sessions remembered at once; the least recently used is forgotten beyond it.
    /// At least 1. Default 65,536 (about 2 MiB).
    pub max_sessions: usize,
    /// Placement of new sessions. Default [`Fallback::LeastLoaded`].
    pub fallback: Fallback,
    /// A session leaves its worker when that worker has more than `overload_factor ×
    /// (mean requests + 1)` requests in flight. At least 1.0. Default 2.0.
    pub overload_factor: f64,
    /// The ring used for requests without a session (content affinity by prefix) and for
    /// [`Fallback::ConsistentHash`].
    pub ring: ConsistentHashConfig,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            max_sessions: 65_536,
            fallback: Fallback::LeastLoaded,
            overload_factor: 2.0,
            ring: ConsistentHashConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    worker: WorkerId,
    prev: u32,
    next: u32,
}

crate::list::linked!(Entry, u32, prev, next);

impl AffinityConfig {
    crate::config::setters! {
        /// Sets [`max_sessions`](Self::max_sessions).
        with_max_sessions: max_sessions: usize;
        /// Sets [`fallback`](Self::fallback).
        with_fallback: fallback: Fallback;
        /// Sets [`overload_factor`](Self::overload_factor).
        with_overload_factor: overload_factor: f64;
        /// Sets [`ring`](Self::ring).
        with_ring: ring: ConsistentHashConfig;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range (the ring's
    /// included); [`Error::InvalidBlockSize`] for the ring's block size.
    pub fn validate(&self) -> Result<(), Error> {
        int(
            "max_sessions",
            self.max_sessions,
            1..=u32::MAX as usize,
            "between 1 and 2^32 - 1",
        )?;
        float(
            "overload_factor",
            self.overload_factor,
            1.0..=1e9,
            "at least 1.0",
        )?;
        self.ring.validate()
    }
}

/// session key → worker, bounded, least recently used forgotten first.
#[derive(Debug, Default)]
struct SessionTable {
    index: FoldMap<u64, u32>,
    entries: Vec<Entry>,
    lru: List<u32>,
}

impl SessionTable {
    fn get(&mut self, key: u64) -> Option<WorkerId> {
        let &slot = self.index.get(&key)?;
        unlink(&mut self.entries, &mut self.lru, slot);
        link_before(&mut self.entries, &mut self.lru, slot, u32::NONE);
        Some(self.entries[slot as usize].worker)
    }

    fn put(&mut self, key: u64, worker: WorkerId, max: usize) {
        if let Some(&slot) = self.index.get(&key) {
            self.entries[slot as usize].worker = worker;
            unlink(&mut self.entries, &mut self.lru, slot);
            link_before(&mut self.entries, &mut self.lru, slot, u32::NONE);
            return;
        }
        let entry = Entry {
            key,
            worker,
            prev: u32::NONE,
            next: u32::NONE,
        };
        let slot = if self.entries.len() < max {
            self.entries.push(entry);
            (self.entries.len() - 1) as u32
        } else {
            // Reuse the least recently used entry's slot.
            let slot = self.lru.head;
            unlink(&mut self.entries, &mut self.lru, slot);
            self.index.remove(&self.entries[slot as usize].key);
            self.entries[slot as usize] = entry;
            slot
        };
        self.index.insert(key, slot);
        link_before(&mut self.entries, &mut self.lru, slot, u32::NONE);
    }
}

/// Session (conversation) stickiness.
///
/// A request with a session id goes where that session went before, so each turn finds the
/// previous turns cached, unless that worker was removed, is unavailable, or is overloaded
/// (see [`AffinityConfig::overload_factor`]); then the session is placed again by the
/// [`Fallback`]. Requests without a session id get content affinity: consistent hashing of
/// their first blocks.
///
/// ```
/// use prefix_router::{AffinityRouter, RouteRequest, Router};
///
/// let router = AffinityRouter::new(4)?;
/// let turn1: Vec<u32> = (0..500).collect();
/// let first = router.route(&RouteRequest::new(&turn1).with_session("chat-1"))?;
/// router.complete(&first);
/// let turn2: Vec<u32> = (0..800).collect();
/// let second = router.route(&RouteRequest::new(&turn2).with_session("chat-1"))?;
/// assert_eq!(first.worker(), second.worker());
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub type AffinityRouter = PolicyRouter<Affinity>;

/// The policy of [`AffinityRouter`]: the session table and the ring.
#[derive(Debug)]
pub struct Affinity {
    ring: Ring,
    sessions: Mutex<SessionTable>,
    config: AffinityConfig,
}

impl Affinity {
    /// The policy with `config`.
    ///
    /// # Errors
    ///
    /// As [`AffinityConfig::validate`].
    pub fn new(config: AffinityConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            ring: Ring::new(config.ring)?,
            sessions: Mutex::new(SessionTable::default()),
            config,
        })
    }

    /// Sessions currently remembered.
    #[must_use]
    pub fn session_count(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .index
            .len()
    }

    fn place(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        match self.config.fallback {
            Fallback::LeastLoaded => least_loaded(request, candidates),
            Fallback::ConsistentHash => self.ring.pick(request, candidates),
        }
    }
}

impl PolicyRouter<Affinity> {
    /// A router over workers `0..num_workers` with the default configuration.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_config(num_workers, AffinityConfig::default())
    }

    /// A router with `config`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); as [`AffinityConfig::validate`].
    pub fn with_config(num_workers: u32, config: AffinityConfig) -> Result<Self, Error> {
        Self::with_policy(num_workers, Affinity::new(config)?, IndexConfig::default())
    }

    /// Sessions currently remembered.
    #[must_use]
    pub fn session_count(&self) -> usize {
        self.policy().session_count()
    }
}

impl Policy for Affinity {
    fn name(&self) -> &'static str {
        "affinity"
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        if request.session().is_none() {
            return self.ring.pick(request, candidates);
        }
        let key = request.key();
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let sticky = sessions.get(key).and_then(|worker| {
            let i = candidates
                .binary_search_by_key(&worker, |c| c.worker)
                .ok()?;
            let total: u64 = candidates.iter().map(Candidate::requests).sum();
            let mean = total as f64 / candidates.len() as f64;
            let limit = self.config.overload_factor * (mean + 1.0);
            ((candidates[i].requests() + 1) as f64 <= limit).then_some(i)
        });
        sticky.unwrap_or_else(|| {
            let i = self.place(request, candidates);
            sessions.put(key, candidates[i].worker, self.config.max_sessions);
            i
        })
    }

    fn worker_added(&self, worker: WorkerId) {
        self.ring.add(worker);
    }

    fn worker_removed(&self, worker: WorkerId) {
        self.ring.remove(worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::RouteRequest;
    use crate::router::Router;

    #[test]
    fn session_table_is_bounded_and_forgets_the_least_recent() {
        let config = AffinityConfig {
            max_sessions: 3,
            ..AffinityConfig::default()
        };
        let router = AffinityRouter::with_config(4, config).unwrap();
        let router = &router;
        let route = |s: &str| {
            let d = router
                .route(&RouteRequest::new(&[1]).with_session(s))
                .unwrap();
            router.complete(&d);
            d.worker()
        };
        let a = route("a");
        route("b");
        route("c");
        assert_eq!(route("a"), a, "a is remembered and refreshed");
        route("d"); // forgets b, the least recent
        assert_eq!(router.session_count(), 3);
    }
}
