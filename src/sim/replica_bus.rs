//! The bus between router replicas ([`ClusterConfig::replica_sync`]): what a replica
//! routes, prefills and completes, drained into a frame as it happens, reaches every other
//! replica the configured delay later, in the order sent, each frame lost on its way to
//! each replica with the probability [`ClusterConfig::event_loss`] (as NATS core loses
//! what a subscriber misses). Every scrape, each replica sends a frame even with nothing
//! in it (the heartbeat that keeps its lease).

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use super::clock::Clock;
use super::config::ClusterConfig;
use super::replicas::{Replica, Replicas};
use super::rng::Rng;
use crate::error::Error;

/// Timed event: the oldest frame in flight reaches the other replicas.
pub(super) const SYNC: u8 = 7;

/// A frame's bytes at most (NATS's default payload limit).
const MAX_FRAME: usize = 1 << 20;

/// Frames in flight and what the bus counted.
pub(super) struct ReplicaBus {
    /// The delay, seconds; `None`: sync off.
    delay_s: Option<f64>,
    loss: f64,
    rng: Rng,
    in_flight: VecDeque<(Replica, Rc<Vec<u8>>)>,
    /// Frames sent, their bytes, and frames lost on the way to a replica.
    pub(super) sent: (u64, u64),
    pub(super) lost: u64,
}

impl ReplicaBus {
    /// The bus `config` asks for.
    pub(super) fn new(config: &ClusterConfig) -> Self {
        Self {
            delay_s: config.replica_sync,
            loss: config.event_loss,
            rng: Rng::new(config.seed ^ 0x0072_6570_6c69_6361),
            in_flight: VecDeque::new(),
            sent: (0, 0),
            lost: 0,
        }
    }

    /// Replica `r` sends what it recorded at `now` (a frame with records, or with none
    /// when `heartbeat`).
    pub(super) fn send(
        &mut self,
        replicas: &Replicas<'_>,
        r: Replica,
        now: f64,
        heartbeat: bool,
        clock: &mut Clock<'_>,
    ) {
        let Some(delay) = self.delay_s else { return };
        if replicas.len() < 2 {
            return;
        }
        loop {
            let mut frame = Vec::new();
            let drained = replicas.router(r).drain_replica_sync(&mut frame, MAX_FRAME);
            if frame.is_empty() || (drained.records == 0 && !heartbeat) {
                return;
            }
            self.sent.0 += 1;
            self.sent.1 += frame.len() as u64;
            self.in_flight.push_back((r, Rc::new(frame)));
            clock.schedule(now + delay, SYNC, 0);
            if !drained.more {
                return;
            }
        }
    }

    /// The oldest frame in flight reaches every other replica at `now`.
    ///
    /// # Errors
    ///
    /// A replica's error applying it.
    pub(super) fn deliver(&mut self, replicas: &Replicas<'_>, now: f64) -> Result<(), Error> {
        let Some((from, frame)) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let at = Duration::from_secs_f64(now.max(0.0));
        for (r, router) in replicas.iter() {
            if r == from {
                continue;
            }
            if self.loss > 0.0 && self.rng.unit() < self.loss {
                self.lost += 1;
                continue;
            }
            router.apply_replica_sync(&frame, at)?;
        }
        Ok(())
    }
}
