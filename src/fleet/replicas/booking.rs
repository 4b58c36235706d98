//! Peer replicas' frames applied to the fleet (impl Fleet): each record through the
//! [`PeerTable`], each change it makes to the worker it names (if
//! still the same registration), and the worker's load key refreshed.
//!
//! How peers and [`LoadConfig::replicas`](super::super::config::LoadConfig::replicas) combine:
//! a peer's requests count as this router's own do, in flight and since the last report;
//! the counts since the report are then multiplied by `max(replicas, 1 + peers heard) /
//! (1 + peers heard)`, so `replicas` guesses only the traffic of replicas not heard (with
//! every replica heard, or `replicas` left at 1, the factor is 1).
//!
//! Lock order: the peer table, then the registry (as `expire` takes them); the mirror is
//! credited by the caller after both are released.

use std::time::Duration;

use super::super::clock::nanos;
use super::super::registry::slots::Slots;
use super::super::tracker::{Fleet, lock};
use super::peers::{Begin, Booking, Change, Limits, PeerTable, Routed};
use crate::error::Error;
use crate::replica::{FrameView, RecordView, ReplicaConfig, ReplicaOutcome, ReplicaStats};
use crate::tree::WorkerId;

impl Fleet {
    /// Bounds the peer table as `config` says (before any frame is applied).
    pub(crate) fn set_replica_config(&mut self, config: &ReplicaConfig) {
        let table = self
            .peers
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *table = PeerTable::new(Limits::of(config));
    }

    /// Applies `frame`, heard at `now`, to the load of the workers it names, for replica
    /// `own`; `target` maps a record's (endpoint, rank) to a worker. The routed records'
    /// blocks worth inserting in the mirror are pushed on `credits`.
    ///
    /// # Errors
    ///
    /// [`Error::ReplicaLimit`] for a new peer beyond the table's bound.
    pub(crate) fn apply_peer_frame<'a, B: Clone>(
        &self,
        frame: &FrameView<'a>,
        (own, now): (u64, Duration),
        target: &dyn Fn(u32, u32) -> Result<WorkerId, Error>,
        credits: &mut Vec<(WorkerId, B)>,
        blocks_of: impl Fn(&RecordView<'a>) -> Option<B>,
    ) -> Result<ReplicaOutcome, Error> {
        self.observe_time(now);
        let now_ns = nanos(now);
        let h = frame.header;
        let mut table = lock(&self.peers);
        let slots = self.registry.read();
        let out = &mut |c: Change| self.change(&slots, c);
        let mut outcome = ReplicaOutcome {
            records: frame.len() as u32,
            ..ReplicaOutcome::default()
        };
        match table.begin(own, (h.replica, h.incarnation, h.seq), now_ns, out) {
            Err(e) => {
                table.stats.rejected_frames += 1;
                return Err(e);
            }
            Ok(Begin::Echo) => {
                table.stats.echoes += 1;
                outcome.echo = true;
                return Ok(outcome);
            }
            Ok(Begin::Stale) => {
                table.stats.stale_frames += 1;
                outcome.stale = true;
                return Ok(outcome);
            }
            Ok(Begin::Apply { restarted, missed }) => {
                outcome.restarted = restarted;
                outcome.missed_frames = missed;
            }
        }
        for record in frame.records() {
            match record_into(
                &mut table,
                &slots,
                (h.replica, now_ns),
                &record,
                target,
                out,
            ) {
                Did::Unknown => outcome.unknown_targets += 1,
                Did::Marked(news) => outcome.duplicates += u32::from(!news),
                Did::Routed(worker, routed) => {
                    outcome.booked += u32::from(routed == Routed::Booked);
                    outcome.duplicates += u32::from(routed != Routed::Booked);
                    if routed != Routed::Duplicate {
                        credits.extend(blocks_of(&record).map(|b| (worker, b)));
                    }
                }
            }
        }
        outcome.released = table.watermarks(h.replica, (h.open, h.awaiting), out);
        count(&mut table.stats, &outcome);
        self.heard
            .store(table.peers() as u64, std::sync::atomic::Ordering::Relaxed);
        // The peer's lease runs out then unless another frame comes.
        let lease_end = now_ns.saturating_add(table.limits().lease_ns);
        self.clock.expires_at(lease_end.saturating_add(1));
        Ok(outcome)
    }

    /// Counts a frame refused before it reached the table (undecodable, another version).
    pub(crate) fn reject_peer_frame(&self) {
        lock(&self.peers).stats.rejected_frames += 1;
    }

    /// Releases the peers gone and the bookings too old by `now_ns`; returns when to look
    /// again (nanoseconds).
    pub(in crate::fleet) fn expire_peers(&self, now_ns: u64) -> u64 {
        let mut table = lock(&self.peers);
        let slots = self.registry.read();
        let (gone, released, next) = table.expire(now_ns, &mut |c| self.change(&slots, c));
        table.stats.expired_peers += u64::from(gone);
        table.stats.released += u64::from(released);
        self.heard
            .store(table.peers() as u64, std::sync::atomic::Ordering::Relaxed);
        next
    }

    /// Fills the applying side's figures of `stats`.
    pub(crate) fn peer_stats(&self, stats: &mut ReplicaStats) {
        let table = lock(&self.peers);
        let s = &table.stats;
        stats.frames_applied = s.frames_applied;
        stats.records_applied = s.records_applied;
        stats.echoes = s.echoes;
        stats.stale_frames = s.stale_frames;
        stats.rejected_frames = s.rejected_frames;
        stats.missed_frames = s.missed_frames;
        stats.restarts = s.restarts;
        stats.expired_peers = s.expired_peers;
        stats.duplicates = s.duplicates;
        stats.unknown_targets = s.unknown_targets;
        stats.released = s.released;
        stats.peers = table.peers() as u64;
        stats.bookings = table.bookings() as u64;
    }

    /// Applies `change` to the worker it names, if it is still the registration booked.
    fn change(&self, slots: &Slots, change: Change) {
        let (Change::Book(b, _) | Change::FirstToken(b) | Change::Release(b, _)) = change;
        let Some(r) = slots.get(b.worker.index()) else {
            return;
        };
        if r.slot.epoch != b.epoch {
            return;
        }
        r.slot.load.peers.apply(change);
        self.refresh(r);
    }
}

/// What one record did.
enum Did {
    /// A routed record named a target this router does not have.
    Unknown,
    /// A routed record, for this worker.
    Routed(WorkerId, Routed),
    /// A first token or completion: whether it was news.
    Marked(bool),
}

/// Applies one record of `replica`, heard at `now_ns`, to `table`, its changes into `out`.
fn record_into(
    table: &mut PeerTable,
    slots: &Slots,
    (replica, now_ns): (u64, u64),
    record: &RecordView<'_>,
    target: &dyn Fn(u32, u32) -> Result<WorkerId, Error>,
    out: &mut dyn FnMut(Change),
) -> Did {
    match record {
        RecordView::Routed { request, shape, .. } => {
            let Ok(worker) = target(shape.endpoint, shape.rank) else {
                return Did::Unknown;
            };
            let Some(r) = slots.get(worker.index()) else {
                return Did::Unknown;
            };
            let figures = (shape.prompt, shape.prefill, shape.output);
            let booking = Booking::new(worker, r.slot.epoch, figures);
            Did::Routed(
                worker,
                table.routed(replica, *request, booking, now_ns, out),
            )
        }
        RecordView::FirstToken { request } => {
            Did::Marked(table.marked(replica, *request, false, now_ns, out))
        }
        RecordView::Completed { request } => {
            Did::Marked(table.marked(replica, *request, true, now_ns, out))
        }
    }
}

/// Adds one frame's `outcome` to the applying side's `stats`.
fn count(s: &mut ReplicaStats, outcome: &ReplicaOutcome) {
    s.frames_applied += 1;
    s.records_applied += u64::from(outcome.records);
    s.missed_frames = s.missed_frames.saturating_add(outcome.missed_frames);
    s.restarts += u64::from(outcome.restarted);
    s.duplicates += u64::from(outcome.duplicates);
    s.unknown_targets += u64::from(outcome.unknown_targets);
    s.released += u64::from(outcome.released);
}
