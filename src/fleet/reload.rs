//! What a cache hit below the device tier costs: the time to load its KV back.

use super::candidate::Candidate;
use crate::config::float;
use crate::error::Error;
use crate::tree::Tier;

/// The reload model: a hit at a lower [`Tier`] costs `tokens × bytes_per_token ÷ the tier's
/// bandwidth` seconds before prefill can use it; a device hit costs nothing.
///
/// Defaults, from public figures: **327,680 bytes per token** (Llama-3-70B at 16-bit KV: 80
/// layers × 8 KV heads × 128 dimensions × 2 tensors × 2 bytes); host memory at **50 GB/s**
/// (host-to-GPU over PCIe 5.0 x16, 64 GB/s a direction in theory, about 50 achieved from
/// pinned memory); local disk at **6 GB/s** (one PCIe 4.0 NVMe SSD reading sequentially,
/// about 7 GB/s); a remote store at **12.5 GB/s** (one 100 Gb/s link). At these figures a
/// host hit reloads a token in 6.6 µs, about 4.6 times faster than prefilling it at 33,000
/// tokens/s, and a disk hit is slower than recomputing; set them to the fleet's.
///
/// ```
/// use prefix_router::{ReloadConfig, Tier};
///
/// let reload = ReloadConfig::default();
/// let host_s = reload.seconds(Tier::Host, 1_000);
/// assert!((host_s - 1_000.0 * 327_680.0 / 50e9).abs() < 1e-12);
/// assert_eq!(reload.seconds(Tier::Device, 1_000), 0.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReloadConfig {
    /// KV bytes per token. Positive. Default 327,680.
    pub bytes_per_token: f64,
    /// Host memory to device, bytes per second. Positive. Default 50e9.
    pub host_bytes_per_s: f64,
    /// Local disk to device, bytes per second. Positive. Default 6e9.
    pub disk_bytes_per_s: f64,
    /// A remote store to device, bytes per second. Positive. Default 12.5e9.
    pub remote_bytes_per_s: f64,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        Self {
            bytes_per_token: 327_680.0,
            host_bytes_per_s: 50e9,
            disk_bytes_per_s: 6e9,
            remote_bytes_per_s: 12.5e9,
        }
    }
}

impl ReloadConfig {
    crate::config::setters! {
        /// Sets [`bytes_per_token`](Self::bytes_per_token).
        with_bytes_per_token: bytes_per_token: f64;
        /// Sets [`host_bytes_per_s`](Self::host_bytes_per_s).
        with_host_bytes_per_s: host_bytes_per_s: f64;
        /// Sets [`disk_bytes_per_s`](Self::disk_bytes_per_s).
        with_disk_bytes_per_s: disk_bytes_per_s: f64;
        /// Sets [`remote_bytes_per_s`](Self::remote_bytes_per_s).
        with_remote_bytes_per_s: remote_bytes_per_s: f64;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field that is not a positive number.
    pub fn validate(&self) -> Result<(), Error> {
        let positive = f64::MIN_POSITIVE..=f64::MAX;
        float(
            "bytes_per_token",
            self.bytes_per_token,
            positive.clone(),
            "a positive number",
        )?;
        float(
            "host_bytes_per_s",
            self.host_bytes_per_s,
            positive.clone(),
            "a positive rate",
        )?;
        float(
            "disk_bytes_per_s",
            self.disk_bytes_per_s,
            positive.clone(),
            "a positive rate",
        )?;
        float(
            "remote_bytes_per_s",
            self.remote_bytes_per_s,
            positive,
            "a positive rate",
        )
    }

    /// Seconds to reload `tokens` tokens from `tier`.
    #[must_use]
    pub fn seconds(&self, tier: Tier, tokens: usize) -> f64 {
        let bandwidth = match tier {
            Tier::Device => return 0.0,
            Tier::Host => self.host_bytes_per_s,
            Tier::Disk => self.disk_bytes_per_s,
            Tier::Remote => self.remote_bytes_per_s,
        };
        tokens as f64 * self.bytes_per_token / bandwidth
    }

    /// Seconds to reload what a candidate holds below the device tier.
    #[must_use]
    pub fn candidate_seconds(&self, candidate: &Candidate) -> f64 {
        Tier::ALL[1..]
            .iter()
            .map(|&t| self.seconds(t, candidate.cached_tokens_at(t)))
            .sum()
    }
}
