//! The event queue of a run: timed events in time order, and the arrivals between them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::follow::ArrivalQueue;

/// What happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tick {
    /// Request `i` arrives.
    Arrival(usize),
    /// A timed event: an engine's kind (events of a lower kind go first at equal times) and
    /// its subject.
    Timed(u8, usize),
}

/// Timed events and the arrivals. Timed events go before an arrival at the same time.
#[derive(Debug, Default)]
pub(super) struct Clock<'s> {
    /// (time bits, kind, subject). Times are non-negative, so their bits order as they do.
    timed: BinaryHeap<Reverse<(u64, u8, usize)>>,
    arrivals: ArrivalQueue<'s>,
}

impl<'s> Clock<'s> {
    /// A clock handing out `arrivals` between its timed events.
    pub(super) fn new(arrivals: ArrivalQueue<'s>) -> Self {
        Self {
            timed: BinaryHeap::new(),
            arrivals,
        }
    }

    /// Schedules a timed event of `kind` about `subject` at `at` (non-negative).
    pub(super) fn schedule(&mut self, at: f64, kind: u8, subject: usize) {
        self.timed
            .push(Reverse((at.max(0.0).to_bits(), kind, subject)));
    }

    /// Whether no arrival is left to hand out now: all arrived, or the rest wait for
    /// requests still running.
    pub(super) fn arrivals_done(&self) -> bool {
        self.arrivals.done()
    }

    /// Requests that have arrived so far.
    pub(super) fn arrived(&self) -> usize {
        self.arrivals.arrived
    }

    /// Request `i` ended at `now` (finished, refused or dropped): what waits for it may
    /// arrive.
    pub(super) fn ended(&mut self, i: usize, now: f64) {
        self.arrivals.ended(i, now);
    }

    /// Whether a request arrives at `now` and has not been handed out yet (arrivals at a
    /// time come after the timed events at that time).
    pub(super) fn arrival_at(&self, now: f64) -> bool {
        self.arrivals.peek().is_some_and(|(at, _)| at <= now)
    }

    /// The next tick and its time.
    pub(super) fn next(&mut self) -> Option<(f64, Tick)> {
        let timed = self
            .timed
            .peek()
            .map(|Reverse((t, _, _))| f64::from_bits(*t));
        let arrival = self.arrivals.peek().map(|(at, _)| at);
        if arrival.is_some_and(|at| timed.is_none_or(|t| at < t)) {
            let (at, i) = self.arrivals.pop()?;
            return Some((at, Tick::Arrival(i)));
        }
        let Reverse((t, kind, subject)) = self.timed.pop()?;
        Some((f64::from_bits(t), Tick::Timed(kind, subject)))
    }
}
