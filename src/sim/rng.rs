//! Seeded randomness for workloads: SplitMix64 and a Zipf sampler.

/// SplitMix64: small, fast, seeded, deterministic.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        crate::fold::mix64(self.0)
    }

    /// Uniform in `0..n` (0 for n = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller, one of the pair).
    pub(crate) fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]: its logarithm is finite
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (core::f64::consts::TAU * v).cos()
    }

    /// A lognormal factor of mean 1 whose logarithm deviates by `sigma` (1 for `sigma` 0).
    pub(crate) fn lognormal_factor(&mut self, sigma: f64) -> f64 {
        if sigma <= 0.0 {
            return 1.0;
        }
        (sigma * self.normal() - sigma * sigma / 2.0).exp()
    }

    /// Exponential with the given rate (mean `1 / rate`); 0 for a non-positive rate.
    pub(crate) fn exponential(&mut self, rate: f64) -> f64 {
        if rate <= 0.0 || !rate.is_finite() {
            return 0.0;
        }
        -(1.0 - self.unit()).ln() / rate
    }
}

/// Zipf(s) over ranks `0..n`, by inverse CDF.
#[derive(Clone, Debug)]
pub(crate) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut total = 0.0;
        for r in 1..=n.max(1) {
            total += 1.0 / (r as f64).powf(s);
            cdf.push(total);
        }
        cdf.iter_mut().for_each(|c| *c /= total);
        Self { cdf }
    }

    pub(crate) fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}
