//! What each worker was observed to deliver against what was predicted of it (`worker.rs`), and those factors joined with a route's candidates (`factors.rs`): what admission's observed gates read.

pub(super) mod factors;
pub(super) mod worker;
