//! [`Outbox`]: a replica's records waiting to be drained, its request numbers and the
//! requests it still has open (the watermarks every frame carries).

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::config::{Drained, ReplicaConfig, ReplicaStats};
use super::wire::{self, FIXED_HEADER, Header, MAX_RECORDS, Shape};
use crate::hash::BlockHash;

/// A replica's side of sync that sends: records encoded as they happen, drained into
/// frames by the host.
#[derive(Debug)]
pub(crate) struct Outbox {
    config: ReplicaConfig,
    pending: Mutex<Pending>,
}

/// What the outbox's lock guards.
///
/// Invariants: `ends` is increasing and its last entry is `bytes.len()` (each entry the
/// end of one encoded record); `awaiting ⊆ open`; every number in `open` is below `next`.
#[derive(Debug)]
struct Pending {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// The next request's number (numbers start at 1).
    next: u64,
    /// The next frame's number.
    seq: u64,
    /// Requests routed and not completed.
    open: BTreeSet<u64>,
    /// Of those, requests whose first token has not come.
    awaiting: BTreeSet<u64>,
    stats: ReplicaStats,
}

impl Outbox {
    /// An empty outbox for the replica `config` describes (validated).
    pub(crate) fn new(config: ReplicaConfig) -> Self {
        Self {
            config,
            pending: Mutex::new(Pending {
                bytes: Vec::new(),
                ends: Vec::new(),
                next: 1,
                seq: 0,
                open: BTreeSet::new(),
                awaiting: BTreeSet::new(),
                stats: ReplicaStats::default(),
            }),
        }
    }

    /// The replica's configuration.
    pub(crate) fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while holding the lock; a poisoned lock still holds valid data.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request was routed: records it and returns its number.
    pub(crate) fn routed(
        &self,
        (endpoint, rank): (u32, u32),
        (prompt, prefill, output): (u64, u64, u32),
        blocks: &[BlockHash],
    ) -> u64 {
        let mut p = self.lock();
        let request = p.next;
        p.next += 1;
        p.open.insert(request);
        p.awaiting.insert(request);
        let shape = Shape {
            endpoint,
            rank,
            prompt,
            prefill,
            output,
        };
        let blocks = &blocks[..blocks.len().min(wire::MAX_BLOCKS)];
        p.push(self.config.max_pending_bytes, |out| {
            wire::write_routed(out, request, shape, blocks);
        });
        request
    }

    /// Request `request`'s first token came (recorded once).
    pub(crate) fn first_token(&self, request: u64) {
        let mut p = self.lock();
        if p.awaiting.remove(&request) {
            p.push(self.config.max_pending_bytes, |out| {
                wire::write_mark_first(out, request);
            });
        }
    }

    /// Request `request` completed (recorded once).
    pub(crate) fn completed(&self, request: u64) {
        let mut p = self.lock();
        if p.open.remove(&request) {
            p.awaiting.remove(&request);
            p.push(self.config.max_pending_bytes, |out| {
                wire::write_mark_completed(out, request);
            });
        }
    }

    /// Replaces `out` with one frame of the records waiting, as many as fit in `max_bytes`
    /// (at least one), oldest first.
    pub(crate) fn drain(&self, out: &mut Vec<u8>, max_bytes: usize) -> Drained {
        let mut p = self.lock();
        let room = max_bytes.saturating_sub(FIXED_HEADER + 30);
        let fit = p.ends.partition_point(|&end| end <= room).max(1);
        let n = fit.min(p.ends.len()).min(MAX_RECORDS);
        let cut = if n == 0 { 0 } else { p.ends[n - 1] };
        let header = Header {
            replica: self.config.replica,
            incarnation: self.config.incarnation,
            seq: p.seq,
            open: p.open.first().copied().unwrap_or(p.next),
            awaiting: p.awaiting.first().copied().unwrap_or(p.next),
        };
        out.clear();
        header.write(n, out);
        out.extend_from_slice(&p.bytes[..cut]);
        p.bytes.drain(..cut);
        p.ends.drain(..n);
        for end in &mut p.ends {
            *end -= cut;
        }
        // A heartbeat carries no record: the next frame may take its number.
        p.seq += u64::from(n > 0);
        p.stats.frames_sent += 1;
        p.stats.records_sent += n as u64;
        p.stats.bytes_sent += out.len() as u64;
        Drained {
            records: n,
            more: !p.ends.is_empty(),
        }
    }

    /// Adds what the outbox counted to `stats`.
    pub(crate) fn stats_into(&self, stats: &mut ReplicaStats) {
        let p = self.lock();
        stats.frames_sent = p.stats.frames_sent;
        stats.records_sent = p.stats.records_sent;
        stats.bytes_sent = p.stats.bytes_sent;
        stats.records_dropped = p.stats.records_dropped;
    }
}

impl Pending {
    /// Appends the record `write` writes, unless `max_bytes` are waiting already (then it
    /// is dropped and counted).
    fn push(&mut self, max_bytes: usize, write: impl FnOnce(&mut Vec<u8>)) {
        if self.bytes.len() >= max_bytes || self.ends.len() >= MAX_RECORDS {
            self.stats.records_dropped += 1;
            return;
        }
        write(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::{Frame, Record};

    fn outbox() -> Outbox {
        Outbox::new(ReplicaConfig::new(3, 9).with_max_pending_bytes(1_024))
    }

    fn drain(o: &Outbox, max: usize) -> (Frame, Drained) {
        let mut out = Vec::new();
        let d = o.drain(&mut out, max);
        (Frame::decode(&out).unwrap(), d)
    }

    #[test]
    fn frames_carry_records_in_order_and_the_watermarks() {
        let o = outbox();
        let a = o.routed((1, 0), (40, 32, 8), &[BlockHash::new(5)]);
        let b = o.routed((2, 0), (16, 16, 8), &[]);
        o.first_token(a);
        o.first_token(a); // once
        o.completed(a);
        let (f, d) = drain(&o, usize::MAX);
        assert_eq!((f.replica, f.incarnation, f.seq), (3, 9, 0));
        assert_eq!((f.open, f.awaiting), (b, b));
        assert_eq!(f.records.len(), 4);
        assert_eq!(f.records[3], Record::Completed { request: a });
        assert_eq!(
            d,
            Drained {
                records: 4,
                more: false
            }
        );
        o.completed(b);
        let (f, d) = drain(&o, usize::MAX);
        assert_eq!((f.seq, f.open, f.awaiting, d.records), (1, 3, 3, 1));
        let (f, d) = drain(&o, usize::MAX);
        assert_eq!((f.seq, d.records, f.records.len()), (2, 0, 0)); // a heartbeat
        o.routed((0, 0), (16, 16, 1), &[]);
        assert_eq!(
            drain(&o, usize::MAX).0.seq,
            2,
            "a heartbeat's number is taken again"
        );
    }

    #[test]
    fn a_small_frame_leaves_the_rest_waiting() {
        let o = outbox();
        for _ in 0..5 {
            o.routed((0, 0), (160, 160, 1), &[BlockHash::new(1); 10]);
        }
        let (f, d) = drain(&o, 200);
        assert_eq!((f.records.len(), d.more), (1, true));
        let (f, d) = drain(&o, 10_000);
        assert_eq!((f.records.len(), d.more), (4, false));
    }

    #[test]
    fn records_beyond_the_bound_are_dropped_and_counted() {
        let o = outbox();
        for _ in 0..20 {
            o.routed((0, 0), (160, 160, 1), &[BlockHash::new(1); 10]);
        }
        let mut stats = ReplicaStats::default();
        o.stats_into(&mut stats);
        assert!(stats.records_dropped > 0);
        let (f, _) = drain(&o, usize::MAX);
        assert_eq!(f.records.len() as u64 + stats.records_dropped, 20);
        assert_eq!(f.open, 1, "dropped records' requests are still open");
    }
}
