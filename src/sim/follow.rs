//! When requests arrive: on their own at their arrival times, or, in a closed-loop
//! workload ([`Request::follows`]), a gap after the requests they wait for end.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::request::Request;
use crate::error::Error;

/// Who waits for whom, checked and indexed once per simulation.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Requests that arrive on their own, in list order.
    starts: Vec<usize>,
    /// Request `i`'s dependents are `dependents[first[i]..first[i + 1]]`.
    dependents: Vec<usize>,
    first: Vec<usize>,
    /// How many requests each waits for.
    waits: Vec<u32>,
    /// Each request's session group: the session of the request its chain of first
    /// predecessors starts from, interned; `None` for a chain that starts with no session.
    groups: Vec<Option<u32>>,
}

impl Plan {
    /// The plan of `requests`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a request that follows none, one not earlier in the
    /// list, or with a gap that is negative or not finite.
    pub(super) fn new(requests: &[Request]) -> Result<Self, Error> {
        let n = requests.len();
        let mut plan = Plan {
            waits: vec![0; n],
            groups: vec![None; n],
            ..Plan::default()
        };
        let mut count = vec![0usize; n + 1];
        let mut sessions = std::collections::BTreeMap::new();
        for (i, r) in requests.iter().enumerate() {
            let Some(f) = &r.follows else {
                plan.starts.push(i);
                plan.groups[i] = r.session.as_ref().map(|s| {
                    let next = sessions.len() as u32;
                    *sessions.entry(s.as_str()).or_insert(next)
                });
                continue;
            };
            check(i, &f.requests, f.gap_s)?;
            plan.waits[i] = f.requests.len() as u32;
            plan.groups[i] = plan.groups[f.requests[0]];
            for &p in &f.requests {
                count[p + 1] += 1;
            }
        }
        for i in 0..n {
            count[i + 1] += count[i];
        }
        plan.dependents = vec![0; count[n]];
        let mut at = count.clone();
        for (i, r) in requests.iter().enumerate() {
            for &p in r.follows.iter().flat_map(|f| &f.requests) {
                plan.dependents[at[p]] = i;
                at[p] += 1;
            }
        }
        plan.first = count;
        Ok(plan)
    }

    /// Each request's session group (see [`Plan`]'s `groups`).
    pub(super) fn groups(&self) -> &[Option<u32>] {
        &self.groups
    }

    /// The requests that wait for request `i`.
    fn dependents(&self, i: usize) -> &[usize] {
        self.first
            .get(i..i + 2)
            .map_or(&[], |r| &self.dependents[r[0]..r[1]])
    }
}

/// Checks that request `i` follows some earlier requests with a gap that is a duration.
fn check(i: usize, waits: &[usize], gap_s: f64) -> Result<(), Error> {
    if waits.is_empty() || waits.iter().any(|&p| p >= i) {
        return Err(crate::config::invalid(
            "follows",
            format!("request {i} follows {waits:?}"),
            "requests earlier in the list, at least one",
        ));
    }
    crate::config::float("follows.gap_s", gap_s, 0.0..=f64::MAX, "seconds")?;
    Ok(())
}

/// The arrivals of one run: the next request arriving on its own, and those released by
/// the ends of the requests they waited for.
#[derive(Debug, Default)]
pub(super) struct ArrivalQueue<'s> {
    plan: Option<&'s Plan>,
    requests: &'s [Request],
    /// Arrival times (and gaps) are divided by it.
    speedup: f64,
    /// The next of the plan's starts.
    next_start: usize,
    /// Requests each still waits for.
    waits: Vec<u32>,
    /// The latest end among what each waited for so far.
    ready: Vec<f64>,
    /// Whether each request has ended (an end counts once).
    ended: Vec<bool>,
    /// (time bits, request) released to arrive.
    released: BinaryHeap<Reverse<(u64, usize)>>,
    /// Requests handed out so far.
    pub(super) arrived: usize,
    /// The warm-up's end: how many requests, first, are warm-up copies, and when the
    /// measured part starts. A copy released at or after it is never issued.
    warmup_end: (usize, f64),
}

impl<'s> ArrivalQueue<'s> {
    /// The arrivals of `requests` under `plan` at `speedup`.
    pub(super) fn new(plan: &'s Plan, requests: &'s [Request], speedup: f64) -> Self {
        Self {
            plan: Some(plan),
            requests,
            speedup,
            next_start: 0,
            waits: plan.waits.clone(),
            ready: vec![0.0; requests.len()],
            ended: vec![false; requests.len()],
            released: BinaryHeap::new(),
            arrived: 0,
            warmup_end: (0, f64::INFINITY),
        }
    }

    /// These arrivals with the first `copies` requests a warm-up ending at `end_s`: a copy
    /// that would arrive at or after it (a closed-loop step whose answers at 1× took longer
    /// than the trace's timing) is not issued, nor anything that waits for it, so that the
    /// measured part carries the measured load alone.
    pub(super) fn with_warmup_end(mut self, copies: usize, end_s: f64) -> Self {
        self.warmup_end = (copies, end_s);
        self
    }

    /// The next arrival, its time and request, without taking it: the earliest of the
    /// next start and the released (a start first at equal times).
    pub(super) fn peek(&self) -> Option<(f64, usize)> {
        let start = self
            .plan
            .and_then(|p| p.starts.get(self.next_start))
            .map(|&i| (self.requests[i].arrival_s / self.speedup, i));
        let released = self
            .released
            .peek()
            .map(|Reverse((t, i))| (f64::from_bits(*t), *i));
        match (start, released) {
            (Some(s), Some(r)) if r.0 < s.0 => Some(r),
            (Some(s), _) => Some(s),
            (None, r) => r,
        }
    }

    /// Takes the next arrival (as [`peek`](Self::peek) gives it).
    pub(super) fn pop(&mut self) -> Option<(f64, usize)> {
        let next = self.peek()?;
        let from_start = self
            .plan
            .and_then(|p| p.starts.get(self.next_start))
            .is_some_and(|&i| i == next.1);
        if from_start {
            self.next_start += 1;
        } else {
            self.released.pop();
        }
        self.arrived += 1;
        Some(next)
    }

    /// Request `i` ended at `now` (its last token, a refusal or a drop): the requests
    /// that waited only for it, and for others already ended, arrive their gap later.
    ///
    /// A warm-up copy released past the warm-up's end ends unissued at its arrival, and
    /// releases what waits for it in turn (see [`with_warmup_end`](Self::with_warmup_end)).
    pub(super) fn ended(&mut self, i: usize, now: f64) {
        // Allocates only when a warm-up step is cut.
        let mut cut = Vec::new();
        self.release_after(i, now, &mut cut);
        while let Some((d, at)) = cut.pop() {
            self.release_after(d, at, &mut cut);
        }
    }

    /// Request `i`'s end at `now` (counted once): releases what waits only for it, and
    /// pushes onto `cut` the warm-up copies that would arrive past the warm-up's end.
    fn release_after(&mut self, i: usize, now: f64, cut: &mut Vec<(usize, f64)>) {
        let Some(plan) = self.plan else { return };
        if std::mem::replace(&mut self.ended[i], true) {
            return;
        }
        let (copies, end_s) = self.warmup_end;
        for &d in plan.dependents(i) {
            self.ready[d] = self.ready[d].max(now);
            self.waits[d] -= 1;
            if self.waits[d] == 0 {
                let gap = self.requests[d].follows.as_ref().map_or(0.0, |f| f.gap_s);
                let at = (self.ready[d] + gap / self.speedup).max(0.0);
                if d < copies && at >= end_s {
                    cut.push((d, at));
                } else {
                    self.released.push(Reverse((at.to_bits(), d)));
                }
            }
        }
    }

    /// Whether no arrival is left to hand out now (one released later may still come).
    pub(super) fn done(&self) -> bool {
        self.peek().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::request::Follows;

    fn chain() -> Vec<Request> {
        vec![
            Request::new(0.0, vec![1], 1),
            Request::new(0.0, vec![2], 1).with_follows(Follows::new(vec![0], 1.0)),
            Request::new(0.0, vec![3], 1).with_follows(Follows::new(vec![1], 1.0)),
            Request::new(10.0, vec![4], 1),
            Request::new(10.0, vec![5], 1).with_follows(Follows::new(vec![3], 1.0)),
        ]
    }

    #[test]
    fn a_warmup_step_released_past_its_end_is_not_issued_nor_what_waits_for_it() {
        let requests = chain();
        let plan = Plan::new(&requests).unwrap();
        let mut queue = ArrivalQueue::new(&plan, &requests, 1.0).with_warmup_end(3, 5.0);
        assert_eq!(queue.pop(), Some((0.0, 0)));
        queue.ended(0, 2.0);
        assert_eq!(
            queue.pop(),
            Some((3.0, 1)),
            "released before the end: issued"
        );
        // Its answer ends at 4.5: the next step would arrive at 5.5, past the end.
        queue.ended(1, 4.5);
        assert!(queue.ended[2], "the step past the end ends unissued");
        assert_eq!(queue.pop(), Some((10.0, 3)), "the measured part comes next");
        // A measured step is issued whenever it is released.
        queue.ended(3, 30.0);
        assert_eq!(queue.pop(), Some((31.0, 4)));
        assert!(queue.done());
        assert_eq!(queue.arrived, 4);
    }

    #[test]
    fn without_a_warmup_every_step_is_issued() {
        let requests = chain();
        let plan = Plan::new(&requests).unwrap();
        let mut queue = ArrivalQueue::new(&plan, &requests, 1.0);
        queue.pop();
        queue.ended(0, 2.0);
        queue.pop();
        queue.ended(1, 4.5);
        assert_eq!(queue.pop(), Some((5.5, 2)));
    }
}
