use super::arena::NodeId;
use super::*;
use crate::hash::BlockHash;

/// Where a position points: its node and depth.
fn at(p: Option<Position>) -> Option<(NodeId, usize)> {
    p.map(|p| (p.node, p.depth()))
}

fn chained_tree() -> RadixTree {
    RadixTree::with_config(TreeConfig::default().with_chained(true)).unwrap()
}

fn chain(values: &[u64]) -> Vec<BlockHash> {
    values.iter().copied().map(BlockHash::new).collect()
}

const A: WorkerId = WorkerId::new(0);
const B: WorkerId = WorkerId::new(1);

#[test]
fn inserting_a_prefix_of_an_edge_splits_it() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2, 3, 4]));
    assert_eq!(t.node_count(), 1);
    t.insert(B, &chain(&[1, 2]));
    t.validate().unwrap();
    assert_eq!(t.node_count(), 2, "split where the holders differ");
    assert_eq!(t.block_count(), 4);
    let m = t.match_prefix(&chain(&[1, 2, 3, 4]));
    assert_eq!((m.matched_blocks(A), m.matched_blocks(B)), (4, 2));
}

#[test]
fn extending_a_leaf_grows_one_node() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2]));
    t.insert(A, &chain(&[1, 2, 3, 4]));
    t.insert(A, &chain(&[1, 2, 3, 4, 5, 6]));
    t.validate().unwrap();
    assert_eq!(
        t.node_count(),
        1,
        "a conversation that grows stays one node"
    );
    assert_eq!(t.worker_block_count(A), 6);
}

/// A conversation's next turn, routed whole, grows the leaf past the previous turn's last
/// block: the index still finds that block where its position was kept (through drops of
/// stale entries and a split above it), and no longer once the block has left the tree.
#[test]
fn a_kept_position_outlives_its_edge_end() {
    let mut t = chained_tree();
    t.track_positions();
    let three_at = t.insert_path(A, &chain(&[1, 2, 3]), Tier::Device).unwrap();
    let node = three_at.node;
    let (three, four) = (BlockHash::new(3), BlockHash::new(4));
    assert_eq!(at(t.find(three, A)), Some((node, 3)));
    t.keep(three_at);
    t.insert(A, &chain(&[1, 2, 3, 4]));
    t.insert(A, &chain(&[1, 2, 3, 4, 5]));
    // Block 4 ended an edge too, but its position was not kept: it is found until stale
    // entries are dropped, then no longer.
    assert_eq!(at(t.find(four, A)), Some((node, 4)));
    // The leaf grows on (each end left behind a stale entry, enough to drop them), then a
    // split above the block.
    let mut turns = vec![1, 2, 3, 4, 5];
    for p in 6..30 {
        turns.push(p);
        t.insert(A, &chain(&turns));
    }
    t.insert(B, &chain(&[1]));
    t.validate().unwrap();
    assert_eq!(at(t.find(three, A)), Some((node, 3)));
    assert_eq!(t.find(three, B), None, "B does not hold block 3");
    assert_eq!(t.find(four, A), None);
    let mut path = Vec::new();
    t.path_to(three_at, &mut path);
    assert_eq!(path, chain(&[1, 2, 3]));
    // A position kept with a wrong node is never an answer.
    t.keep(Position {
        node: NodeId::from_raw(10_000),
        depth: 2,
        block: BlockHash::new(2),
    });
    t.keep(Position {
        block: BlockHash::new(77),
        ..three_at
    });
    assert_eq!(t.find(BlockHash::new(77), A), None);
    // Evicting down to two blocks takes block 3 out of the tree for A.
    t.truncate(A, &chain(&[1, 2, 3]), 2);
    t.validate().unwrap();
    assert_eq!(t.find(three, A), None);
}

#[test]
fn diverging_at_the_first_block_makes_siblings() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2]));
    t.insert(B, &chain(&[9, 2]));
    t.validate().unwrap();
    assert_eq!(t.node_count(), 2);
    assert_eq!(t.match_prefix(&chain(&[9, 2])).best(), Some((B, 2)));
    assert_eq!(t.match_prefix(&chain(&[1])).best(), Some((A, 1)));
    assert!(t.match_prefix(&chain(&[5])).is_empty());
}

#[test]
fn the_same_prefix_twice_changes_nothing_but_recency() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2, 3]));
    let before = (t.node_count(), t.block_count(), t.worker_block_count(A));
    t.insert(A, &chain(&[1, 2, 3]));
    t.validate().unwrap();
    assert_eq!(
        (t.node_count(), t.block_count(), t.worker_block_count(A)),
        before
    );
}

#[test]
fn a_thousand_and_twenty_four_workers_on_one_node() {
    let mut t = RadixTree::new();
    let blocks = chain(&[7, 8, 9]);
    for w in 0..1024 {
        t.insert(WorkerId::new(w), &blocks);
    }
    t.validate().unwrap();
    assert_eq!(t.node_count(), 1);
    assert_eq!(t.block_count(), 3);
    let m = t.match_prefix(&blocks);
    assert_eq!(m.len(), 1024);
    assert!((0..1024).all(|w| m.matched_blocks(WorkerId::new(w)) == 3));
    assert_eq!(
        m.best(),
        Some((WorkerId::new(0), 3)),
        "ties go to the lowest id"
    );
    t.remove_worker(WorkerId::new(1000));
    t.validate().unwrap();
    assert_eq!(t.match_prefix(&blocks).len(), 1023);
}

#[test]
fn removing_a_middle_block_keeps_what_is_above() {
    let mut t = RadixTree::new();
    let blocks = chain(&[1, 2, 3, 4, 5]);
    t.insert(A, &blocks);
    t.insert(B, &blocks);
    t.remove(A, &blocks[2..3]);
    t.validate().unwrap();
    let m = t.match_prefix(&blocks);
    assert_eq!((m.matched_blocks(A), m.matched_blocks(B)), (2, 5));
    t.remove(B, &blocks);
    t.validate().unwrap();
    assert_eq!(t.worker_block_count(B), 0);
    assert_eq!(t.block_count(), 2);
}

#[test]
fn removing_what_is_not_there_is_a_no_op() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2]));
    t.remove(B, &chain(&[1, 2]));
    t.remove(A, &chain(&[5]));
    t.remove(A, &[]);
    t.remove_worker(WorkerId::new(77));
    t.validate().unwrap();
    assert_eq!(t.worker_block_count(A), 2);
}

#[test]
fn out_of_range_worker_ids_are_ignored() {
    let mut t = RadixTree::new();
    let huge = WorkerId::new(u32::MAX);
    t.insert(huge, &chain(&[1]));
    t.set_capacity(huge, 1);
    t.touch(huge, &chain(&[1]));
    t.validate().unwrap();
    assert_eq!(t.block_count(), 0);
    assert_eq!(t.worker_block_count(huge), 0);
    assert_eq!(t.capacity(huge), usize::MAX);
}

#[test]
fn capacity_evicts_least_recent_deepest_first() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2, 3]));
    t.insert(A, &chain(&[1, 5, 6]));
    t.set_capacity(A, 4);
    t.validate().unwrap();
    // [1, 2, 3] is older: its deepest block goes first; the shared 1 was refreshed.
    let m = t.match_prefix(&chain(&[1, 2, 3]));
    assert_eq!(m.matched_blocks(A), 2);
    assert_eq!(t.match_prefix(&chain(&[1, 5, 6])).matched_blocks(A), 3);
    t.touch(A, &chain(&[1]));
    t.set_capacity(A, 2);
    t.validate().unwrap();
    // Evicted in order: 2 (oldest), then 6 (deepest of the next oldest); 1 was touched.
    assert_eq!(t.match_prefix(&chain(&[1, 2, 3])).matched_blocks(A), 1);
    assert_eq!(t.match_prefix(&chain(&[1, 5, 6])).matched_blocks(A), 2);
}

#[test]
fn global_budget_bounds_the_tree() {
    let config = TreeConfig::default().with_max_blocks(100).with_max_nodes(8);
    let mut t = RadixTree::with_config(config).unwrap();
    for i in 0..1000u64 {
        let blocks: Vec<BlockHash> = (0..10).map(|j| BlockHash::new(i * 100 + j)).collect();
        t.insert(WorkerId::new((i % 3) as u32), &blocks);
        assert!(t.block_count() <= 100 && t.node_count() <= 8);
    }
    t.validate().unwrap();
    // The most recent prompt survives whole.
    let last: Vec<BlockHash> = (0..10).map(|j| BlockHash::new(999 * 100 + j)).collect();
    assert_eq!(t.match_prefix(&last).best(), Some((WorkerId::new(0), 10)));
}

#[test]
fn memory_is_reported_from_real_allocations_and_churn_does_not_leak() {
    let mut t = RadixTree::new();
    let empty = t.memory_bytes();
    for round in 0..20u64 {
        for i in 0..200u64 {
            let blocks: Vec<BlockHash> = (0..32)
                .map(|j| BlockHash::new((round * 1000 + i) << 8 | j))
                .collect();
            t.insert(WorkerId::new((i % 8) as u32), &blocks);
        }
        for w in 0..8 {
            t.remove_worker(WorkerId::new(w));
        }
        t.validate().unwrap();
        assert_eq!((t.node_count(), t.block_count()), (0, 0));
    }
    let after = t.memory_bytes();
    assert!(after > empty, "capacities of the arenas are counted");
    // Churn reuses the arenas instead of growing them: bounded by one round's footprint.
    assert!(
        after < 2 * 200 * 32 * 8 + 200 * 400,
        "{after} bytes after churn"
    );
}

/// Chains that grow and shrink at their ends (event sync's steady state) keep the edge pool
/// within 1.5 × the live blocks: garbage is rewritten away when the pool would otherwise
/// double.
#[test]
fn a_churning_pool_stays_near_its_live_blocks() {
    let mut t = chained_tree();
    let chain = |c: u64, len: u64| -> Vec<BlockHash> {
        (0..len).map(|j| BlockHash::new(c << 20 | j)).collect()
    };
    // 400 chains of up to 64 blocks, each growing by 8 blocks a turn and, once full,
    // cut back to 8 (another chain's growth in between, so extensions move edges).
    let mut len = vec![0u64; 400];
    for turn in 0..40_000usize {
        let c = (turn * 7919) % 400;
        let w = WorkerId::new((c % 4) as u32);
        if len[c] == 64 {
            t.truncate(w, &chain(c as u64, 64), 8);
            len[c] = 8;
        } else {
            len[c] += 8;
            t.insert(w, &chain(c as u64, len[c]));
        }
        if turn % 4_000 == 0 {
            t.validate().unwrap();
        }
    }
    t.validate().unwrap();
    let live = t.block_count();
    assert!(
        t.pool_capacity() <= live + live / 2 + live / 8 + 64,
        "pool capacity {} for {live} live blocks",
        t.pool_capacity()
    );
}

#[test]
fn match_into_reuses_buffers() {
    let mut t = RadixTree::new();
    t.insert(A, &chain(&[1, 2, 3]));
    t.insert(B, &chain(&[1, 2]));
    let mut m = PrefixMatch::new();
    t.match_prefix_into(&chain(&[1, 2, 3]), &mut m);
    assert_eq!((m.matched_blocks(A), m.matched_blocks(B)), (3, 2));
    t.match_prefix_into(&chain(&[9]), &mut m);
    assert!(m.is_empty());
    assert_eq!((m.matched_blocks(A), m.matched_blocks(B)), (0, 0));
    assert_eq!(m.query_blocks(), 1);
}

/// Random operations on a chained tree, shared by the property tests below.
mod random_ops {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    pub(super) enum Op {
        /// A worker inserts a prompt; the number is where a test may cut it.
        Insert(u32, Vec<u32>, usize),
        Truncate(u32, Vec<u32>, usize),
        Capacity(u32, usize),
        RemoveWorker(u32),
    }

    fn prompt() -> impl Strategy<Value = Vec<u32>> {
        // A small alphabet, so prompts share prefixes and split and merge edges often.
        proptest::collection::vec(0u32..3, 1..8)
    }

    pub(super) fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            5 => (0u32..3, prompt(), 1usize..8).prop_map(|(w, p, k)| Op::Insert(w, p, k)),
            2 => (0u32..3, prompt(), 0usize..6).prop_map(|(w, p, k)| Op::Truncate(w, p, k)),
            1 => (0u32..3, 1usize..12).prop_map(|(w, c)| Op::Capacity(w, c)),
            1 => (0u32..3).prop_map(Op::RemoveWorker),
        ];
        proptest::collection::vec(op, 1..60)
    }

    pub(super) fn chained() -> RadixTree {
        super::chained_tree()
    }

    /// Applies `op` to `tree` unless it is an insert (each test inserts its own way).
    pub(super) fn apply_other(tree: &mut RadixTree, hasher: &crate::hash::PrefixHasher, op: &Op) {
        match op {
            Op::Insert(..) => {}
            Op::Truncate(w, p, keep) => tree.truncate(WorkerId::new(*w), &hasher.hash(p), *keep),
            Op::Capacity(w, c) => tree.set_capacity(WorkerId::new(*w), *c),
            Op::RemoveWorker(w) => tree.remove_worker(WorkerId::new(*w)),
        }
    }
}

/// The weak pointers event sync keeps into the tree: a position found from a hint taken at
/// any earlier time is exactly the block's path, held by the worker asked about; right after
/// an insert its hint finds the inserted block (unless the worker's capacity evicted it).
mod positions {
    use super::random_ops::{Op, apply_other, chained, ops};
    use super::*;
    use crate::hash::PrefixHasher;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_position_is_the_blocks_path_or_nothing(ops in ops()) {
            let hasher = PrefixHasher::new(1).unwrap();
            let mut tree = chained();
            // (worker, path, hint) for every inserted prefix of every inserted prompt.
            let mut hints: Vec<(WorkerId, Vec<BlockHash>, Position)> = Vec::new();
            let mut out = Vec::new();
            for op in &ops {
                if let Op::Insert(w, p, _) = op {
                    let (w, blocks) = (WorkerId::new(*w), hasher.hash(p));
                    let end = tree.insert_path(w, &blocks, Tier::Device).unwrap();
                    // Unless the worker's capacity evicted it at once.
                    if tree.held_prefix(w, &blocks) == blocks.len() {
                        prop_assert_eq!(tree.resolve(end, w), Some(end));
                        prop_assert_eq!(tree.find_path(&blocks), Some(end));
                    }
                    for k in 1..=blocks.len() {
                        let Some(found) = tree.find_path(&blocks[..k]) else {
                            continue;
                        };
                        hints.push((w, blocks[..k].to_vec(), found));
                        if k > 1 {
                            // A hint below the block: the position is found walking up.
                            let above = Position { depth: k as u32 - 1, block: blocks[k - 2], ..found };
                            hints.push((w, blocks[..k - 1].to_vec(), above));
                        }
                    }
                }
                apply_other(&mut tree, &hasher, op);
                tree.validate().map_err(TestCaseError::fail)?;
                for (w, path, hint) in &hints {
                    let Some(found) = tree.resolve(*hint, *w) else {
                        continue;
                    };
                    tree.path_to(found, &mut out);
                    prop_assert_eq!(&out, path);
                    prop_assert_eq!(tree.held_prefix(*w, path), path.len());
                    prop_assert_eq!(tree.find_path(path).map(|p| p.node), Some(found.node));
                }
            }
        }
    }
}

/// The last-block index that event sync turns on: whatever the operations and whenever it is
/// turned on, every edge's last block is indexed (`validate`), and a found block comes with
/// exactly its path, held by the worker asked about, also where positions were kept
/// (`keep_position`, at random blocks, workers and hints) and the tree changed since.
mod last_block_index {
    use super::random_ops::{Op, apply_other, chained, ops};
    use super::*;
    use crate::hash::PrefixHasher;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_edge_end_is_found_with_its_path(ops in ops(), index_from in 0usize..60) {
            let hasher = PrefixHasher::new(1).unwrap();
            let mut tree = chained();
            let mut seen: Vec<Vec<BlockHash>> = Vec::new();
            let mut out = Vec::new();
            let mut last_end = None;
            for (i, op) in ops.iter().enumerate() {
                if i == index_from {
                    tree.track_positions();
                }
                if let Op::Insert(w, p, _) = op {
                    let blocks = hasher.hash(p);
                    last_end = tree.insert_path(WorkerId::new(*w), &blocks, Tier::Device).map(|p| p.node);
                    seen.push(blocks);
                }
                apply_other(&mut tree, &hasher, op);
                if !seen.is_empty() {
                    // Keep a position: a block of an earlier prompt, hinted at by the node
                    // holding it or, as a stale tip might, by another node.
                    let p = &seen[i * 31 % seen.len()];
                    let k = i * 7 % p.len() + 1;
                    let hint = match i % 4 {
                        0 => tree.find_path(&p[..k]).map(|p| p.node),
                        1 => tree.find_path(p).map(|p| p.node),
                        2 => last_end,
                        // A node id the tree never had.
                        _ => Some(NodeId::from_raw(10_000 + i as u32)),
                    };
                    if let Some(node) = hint {
                        tree.keep(Position { node, depth: k as u32, block: p[k - 1] });
                    }
                }
                tree.validate().map_err(TestCaseError::fail)?;
                for p in &seen {
                    for k in 1..=p.len() {
                        for w in 0..3 {
                            let worker = WorkerId::new(w);
                            if let Some(found) = tree.find(p[k - 1], worker) {
                                prop_assert!(i >= index_from, "answered before the index was on");
                                prop_assert_eq!(found.depth(), k);
                                tree.path_to(found, &mut out);
                                prop_assert_eq!(&out[..], &p[..k]);
                                prop_assert_eq!(tree.held_prefix(worker, &out), k);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `insert_below` (an insert continuing a known position, without its path) leaves the tree
/// exactly as `insert` of the whole path does, and `remove_tier_at` (from a known position) as
/// `truncate`: two trees, one fed each way, agree on every answer, count and later eviction.
mod insert_below {
    use super::random_ops::{Op, apply_other, chained, ops};
    use super::*;
    use crate::hash::PrefixHasher;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn inserting_below_a_position_is_inserting_the_path(ops in ops()) {
            let hasher = PrefixHasher::new(1).unwrap();
            let (mut below, mut whole) = (chained(), chained());
            let mut seen: Vec<Vec<BlockHash>> = Vec::new();
            let mut used = 0;
            for op in &ops {
                if let Op::Insert(w, p, k) = op {
                    let (w, blocks) = (WorkerId::new(*w), hasher.hash(p));
                    // Continue from the first `k` blocks where the tree has them for `w`.
                    let k = (*k).min(blocks.len() - 1);
                    let found = (k > 0)
                        .then(|| below.find_path(&blocks[..k]))
                        .flatten()
                        .and_then(|at| below.resolve(at, w));
                    if found.is_some_and(|at| below.insert_below(w, at, &blocks[k..], Tier::Device).is_some()) {
                        used += 1;
                    } else {
                        below.insert(w, &blocks);
                    }
                    whole.insert(w, &blocks);
                    seen.push(blocks);
                }
                match op {
                    // Truncate from a position found ahead (the node holding the first
                    // dropped block, or the path's last), as event sync does.
                    Op::Truncate(w, p, keep) => {
                        let (w, blocks) = (WorkerId::new(*w), hasher.hash(p));
                        let hint = if keep % 2 == 0 {
                            below.find_path(&blocks[..(*keep + 1).min(blocks.len())])
                        } else {
                            below.find_path(&blocks)
                        };
                        match hint {
                            Some(hint) if *keep < blocks.len() => {
                                let first_dropped = Position {
                                    depth: *keep as u32 + 1,
                                    block: blocks[*keep],
                                    ..hint
                                };
                                below.remove_tier_at(w, first_dropped, Tier::Device);
                            }
                            _ => below.truncate(w, &blocks, *keep),
                        }
                    }
                    _ => apply_other(&mut below, &hasher, op),
                }
                apply_other(&mut whole, &hasher, op);
                below.validate().map_err(TestCaseError::fail)?;
                prop_assert_eq!(below.block_count(), whole.block_count());
                prop_assert_eq!(below.node_count(), whole.node_count());
                for p in &seen {
                    let (a, b) = (below.match_prefix(p), whole.match_prefix(p));
                    for w in 0..3 {
                        let w = WorkerId::new(w);
                        prop_assert_eq!(a.matched_blocks(w), b.matched_blocks(w));
                        prop_assert_eq!(below.worker_block_count(w), whole.worker_block_count(w));
                    }
                }
            }
            // Not vacuous: most runs continue below a position at least once.
            prop_assume!(used > 0);
        }
    }
}

/// `insert_to` (an insert of the path to a known position, without the path) leaves the tree
/// exactly as an insert of that path does, and `below` finds the block a path continues with
/// where a walk from the root finds it: two trees, one fed each way, agree on every answer,
/// count and later eviction.
mod insert_to {
    use super::random_ops::{Op, apply_other, chained, ops};
    use super::*;
    use crate::hash::PrefixHasher;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn inserting_to_a_position_is_inserting_its_path(ops in ops()) {
            let hasher = PrefixHasher::new(1).unwrap();
            let (mut to, mut whole) = (chained(), chained());
            let mut seen: Vec<Vec<BlockHash>> = Vec::new();
            let mut used = 0;
            let mut out = Vec::new();
            for op in &ops {
                if let Op::Insert(w, p, k) = op {
                    let (w, blocks) = (WorkerId::new(*w), hasher.hash(p));
                    // The prompt, then its first `k` blocks again at the host tier, from
                    // their position where the tree has them for `w` (its capacity may
                    // have evicted them at once).
                    to.insert(w, &blocks);
                    whole.insert(w, &blocks);
                    let k = (*k).min(blocks.len());
                    let found = to.find_path(&blocks[..k]).and_then(|at| to.resolve(at, w));
                    if let Some(at) = found {
                        prop_assert!(to.insert_to(w, at, Tier::Host).is_some());
                        whole.insert_at(w, &blocks[..k], Tier::Host);
                        used += 1;
                    }
                    seen.push(blocks);
                }
                apply_other(&mut to, &hasher, op);
                apply_other(&mut whole, &hasher, op);
                to.validate().map_err(TestCaseError::fail)?;
                prop_assert_eq!(to.block_count(), whole.block_count());
                prop_assert_eq!(to.node_count(), whole.node_count());
                for p in &seen {
                    let (a, b) = (to.match_prefix(p), whole.match_prefix(p));
                    for w in 0..3 {
                        let w = WorkerId::new(w);
                        prop_assert_eq!(a.matched_blocks(w), b.matched_blocks(w));
                        prop_assert_eq!(a.matched_blocks_at(w, Tier::Host), b.matched_blocks_at(w, Tier::Host));
                        prop_assert_eq!(to.worker_block_count(w), whole.worker_block_count(w));
                    }
                    for k in 1..p.len() {
                        let Some(at) = to.find_path(&p[..k]) else { continue };
                        let next = to.below(at, p[k]);
                        prop_assert_eq!(next.map(|n| (n.depth(), n.block())), to.find_path(&p[..=k]).map(|n| (n.depth(), n.block())));
                        if let Some(next) = next {
                            to.path_to(to.ancestor(next, k + 1).unwrap(), &mut out);
                            prop_assert_eq!(&out[..], &p[..=k]);
                        }
                    }
                }
            }
            prop_assume!(used > 0);
        }
    }
}
