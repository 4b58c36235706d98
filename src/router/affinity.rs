//! Session stickiness with a bounded LRU session table.

use std::sync::{Mutex, PoisonError};

use super::baseline::least_loaded;
use super::consistent::Ring;
use super::{Candidate, Fleet, Policy, RouteRequest, Selection, check_range};
use crate::list::{List, NIL, link_before, unlink};
use crate::tree::FoldMap;
use crate::{ConsistentHashConfig, Error, WorkerId};

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

crate::list::linked!(Entry, prev, next);

/// session key → worker, bounded, least recently used forgotten first.
#[derive(Debug, Default)]
struct SessionTable {
    index: FoldMap<u64, u32>,
    entries: Vec<Entry>,
    lru: List,
}

impl SessionTable {
    fn get(&mut self, key: u64) -> Option<WorkerId> {
        let &slot = self.index.get(&key)?;
        unlink(&mut self.entries, &mut self.lru, slot);
        link_before(&mut self.entries, &mut self.lru, slot, NIL);
        Some(self.entries[slot as usize].worker)
    }

    fn put(&mut self, key: u64, worker: WorkerId, max: usize) {
        if let Some(&slot) = self.index.get(&key) {
            self.entries[slot as usize].worker = worker;
            unlink(&mut self.entries, &mut self.lru, slot);
            link_before(&mut self.entries, &mut self.lru, slot, NIL);
            return;
        }
        let entry = Entry {
            key,
            worker,
            prev: NIL,
            next: NIL,
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
        link_before(&mut self.entries, &mut self.lru, slot, NIL);
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
#[derive(Debug)]
pub struct AffinityRouter {
    fleet: Fleet,
    ring: Ring,
    sessions: Mutex<SessionTable>,
    config: AffinityConfig,
}

impl AffinityRouter {
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
    /// As [`new`](Self::new); [`Error::InvalidConfig`] for a value out of its range.
    pub fn with_config(num_workers: u32, config: AffinityConfig) -> Result<Self, Error> {
        check_range(
            "max_sessions",
            config.max_sessions as f64,
            1.0..=(u32::MAX as f64),
            "between 1 and 2^32 - 1",
        )?;
        check_range(
            "overload_factor",
            config.overload_factor,
            1.0..=1e9,
            "at least 1.0",
        )?;
        let fleet = Fleet::new(num_workers)?;
        let ring = Ring::new(&fleet.workers(), config.ring)?;
        Ok(Self {
            fleet,
            ring,
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
            Fallback::LeastLoaded => least_loaded(candidates, request.key()),
            Fallback::ConsistentHash => self.ring.pick(self.ring.key(request), candidates),
        }
    }
}

impl Policy for AffinityRouter {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    fn select(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<Selection, Error> {
        if request.session().is_none() {
            let i = self.ring.pick(self.ring.key(request), candidates);
            return Ok(Selection::plain(candidates[i]));
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
        let i = match sticky {
            Some(i) => i,
            None => {
                let i = self.place(request, candidates);
                sessions.put(key, candidates[i].worker, self.config.max_sessions);
                i
            }
        };
        Ok(Selection::plain(candidates[i]))
    }

    fn worker_added(&self, worker: WorkerId) {
        self.ring.add(worker);
    }

    fn worker_removed(&self, worker: WorkerId) {
        self.ring.remove(worker);
    }

    fn name(&self) -> &'static str {
        "affinity"
    }
}
