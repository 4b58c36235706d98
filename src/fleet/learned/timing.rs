//! [`Timing`]: the absolute terms of one worker's step time as the router believes them, and
//! [`TermCounts`]: how much of each term a prediction counts, so that a prediction is one dot
//! product and what the host measures later can teach each term.

use super::super::config::LoadConfig;

/// The terms a worker's times are made of (seconds), the ones the router predicts with and
/// learns: a step's fixed time, and what each prefill token, each decoding request and each
/// context token those decodes attend to add to it; and what each pair of tokens a prefill
/// attends to adds (attention over a prompt grows with its square: a chunk of `L` tokens
/// after `E` of its request's tokens attends to `L·(E + L/2)` pairs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    /// Seconds per prefill token.
    pub(crate) prefill_s_per_token: f64,
    /// A step's fixed time.
    pub(crate) step_base_s: f64,
    /// Per decoding request in a step.
    pub(crate) step_s_per_decode: f64,
    /// Per context token a step's decodes attend to.
    pub(crate) step_s_per_context_token: f64,
    /// Per pair of tokens a prefill attends to. 0 as configured ([`StepModel`] has no such
    /// term); learned.
    ///
    /// [`StepModel`]: crate::StepModel
    pub(crate) prefill_s_per_attended: f64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing::configured(&LoadConfig::default(), 1.0)
    }
}

impl Timing {
    /// The configured terms of a worker of relative `speed` (each divided by it).
    pub(crate) fn configured(config: &LoadConfig, speed: f64) -> Timing {
        let step = &config.step;
        Timing {
            prefill_s_per_token: 1.0 / (config.prefill_tokens_per_s * speed),
            step_base_s: step.step_base_s / speed,
            step_s_per_decode: step.step_s_per_decode / speed,
            step_s_per_context_token: step.step_s_per_context_token / speed,
            prefill_s_per_attended: 0.0,
        }
    }

    /// The terms as an array, in [`TermCounts`]' order.
    pub(crate) fn to_array(self) -> [f64; TERMS] {
        [
            self.prefill_s_per_token,
            self.step_base_s,
            self.step_s_per_decode,
            self.step_s_per_context_token,
            self.prefill_s_per_attended,
        ]
    }

    /// Terms from an array in [`TermCounts`]' order.
    pub(crate) fn from_array(a: [f64; TERMS]) -> Timing {
        Timing {
            prefill_s_per_token: a[0],
            step_base_s: a[1],
            step_s_per_decode: a[2],
            step_s_per_context_token: a[3],
            prefill_s_per_attended: a[4],
        }
    }

    /// Seconds to prefill `tokens` tokens attending to `pairs` pairs, beyond the fixed part
    /// of the steps they take.
    #[inline]
    pub(crate) fn prefill_s(&self, tokens: f64, pairs: f64) -> f64 {
        tokens * self.prefill_s_per_token + pairs * self.prefill_s_per_attended
    }

    /// Seconds of a step computing `prefill` prompt tokens (their attention left out) and
    /// one token for each of `decodes` requests attending to `context` tokens.
    #[inline]
    pub(crate) fn step_s(&self, prefill: f64, decodes: f64, context: f64) -> f64 {
        self.step_base_s
            + prefill * self.prefill_s_per_token
            + decodes * self.step_s_per_decode
            + context * self.step_s_per_context_token
    }

    /// The prediction `terms` count: their dot product with these terms.
    #[inline]
    pub(crate) fn of(&self, terms: &TermCounts) -> f64 {
        self.to_array()
            .iter()
            .zip(terms.0)
            .map(|(t, n)| t * f64::from(n))
            .sum()
    }

    /// The speed relative to `config`'s terms (2.0: twice as fast): the configured time over
    /// this timing's of a reference prefill (2,048 uncached tokens in one step).
    pub(crate) fn relative_speed(&self, config: &LoadConfig) -> f64 {
        let reference = |t: &Timing| {
            let tokens = 2_048.0;
            t.prefill_s(tokens, tokens * tokens / 2.0) + t.step_s(0.0, 0.0, 0.0)
        };
        reference(&Timing::configured(config, 1.0)) / reference(self)
    }
}

/// The number of [`Timing`] terms.
pub(crate) const TERMS: usize = 5;

/// How much of each of a worker's [`Timing`] terms a prediction counts: prefill tokens,
/// steps, decodes over those steps, context tokens over those steps, and the pairs the
/// prefill attends to. A prediction is their dot product with the terms; a measured time
/// teaches the terms in proportion.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TermCounts(pub(crate) [f32; TERMS]);

impl TermCounts {
    /// Counts of `prefill` tokens attending to `pairs` pairs, and `steps` steps each
    /// carrying `decodes` decodes attending to `context` tokens.
    pub(crate) fn new(
        (prefill, pairs): (f64, f64),
        steps: f64,
        decodes: f64,
        context: f64,
    ) -> TermCounts {
        TermCounts([
            prefill as f32,
            steps as f32,
            (steps * decodes) as f32,
            (steps * context) as f32,
            pairs as f32,
        ])
    }

    /// These terms and `other`'s together.
    pub(crate) fn plus(self, other: TermCounts) -> TermCounts {
        let mut sum = self.0;
        for (s, o) in sum.iter_mut().zip(other.0) {
            *s += o;
        }
        TermCounts(sum)
    }

    /// These terms `n` times over.
    pub(crate) fn times(self, n: f64) -> TermCounts {
        TermCounts(self.0.map(|t| (f64::from(t) * n) as f32))
    }
}

/// The pairs of tokens a prefill of `prefill` uncached tokens of a `prompt`-token prompt
/// attends to (its cached tokens before them): `m·(prompt − m) + m²/2`, however it is
/// chunked.
pub(crate) fn attended(prompt: u64, prefill: u64) -> u64 {
    let prefill = prefill.min(prompt);
    prefill.saturating_mul(2 * prompt - prefill) / 2
}
