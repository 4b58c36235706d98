//! Peer replicas' requests in the load model: each worker's [`PeerCounts`] (beside its own
//! counts in `state.rs`), and the [`PeerTable`] that turns the records of every peer's
//! frames into bookings ([`Change`]s of those counts), idempotently.
//!
//! Per peer the table keeps its incarnation, the highest frame number heard, when it was
//! last heard, its watermarks and an entry per request number at or above its open
//! watermark: booked (charged on a worker), early (a first token or a completion came
//! before its route) or done. Requests below the open watermark are complete at the peer:
//! a record of one is a duplicate (a late route is still worth its mirror insert). The
//! table knows nothing of the registry: the fleet applies its changes (`booking.rs`).
//!
//! Invariants: a booking is charged exactly once and released at most once (a `Book`
//! change is followed by at most one `Release` of the same booking, and `FirstToken` only
//! between them, at most once); every peer's entries are below `max_bookings`; there are at
//! most `max_peers` peers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::super::clock::nanos;
use super::super::learned::timing::attended;
use super::super::prediction::estimate::Estimate;
use crate::error::Error;
use crate::replica::{ReplicaConfig, ReplicaStats};
use crate::tree::WorkerId;

/// Frames a peer's number may go back within one incarnation before it counts as a
/// restart (transports that reorder do so by a few frames).
const RESTART_WINDOW: u64 = 1_024;

/// Nanoseconds between two sweeps for bookings past their age.
const SWEEP_NS: u64 = 1_000_000_000;

/// A peer's request as booked on a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Booking {
    pub(crate) worker: WorkerId,
    /// The worker's registration when booked: a release after the worker was removed and
    /// added again must not touch the new registration's counts.
    pub(crate) epoch: u64,
    pub(crate) prompt: u64,
    /// Uncached prompt tokens (at most `prompt`).
    pub(crate) prefill: u64,
    pub(crate) output: u32,
}

impl Booking {
    /// A booking with its figures clamped to what a worker can hold (a hostile peer's
    /// figures cannot overflow the counters).
    pub(crate) fn new(
        worker: WorkerId,
        epoch: u64,
        (prompt, prefill, output): (u64, u64, u32),
    ) -> Self {
        let prompt = prompt.min(u64::from(u32::MAX));
        Self {
            worker,
            epoch,
            prompt,
            prefill: prefill.min(prompt),
            output,
        }
    }
}

/// What the table does to a worker's peer counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A request is booked, awaiting its first token or not.
    Book(Booking, bool),
    /// A booked request's first token came.
    FirstToken(Booking),
    /// A booked request leaves, its first token still awaited or not.
    Release(Booking, bool),
}

/// One worker's counts of its peers' requests, lock-free, as `state.rs` keeps its own.
#[derive(Debug, Default)]
pub(crate) struct PeerCounts {
    in_flight: AtomicU64,
    awaiting_first: AtomicU64,
    prefill_tokens: AtomicU64,
    prefill_pairs: AtomicU64,
    context_tokens: AtomicU64,
    kv_tokens: AtomicU64,
    /// Since the worker's last engine report: routed, first tokens, completed, prefill
    /// routed, prefill done.
    since: [AtomicU64; 5],
    /// Set at the worker's first booking: until then every count is 0, and a read of the
    /// counts (on every route) is one load.
    booked: AtomicBool,
}

/// A snapshot of [`PeerCounts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerLoad {
    pub(crate) in_flight: u64,
    pub(crate) awaiting_first: u64,
    pub(crate) prefill_tokens: u64,
    pub(crate) prefill_pairs: u64,
    pub(crate) context_tokens: u64,
    pub(crate) kv_tokens: u64,
    /// As [`PeerCounts`]' `since`.
    pub(crate) since: [u64; 5],
}

impl PeerLoad {
    /// Counts these requests in `e` as the router's own, whose own requests awaiting their
    /// first token are `own_awaiting`.
    pub(crate) fn add_to(&self, e: &mut Estimate, own_awaiting: u64) {
        e.requests += self.in_flight;
        let awaiting = (own_awaiting + self.awaiting_first).min(e.requests);
        e.decoding = e.requests - awaiting;
        e.prefill_tokens += self.prefill_tokens;
        e.prefill_pairs += self.prefill_pairs;
        e.context_tokens += self.context_tokens;
        e.kv_tokens += self.kv_tokens;
    }
}

impl PeerCounts {
    /// Applies `change` (its booking's worker is this one).
    pub(crate) fn apply(&self, change: Change) {
        let add = |c: &AtomicU64, v: u64| c.fetch_add(v, Relaxed);
        let sub = |c: &AtomicU64, v: u64| c.fetch_sub(v, Relaxed);
        match change {
            Change::Book(b, awaiting) => {
                self.booked.store(true, Relaxed);
                add(&self.in_flight, 1);
                add(&self.context_tokens, b.prompt + u64::from(b.output));
                add(&self.kv_tokens, b.prefill + u64::from(b.output));
                add(&self.since[0], 1);
                if awaiting {
                    add(&self.awaiting_first, 1);
                    add(&self.prefill_tokens, b.prefill);
                    add(&self.prefill_pairs, attended(b.prompt, b.prefill));
                    add(&self.since[3], b.prefill);
                }
            }
            Change::FirstToken(b) => {
                sub(&self.awaiting_first, 1);
                sub(&self.prefill_tokens, b.prefill);
                sub(&self.prefill_pairs, attended(b.prompt, b.prefill));
                add(&self.since[1], 1);
                add(&self.since[4], b.prefill);
            }
            Change::Release(b, awaiting) => {
                if awaiting {
                    self.apply(Change::FirstToken(b));
                }
                sub(&self.in_flight, 1);
                sub(&self.context_tokens, b.prompt + u64::from(b.output));
                sub(&self.kv_tokens, b.prefill + u64::from(b.output));
                add(&self.since[2], 1);
            }
        }
    }

    /// The worker's engine reported: the counts since start again.
    pub(crate) fn reported(&self) {
        for c in &self.since {
            c.store(0, Relaxed);
        }
    }

    /// The peers' requests in flight here.
    #[inline]
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    /// The peers' prompt tokens here still to prefill.
    pub(crate) fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens.load(Relaxed)
    }

    /// The counts now; `None` before the worker's first booking (every count 0).
    pub(crate) fn load(&self) -> Option<PeerLoad> {
        if !self.booked.load(Relaxed) {
            return None;
        }
        let get = |c: &AtomicU64| c.load(Relaxed);
        Some(PeerLoad {
            in_flight: get(&self.in_flight),
            awaiting_first: get(&self.awaiting_first),
            prefill_tokens: get(&self.prefill_tokens),
            prefill_pairs: get(&self.prefill_pairs),
            context_tokens: get(&self.context_tokens),
            kv_tokens: get(&self.kv_tokens),
            since: self.since.each_ref().map(get),
        })
    }
}

/// The table's bounds, in nanoseconds and counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) lease_ns: u64,
    pub(crate) max_age_ns: u64,
    pub(crate) max_peers: usize,
    pub(crate) max_bookings: usize,
}

impl Limits {
    /// The bounds `config` gives.
    pub(crate) fn of(config: &ReplicaConfig) -> Self {
        Self {
            lease_ns: nanos(config.lease),
            max_age_ns: nanos(config.max_age),
            max_peers: config.max_peers,
            max_bookings: config.max_bookings_per_peer,
        }
    }
}

/// One request of a peer, at or above its open watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Charged on a worker; `awaiting` its first token.
    Booked {
        booking: Booking,
        awaiting: bool,
        at_ns: u64,
    },
    /// Its first token or completion came before its route.
    Early {
        first_token: bool,
        completed: bool,
        at_ns: u64,
    },
    /// Routed and complete.
    Done { at_ns: u64 },
}

impl Entry {
    fn at_ns(&self) -> u64 {
        match *self {
            Entry::Booked { at_ns, .. } | Entry::Early { at_ns, .. } | Entry::Done { at_ns } => {
                at_ns
            }
        }
    }

    /// Releases the entry's booking, if it has one, into `out`.
    fn release(self, out: &mut dyn FnMut(Change)) -> bool {
        match self {
            Entry::Booked {
                booking, awaiting, ..
            } => {
                out(Change::Release(booking, awaiting));
                true
            }
            _ => false,
        }
    }
}

/// One peer replica.
#[derive(Debug)]
struct Peer {
    incarnation: u64,
    /// The highest frame number heard of the incarnation.
    seq: u64,
    heard_ns: u64,
    /// Requests below are complete at the peer.
    open: u64,
    /// Requests below have had their first token.
    awaiting: u64,
    entries: BTreeMap<u64, Entry>,
}

impl Peer {
    fn new(incarnation: u64, seq: u64, now_ns: u64) -> Self {
        Self {
            incarnation,
            seq,
            heard_ns: now_ns,
            open: 0,
            awaiting: 0,
            entries: BTreeMap::new(),
        }
    }

    /// Releases every booking; returns how many.
    fn release_all(&mut self, out: &mut dyn FnMut(Change)) -> u32 {
        let entries = std::mem::take(&mut self.entries);
        entries.into_values().filter(|e| e.release(out)).count() as u32
    }
}

/// How a frame's header was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// The replica's own frame.
    Echo,
    /// A frame of an earlier incarnation.
    Stale,
    /// Apply its records; the peer restarted (its old bookings released), and so many of
    /// its frames were missed.
    Apply { restarted: bool, missed: u64 },
}

/// What a routed record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Routed {
    /// Booked (and its prefix is news).
    Booked,
    /// Its request is complete already: not booked, but its prefix is news.
    Finished,
    /// Heard before: nothing to do.
    Duplicate,
}

/// Every peer's requests (see the module docs).
#[derive(Debug)]
pub(crate) struct PeerTable {
    limits: Limits,
    peers: BTreeMap<u64, Peer>,
    next_sweep_ns: u64,
    /// The applying side's counters (the fleet fills them in).
    pub(crate) stats: ReplicaStats,
}

impl PeerTable {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            peers: BTreeMap::new(),
            next_sweep_ns: 0,
            stats: ReplicaStats::default(),
        }
    }

    /// The table's bounds.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Peers heard now.
    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Bookings charged now.
    pub(crate) fn bookings(&self) -> usize {
        let booked = |e: &&Entry| matches!(e, Entry::Booked { .. });
        self.peers
            .values()
            .map(|p| p.entries.values().filter(booked).count())
            .sum()
    }

    /// Takes the header of a frame of `replica` (`incarnation`, frame `seq`) heard at
    /// `now_ns` by replica `own`.
    ///
    /// # Errors
    ///
    /// [`Error::ReplicaLimit`] for a new peer beyond `max_peers`.
    pub(crate) fn begin(
        &mut self,
        own: u64,
        (replica, incarnation, seq): (u64, u64, u64),
        now_ns: u64,
        out: &mut dyn FnMut(Change),
    ) -> Result<Begin, Error> {
        if replica == own {
            return Ok(Begin::Echo);
        }
        if !self.peers.contains_key(&replica) && self.peers.len() >= self.limits.max_peers {
            return Err(Error::ReplicaLimit {
                what: "peers",
                limit: self.limits.max_peers,
            });
        }
        let peer = self
            .peers
            .entry(replica)
            .or_insert_with(|| Peer::new(incarnation, seq, now_ns));
        if incarnation < peer.incarnation {
            return Ok(Begin::Stale);
        }
        let restarted =
            incarnation > peer.incarnation || seq.saturating_add(RESTART_WINDOW) < peer.seq;
        let mut missed = seq.saturating_sub(peer.seq.saturating_add(1));
        if restarted {
            peer.release_all(out);
            *peer = Peer::new(incarnation, seq, now_ns);
            missed = 0;
        }
        peer.seq = peer.seq.max(seq);
        peer.heard_ns = peer.heard_ns.max(now_ns);
        Ok(Begin::Apply { restarted, missed })
    }

    /// The entry of `request` of `replica` (begun), unless the request is below its open
    /// watermark (complete); a new entry makes room under `max_bookings` first.
    fn entry<'t>(
        &'t mut self,
        replica: u64,
        request: u64,
        out: &mut dyn FnMut(Change),
    ) -> Option<(&'t mut BTreeMap<u64, Entry>, u64)> {
        let max = self.limits.max_bookings;
        let peer = self.peers.get_mut(&replica)?;
        if request < peer.open {
            return None;
        }
        if !peer.entries.contains_key(&request) {
            // The oldest requests go first: beyond the bound they are the likeliest lost.
            while peer.entries.len() >= max {
                if let Some((_, e)) = peer.entries.pop_first() {
                    e.release(out);
                }
            }
        }
        Some((&mut peer.entries, peer.awaiting))
    }

    /// `replica`'s request `request` was routed, `booking` on its worker.
    pub(crate) fn routed(
        &mut self,
        replica: u64,
        request: u64,
        booking: Booking,
        now_ns: u64,
        out: &mut dyn FnMut(Change),
    ) -> Routed {
        let Some((entries, awaiting_mark)) = self.entry(replica, request, out) else {
            return Routed::Finished;
        };
        let (first_token, completed) = match entries.get(&request) {
            None => (false, false),
            Some(Entry::Early {
                first_token,
                completed,
                ..
            }) => (*first_token, *completed),
            Some(_) => return Routed::Duplicate,
        };
        if completed {
            entries.insert(request, Entry::Done { at_ns: now_ns });
            return Routed::Finished;
        }
        let awaiting = !first_token && request >= awaiting_mark;
        out(Change::Book(booking, awaiting));
        let entry = Entry::Booked {
            booking,
            awaiting,
            at_ns: now_ns,
        };
        entries.insert(request, entry);
        Routed::Booked
    }

    /// `replica`'s request `request` had its first token (`completed`: it completed).
    /// Returns whether it was news.
    pub(crate) fn marked(
        &mut self,
        replica: u64,
        request: u64,
        completed: bool,
        now_ns: u64,
        out: &mut dyn FnMut(Change),
    ) -> bool {
        let Some((entries, _)) = self.entry(replica, request, out) else {
            return false;
        };
        let early = Entry::Early {
            first_token: true,
            completed,
            at_ns: now_ns,
        };
        let entry = entries.entry(request).or_insert(Entry::Early {
            first_token: false,
            completed: false,
            at_ns: now_ns,
        });
        match *entry {
            Entry::Booked {
                booking, awaiting, ..
            } if completed => {
                out(Change::Release(booking, awaiting));
                *entry = Entry::Done { at_ns: now_ns };
                true
            }
            Entry::Booked {
                booking,
                awaiting: true,
                at_ns,
            } => {
                out(Change::FirstToken(booking));
                *entry = Entry::Booked {
                    booking,
                    awaiting: false,
                    at_ns,
                };
                true
            }
            Entry::Early {
                first_token,
                completed: was,
                ..
            } if !first_token || (completed && !was) => {
                *entry = early;
                true
            }
            _ => false,
        }
    }

    /// Raises `replica`'s watermarks to `open` and `awaiting` (never lowers them): its
    /// requests below `open` are complete, below `awaiting` prefilled. Returns the
    /// bookings released.
    pub(crate) fn watermarks(
        &mut self,
        replica: u64,
        (open, awaiting): (u64, u64),
        out: &mut dyn FnMut(Change),
    ) -> u32 {
        let Some(peer) = self.peers.get_mut(&replica) else {
            return 0;
        };
        peer.open = peer.open.max(open);
        peer.awaiting = peer.awaiting.max(awaiting);
        let kept = peer.entries.split_off(&peer.open);
        let gone = std::mem::replace(&mut peer.entries, kept);
        let released = gone.into_values().filter(|e| e.release(out)).count() as u32;
        let below = peer.awaiting;
        for (_, e) in peer.entries.range_mut(..below) {
            if let Entry::Booked {
                booking,
                awaiting: awaiting @ true,
                ..
            } = e
            {
                out(Change::FirstToken(*booking));
                *awaiting = false;
            }
        }
        released
    }

    /// Releases, at `now_ns`, every peer not heard for the lease and (every second) every
    /// booking past its age. Returns the peers gone, the bookings released and when to look
    /// again (nanoseconds; `u64::MAX`: no peer).
    pub(crate) fn expire(&mut self, now_ns: u64, out: &mut dyn FnMut(Change)) -> (u32, u32, u64) {
        let Limits {
            lease_ns,
            max_age_ns,
            ..
        } = self.limits;
        let (mut gone, mut released) = (0, 0);
        let dead: Vec<u64> = self
            .peers
            .iter()
            .filter(|(_, p)| p.heard_ns.saturating_add(lease_ns) < now_ns)
            .map(|(&id, _)| id)
            .collect();
        for id in dead {
            if let Some(mut peer) = self.peers.remove(&id) {
                released += peer.release_all(out);
                gone += 1;
            }
        }
        if now_ns >= self.next_sweep_ns {
            self.next_sweep_ns = now_ns.saturating_add(SWEEP_NS);
            for peer in self.peers.values_mut() {
                peer.entries.retain(|_, e| {
                    let keep = e.at_ns().saturating_add(max_age_ns) >= now_ns;
                    if !keep && e.release(out) {
                        released += 1;
                    }
                    keep
                });
            }
        }
        let next = self
            .peers
            .values()
            .map(|p| p.heard_ns.saturating_add(lease_ns).saturating_add(1))
            .min()
            .map_or(u64::MAX, |lease| lease.min(self.next_sweep_ns));
        (gone, released, next)
    }
}
