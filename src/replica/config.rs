//! How a replica syncs ([`ReplicaConfig`]) and what it tells of it: one frame applied
//! ([`ReplicaOutcome`]), one frame drained ([`Drained`]), everything so far
//! ([`ReplicaStats`]).

use std::time::Duration;

use crate::error::Error;

/// How a router replica syncs with its peers
/// ([`PolicyRouter::with_replica_sync`](crate::PolicyRouter::with_replica_sync)).
///
/// Every replica of a fleet needs its own `replica` id, and a new `incarnation` each time
/// it starts (the host's start time in milliseconds will do): a peer that hears a higher
/// incarnation drops what the old one booked at once, instead of waiting for its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaConfig {
    /// This replica's id, unique in the fleet: frames carrying it are its own echoes and
    /// are ignored.
    pub replica: u64,
    /// This start of the replica; higher than any earlier start's.
    pub incarnation: u64,
    /// A peer not heard from for this long (by the times given to
    /// [`apply_replica_sync`](crate::Router::apply_replica_sync) and carried by requests)
    /// is gone: its bookings are released. Hosts drain a frame at least every third of it
    /// (an empty frame is a heartbeat). Default 10 s.
    pub lease: Duration,
    /// A booking older than this is released even while its peer is heard (a completion
    /// lost, and the peer's watermark held back by a longer request). Default 1 hour, as
    /// Dynamo's replica sync expires its stale requests.
    pub max_age: Duration,
    /// Peers heard at once at most; a frame of another peer beyond them is refused with
    /// [`Error::ReplicaLimit`]. 1 to 4,096; default 64.
    pub max_peers: usize,
    /// Bookings (and records of requests not yet routed) kept per peer at most; beyond it
    /// its oldest requests are released. At least 16; default 16,384.
    pub max_bookings_per_peer: usize,
    /// Bytes of records waiting to be drained at most; records beyond it are dropped and
    /// counted ([`ReplicaStats::records_dropped`]), their requests still covered by the
    /// watermarks. At least 1 KiB; default 4 MiB.
    pub max_pending_bytes: usize,
}

impl ReplicaConfig {
    /// Replica `replica` in its start `incarnation`, with the default bounds.
    #[must_use]
    pub fn new(replica: u64, incarnation: u64) -> Self {
        Self {
            replica,
            incarnation,
            lease: Duration::from_secs(10),
            max_age: Duration::from_secs(3_600),
            max_peers: 64,
            max_bookings_per_peer: 16_384,
            max_pending_bytes: 4 << 20,
        }
    }

    crate::config::setters! {
        /// Sets [`lease`](Self::lease).
        with_lease: lease: Duration;
        /// Sets [`max_age`](Self::max_age).
        with_max_age: max_age: Duration;
        /// Sets [`max_peers`](Self::max_peers).
        with_max_peers: max_peers: usize;
        /// Sets [`max_bookings_per_peer`](Self::max_bookings_per_peer).
        with_max_bookings_per_peer: max_bookings_per_peer: usize;
        /// Sets [`max_pending_bytes`](Self::max_pending_bytes).
        with_max_pending_bytes: max_pending_bytes: usize;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range (a lease or age of
    /// zero, bounds below their minimum).
    pub fn validate(&self) -> Result<(), Error> {
        let positive = |field, d: Duration| {
            if d.is_zero() {
                Err(crate::config::invalid(
                    field,
                    format!("{d:?}"),
                    "a positive duration",
                ))
            } else {
                Ok(())
            }
        };
        positive("lease", self.lease)?;
        positive("max_age", self.max_age)?;
        crate::config::int("max_peers", self.max_peers, 1..=4_096, "1 to 4096 peers")?;
        crate::config::int(
            "max_bookings_per_peer",
            self.max_bookings_per_peer,
            16..,
            "at least 16 bookings",
        )?;
        crate::config::int(
            "max_pending_bytes",
            self.max_pending_bytes,
            1_024..,
            "at least 1024 bytes",
        )
    }
}

/// What applying one frame did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaOutcome {
    /// The frame was this replica's own (an echo from the bus): nothing applied.
    pub echo: bool,
    /// The frame was of an earlier incarnation of its peer: nothing applied.
    pub stale: bool,
    /// The frame was of a new incarnation: the peer's earlier bookings were released.
    pub restarted: bool,
    /// Frames of the peer that never came between the last one heard and this one.
    pub missed_frames: u64,
    /// Records in the frame.
    pub records: u32,
    /// Requests booked on their worker's load.
    pub booked: u32,
    /// Records already applied (duplicates), or of requests already complete.
    pub duplicates: u32,
    /// Routed records naming a target this router does not have: skipped.
    pub unknown_targets: u32,
    /// Bookings released by the frame's watermarks (their records were lost).
    pub released: u32,
}

/// One frame drained ([`Router::drain_replica_sync`](crate::Router::drain_replica_sync)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Records in the frame written (0: a heartbeat; none when sync is off).
    pub records: usize,
    /// Whether records wait still (the frame was full): drain again.
    pub more: bool,
}

/// What a replica's sync did so far, both ways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaStats {
    /// Frames drained.
    pub frames_sent: u64,
    /// Records drained.
    pub records_sent: u64,
    /// Bytes of the frames drained.
    pub bytes_sent: u64,
    /// Records dropped because [`ReplicaConfig::max_pending_bytes`] were waiting.
    pub records_dropped: u64,
    /// Frames applied (peers' frames of their current incarnation).
    pub frames_applied: u64,
    /// Records applied.
    pub records_applied: u64,
    /// Own frames heard back.
    pub echoes: u64,
    /// Frames of earlier incarnations.
    pub stale_frames: u64,
    /// Frames refused: undecodable, another version, or a peer beyond
    /// [`ReplicaConfig::max_peers`].
    pub rejected_frames: u64,
    /// Frames of peers that never came (gaps in their numbers).
    pub missed_frames: u64,
    /// Peers' restarts seen.
    pub restarts: u64,
    /// Peers whose lease ran out.
    pub expired_peers: u64,
    /// Duplicate records, and records of requests already complete.
    pub duplicates: u64,
    /// Routed records naming a target this router does not have.
    pub unknown_targets: u64,
    /// Bookings released by watermarks, age or a full peer table.
    pub released: u64,
    /// Peers heard now.
    pub peers: u64,
    /// Peers' requests booked now.
    pub bookings: u64,
}
