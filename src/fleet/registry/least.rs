//! The least-loaded pass: the least loaded available worker of each class of workers that
//! hold a prompt alike, read from the column of load keys, and the tie-break every policy
//! shares ([`pick_min`]): fewest routed, then a per-request rotation, never the lowest id.

use std::sync::atomic::Ordering::Relaxed;

use super::super::candidate::Candidate;
use super::slots::{LoadKey, Registered, Slots};

/// A worker of no class in [`Slots::least_of_each`].
pub(crate) const NO_CLASS: u16 = u16::MAX;

impl Slots {
    /// Calls `each` on the least loaded available worker of each class, in id order: `class_of[i]` is worker
    /// `i`'s class (`classes` of them), [`NO_CLASS`] or beyond the slice a class of its own.
    /// "Least loaded" is the lowest load key, then the least prefill handed out, then the
    /// fewest routed, then a per-request rotation (`salt`), as [`pick_min`] breaks ties.
    #[inline]
    pub(crate) fn least_of_each(
        &self,
        class_of: &[u16],
        classes: usize,
        salt: u64,
        mut each: impl FnMut(usize, Registered<'_>),
    ) {
        // On the stack up to 8 classes (one per distinct match, and the workers of none),
        // written in place.
        let mut inline = [Least::default(); 8];
        let mut spilled = Vec::new();
        let least: &mut [Least] = match inline.get_mut(..=classes) {
            Some(least) => least,
            None => {
                spilled.resize(classes + 1, Least::default());
                &mut spilled
            }
        };
        let keys = &self.keys;
        let nothing = classes;
        // Workers past `class_of` are of no class.
        let split = class_of.len().min(keys.len());
        for ((i, key), &class) in keys[..split].iter().enumerate().zip(class_of) {
            if let Some(l) = least.get_mut(usize::from(class).min(nothing)) {
                l.offer(i, key, self, salt);
            }
        }
        if let Some(l) = least.get_mut(nothing) {
            for (i, key) in keys.iter().enumerate().skip(split) {
                l.offer(i, key, self, salt);
            }
        }
        // In id order; a class no worker was offered to sorts last (`usize::MAX`).
        least.sort_unstable_by_key(|l| l.slot);
        for i in least.iter().map_while(Least::slot) {
            if let Some(r) = self.get(i) {
                each(i, r);
            }
        }
    }
}

/// A worker's place in the order a least-cost policy breaks equal costs by, after its cost:
/// prefill handed out, requests routed, the per-request rotation.
pub(crate) type Tie = (u64, u64, u64);

/// A class [`Slots::each_below`] reads the rest of: its index (the number of classes for
/// the workers of no class) and what an idle worker with the fleet's least step terms
/// costs beyond its load, holding what the class holds.
pub(crate) type Widened = (usize, u64);

impl Slots {
    /// Calls `each` on every available worker of a `widened` class (`class_of` and
    /// `classes` as [`least_of_each`](Self::least_of_each) reads them) whose load plus its
    /// class's floor, then its [`Tie`], comes before `best`: those that could cost less
    /// than, or as much as and win the tie against, the best found.
    pub(crate) fn each_below(
        &self,
        (class_of, classes): (&[u16], usize),
        widened: &[Widened],
        (best, salt): ((u64, Tie), u64),
        mut each: impl FnMut(usize, Registered<'_>),
    ) {
        for (i, key) in self.keys.iter().enumerate() {
            let class = class_of
                .get(i)
                .map_or(classes, |&c| usize::from(c).min(classes));
            let Some(&(_, floor)) = widened.iter().find(|w| w.0 == class) else {
                continue;
            };
            let bound = key.load_ns.load(Relaxed).saturating_add(floor);
            if bound > best.0 {
                continue;
            }
            let tie = (
                key.assigned_prefill.load(Relaxed),
                key.routed.load(Relaxed),
                spread(salt, i),
            );
            if (bound, tie) < best {
                if let Some(r) = self.available(i) {
                    each(i, r);
                }
            }
        }
    }
}

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
    /// Offers id `i`, whose key is `key`; each field is read only where the ones before it
    /// tie. Whether a worker is registered and available is read only when it would become
    /// the least (an id with no worker has the highest key).
    #[inline(always)]
    fn offer(&mut self, i: usize, key: &LoadKey, registry: &Slots, salt: u64) {
        let prefill = key.load_ns.load(Relaxed);
        if prefill != self.key.0 {
            if prefill < self.key.0 {
                self.take(i, registry, salt);
            }
            return;
        }
        let assigned = key.assigned_prefill.load(Relaxed);
        if assigned != self.key.1 {
            if assigned < self.key.1 {
                self.take(i, registry, salt);
            }
            return;
        }
        let routed = key.routed.load(Relaxed);
        if routed < self.key.2 || (routed == self.key.2 && spread(salt, i) < self.spread) {
            self.take(i, registry, salt);
        }
    }

    /// Id `i` becomes the least if it is an available worker.
    #[cold]
    fn take(&mut self, i: usize, registry: &Slots, salt: u64) {
        if let Some(r) = registry.available(i) {
            *self = Least {
                slot: i,
                key: r.key.get(),
                spread: spread(salt, i),
            };
        }
    }

    fn slot(&self) -> Option<usize> {
        (self.slot != usize::MAX).then_some(self.slot)
    }
}

/// The per-request rotation that breaks a full tie in favour of worker `i`: the id, xored
/// with the request's salt, times an odd constant. For each salt it orders the ids
/// differently (a bijection), and it costs two instructions a worker in the
/// least-loaded pass, where idle workers all tie.
#[inline]
pub(crate) fn spread(salt: u64, i: usize) -> u64 {
    ((i as u64) ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::prediction::estimate::Estimate;
    use crate::tree::WorkerId;
    fn candidate(worker: u32, in_flight: u64, routed: u64) -> Candidate {
        Candidate {
            worker: WorkerId::new(worker),
            epoch: 1,
            in_flight,
            routed,
            assigned_prefill: 0,
            load_ns: 0,
            estimate: Estimate {
                requests: in_flight,
                ..Default::default()
            },
            matched_blocks: 0,
            cached_tokens: 0,
            fleet_load: 0.0,
            kv_room: u32::MAX,
            cached_by_tier: [0; 4],
        }
    }

    #[test]
    fn pick_min_breaks_ties_by_routed_then_rotation() {
        let cs = [candidate(0, 1, 5), candidate(1, 1, 2), candidate(2, 3, 0)];
        assert_eq!(pick_min(&cs, 0, |_, c| c.in_flight), Some(1));
        // Equal everything: the choice depends on the salt, and different salts reach every worker.
        let idle = [candidate(0, 0, 0), candidate(1, 0, 0), candidate(2, 0, 0)];
        let reached: std::collections::HashSet<usize> = (0..64)
            .filter_map(|salt| pick_min(&idle, salt, |_, _| 0))
            .collect();
        assert_eq!(reached.len(), 3);
        assert_eq!(pick_min(&[], 0, |_, c: &Candidate| c.in_flight), None);
    }
}
