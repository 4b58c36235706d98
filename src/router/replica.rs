//! Replica sync on a [`PolicyRouter`]: each route, first token and completion recorded in
//! its outbox (`crate::replica`), and its peers' frames applied to the fleet model
//! (their requests' load) and to the mirror (their prompts, inserted as this router inserts
//! its own: optimistically, so that an engine's removal takes them out again).

use std::time::Duration;

use super::policy::Policy;
use super::policy_router::PolicyRouter;
use crate::error::Error;
use crate::index::Blocks;
use crate::replica::{Drained, FrameView, Outbox, RecordView, ReplicaOutcome, ReplicaStats};
use crate::request::RouteDecision;

/// The error of a replica sync call on a router built without it.
fn sync_off() -> Error {
    crate::config::invalid(
        "replica_sync",
        "off",
        "a router built with_replica_sync (a ReplicaConfig with its replica id)",
    )
}

impl<P: Policy> PolicyRouter<P> {
    /// Records `decision` in `outbox` for the peers and numbers it; `blocks` are its
    /// prompt's block hashes (none for a policy that does not read the cache).
    pub(super) fn record_route(
        &self,
        outbox: &Outbox,
        blocks: &Blocks,
        decision: &mut RouteDecision,
    ) {
        let w = decision.worker();
        let target = (self.layout.endpoint(w), self.layout.rank(w));
        let figures = (
            decision.prompt_tokens() as u64,
            decision.prefill_tokens() as u64,
            decision.output_tokens(),
        );
        decision.set_sync(outbox.routed(target, figures, blocks));
    }

    /// Records `decision`'s first token (`completed`: its completion) for the peers.
    pub(super) fn record_mark(&self, decision: &RouteDecision, completed: bool) {
        match (&self.replica, decision.sync()) {
            (Some(outbox), n) if n > 0 && completed => outbox.completed(n),
            (Some(outbox), n) if n > 0 => outbox.first_token(n),
            _ => {}
        }
    }

    /// [`Router::drain_replica_sync`](super::Router::drain_replica_sync).
    pub(super) fn drain(&self, out: &mut Vec<u8>, max_bytes: usize) -> Drained {
        match &self.replica {
            Some(outbox) => outbox.drain(out, max_bytes),
            None => {
                out.clear();
                Drained::default()
            }
        }
    }

    /// [`Router::apply_replica_sync`](super::Router::apply_replica_sync).
    pub(super) fn apply(&self, bytes: &[u8], now: Duration) -> Result<ReplicaOutcome, Error> {
        let outbox = self.replica.as_ref().ok_or_else(sync_off)?;
        let frame = FrameView::parse(bytes).inspect_err(|_| self.fleet.reject_peer_frame())?;
        let own = outbox.config().replica;
        let reads_cache = self.policy.reads_cache();
        let mut credits = Vec::new();
        let outcome = self.fleet.apply_peer_frame(
            &frame,
            (own, now),
            &|endpoint, rank| self.layout.target(endpoint, rank),
            &mut credits,
            |record| match record {
                RecordView::Routed { blocks, .. } if reads_cache && blocks.len() > 0 => {
                    Some(blocks.clone())
                }
                _ => None,
            },
        )?;
        let mut buffer = Blocks::new();
        for (worker, blocks) in credits {
            buffer.clear();
            buffer.extend(blocks);
            self.credit(worker, &buffer);
        }
        Ok(outcome)
    }

    /// [`Router::replica_sync_stats`](super::Router::replica_sync_stats).
    pub(super) fn stats(&self) -> Option<ReplicaStats> {
        let outbox = self.replica.as_ref()?;
        let mut stats = ReplicaStats::default();
        outbox.stats_into(&mut stats);
        self.fleet.peer_stats(&mut stats);
        Some(stats)
    }
}
