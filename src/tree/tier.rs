//! Storage tiers: where a worker keeps a cached block.

/// Where a worker keeps a block's KV cache, fastest first.
///
/// Engines offload KV from GPU memory to host memory, local disk or a shared store, and say
/// so in their events (`medium`). A block held at a lower tier is still a hit, but its
/// reload takes time; the mirror keeps, per worker and block, the best tier holding it.
///
/// ```
/// use prefix_router::Tier;
///
/// assert_eq!(Tier::default(), Tier::Device);
/// assert_eq!(Tier::from_medium("CPU_PINNED"), Tier::Host);
/// assert_eq!(Tier::from_medium("something new"), Tier::Remote);
/// assert!(Tier::Device < Tier::Host);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Tier {
    /// Accelerator memory (the GPU's KV cache): a hit costs nothing to reload.
    #[default]
    Device,
    /// Host memory (CPU offload).
    Host,
    /// Local disk.
    Disk,
    /// A store shared over the network.
    Remote,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::Remote];

    /// The tier's index in [`Tier::ALL`] (device 0, host 1, disk 2, remote 3).
    #[inline]
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The tier of index `i` in [`Tier::ALL`]; `None` beyond it.
    #[inline]
    #[must_use]
    pub const fn from_index(i: usize) -> Option<Tier> {
        match i {
            0 => Some(Tier::Device),
            1 => Some(Tier::Host),
            2 => Some(Tier::Disk),
            3 => Some(Tier::Remote),
            _ => None,
        }
    }

    /// The tier an engine's `medium` names, case-insensitively:
    ///
    /// | medium | tier |
    /// |---|---|
    /// | `GPU`, `CUDA`, `HBM`, `DEVICE`, `NPU`, `XPU` | [`Tier::Device`] |
    /// | `CPU`, `CPU_PINNED`, `CPU_TIER1`, `HOST`, `DRAM` | [`Tier::Host`] |
    /// | `CPU_TIER2`, `DISK`, `SSD`, `NVME`, `LOCAL_DISK`, `FILE` | [`Tier::Disk`] |
    /// | anything else (`REMOTE`, a shared store's name, an unknown medium) | [`Tier::Remote`] |
    ///
    /// An unknown medium is the least credited tier: a block there is still a hit, charged
    /// the slowest reload, so a new medium can only make the router under-predict.
    /// (SGLang's `CPU_TIER2` is its storage tier.)
    #[must_use]
    pub fn from_medium(medium: &str) -> Tier {
        const DEVICE: [&str; 6] = ["GPU", "CUDA", "HBM", "DEVICE", "NPU", "XPU"];
        const HOST: [&str; 5] = ["CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "DRAM"];
        const DISK: [&str; 6] = ["CPU_TIER2", "DISK", "SSD", "NVME", "LOCAL_DISK", "FILE"];
        let is = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(medium));
        if is(&DEVICE) {
            Tier::Device
        } else if is(&HOST) {
            Tier::Host
        } else if is(&DISK) {
            Tier::Disk
        } else {
            Tier::Remote
        }
    }
}

/// A set of tiers, as a bitmask over [`Tier::index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TierSet(u8);

impl TierSet {
    /// The set holding only `tier`.
    #[inline]
    pub(crate) const fn of(tier: Tier) -> TierSet {
        TierSet(1 << tier.index())
    }

    #[inline]
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    #[inline]
    pub(crate) fn contains(self, tier: Tier) -> bool {
        self.0 & (1 << tier.index()) != 0
    }

    #[inline]
    pub(crate) fn with(self, tier: Tier) -> TierSet {
        TierSet(self.0 | (1 << tier.index()))
    }

    #[inline]
    pub(crate) fn without(self, tier: Tier) -> TierSet {
        TierSet(self.0 & !(1 << tier.index()))
    }

    /// Whether every tier of `self` is in `other`.
    #[inline]
    pub(crate) fn within(self, other: TierSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The best (fastest) tier's index; 0 for the empty set.
    #[inline]
    pub(crate) fn best_index(self) -> u8 {
        if self.0 == 0 {
            0
        } else {
            self.0.trailing_zeros() as u8
        }
    }
}
