//! The event queue of a run: timed events in time order, and the trace's arrivals between
//! them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tick {
    /// Request `i` arrives.
    Arrival(usize),
    /// A timed event: an engine's kind (events of a lower kind go first at equal times) and
    /// its subject.
    Timed(u8, usize),
}

/// Timed events and the next arrival. Timed events go before an arrival at the same time.
#[derive(Debug, Default)]
pub(super) struct Clock {
    /// (time bits, kind, subject). Times are non-negative, so their bits order as they do.
    timed: BinaryHeap<Reverse<(u64, u8, usize)>>,
    next_arrival: usize,
}

impl Clock {
    /// Schedules a timed event of `kind` about `subject` at `at` (non-negative).
    pub(super) fn schedule(&mut self, at: f64, kind: u8, subject: usize) {
        self.timed
            .push(Reverse((at.max(0.0).to_bits(), kind, subject)));
    }

    /// Whether all of `arrivals` arrivals have been handed out.
    pub(super) fn arrivals_done(&self, arrivals: usize) -> bool {
        self.next_arrival >= arrivals
    }

    /// The next tick and its time, `arrival(i)` giving request `i`'s arrival time for `i`
    /// below `arrivals`.
    pub(super) fn next(
        &mut self,
        arrivals: usize,
        arrival: impl Fn(usize) -> f64,
    ) -> Option<(f64, Tick)> {
        let timed = self
            .timed
            .peek()
            .map(|Reverse((t, _, _))| f64::from_bits(*t));
        let i = self.next_arrival;
        if i < arrivals && timed.is_none_or(|t| arrival(i) < t) {
            self.next_arrival += 1;
            return Some((arrival(i), Tick::Arrival(i)));
        }
        let Reverse((t, kind, subject)) = self.timed.pop()?;
        Some((f64::from_bits(t), Tick::Timed(kind, subject)))
    }
}
