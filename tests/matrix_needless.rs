//! The results matrix's needless sheds (`examples/simulate/needless.rs`): a run with
//! admission joined by request index to the same run without it. The tests are the
//! module's own.

#![cfg(feature = "sim")]

#[path = "../examples/simulate/needless.rs"]
mod needless;
