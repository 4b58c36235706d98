//! The workers by id: a slot per registered worker with its lock-free counters, and apart the
//! column of their load keys, which the least-loaded pass reads from end to end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::super::observed::worker::Observed;
use super::state::LoadState;
use crate::error::Error;
use crate::request::RouteDecision;
use crate::tree::{RadixTree, WorkerId};

/// One registered worker's counters that the least-loaded pass compares, in the order it
/// compares them: lock-free, read and written under the registry's read lock.
#[derive(Debug)]
pub(crate) struct LoadKey {
    /// The worker's load (nanoseconds, [`Estimate::load_s`](super::super::prediction::estimate::Estimate)),
    /// refreshed whenever it changes.
    pub(crate) load_ns: AtomicU64,
    /// Uncached prompt tokens of every request routed to it since it was added.
    pub(crate) assigned_prefill: AtomicU64,
    pub(crate) routed: AtomicU64,
}

impl LoadKey {
    /// A key with `value` in every field: [`LoadKey::VACANT`] for an id with no worker
    /// (above every registered worker's key), 0 for a new registration.
    fn filled(value: u64) -> Self {
        LoadKey {
            load_ns: AtomicU64::new(value),
            assigned_prefill: AtomicU64::new(value),
            routed: AtomicU64::new(value),
        }
    }

    /// The value of every field of an id with no worker.
    const VACANT: u64 = u64::MAX;

    /// The fields, in the order the least-loaded pass compares them.
    #[inline]
    pub(crate) fn get(&self) -> (u64, u64, u64) {
        (
            self.load_ns.load(Relaxed),
            self.assigned_prefill.load(Relaxed),
            self.routed.load(Relaxed),
        )
    }

    /// The load, in seconds.
    #[inline]
    pub(crate) fn load_s(&self) -> f64 {
        self.load_ns.load(Relaxed) as f64 * 1e-9
    }
}

/// One registered worker's other counters, lock-free like its [`LoadKey`].
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) available: AtomicBool,
    /// Distinguishes this registration from an earlier one of the same id, so that a
    /// decision made before a remove / add does not release the new registration's load.
    pub(crate) epoch: u64,
    pub(crate) load: LoadState,
    pub(crate) predicted_cached: AtomicU64,
    /// Blocks the deepest holder held, summed over the requests routed here.
    pub(crate) available_blocks: AtomicU64,
    /// Tokens predicted cached here, summed over the requests routed here.
    pub(crate) captured: AtomicU64,
    pub(crate) reports: AtomicU64,
    pub(crate) reported_cached: AtomicU64,
    pub(crate) predicted_for_reports: AtomicU64,
    pub(crate) mispredicted: AtomicU64,
    /// What the worker was observed to deliver (`observed.rs`).
    pub(crate) observed: Observed,
}

impl Slot {
    fn new(epoch: u64) -> Self {
        Slot {
            epoch,
            available: AtomicBool::new(true),
            load: LoadState::default(),
            predicted_cached: AtomicU64::new(0),
            available_blocks: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reported_cached: AtomicU64::new(0),
            predicted_for_reports: AtomicU64::new(0),
            mispredicted: AtomicU64::new(0),
            observed: Observed::default(),
        }
    }
}

/// The slots and keys of every id.
///
/// Invariant: `keys.len() == slots.len()`, and the key of an id with no worker is
/// filled with [`LoadKey::VACANT`].
#[derive(Debug, Default)]
pub(crate) struct Slots {
    slots: Vec<Option<Slot>>,
    pub(crate) keys: Vec<LoadKey>,
}

/// A registered worker's slot and load key.
#[derive(Clone, Copy)]
pub(crate) struct Registered<'a> {
    pub(crate) slot: &'a Slot,
    pub(crate) key: &'a LoadKey,
}

impl Slots {
    /// Worker `i`, if registered.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<Registered<'_>> {
        let slot = self.slots.get(i)?.as_ref()?;
        let key = self.keys.get(i)?;
        Some(Registered { slot, key })
    }

    /// Worker `i`, if registered and available.
    #[inline]
    pub(crate) fn available(&self, i: usize) -> Option<Registered<'_>> {
        self.get(i).filter(|r| r.slot.available.load(Relaxed))
    }

    /// Registered workers by id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, Registered<'_>)> {
        (0..self.slots.len()).filter_map(|i| Some((i, self.get(i)?)))
    }

    /// Ids with a slot, registered or not.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// The registry: [`Slots`] behind a `RwLock` taken for writing only by add and remove;
/// routing takes it for reading, and the counters are atomics.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    slots: RwLock<Slots>,
    epochs: AtomicU64,
    /// The registered workers' loads summed, each capped at `cap_ns`, and their number:
    /// the fleet's load in O(1) a route ([`busy_share`](Self::busy_share)).
    busy_ns: AtomicU64,
    workers: AtomicU64,
    /// The cap of each worker's part of `busy_ns` (the busy horizon), set once.
    cap_ns: AtomicU64,
}

impl Registry {
    #[inline]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Slots> {
        // Nothing panics while holding the lock; a poisoned lock still holds valid data.
        self.slots.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the cap of each worker's part of the fleet's load (once, before any load).
    pub(crate) fn set_cap(&self, cap_ns: u64) {
        self.cap_ns.store(cap_ns, Relaxed);
    }

    /// Sets a registered worker's load key to `load_s`; the fleet's sum follows its load
    /// capped at the cap `set_cap` set (`cap_ns`, passed to spare the read).
    #[inline]
    pub(crate) fn set_load(&self, key: &LoadKey, load_s: f64, cap_ns: u64) {
        let load = (load_s * 1e9) as u64;
        // Swapped, not stored: the previous load gives the worker's previous part exactly,
        // whatever other threads set meanwhile.
        let before = key.load_ns.swap(load, Relaxed).min(cap_ns);
        let busy = load.min(cap_ns);
        if busy != before {
            // Modular: the sum stays exact whichever way the worker's part moved.
            self.busy_ns.fetch_add(busy.wrapping_sub(before), Relaxed);
        }
    }

    /// The fleet's load: the registered workers' loads (each capped at `cap_ns` when set)
    /// summed, beyond `idle_ns` each, over their number times `cap_ns − idle_ns`; in
    /// `0.0..=1.0` (a set racing a read can stray from it briefly, which the clamp hides),
    /// 0 for no workers.
    #[inline]
    pub(crate) fn busy_share(&self, cap_ns: u64, idle_ns: u64) -> f32 {
        let workers = self.workers.load(Relaxed) as f32;
        let span = cap_ns.saturating_sub(idle_ns) as f32;
        if workers == 0.0 || span == 0.0 {
            return 0.0;
        }
        let busy = self.busy_ns.load(Relaxed) as f32 - workers * idle_ns as f32;
        (busy / (workers * span)).clamp(0.0, 1.0)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots> {
        self.slots.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `worker`, available, with no load.
    pub(crate) fn add(&self, worker: WorkerId) -> Result<(), Error> {
        check_id(worker.get())?;
        let mut slots = self.write();
        let slots = &mut *slots;
        let i = worker.index();
        if slots.slots.len() <= i {
            slots.slots.resize_with(i + 1, || None);
            slots
                .keys
                .resize_with(i + 1, || LoadKey::filled(LoadKey::VACANT));
        }
        if slots.slots[i].is_some() {
            return Err(Error::WorkerExists(worker));
        }
        slots.keys[i] = LoadKey::filled(0);
        slots.slots[i] = Some(Slot::new(self.epochs.fetch_add(1, Relaxed) + 1));
        self.workers.fetch_add(1, Relaxed);
        Ok(())
    }

    pub(crate) fn remove(&self, worker: WorkerId) -> Result<(), Error> {
        let mut slots = self.write();
        let i = worker.index();
        match slots.slots.get_mut(i) {
            Some(slot @ Some(_)) => {
                *slot = None;
                if let Some(key) = slots.keys.get_mut(i) {
                    // Under the write lock: no load is being set meanwhile.
                    let busy = key.load_ns.load(Relaxed).min(self.cap_ns.load(Relaxed));
                    self.busy_ns.fetch_sub(busy, Relaxed);
                    *key = LoadKey::filled(LoadKey::VACANT);
                }
                self.workers.fetch_sub(1, Relaxed);
                Ok(())
            }
            _ => Err(Error::UnknownWorker(worker)),
        }
    }

    /// Runs `f` on `worker`'s slot.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when it is not registered.
    #[inline]
    pub(crate) fn with_slot<T>(
        &self,
        worker: WorkerId,
        f: impl FnOnce(Registered<'_>) -> T,
    ) -> Result<T, Error> {
        let slots = self.read();
        match slots.get(worker.index()) {
            Some(r) => Ok(f(r)),
            None => Err(Error::UnknownWorker(worker)),
        }
    }

    /// Runs `f` on the decision's worker slot if it is still the same registration.
    #[inline]
    pub(crate) fn with_current(&self, decision: &RouteDecision, f: impl FnOnce(Registered<'_>)) {
        let slots = self.read();
        if let Some(r) = slots.get(decision.worker().index()) {
            if r.slot.epoch == decision.epoch() {
                f(r);
            }
        }
    }

    /// Registered workers (available or not), in id order.
    pub(crate) fn workers(&self) -> Vec<WorkerId> {
        let slots = self.read();
        slots.iter().map(|(i, _)| WorkerId::new(i as u32)).collect()
    }
}

/// Worker ids index dense arrays (and the tree's bitsets): they are bounded.
pub(crate) fn check_id(id: u32) -> Result<(), Error> {
    if id >= RadixTree::MAX_WORKERS {
        return Err(Error::WorkerOutOfRange {
            worker: id,
            limit: RadixTree::MAX_WORKERS,
        });
    }
    Ok(())
}
