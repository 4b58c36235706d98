//! Which candidates a route offers its policy: every available worker with what the mirror
//! says each holds ([`fill`]), or the shortlist of [`CandidateSet::LeastLoadedPerMatch`]
//! (the least loaded of each class of workers holding a prompt alike, [`Classes`]).

use smallvec::SmallVec;

#[cfg(doc)]
use super::policy::CandidateSet;
use crate::fleet::{Candidate, Candidates, Fleet, NO_CLASS};
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
}

impl Classes {
    pub(super) fn of(holders: &[(WorkerId, Held)]) -> Classes {
        let len = holders.iter().map(|h| h.0.index() + 1).max().unwrap_or(0);
        let mut classes = Classes {
            class_of: SmallVec::new(),
            held: SmallVec::new(),
        };
        // One copy from a filled array, where `resize` writes element by element.
        match NO_CLASSES.get(..len) {
            Some(vacant) => classes.class_of.extend_from_slice(vacant),
            None => classes.class_of.resize(len, NO_CLASS),
        }
        for &(worker, held) in holders {
            // Holders come shallowest first, so equal holdings are mostly consecutive.
            let class = match classes.held.iter().rposition(|h| *h == held) {
                Some(c) => c,
                None => {
                    classes.held.push(held);
                    classes.held.len() - 1
                }
            };
            classes.class_of[worker.index()] = u16::try_from(class).unwrap_or(NO_CLASS);
        }
        classes
    }

    /// The least loaded worker of each class and of the workers holding nothing, with what
    /// they hold (in blocks).
    pub(super) fn shortlist(&self, fleet: &Fleet, salt: u64, out: &mut Candidates) {
        fleet.least_of_each(&self.class_of, self.held.len(), salt, out);
        for c in out.iter_mut() {
            let class = self
                .class_of
                .get(c.worker.index())
                .copied()
                .unwrap_or(NO_CLASS);
            if let Some(held) = self.held.get(usize::from(class)) {
                c.hold(*held);
            }
        }
    }
}
