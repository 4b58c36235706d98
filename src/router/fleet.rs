//! The worker registry and load tracker every policy shares.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use super::{Candidate, RouteDecision, RouteRequest};
use crate::{Error, RadixTree, WorkerId};

/// Load a host pushes from a worker's own metrics (for example its `/metrics` endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[non_exhaustive]
pub struct ReportedLoad {
    /// Requests waiting or running on the worker, as the worker counts them (this router's
    /// and any other router's).
    pub queue_len: u64,
    /// Fraction of the worker's KV cache in use, `0.0..=1.0`.
    pub kv_usage: f32,
}

impl ReportedLoad {
    /// A report of `queue_len` requests and `kv_usage` (fraction of KV cache in use).
    #[must_use]
    pub fn new(queue_len: u64, kv_usage: f32) -> Self {
        Self {
            queue_len,
            kv_usage,
        }
    }
}

/// A snapshot of one worker's load as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerLoad {
    /// Whether the worker takes new requests.
    pub available: bool,
    /// Requests routed to it and not yet completed.
    pub in_flight: u64,
    /// Uncached prompt tokens of those requests whose prefill is not known to be done
    /// (prefill work queued or running on it; see [`Router::first_token`](crate::Router::first_token)).
    pub prefill_tokens: u64,
    /// Requests routed to it since it was added.
    pub routed: u64,
    /// Prompt tokens predicted cached, summed over those requests.
    pub predicted_cached_tokens: u64,
    /// The last [`ReportedLoad`] pushed for it.
    pub reported: ReportedLoad,
    /// Cached-token reports received for it
    /// ([`CacheSync::report_cached`](crate::CacheSync::report_cached)).
    pub reports: u64,
    /// Prompt tokens those reports said were cached (in the mirror's whole blocks).
    pub reported_cached_tokens: u64,
    /// Prompt tokens the mirror predicted cached for the same prompts when each report came:
    /// beside `reported_cached_tokens`, how far the mirror is from the truth (a block size,
    /// LoRA, group or hash mismatch shows as a large gap instead of staying silent).
    pub predicted_for_reports_tokens: u64,
    /// Reports that disagreed with the mirror's prediction.
    pub mispredicted_reports: u64,
}

/// One registered worker: lock-free counters read and written under the registry's read lock.
/// The fields a shortlist scans come first, so that the scan mostly reads one cache line a
/// worker.
#[derive(Debug)]
#[repr(C)]
struct Slot {
    prefill_tokens: AtomicU64,
    /// Uncached prompt tokens of every request routed to it since it was added.
    assigned_prefill: AtomicU64,
    routed: AtomicU64,
    available: AtomicBool,
    /// Distinguishes this registration from an earlier one of the same id, so that a
    /// decision made before a remove / add does not release the new registration's load.
    epoch: u64,
    in_flight: AtomicU64,
    predicted_cached: AtomicU64,
    queue_len: AtomicU64,
    kv_usage_bits: AtomicU32,
    reports: AtomicU64,
    reported_cached: AtomicU64,
    predicted_for_reports: AtomicU64,
    mispredicted: AtomicU64,
}

/// Candidates of one route call; on the stack for fleets of up to 64 workers.
pub(crate) type Candidates = SmallVec<[Candidate; 64]>;

/// Registry of workers plus per-worker load counters, shared by every policy.
///
/// The registry is behind a `RwLock` taken for writing only by add / remove; routing takes
/// it for reading, and the counters are atomics.
#[derive(Debug)]
pub(crate) struct Fleet {
    slots: RwLock<Vec<Option<Slot>>>,
    epochs: AtomicU64,
}

impl Fleet {
    /// A fleet of workers `0..num_workers`, all available.
    pub(crate) fn new(num_workers: u32) -> Result<Self, Error> {
        check_id(num_workers.saturating_sub(1))?;
        let fleet = Self {
            slots: RwLock::new(Vec::new()),
            epochs: AtomicU64::new(0),
        };
        for w in 0..num_workers {
            fleet.add(WorkerId::new(w))?;
        }
        Ok(fleet)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Slot>>> {
        // Nothing panics while holding the lock; a poisoned lock still holds valid data.
        self.slots
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Option<Slot>>> {
        self.slots
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn add(&self, worker: WorkerId) -> Result<(), Error> {
        check_id(worker.get())?;
        let mut slots = self.write();
        let i = worker.index();
        if slots.len() <= i {
            slots.resize_with(i + 1, || None);
        }
        if slots[i].is_some() {
            return Err(Error::WorkerExists(worker));
        }
        slots[i] = Some(Slot {
            epoch: self.epochs.fetch_add(1, Relaxed) + 1,
            available: AtomicBool::new(true),
            in_flight: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            routed: AtomicU64::new(0),
            assigned_prefill: AtomicU64::new(0),
            predicted_cached: AtomicU64::new(0),
            queue_len: AtomicU64::new(0),
            kv_usage_bits: AtomicU32::new(0),
            reports: AtomicU64::new(0),
            reported_cached: AtomicU64::new(0),
            predicted_for_reports: AtomicU64::new(0),
            mispredicted: AtomicU64::new(0),
        });
        Ok(())
    }

    pub(crate) fn remove(&self, worker: WorkerId) -> Result<(), Error> {
        let mut slots = self.write();
        match slots.get_mut(worker.index()) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(Error::UnknownWorker(worker)),
        }
    }

    fn with_slot<T>(&self, worker: WorkerId, f: impl FnOnce(&Slot) -> T) -> Result<T, Error> {
        let slots = self.read();
        match slots.get(worker.index()) {
            Some(Some(slot)) => Ok(f(slot)),
            _ => Err(Error::UnknownWorker(worker)),
        }
    }

    /// `Ok` when `worker` is registered.
    pub(crate) fn check(&self, worker: WorkerId) -> Result<(), Error> {
        self.with_slot(worker, |_| ())
    }

    pub(crate) fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        self.with_slot(worker, |s| s.available.store(available, Relaxed))
    }

    pub(crate) fn report_load(&self, worker: WorkerId, load: ReportedLoad) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&load.kv_usage) {
            return Err(Error::InvalidConfig {
                field: "kv_usage",
                value: load.kv_usage.to_string(),
                allowed: "a fraction between 0.0 and 1.0",
            });
        }
        self.with_slot(worker, |s| {
            s.queue_len.store(load.queue_len, Relaxed);
            s.kv_usage_bits.store(load.kv_usage.to_bits(), Relaxed);
        })
    }

    pub(crate) fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.with_slot(worker, |s| WorkerLoad {
            available: s.available.load(Relaxed),
            in_flight: s.in_flight.load(Relaxed),
            prefill_tokens: s.prefill_tokens.load(Relaxed),
            routed: s.routed.load(Relaxed),
            predicted_cached_tokens: s.predicted_cached.load(Relaxed),
            reported: ReportedLoad {
                queue_len: s.queue_len.load(Relaxed),
                kv_usage: f32::from_bits(s.kv_usage_bits.load(Relaxed)),
            },
            reports: s.reports.load(Relaxed),
            reported_cached_tokens: s.reported_cached.load(Relaxed),
            predicted_for_reports_tokens: s.predicted_for_reports.load(Relaxed),
            mispredicted_reports: s.mispredicted.load(Relaxed),
        })
        .ok()
    }

    /// Counts a cached-token report for `worker`: the mirror predicted `predicted` tokens,
    /// the worker reported `reported` (both in whole blocks of the mirror).
    pub(crate) fn reported(&self, worker: WorkerId, predicted: usize, reported: usize) {
        let _ = self.with_slot(worker, |s| {
            s.reports.fetch_add(1, Relaxed);
            s.reported_cached.fetch_add(reported as u64, Relaxed);
            s.predicted_for_reports.fetch_add(predicted as u64, Relaxed);
            if predicted != reported {
                s.mispredicted.fetch_add(1, Relaxed);
            }
        });
    }

    /// Registered workers (available or not), in id order.
    pub(crate) fn workers(&self) -> Vec<WorkerId> {
        let slots = self.read();
        (0..slots.len())
            .filter(|&i| slots[i].is_some())
            .map(|i| WorkerId::new(i as u32))
            .collect()
    }

    /// Fills `out` with the available workers, in id order.
    pub(crate) fn candidates(&self, out: &mut Candidates) {
        out.clear();
        let slots = self.read();
        out.reserve(slots.len());
        for (i, slot) in slots.iter().enumerate() {
            if let Some(s) = slot.as_ref().filter(|s| s.available.load(Relaxed)) {
                out.push(snapshot(i, s));
            }
        }
    }

    /// Fills `out`, in id order, with the least loaded available worker of each class:
    /// `class_of[i]` is worker `i`'s class (`classes` of them), [`NO_CLASS`] or beyond the
    /// slice a class of its own. "Least loaded" is the fewest outstanding prefill tokens, then
    /// the least prefill handed out, then the fewest routed, then a per-request rotation
    /// (`salt`), as [`pick_min`] breaks ties.
    pub(crate) fn least_of_each(
        &self,
        class_of: &[u16],
        classes: usize,
        salt: u64,
        out: &mut Candidates,
    ) {
        out.clear();
        let slots = self.read();
        let mut all: SmallVec<[Least; 8]> = smallvec::smallvec![Least::default(); classes + 1];
        let least = all.as_mut_slice();
        let nothing = classes;
        // Workers past `class_of` are of no class.
        let split = class_of.len().min(slots.len());
        for ((i, slot), &class) in slots[..split].iter().enumerate().zip(class_of) {
            if let Some(s) = slot.as_ref().filter(|s| s.available.load(Relaxed)) {
                if let Some(l) = least.get_mut(usize::from(class).min(nothing)) {
                    l.offer(i, s, salt);
                }
            }
        }
        if let Some(l) = least.get_mut(nothing) {
            for (i, slot) in slots.iter().enumerate().skip(split) {
                if let Some(s) = slot.as_ref().filter(|s| s.available.load(Relaxed)) {
                    l.offer(i, s, salt);
                }
            }
        }
        let mut winners: SmallVec<[usize; 8]> = all.iter().filter_map(Least::slot).collect();
        winners.sort_unstable();
        for i in winners {
            if let Some(s) = &slots[i] {
                out.push(snapshot(i, s));
            }
        }
    }

    /// Charges the chosen worker with the request (and the candidate's predicted cached
    /// tokens), unless it was removed (or removed and added again) since it was chosen: then
    /// `None`, and the caller chooses again.
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
    ) -> Option<RouteDecision> {
        let (matched_blocks, cached_tokens) =
            (candidate.matched_blocks(), candidate.cached_tokens());
        let by_tier = candidate.cached_by_tier;
        let slots = self.read();
        let slot = slots.get(candidate.worker.index())?.as_ref()?;
        if slot.epoch != candidate.epoch {
            return None;
        }
        let prompt_tokens = request.tokens().len();
        let cached_tokens = cached_tokens.min(prompt_tokens);
        let prefill = (prompt_tokens - cached_tokens) as u64;
        slot.in_flight.fetch_add(1, Relaxed);
        slot.prefill_tokens.fetch_add(prefill, Relaxed);
        slot.predicted_cached
            .fetch_add(cached_tokens as u64, Relaxed);
        slot.routed.fetch_add(1, Relaxed);
        slot.assigned_prefill.fetch_add(prefill, Relaxed);
        Some(RouteDecision::new(
            candidate.worker,
            candidate.epoch,
            prompt_tokens,
            matched_blocks,
            cached_tokens,
            by_tier,
        ))
    }

    /// Takes the decision's prefill tokens off its worker's outstanding prefill, once.
    pub(crate) fn prefilled(&self, decision: &RouteDecision) {
        if !decision.mark_prefilled() {
            return;
        }
        self.with_current(decision, |slot| {
            sub(&slot.prefill_tokens, decision.prefill_tokens() as u64);
        });
    }

    /// Runs `f` on the decision's worker slot if it is still the same registration.
    fn with_current(&self, decision: &RouteDecision, f: impl FnOnce(&Slot)) {
        let slots = self.read();
        if let Some(Some(slot)) = slots.get(decision.worker().index()) {
            if slot.epoch == decision.epoch() {
                f(slot);
            }
        }
    }

    /// Releases what `commit` charged, once; a no-op when the decision was already released
    /// or its worker was removed since.
    pub(crate) fn release(&self, decision: &RouteDecision) {
        let Some(prefill_outstanding) = decision.mark_released() else {
            return;
        };
        let prefill = if prefill_outstanding {
            decision.prefill_tokens() as u64
        } else {
            0
        };
        self.with_current(decision, |slot| {
            sub(&slot.in_flight, 1);
            sub(&slot.prefill_tokens, prefill);
            sub(&slot.predicted_cached, decision.cached_tokens() as u64);
        });
    }
}

/// Takes back what `commit` added. Each decision is released once (its state bits and the
/// registration epoch see to it), so a counter never goes below zero.
fn sub(counter: &AtomicU64, by: u64) {
    counter.fetch_sub(by, Relaxed);
}

/// Worker ids index dense arrays (and the tree's bitsets): they are bounded.
fn check_id(id: u32) -> Result<(), Error> {
    if id >= RadixTree::MAX_WORKERS {
        return Err(Error::WorkerOutOfRange {
            worker: id,
            limit: RadixTree::MAX_WORKERS,
        });
    }
    Ok(())
}

/// A deterministic 64-bit mix (SplitMix64's finaliser), for tie-breaks and seeded choices.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A worker of no class in [`Fleet::least_of_each`].
pub(crate) const NO_CLASS: u16 = u16::MAX;

/// The least loaded slot offered so far, by (prefill tokens, prefill handed out, routed),
/// then the per-request rotation: [`pick_min`]'s order among workers a policy scores alike.
/// `slot` is `usize::MAX` until a slot is offered (whose key is then below the initial one).
#[derive(Clone, Copy)]
struct Least {
    slot: usize,
    key: (u64, u64, u64),
    /// The slot's rotation, computed when it became the least.
    spread: u64,
}

impl Default for Least {
    fn default() -> Self {
        Least {
            slot: usize::MAX,
            key: (u64::MAX, u64::MAX, u64::MAX),
            spread: u64::MAX,
        }
    }
}

impl Least {
    /// Offers slot `i`; each field is read only where the ones before it tie.
    #[inline(always)]
    fn offer(&mut self, i: usize, s: &Slot, salt: u64) {
        let prefill = s.prefill_tokens.load(Relaxed);
        if prefill != self.key.0 {
            if prefill < self.key.0 {
                self.take(i, s, salt);
            }
            return;
        }
        let assigned = s.assigned_prefill.load(Relaxed);
        if assigned != self.key.1 {
            if assigned < self.key.1 {
                self.take(i, s, salt);
            }
            return;
        }
        let routed = s.routed.load(Relaxed);
        if routed < self.key.2 || (routed == self.key.2 && spread(salt, i) < self.spread) {
            self.take(i, s, salt);
        }
    }

    /// Slot `i` becomes the least.
    #[cold]
    fn take(&mut self, i: usize, s: &Slot, salt: u64) {
        *self = Least {
            slot: i,
            key: (
                s.prefill_tokens.load(Relaxed),
                s.assigned_prefill.load(Relaxed),
                s.routed.load(Relaxed),
            ),
            spread: spread(salt, i),
        };
    }

    fn slot(&self) -> Option<usize> {
        (self.slot != usize::MAX).then_some(self.slot)
    }
}

/// A candidate snapshot of slot `i`.
#[inline]
fn snapshot(i: usize, s: &Slot) -> Candidate {
    Candidate {
        worker: WorkerId::new(i as u32),
        epoch: s.epoch,
        in_flight: s.in_flight.load(Relaxed),
        prefill_tokens: s.prefill_tokens.load(Relaxed),
        routed: s.routed.load(Relaxed),
        assigned_prefill: s.assigned_prefill.load(Relaxed),
        queue_len: s.queue_len.load(Relaxed),
        matched_blocks: 0,
        cached_tokens: 0,
        cached_by_tier: [0; 4],
    }
}

/// The per-request rotation that breaks a full tie in favour of worker `i`.
#[inline]
fn spread(salt: u64, i: usize) -> u64 {
    mix64(salt ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Picks the candidate with the smallest `key`; remaining ties go to the worker that has
/// been routed the fewest requests so far, then to a per-request rotation (`salt`), never
/// to the lowest id.
pub(crate) fn pick_min<K: PartialOrd>(
    candidates: &[Candidate],
    salt: u64,
    mut key: impl FnMut(usize, &Candidate) -> K,
) -> Option<usize> {
    let spread = |c: &Candidate| spread(salt, c.worker.index());
    let mut best: Option<(usize, K)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let k = key(i, c);
        let better = match &best {
            None => true,
            Some((b, bk)) => match k.partial_cmp(bk) {
                Some(core::cmp::Ordering::Less) => true,
                Some(core::cmp::Ordering::Greater) => false,
                Some(core::cmp::Ordering::Equal) | None => {
                    let bc = &candidates[*b];
                    (c.routed, spread(c)) < (bc.routed, spread(bc))
                }
            },
        };
        if better {
            best = Some((i, k));
        }
    }
    best.map(|(i, _)| i)
}
