//! The wire between the workers' engines and the router replicas' mirrors
//! ([`SyncMode::Events`](super::SyncMode::Events)).
//!
//! Glossary:
//! - a **batch** is what one worker publishes at once: every change of its pool since its
//!   last batch, under the next sequence number of that worker (0 after a restart);
//! - a **sink** is one replica's [`CacheSync`], or none for a replica that keeps no mirror;
//! - a **channel** is the path of one worker's batches to one sink.
//!
//! A batch reaches every sink [`ClusterConfig::event_delay_s`] after it is published, in
//! the order published. Each channel loses a batch with probability
//! [`ClusterConfig::event_loss`]. With [`ClusterConfig::event_replay`] off the sink applies
//! the next batch anyway (its sequence check reports the gap, and the lost changes are
//! missing from its mirror until later batches or a restart cover them). With it on, the
//! host holds the channel's batches from the lost one on until the next batch reveals the
//! gap, asks the engine to replay, and after [`ClusterConfig::event_delay_s`] more applies
//! the held batches in order, as a host buffering behind vLLM's replay socket does.

use std::collections::VecDeque;
use std::rc::Rc;

use super::clock::Clock;
use super::config::ClusterConfig;
use super::rng::Rng;
use crate::error::Error;
use crate::sync::{CacheEvent, CacheSync};
use crate::tree::WorkerId;

/// Timed event: the oldest batch in flight reaches the sinks.
pub(super) const DELIVER: u8 = 1;
/// Timed event: a channel's replay arrives (subject: the channel).
pub(super) const REPLAY: u8 = 2;

/// One published batch.
struct Batch {
    worker: WorkerId,
    seq: u64,
    events: Vec<CacheEvent>,
}

/// A channel's state.
#[derive(Default)]
enum Channel {
    /// Batches are applied as they come.
    #[default]
    Open,
    /// A batch was lost and no later one has come: the held batches wait for the gap to
    /// show.
    Lost(Vec<Rc<Batch>>),
    /// The gap showed and a replay is on its way: the held batches wait for it.
    Replaying(Vec<Rc<Batch>>),
}

/// Batches in flight and every channel's state.
pub(super) struct EventBus<'s> {
    sinks: Vec<Option<&'s dyn CacheSync>>,
    workers: usize,
    delay_s: f64,
    loss: f64,
    replay: bool,
    rng: Rng,
    in_flight: VecDeque<Rc<Batch>>,
    /// Channel of sink `s` and worker `w` at `s * workers + w`.
    channels: Vec<Channel>,
    /// Batches lost on a channel, over all channels.
    lost: u64,
}

impl<'s> EventBus<'s> {
    /// A bus from `workers` workers to `sinks`, configured by `config`.
    pub(super) fn new(
        sinks: Vec<Option<&'s dyn CacheSync>>,
        workers: usize,
        config: &ClusterConfig,
    ) -> Self {
        let channels = (0..sinks.len() * workers).map(|_| Channel::Open).collect();
        Self {
            sinks,
            workers,
            delay_s: config.event_delay_s,
            loss: config.event_loss,
            replay: config.event_replay,
            rng: Rng::new(config.seed ^ 0x6576_656e_7473),
            in_flight: VecDeque::new(),
            channels,
            lost: 0,
        }
    }

    /// Whether any sink listens.
    pub(super) fn is_listened(&self) -> bool {
        self.sinks.iter().any(Option::is_some)
    }

    /// Batches lost so far, counted per channel.
    pub(super) fn lost(&self) -> u64 {
        self.lost
    }

    /// `worker` publishes `events` as batch `seq` at `now`.
    ///
    /// # Errors
    ///
    /// A sink's error applying an event.
    pub(super) fn publish(
        &mut self,
        now: f64,
        worker: WorkerId,
        seq: u64,
        events: Vec<CacheEvent>,
        clock: &mut Clock<'_>,
    ) -> Result<(), Error> {
        let batch = Rc::new(Batch {
            worker,
            seq,
            events,
        });
        if self.delay_s > 0.0 {
            self.in_flight.push_back(batch);
            clock.schedule(now + self.delay_s, DELIVER, 0);
            return Ok(());
        }
        self.arrive(now, &batch, clock)
    }

    /// The oldest batch in flight reaches the sinks at `now`.
    ///
    /// # Errors
    ///
    /// A sink's error applying an event.
    pub(super) fn deliver(&mut self, now: f64, clock: &mut Clock<'_>) -> Result<(), Error> {
        match self.in_flight.pop_front() {
            Some(batch) => self.arrive(now, &batch, clock),
            None => Ok(()),
        }
    }

    /// The replay of `channel` arrives: its held batches are applied in order.
    ///
    /// # Errors
    ///
    /// A sink's error applying an event.
    pub(super) fn replayed(&mut self, channel: usize) -> Result<(), Error> {
        if let Channel::Replaying(held) = std::mem::take(&mut self.channels[channel]) {
            let sink = self.sinks[channel / self.workers];
            for batch in &held {
                apply(sink, batch)?;
            }
        }
        Ok(())
    }

    /// `batch` reaches every sink's channel at `now`.
    fn arrive(&mut self, now: f64, batch: &Rc<Batch>, clock: &mut Clock<'_>) -> Result<(), Error> {
        for s in 0..self.sinks.len() {
            let Some(sink) = self.sinks[s] else { continue };
            let channel = s * self.workers + batch.worker.index();
            let lost = self.loss > 0.0 && self.rng.unit() < self.loss;
            self.lost += u64::from(lost);
            match (&mut self.channels[channel], lost) {
                (Channel::Open, false) => apply(Some(sink), batch)?,
                (Channel::Open, true) if self.replay => {
                    self.channels[channel] = Channel::Lost(vec![Rc::clone(batch)]);
                }
                (Channel::Open, true) => {}
                (Channel::Lost(held), true) => held.push(Rc::clone(batch)),
                (Channel::Lost(held), false) => {
                    held.push(Rc::clone(batch));
                    let held = std::mem::take(held);
                    self.channels[channel] = Channel::Replaying(held);
                    clock.schedule(now + self.delay_s, REPLAY, channel);
                }
                (Channel::Replaying(held), _) => held.push(Rc::clone(batch)),
            }
        }
        Ok(())
    }
}

/// Applies every event of `batch` to `sink`. A batch of a worker the sink no longer knows
/// (it left the fleet while the batch was on its way) is dropped, as a gateway drops the
/// events of a deregistered worker.
fn apply(sink: Option<&dyn CacheSync>, batch: &Batch) -> Result<(), Error> {
    let Some(sink) = sink else { return Ok(()) };
    for event in &batch.events {
        match sink.apply_event(batch.worker, batch.seq, event) {
            Err(Error::UnknownWorker(_)) => return Ok(()),
            other => other?,
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{CacheIndex, IndexConfig};
    use crate::sim::clock::Tick;
    use proptest::prelude::*;

    const W: WorkerId = WorkerId::new(0);

    /// The event of step `k` of a chain of blocks of 4 tokens: blocks `1..=n` are stored in
    /// order, each its own event; a negative step `-k` removes block `k`.
    fn event(step: i64) -> CacheEvent {
        let b = step.unsigned_abs();
        if step < 0 {
            return CacheEvent::removed(vec![b]);
        }
        let tokens = (0..4).map(|i| (b * 4 + i) as u32).collect();
        CacheEvent::stored(b.checked_sub(1).filter(|&p| p > 0), vec![b], tokens)
    }

    /// Tokens of the chain's first `n` blocks.
    fn chain(n: u64) -> Vec<u32> {
        (1..=n)
            .flat_map(|b| (0..4).map(move |i| (b * 4 + i) as u32))
            .collect()
    }

    fn mirror() -> CacheIndex {
        CacheIndex::new(IndexConfig::default().with_block_size(4)).unwrap()
    }

    /// Publishes a batch per entry of `batches` 10 ms apart through a bus configured by
    /// `config` into `sink`, and runs the clock out. Returns the batches lost.
    fn send(config: &ClusterConfig, sink: &CacheIndex, batches: &[Vec<i64>]) -> u64 {
        let mut bus = EventBus::new(vec![Some(sink as &dyn CacheSync)], 1, config);
        let mut clock = Clock::default();
        let mut published = 0;
        loop {
            let next = clock.next();
            let publish_at = published as f64 * 0.01;
            let due = next.is_none_or(|(t, _)| publish_at <= t);
            if due && published < batches.len() {
                let events = batches[published].iter().map(|&s| event(s)).collect();
                bus.publish(publish_at, W, published as u64, events, &mut clock)
                    .unwrap();
                published += 1;
                if let Some((t, Tick::Timed(kind, subject))) = next {
                    clock.schedule(t, kind, subject); // not handled yet: put it back
                }
                continue;
            }
            match next {
                Some((t, Tick::Timed(DELIVER, _))) => bus.deliver(t, &mut clock).unwrap(),
                Some((_, Tick::Timed(_, channel))) => bus.replayed(channel).unwrap(),
                _ => return bus.lost(),
            }
        }
    }

    /// Batches that grow a chain of blocks and cut it back: batch `k` stores block `k + 1`,
    /// and removes the last block when `cut[k]`.
    fn batches(cut: &[bool]) -> Vec<Vec<i64>> {
        let mut top = 0i64;
        cut.iter()
            .map(|&c| {
                if c && top > 0 {
                    top -= 1;
                    vec![-(top + 1)]
                } else {
                    top += 1;
                    vec![top]
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// With replay, a lossy and late channel ends with the mirror a lossless one gives,
        /// once a batch arrives after the last loss (here the engine keeps publishing empty
        /// batches; the chance that 200 are all lost is below 1e-9).
        #[test]
        fn replay_repairs_every_loss(
            cut in proptest::collection::vec(any::<bool>(), 1..40),
            loss in 0.0f64..0.9,
            delay_ms in 0u32..50,
            seed: u64,
        ) {
            let mut batches = batches(&cut);
            let real = batches.len() as u64;
            batches.extend((0..200).map(|_| Vec::new()));
            let truth = mirror();
            send(&ClusterConfig::default(), &truth, &batches);
            let config = ClusterConfig::default()
                .with_event_loss(loss)
                .with_event_delay_s(f64::from(delay_ms) / 1_000.0)
                .with_seed(seed);
            let lossy = mirror();
            send(&config, &lossy, &batches);
            for n in 0..=real {
                prop_assert_eq!(
                    lossy.cached_tokens(W, &[], &chain(n)),
                    truth.cached_tokens(W, &[], &chain(n)),
                );
            }
        }
    }

    #[test]
    fn without_replay_a_lost_store_stays_missing() {
        let batches = batches(&[false; 30]);
        let config = ClusterConfig::default()
            .with_event_loss(0.3)
            .with_event_replay(false);
        let lossy = mirror();
        let lost = send(&config, &lossy, &batches);
        assert!(lost > 0);
        assert!(lossy.cached_tokens(W, &[], &chain(30)) < 30 * 4);
        let truth = mirror();
        assert_eq!(send(&ClusterConfig::default(), &truth, &batches), 0);
        assert_eq!(truth.cached_tokens(W, &[], &chain(30)), 30 * 4);
    }

    #[test]
    fn a_delayed_batch_arrives_after_its_delay() {
        let sink = mirror();
        let config = ClusterConfig::default().with_event_delay_s(0.5);
        let mut bus = EventBus::new(vec![Some(&sink as &dyn CacheSync)], 1, &config);
        let mut clock = Clock::default();
        bus.publish(1.0, W, 0, vec![event(1)], &mut clock).unwrap();
        assert_eq!(sink.cached_tokens(W, &[], &chain(1)), 0, "not yet");
        assert_eq!(clock.next(), Some((1.5, Tick::Timed(DELIVER, 0))));
        bus.deliver(1.5, &mut clock).unwrap();
        assert_eq!(sink.cached_tokens(W, &[], &chain(1)), 4);
    }
}
