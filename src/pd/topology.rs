//! Where workers sit, and how fast KV moves between them.

use crate::error::Error;

use crate::tree::WorkerId;

/// Nested domains (for example node, rack, zone), each with the bandwidth at which KV moves
/// between two workers sharing it, and each worker's label at each level. Two workers
/// move KV at the bandwidth of the innermost level whose label they share, else at the
/// bandwidth between domains. A worker not placed shares no domain.
///
/// ```
/// use prefix_router::{Topology, WorkerId};
///
/// let mut t = Topology::new(25e9).with_level("node", 450e9)?.with_level("rack", 100e9)?;
/// t.place(WorkerId::new(0), &[("node", "n1"), ("rack", "r1")])?;
/// t.place(WorkerId::new(1), &[("node", "n1"), ("rack", "r1")])?;
/// t.place(WorkerId::new(2), &[("node", "n2"), ("rack", "r1")])?;
/// assert_eq!(t.bytes_per_s(WorkerId::new(0), WorkerId::new(1)), 450e9);
/// assert_eq!(t.bytes_per_s(WorkerId::new(0), WorkerId::new(2)), 100e9);
/// assert_eq!(t.bytes_per_s(WorkerId::new(0), WorkerId::new(3)), 25e9);
/// assert!(t.place(WorkerId::new(3), &[("zone", "z1")]).is_err());
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// Bytes per second between workers sharing no domain.
    across_bytes_per_s: f64,
    /// Levels from the innermost: name and bytes per second within a domain of it.
    levels: Vec<(String, f64)>,
    /// Each worker's label at each level, by worker index.
    labels: Vec<Vec<Option<String>>>,
}

impl Default for Topology {
    /// One domain-less fleet moving KV at 50 GB/s (a 400 Gb/s RDMA link).
    fn default() -> Self {
        Self::new(50e9)
    }
}

impl Topology {
    /// No levels: every pair moves KV at `across_bytes_per_s`.
    #[must_use]
    pub fn new(across_bytes_per_s: f64) -> Self {
        Self {
            across_bytes_per_s,
            levels: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// Adds a level outside the ones added before, moving KV at `bytes_per_s` within a
    /// domain of it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a bandwidth that is not positive, or a name used twice.
    pub fn with_level(mut self, name: &str, bytes_per_s: f64) -> Result<Self, Error> {
        crate::config::float(
            "bytes_per_s",
            bytes_per_s,
            f64::MIN_POSITIVE..=f64::MAX,
            "above 0",
        )?;
        if self.level(name).is_some() {
            return Err(crate::config::invalid("level", name, "a level named once"));
        }
        self.levels.push((name.to_owned(), bytes_per_s));
        Ok(self)
    }

    fn level(&self, name: &str) -> Option<usize> {
        self.levels.iter().position(|(n, _)| n == name)
    }

    /// Places `worker`: its label at each named level (levels not named: no domain there).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming a level the topology does not have.
    pub fn place(&mut self, worker: WorkerId, labels: &[(&str, &str)]) -> Result<(), Error> {
        let mut row = vec![None; self.levels.len()];
        for (level, label) in labels {
            let i = self.level(level).ok_or_else(|| {
                crate::config::invalid("topology level", level, "a level added with with_level")
            })?;
            row[i] = Some((*label).to_owned());
        }
        let index = worker.index();
        if self.labels.len() <= index {
            self.labels.resize(index + 1, Vec::new());
        }
        self.labels[index] = row;
        Ok(())
    }

    /// `worker`'s labels by level (empty when not placed): workers with equal labels move
    /// KV to any worker at the same bandwidth.
    pub(crate) fn domain(&self, worker: WorkerId) -> &[Option<String>] {
        self.labels
            .get(worker.index())
            .map_or(&[][..], Vec::as_slice)
    }

    /// Bytes per second at which KV moves from `from` to `to`.
    #[must_use]
    pub fn bytes_per_s(&self, from: WorkerId, to: WorkerId) -> f64 {
        let labels = |w: WorkerId| self.labels.get(w.index()).map_or(&[][..], Vec::as_slice);
        let (a, b) = (labels(from), labels(to));
        self.levels
            .iter()
            .enumerate()
            .find(
                |(i, _)| matches!((a.get(*i), b.get(*i)), (Some(Some(x)), Some(Some(y))) if x == y),
            )
            .map_or(self.across_bytes_per_s, |(_, (_, bw))| *bw)
    }

    /// Checks the bandwidth between domains.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for one that is not positive.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::float(
            "across_bytes_per_s",
            self.across_bytes_per_s,
            f64::MIN_POSITIVE..=f64::MAX,
            "above 0",
        )
    }
}
