//! What is forecast of a request on a worker: the worker's load figures at one instant (`estimate.rs`) and the predictions over them, the one place a request's time to first token and per output token are computed (`predict.rs`).

pub(super) mod estimate;
pub(super) mod predict;
