//! `RadixTree::validate`: every structural invariant, checked from scratch.

use core::cmp::Reverse;

use super::radix::{INDEX_SLACK, Indexed, Linked, NIL, ROOT, RadixTree, bits};

impl RadixTree {
    /// Checks every invariant of the tree and returns the first violation found.
    ///
    /// Checked: parent/child links, the child map, compressed edges (no node that could be
    /// merged with its only child), membership shrinking from root to leaf, holdings and
    /// their recency (a child never more recent than its parent), per-worker block counts
    /// and capacities, both LRU lists (complete and ordered), and the edge pool's
    /// accounting. Cost: O(size of the tree). Meant for tests and fuzzing.
    ///
    /// # Errors
    ///
    /// A description of the first broken invariant.
    pub fn validate(&self) -> Result<(), String> {
        let fail = |msg: String| Err(msg);
        let mut live = 0usize;
        let mut blocks = 0usize;
        let mut member_bits = 0usize;
        let mut child_links = 0usize;
        for (id, n) in self.nodes.iter().enumerate() {
            let id = id as u32;
            if id != ROOT && n.parent == NIL {
                continue; // free
            }
            // Child list: back links, parents, count.
            let mut prev = NIL;
            let mut c = n.first_child;
            while c != NIL {
                let child = &self.nodes[c as usize];
                if child.parent != id || child.prev_sibling != prev {
                    return fail(format!("node {c}: bad parent/sibling links under {id}"));
                }
                if id != ROOT && child.stamp > n.stamp {
                    return fail(format!("node {c} is more recent than its parent {id}"));
                }
                child_links += 1;
                prev = c;
                c = child.next_sibling;
            }
            if id == ROOT {
                if n.edge_len != 0 || self.words(ROOT).iter().any(|&w| w != 0) {
                    return fail("the root holds blocks".into());
                }
                continue;
            }
            live += 1;
            blocks += n.edge_len as usize;
            if n.edge_len == 0 || (n.edge_start + n.edge_len) as usize > self.pool.len() {
                return fail(format!("node {id}: empty or out-of-pool edge"));
            }
            if self.edge(id).last() != Some(&n.last) {
                return fail(format!("node {id}: stale copy of the edge's last block"));
            }
            let p = &self.nodes[n.parent as usize];
            if !self.alive(n.parent) || n.depth != p.depth + p.edge_len {
                return fail(format!("node {id}: dead parent or wrong depth"));
            }
            if self.child(n.parent, self.edge(id)[0]) != Some(id) {
                return fail(format!("node {id}: missing from the child map"));
            }
            let words = self.words(id);
            if words.iter().all(|&w| w == 0) {
                return fail(format!("node {id}: held by nobody"));
            }
            if n.parent != ROOT
                && words
                    .iter()
                    .zip(self.words(n.parent))
                    .any(|(&c, &p)| c & !p != 0)
            {
                return fail(format!("node {id}: a holder does not hold the parent"));
            }
            for w in bits(words) {
                member_bits += 1;
                let Some(h) = self.holding_of(id, w) else {
                    return fail(format!("node {id}: worker {w} has no holding"));
                };
                let holding = &self.holdings[h as usize];
                if holding.node != id || holding.worker as usize != w {
                    return fail(format!("holding {h}: wrong node or worker"));
                }
                if holding.stamp > n.stamp {
                    return fail(format!("node {id}: holding more recent than the node"));
                }
                if n.parent != ROOT {
                    let ph = self
                        .holding_of(n.parent, w)
                        .map(|h| self.holdings[h as usize]);
                    if ph.is_none_or(|ph| ph.stamp < holding.stamp) {
                        return fail(format!("node {id}: worker {w} more recent than parent"));
                    }
                }
            }
            if self.mergeable(id).is_some() {
                return fail(format!("node {id}: could be merged with its only child"));
            }
            let end = n.depth + n.edge_len;
            if self.last_indexed
                && self
                    .by_last
                    .get(&n.last)
                    .is_none_or(|e| e.node != id || e.depth & !Indexed::KEPT != end)
            {
                return fail(format!("node {id}: missing from the last-block index"));
            }
        }
        if child_links != live || self.children.len() != live {
            return fail(format!(
                "{live} nodes, {child_links} child links, {} map entries",
                self.children.len()
            ));
        }
        if self.last_indexed && self.by_last.len() > 2 * self.index_bound + INDEX_SLACK {
            return fail(format!(
                "{live} nodes, {} last-block index entries (stale ones not dropped)",
                self.by_last.len()
            ));
        }
        if live + 1 != self.live_nodes
            || self.live_nodes + self.free_nodes.len() != self.nodes.len()
        {
            return fail("node counts disagree".into());
        }
        if blocks != self.block_count || blocks + self.garbage != self.pool.len() {
            return fail(format!(
                "{blocks} blocks in edges, block_count {}, pool {} with {} garbage",
                self.block_count,
                self.pool.len(),
                self.garbage
            ));
        }
        let live_holdings = self.holdings.len() - self.free_holdings.len();
        if member_bits != self.holding_index.len() || member_bits != live_holdings {
            return fail("holding counts disagree".into());
        }
        // Global LRU: every live node once, ordered by recency then deepest first.
        let key = |n: u32| {
            let node = &self.nodes[n as usize];
            (node.stamp, Reverse(node.depth))
        };
        let listed = walk(
            &self.nodes,
            self.lru.head,
            self.lru.tail,
            |n| self.alive(n),
            key,
        )
        .map_err(|e| format!("global LRU: {e}"))?;
        if listed != live {
            return fail(format!("global LRU lists {listed} of {live} nodes"));
        }
        // Per worker.
        for (w, state) in self.workers.iter().enumerate() {
            let key = |h: u32| {
                let holding = &self.holdings[h as usize];
                (
                    holding.stamp,
                    Reverse(self.nodes[holding.node as usize].depth),
                )
            };
            let valid = |h: u32| {
                let holding = &self.holdings[h as usize];
                holding.node != NIL && holding.worker as usize == w
            };
            let listed = walk(&self.holdings, state.list.head, state.list.tail, valid, key)
                .map_err(|e| format!("worker {w} LRU: {e}"))?;
            let mut held = 0;
            let mut h = state.list.head;
            while h != NIL {
                held += self.nodes[self.holdings[h as usize].node as usize].edge_len as usize;
                h = self.holdings[h as usize].next;
            }
            if listed != state.holdings || held != state.blocks {
                return fail(format!("worker {w}: counts disagree with its list"));
            }
            if state.blocks > state.capacity {
                return fail(format!("worker {w}: above its capacity"));
            }
        }
        Ok(())
    }
}

/// Walks an intrusive list: back links, tail, validity of every item, and ordering by `key`
/// (non-decreasing). Returns the number of items.
fn walk<T: Linked, K: Ord>(
    items: &[T],
    head: u32,
    tail: u32,
    valid: impl Fn(u32) -> bool,
    key: impl Fn(u32) -> K,
) -> Result<usize, String> {
    let mut count = 0;
    let mut prev = NIL;
    let mut i = head;
    while i != NIL {
        if count > items.len() || !valid(i) || items[i as usize].links().0 != prev {
            return Err(format!("bad item or link at {i}"));
        }
        if prev != NIL && key(prev) > key(i) {
            return Err(format!("out of order at {i}"));
        }
        count += 1;
        prev = i;
        i = items[i as usize].links().1;
    }
    if prev != tail {
        return Err("wrong tail".into());
    }
    Ok(count)
}
