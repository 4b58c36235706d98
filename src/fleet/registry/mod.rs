//! The workers by id: slots of lock-free counters and the column of load keys (`slots.rs`), one worker's load state reconciled from its report and the router's counts (`state.rs`), and the least-loaded pass over the keys with the tie-break every policy shares (`least.rs`).

pub(super) mod least;
pub(super) mod slots;
pub(super) mod state;
