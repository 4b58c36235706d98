//! Which candidates a route offers its policy: every available worker with what the mirror
//! says each holds ([`fill`]), or the shortlist of [`CandidateSet::LeastLoadedPerMatch`]
//! (the least loaded of each class of workers holding a prompt alike, [`Classes`], widened
//! to every worker that could cost less for a policy that bounds its cost by load).
//!
//! Why the widened shortlist is exact, for a policy keeping the contract of
//! [`Policy::cost_above_load_ns`]: a worker's cost is its load plus what it costs beyond,
//! and what it costs beyond is at least what the floor candidate holding the same costs
//! (an idle worker with the fleet's least step terms). So a worker whose load plus its
//! class's floor exceeds the best cost found cannot be chosen, nor one that reaches it
//! exactly and comes after the best in the tie order. A class whose least loaded worker
//! is ruled out so rules out the rest of the class, which come after it in load and tie
//! order; any other class is read whole for the workers not ruled out. All in integers:
//! no rounding decides.
use smallvec::SmallVec;

#[cfg(doc)]
use super::policy::CandidateSet;
use super::policy::Policy;
use crate::fleet::{Candidate, Candidates, Estimate, Fleet, NO_CLASS, Tie, Widened, spread};
use crate::index::MirrorView;
use crate::request::RouteRequest;
use crate::tree::Held;
use crate::tree::WorkerId;

/// Writes what each holder holds, in blocks, into its candidate (candidates are in id
/// order).
pub(super) fn fill(candidates: &mut [Candidate], holders: &[(WorkerId, Held)]) {
    for &(worker, held) in holders {
        // Usually one candidate per id from 0.
        let slot = match candidates.get(worker.index()) {
            Some(c) if c.worker == worker => Some(worker.index()),
            _ => candidates.binary_search_by_key(&worker, |c| c.worker).ok(),
        };
        if let Some(c) = slot.map(|i| &mut candidates[i]) {
            c.hold(held);
        }
    }
}

/// Workers [`Classes`] holds on the stack.
const CLASSES_INLINE: usize = 256;

/// A class for each worker [`Classes`] holds on the stack: none.
static NO_CLASSES: [u16; CLASSES_INLINE] = [NO_CLASS; CLASSES_INLINE];

/// The holders of a prompt grouped by what they hold: workers holding alike are scored alike
/// under [`CandidateSet::LeastLoadedPerMatch`].
pub(super) struct Classes {
    /// Class by worker index ([`NO_CLASS`]: holds nothing).
    class_of: SmallVec<[u16; CLASSES_INLINE]>,
    /// What the workers of each class hold.
    held: SmallVec<[Held; 8]>,
    /// How many holders each class has.
    members: SmallVec<[u32; 8]>,
    /// Holders that have a slot in the registry, and the registry's slots, once
    /// [`shortlist`](Self::shortlist) read them: at least the workers holding nothing is
    /// their difference.
    holders: usize,
    slots: usize,
}

/// What a route writes into each candidate it offers its policy, beside the load snapshot
/// and what the worker holds of the prompt.
#[derive(Clone, Copy)]
pub(super) struct Offer<'a> {
    pub(super) block_size: usize,
    /// The prompt's tokens.
    pub(super) tokens: usize,
    /// The fleet's load every candidate of the route carries.
    pub(super) fleet_load: f32,
    /// The mirror, for each worker's KV room.
    pub(super) mirror: MirrorView<'a>,
}

impl Offer<'_> {
    /// Completes `c` (its held blocks set) with its cached tokens, the fleet's load and,
    /// where its capacity is known, its KV room.
    #[inline]
    pub(super) fn complete(&self, c: &mut Candidate) {
        c.set_cached(self.block_size, self.tokens);
        c.set_fleet_load(self.fleet_load);
        if c.estimate.kv_capacity_tokens > 0 {
            let held = self.mirror.blocks_held(c.worker) * self.block_size;
            c.set_held_tokens(held as u64);
        }
    }
}

/// What the policy and the request a shortlist is widened for.
pub(super) struct Scoring<'a, P> {
    pub(super) policy: &'a P,
    pub(super) request: &'a RouteRequest<'a>,
    pub(super) offer: Offer<'a>,
}

impl Classes {
    /// No holders yet: [`group`](Self::group) fills it.
    pub(super) fn new() -> Classes {
        Classes {
            class_of: SmallVec::new(),
            held: SmallVec::new(),
            members: SmallVec::new(),
            holders: 0,
            slots: 0,
        }
    }

    /// Groups `holders` by what they hold (filled in place: the struct is large).
    pub(super) fn group(&mut self, holders: &[(WorkerId, Held)]) {
        let len = holders.iter().map(|h| h.0.index() + 1).max().unwrap_or(0);
        self.holders = holders.len();
        // One copy from a filled array, where `resize` writes element by element.
        match NO_CLASSES.get(..len) {
            Some(vacant) => self.class_of.extend_from_slice(vacant),
            None => self.class_of.resize(len, NO_CLASS),
        }
        for &(worker, held) in holders {
            // Holders come shallowest first, so equal holdings are mostly consecutive.
            let class = match self.held.iter().rposition(|h| *h == held) {
                Some(c) => c,
                None => {
                    self.held.push(held);
                    self.members.push(0);
                    self.held.len() - 1
                }
            };
            self.members[class] += 1;
            self.class_of[worker.index()] = u16::try_from(class).unwrap_or(NO_CLASS);
        }
    }

    /// The least loaded worker of each class and of the workers holding nothing, with what
    /// they hold (in blocks).
    pub(super) fn shortlist(&mut self, fleet: &Fleet, salt: u64, out: &mut Candidates) {
        self.slots = fleet.least_of_each(&self.class_of, self.held.len(), salt, out);
        self.holders = self.class_of.len().min(self.slots).min(self.holders);
        for c in out.iter_mut() {
            if let Some(held) = self.held.get(self.class(c.worker.index())) {
                c.hold(*held);
            }
        }
    }

    /// Worker `i`'s class: the number of classes for a worker holding nothing.
    fn class(&self, i: usize) -> usize {
        let class = self.class_of.get(i).copied().unwrap_or(NO_CLASS);
        usize::from(class).min(self.held.len())
    }

    /// At least how many workers class `class` has.
    fn members(&self, class: usize) -> usize {
        match self.members.get(class) {
            Some(&n) => n as usize,
            None => self.slots.saturating_sub(self.holders),
        }
    }

    /// The choice of `scoring`'s policy among every worker, from the shortlist
    /// `candidates` (cached tokens set) widened to every worker that could cost less than
    /// the cheapest of them (see the module's comment): an index into `candidates`, which
    /// the workers added to end. `None` for a policy that does not bound its cost by load
    /// ([`Policy::cost_above_load_ns`]): its choice among the shortlist is the route's.
    pub(super) fn choose<P: Policy>(
        &self,
        fleet: &Fleet,
        scoring: &Scoring<'_, P>,
        candidates: &mut Candidates,
    ) -> Option<usize> {
        let salt = scoring.request.key();
        let order = |c: &Candidate, beyond: u64| {
            let tie = (
                c.assigned_prefill_tokens(),
                c.routed(),
                spread(salt, c.worker.index()),
            );
            (c.load_ns().saturating_add(beyond), tie)
        };
        let mut leaders: SmallVec<[Leader; 8]> = SmallVec::new();
        let (mut chosen, mut best) = (0, (u64::MAX, (u64::MAX, u64::MAX, u64::MAX)));
        for (i, c) in candidates.iter().enumerate() {
            let beyond = scoring.policy.cost_above_load_ns(scoring.request, c)?;
            let cost = order(c, beyond);
            if cost < best {
                (chosen, best) = (i, cost);
            }
            leaders.push(Leader {
                class: self.class(c.worker.index()),
                beyond,
                tie: cost.1,
            });
        }
        let mut widened = SmallVec::new();
        self.widen(fleet, scoring, (candidates, &leaders), best, &mut widened)?;
        if widened.is_empty() {
            return Some(chosen);
        }
        let offered = candidates.len();
        let classes = (self.class_of.as_slice(), self.held.len());
        fleet.widen(classes, &widened, (best, salt), candidates);
        for i in offered..candidates.len() {
            let c = &mut candidates[i];
            if let Some(held) = self.held.get(self.class(c.worker.index())) {
                c.hold(*held);
            }
            scoring.offer.complete(c);
            let cost = order(c, scoring.policy.cost_above_load_ns(scoring.request, c)?);
            if cost < best {
                (chosen, best) = (i, cost);
            }
        }
        Some(chosen)
    }

    /// Fills `widened` with the classes whose other workers could come before `best`
    /// (their least loaded worker's load plus the class's floor does, in cost then tie
    /// order), each with its floor; `leaders` says of each of `candidates` (the least
    /// loaded of each class) its class, what it costs beyond its load and its tie. A class
    /// of one worker has none other; a least loaded worker as idle as the floor, with its
    /// terms, is its class's floor. `None` when the policy stops answering.
    fn widen<P: Policy>(
        &self,
        fleet: &Fleet,
        scoring: &Scoring<'_, P>,
        (candidates, leaders): (&Candidates, &[Leader]),
        best: (u64, Tie),
        widened: &mut SmallVec<[Widened; 8]>,
    ) -> Option<()> {
        let floor = fleet.floor();
        for (c, leader) in candidates.iter().zip(leaders) {
            if self.members(leader.class) <= 1 {
                continue;
            }
            let floor_beyond = if c.estimate == floor {
                leader.beyond
            } else {
                self.floor_beyond(floor, leader.class, scoring)?
            };
            if (c.load_ns().saturating_add(floor_beyond), leader.tie) < best {
                widened.push((leader.class, floor_beyond));
            }
        }
        Some(())
    }

    /// What an idle worker with the load figures `floor` (the fleet's floor) costs the
    /// policy beyond its load, holding what class `class` holds.
    fn floor_beyond<P: Policy>(
        &self,
        floor: Estimate,
        class: usize,
        scoring: &Scoring<'_, P>,
    ) -> Option<u64> {
        // Its KV room is not set: unknown, it costs nothing, at most what any worker's does.
        let mut idle = Candidate::idle(floor);
        idle.hold(self.held.get(class).copied().unwrap_or_default());
        let offer = scoring.offer;
        idle.set_cached(offer.block_size, offer.tokens);
        idle.set_fleet_load(offer.fleet_load);
        scoring.policy.cost_above_load_ns(scoring.request, &idle)
    }
}

/// What [`Classes::choose`] keeps of a class's least loaded worker.
struct Leader {
    class: usize,
    /// What it costs the policy beyond its load.
    beyond: u64,
    tie: Tie,
}
