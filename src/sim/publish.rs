//! What a worker publishes: its pool's and host tier's changes as engine events, in the form
//! vLLM's KV events take.
//!
//! A run of blocks cached one after another, each the parent of the next (a request's
//! blocks filled in one step), is one `Stored` event naming them all after the run's
//! parent, as vLLM's block pool reports a request's newly full blocks at once; each eviction
//! is its own `Removed` event, as vLLM reports them. After every pool change (a chunk is
//! copied once its blocks are cached), consecutive host-tier copies are one placeholder
//! store naming each chunk by its last block, in the order recorded (root first within a
//! copy), and each drop is a host-tier removal.
//!
//! Contract: the events name the same blocks, in the same order, with the same parents and
//! tokens, as one event per change would; only consecutive changes of one kind share an
//! event.

use super::host::HostChange;
use super::pool::{PoolChange, PoolLog};
use crate::sync::CacheEvent;
use crate::tree::Tier;

/// The events of one batch: `pool`'s changes, then `host`'s.
pub(super) fn events(pool: &PoolLog, host: &[HostChange]) -> Vec<CacheEvent> {
    let mut events = Vec::with_capacity(pool.changes.len() + host.len());
    let mut run: Option<Run> = None;
    for change in &pool.changes {
        match change {
            PoolChange::Cached {
                hash,
                parent,
                tokens,
            } => match &mut run {
                Some(r) if *parent == Some(r.last()) && tokens.start == r.tokens.end => {
                    r.blocks.push(hash.get());
                    r.tokens.end = tokens.end;
                }
                _ => {
                    events.extend(run.take().map(|r| r.event(pool)));
                    run = Some(Run {
                        parent: parent.map(|p| p.get()),
                        blocks: vec![hash.get()],
                        tokens: tokens.clone(),
                    });
                }
            },
            PoolChange::Evicted(hash) => {
                events.extend(run.take().map(|r| r.event(pool)));
                events.push(CacheEvent::removed(vec![hash.get()]));
            }
        }
    }
    events.extend(run.map(|r| r.event(pool)));
    host_events(host, &mut events);
    events
}

/// The host tier's changes as events: consecutive copies (each refresh's root first) are
/// one placeholder store naming their chunks in that order, as vLLM's offloading connector
/// reports a store; each drop is a host-tier removal.
fn host_events(host: &[HostChange], events: &mut Vec<CacheEvent>) {
    let mut copied: Vec<u64> = Vec::new();
    for change in host {
        match *change {
            HostChange::Stored(last) => copied.push(last.get()),
            HostChange::Dropped(last) => {
                if !copied.is_empty() {
                    events.push(CacheEvent::placeholder(
                        std::mem::take(&mut copied),
                        Tier::Host,
                    ));
                }
                events.push(CacheEvent::removed(vec![last.get()]).with_tier(Tier::Host));
            }
        }
    }
    if !copied.is_empty() {
        events.push(CacheEvent::placeholder(copied, Tier::Host));
    }
}

/// Blocks cached one after another, each the parent of the next.
struct Run {
    parent: Option<u64>,
    blocks: Vec<u64>,
    /// Their tokens in the log.
    tokens: std::ops::Range<usize>,
}

impl Run {
    /// The run's last block.
    fn last(&self) -> crate::hash::BlockHash {
        crate::hash::BlockHash::new(self.blocks[self.blocks.len() - 1])
    }

    fn event(self, log: &PoolLog) -> CacheEvent {
        CacheEvent::stored(self.parent, self.blocks, log.tokens[self.tokens].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::BlockHash;

    fn h(i: u64) -> BlockHash {
        BlockHash::new(i)
    }

    /// The log of `changes`, each cached block with two tokens (`hash × 10` and the next).
    fn log(changes: &[PoolChange]) -> PoolLog {
        let mut log = PoolLog::default();
        for change in changes {
            match change {
                PoolChange::Cached { hash, parent, .. } => {
                    let start = log.tokens.len();
                    let t = hash.get() as crate::hash::TokenId * 10;
                    log.tokens.extend([t, t + 1]);
                    log.changes.push(PoolChange::Cached {
                        hash: *hash,
                        parent: *parent,
                        tokens: start..log.tokens.len(),
                    });
                }
                evicted => log.changes.push(evicted.clone()),
            }
        }
        log
    }

    fn cached(hash: u64, parent: Option<u64>) -> PoolChange {
        PoolChange::Cached {
            hash: h(hash),
            parent: parent.map(h),
            tokens: 0..0,
        }
    }

    #[test]
    fn a_chained_run_is_one_store_and_anything_else_starts_another() {
        let pool = log(&[
            cached(1, None),
            cached(2, Some(1)),
            cached(3, Some(2)),
            cached(7, Some(5)), // another request's block
            PoolChange::Evicted(h(9)),
            cached(8, Some(7)),
        ]);
        let host = [
            HostChange::Stored(h(1)),
            HostChange::Stored(h(2)),
            HostChange::Dropped(h(4)),
            HostChange::Stored(h(3)),
        ];
        let events = events(&pool, &host);
        assert_eq!(
            events,
            [
                CacheEvent::stored(None, vec![1, 2, 3], vec![10, 11, 20, 21, 30, 31]),
                CacheEvent::stored(Some(5), vec![7], vec![70, 71]),
                CacheEvent::removed(vec![9]),
                CacheEvent::stored(Some(7), vec![8], vec![80, 81]),
                CacheEvent::placeholder(vec![1, 2], Tier::Host),
                CacheEvent::removed(vec![4]).with_tier(Tier::Host),
                CacheEvent::placeholder(vec![3], Tier::Host),
            ]
        );
    }
}
