//! The radix tree that mirrors every worker's prefix cache.

/// Identifies one inference worker: a dense index (`0..n`) chosen by the host.
///
/// Opaque apart from its number; routers hand out `WorkerId::new(0)..WorkerId::new(n)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct WorkerId(u32);

impl WorkerId {
    /// The worker with index `id`.
    #[inline]
    #[must_use]
    pub const fn new(id: u32) -> Self {
        Self(id)
    }

    /// The worker's index.
    #[inline]
    #[must_use]
    pub const fn get(self) -> u32 {
        self.0
    }
}
