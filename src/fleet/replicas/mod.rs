//! Peer router replicas' requests: each worker's counts of them beside its own and the table of every peer's bookings (`peers.rs`), and their sync frames applied to the fleet (`booking.rs`).

pub(super) mod booking;
pub(super) mod peers;
