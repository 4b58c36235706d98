//! What the router learns of each worker's step times from the timings its host reports: the terms (`timing.rs`), how they are learned with the fleet's as prior (`learn.rs`), each worker compared with the fleet at like shapes (`residuals.rs`), the fleet's least terms under every worker's (`floor.rs`), and the terms admission's forecast is made with (`forecast.rs`).

pub(super) mod floor;
pub(super) mod forecast;
pub(super) mod learn;
pub(super) mod residuals;
pub(super) mod timing;
