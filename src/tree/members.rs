//! Holder bitsets: which workers hold each node, and at which storage tier.
//!
//! Every node has `planes` bitsets of `stride` words (one bit per worker index). Plane 0 is
//! the node's holders. Once a block is held below the device tier, three more planes are
//! kept: a holder's bit is set in plane `p` (1 to 3) when its best tier for the node is at
//! index `p` or below ([`Tier::index`](super::Tier::index): host 1, disk 2, remote 3), so a
//! walk reads a holder's best tier from a few bits. A tree holding only device blocks keeps
//! one plane and pays nothing for tiers.

/// The planes of every node, node by node.
#[derive(Clone, Debug)]
pub(super) struct Members {
    words: Vec<u64>,
    /// Words per plane.
    stride: usize,
    /// Planes per node: 1 (holders) or [`TIERED_PLANES`].
    planes: usize,
    /// Words per node: `stride × planes`.
    per_node: usize,
}

/// Planes per node once tiers are kept: holders, then best tier ≥ host, ≥ disk, ≥ remote.
const TIERED_PLANES: usize = 4;

#[inline]
fn bit(w: usize) -> (usize, u64) {
    (w / 64, 1 << (w % 64))
}

impl Members {
    /// Bitsets for `nodes` nodes, one worker word, one plane.
    pub(super) fn new(nodes: usize) -> Self {
        Self {
            words: vec![0; nodes],
            stride: 1,
            planes: 1,
            per_node: 1,
        }
    }

    #[inline]
    fn base(&self, node: usize) -> usize {
        node * self.per_node
    }

    /// Room for one more node (all bits clear).
    pub(super) fn push_node(&mut self) {
        let len = self.words.len() + self.per_node;
        self.words.resize(len, 0);
    }

    /// Clears every plane of `node`.
    pub(super) fn clear_node(&mut self, node: usize) {
        let base = self.base(node);
        self.words[base..base + self.per_node].fill(0);
    }

    /// Copies every plane of `from` onto `to`.
    pub(super) fn copy_node(&mut self, from: usize, to: usize) {
        let len = self.per_node;
        let (from, to) = (self.base(from), self.base(to));
        self.words.copy_within(from..from + len, to);
    }

    /// Rebuilds the layout for `stride` words per plane and `planes` planes.
    fn relayout(&mut self, nodes: usize, stride: usize, planes: usize) {
        let (old_stride, old_planes) = (self.stride, self.planes);
        let mut words = vec![0u64; nodes * stride * planes];
        for n in 0..nodes {
            for p in 0..old_planes {
                let from = n * old_stride * old_planes + p * old_stride;
                let to = n * stride * planes + p * stride;
                words[to..to + old_stride].copy_from_slice(&self.words[from..from + old_stride]);
            }
        }
        *self = Self {
            words,
            stride,
            planes,
            per_node: stride * planes,
        };
    }

    /// Makes room for worker index `w` in every plane of `nodes` nodes.
    pub(super) fn ensure_worker(&mut self, nodes: usize, w: usize) {
        let stride = w / 64 + 1;
        if stride > self.stride {
            self.relayout(nodes, stride, self.planes);
        }
    }

    /// Whether tier planes are kept.
    #[inline]
    pub(super) fn tiered(&self) -> bool {
        self.planes > 1
    }

    /// Starts keeping tier planes (all holders at the device tier).
    pub(super) fn enable_tiers(&mut self, nodes: usize) {
        if !self.tiered() {
            self.relayout(nodes, self.stride, TIERED_PLANES);
        }
    }

    /// The holders of `node` (plane 0).
    #[inline]
    pub(super) fn holders(&self, node: usize) -> &[u64] {
        let base = self.base(node);
        &self.words[base..base + self.stride]
    }

    /// Plane `p` of `node` (`p < planes`).
    #[inline]
    fn plane(&self, node: usize, p: usize) -> &[u64] {
        let base = self.base(node) + p * self.stride;
        &self.words[base..base + self.stride]
    }

    /// Whether worker `w` holds `node`.
    #[inline]
    pub(super) fn has(&self, node: usize, w: usize) -> bool {
        let (word, mask) = bit(w);
        word < self.stride && self.words[self.base(node) + word] & mask != 0
    }

    #[inline]
    fn set_bit(&mut self, node: usize, p: usize, w: usize, on: bool) {
        let (word, mask) = bit(w);
        let i = self.base(node) + p * self.stride + word;
        if on {
            self.words[i] |= mask;
        } else {
            self.words[i] &= !mask;
        }
    }

    /// Makes `w` a holder of `node` or not; a holder that leaves has its tier bits cleared.
    #[inline]
    pub(super) fn set(&mut self, node: usize, w: usize, on: bool) {
        self.set_bit(node, 0, w, on);
        if !on && self.tiered() {
            self.set_best(node, w, 0);
        }
    }

    /// The best tier index of holder `w` of `node` (0: device).
    #[inline]
    pub(super) fn best(&self, node: usize, w: usize) -> u8 {
        if !self.tiered() {
            return 0;
        }
        let (word, mask) = bit(w);
        (1..self.planes)
            .map(|p| u8::from(self.plane(node, p)[word] & mask != 0))
            .sum()
    }

    /// Sets the best tier index of holder `w` of `node`. Requires tier planes unless the
    /// index is 0.
    #[inline]
    pub(super) fn set_best(&mut self, node: usize, w: usize, tier: u8) {
        for p in 1..self.planes {
            self.set_bit(node, p, w, usize::from(tier) >= p);
        }
    }

    /// Whether two nodes have the same bits in every plane.
    #[inline]
    pub(super) fn same(&self, a: usize, b: usize) -> bool {
        let len = self.per_node;
        self.words[self.base(a)..][..len] == self.words[self.base(b)..][..len]
    }

    /// Bytes allocated.
    pub(super) fn memory_bytes(&self) -> usize {
        self.words.capacity() * core::mem::size_of::<u64>()
    }
}
