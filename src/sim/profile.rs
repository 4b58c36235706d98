//! Engine profiles: what one step of a modelled engine takes, from published measurements
//! of real engines, so that a simulated fleet runs by physics its routers are not given.
//!
//! A step of `P` prefill tokens in chunks (each chunk of `L` tokens after `E` tokens of the
//! same request already in KV), `D` decoding requests and `C` context tokens attended by
//! those decodes takes
//! `max(floor_s, base_s + prefill_s_per_token·P + prefill_s_per_attended·Σ L·(E + L/2) +
//! decode_s_per_seq·D + decode_s_per_context_token·C)` seconds: a floor (a step reads the
//! weights once), a cost per prefill token (the linear layers), prefill attention quadratic
//! in the chunk and linear in the chunk times its earlier context, and decode costs per
//! sequence and per context token (reading the KV).
//!
//! A profile may add per-phase terms, for engines timed by a fitted polynomial per phase
//! (NVIDIA Dynamo's mocker): a step with any prefill takes `prefill_step_s +
//! prefill_s_per_token_squared·P²` more, and a step with any decode `decode_step_s +
//! decode_s_per_usage·u + decode_s_per_usage_squared·u²` more, `u` the decodes' context over
//! the worker's KV capacity in tokens, at most 1. They are 0 in the other profiles.
//! `decode_s_per_usage_squared` alone may be negative (a concave decode curve), as long as
//! the decode terms stay at least 0 over `u` in `[0, 1]`.

use crate::error::Error;

/// The numbers of a step's time (see the module docs), in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StepProfile {
    /// The least a step takes.
    pub floor_s: f64,
    /// A step's fixed time.
    pub base_s: f64,
    /// Per prefill token.
    pub prefill_s_per_token: f64,
    /// Per attended pair of a prefill chunk: `L·(E + L/2)` for a chunk of `L` tokens after
    /// `E` of its request's tokens in KV.
    pub prefill_s_per_attended: f64,
    /// Per decoding request.
    pub decode_s_per_seq: f64,
    /// Per context token the step's decodes attend to.
    pub decode_s_per_context_token: f64,
    /// A step's fixed time when it computes any prefill token (added to `base_s`).
    pub prefill_step_s: f64,
    /// Per squared prefill token of the step: `P²` for a step of `P` prefill tokens.
    pub prefill_s_per_token_squared: f64,
    /// A step's fixed time when it has any decode (added to `base_s`).
    pub decode_step_s: f64,
    /// Per unit of the decodes' KV usage `u`: their context tokens over the worker's KV
    /// capacity in tokens, at most 1.
    pub decode_s_per_usage: f64,
    /// Per `u²`; may be negative (see [`validate`](Self::validate)).
    pub decode_s_per_usage_squared: f64,
}

impl StepProfile {
    /// The profile's numbers by name, in the order of the JSON keys.
    const KEYS: [&'static str; 11] = [
        "floor_s",
        "base_s",
        "prefill_s_per_token",
        "prefill_s_per_attended",
        "decode_s_per_seq",
        "decode_s_per_context_token",
        "prefill_step_s",
        "prefill_s_per_token_squared",
        "decode_step_s",
        "decode_s_per_usage",
        "decode_s_per_usage_squared",
    ];

    /// The key of the one number that may be negative.
    const SIGNED: &'static str = "decode_s_per_usage_squared";

    fn numbers_mut(&mut self) -> [&mut f64; 11] {
        [
            &mut self.floor_s,
            &mut self.base_s,
            &mut self.prefill_s_per_token,
            &mut self.prefill_s_per_attended,
            &mut self.decode_s_per_seq,
            &mut self.decode_s_per_context_token,
            &mut self.prefill_step_s,
            &mut self.prefill_s_per_token_squared,
            &mut self.decode_step_s,
            &mut self.decode_s_per_usage,
            &mut self.decode_s_per_usage_squared,
        ]
    }

    fn numbers(&self) -> [f64; 11] {
        [
            self.floor_s,
            self.base_s,
            self.prefill_s_per_token,
            self.prefill_s_per_attended,
            self.decode_s_per_seq,
            self.decode_s_per_context_token,
            self.prefill_step_s,
            self.prefill_s_per_token_squared,
            self.decode_step_s,
            self.decode_s_per_usage,
            self.decode_s_per_usage_squared,
        ]
    }

    /// Seconds of a step with `prefill` prompt tokens whose chunks attend to `attended`
    /// pairs (`Σ L·(E + L/2)`), and `decodes` decoding requests attending to `context`
    /// tokens, on a worker of `kv_capacity_tokens` tokens of KV (the decodes' usage
    /// `u = context / kv_capacity_tokens`, at most 1; a capacity of 0 is full usage).
    #[must_use]
    pub fn step_s(
        &self,
        prefill: f64,
        attended: f64,
        decodes: f64,
        context: f64,
        kv_capacity_tokens: f64,
    ) -> f64 {
        let mut work = self.base_s
            + self.prefill_s_per_token * prefill
            + self.prefill_s_per_attended * attended
            + self.decode_s_per_seq * decodes
            + self.decode_s_per_context_token * context;
        if prefill > 0.0 {
            work += self.prefill_step_s + self.prefill_s_per_token_squared * prefill * prefill;
        }
        if decodes > 0.0 {
            let usage = if kv_capacity_tokens > 0.0 {
                (context / kv_capacity_tokens).clamp(0.0, 1.0)
            } else {
                1.0
            };
            // At least 0 for a validated profile (see `validate`); the max keeps a step
            // from shortening by its decodes whatever the numbers.
            let decode = self.decode_step_s
                + self.decode_s_per_usage * usage
                + self.decode_s_per_usage_squared * usage * usage;
            work += decode.max(0.0);
        }
        work.max(self.floor_s)
    }

    /// Checks every number.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first number that is not finite or is negative
    /// (but `decode_s_per_usage_squared`, which may be negative when the decode terms stay
    /// at least 0 at full usage: `decode_step_s + decode_s_per_usage +
    /// decode_s_per_usage_squared ≥ 0`; a quadratic with a negative square term is least
    /// at an end of `[0, 1]`, and at 0 it is `decode_step_s ≥ 0`).
    pub fn validate(&self) -> Result<(), Error> {
        for (key, value) in Self::KEYS.into_iter().zip(self.numbers()) {
            if key == Self::SIGNED {
                crate::config::float(key, value, f64::MIN..=f64::MAX, "a number of seconds")?;
            } else {
                crate::config::float(key, value, 0.0..=f64::MAX, "zero or more seconds")?;
            }
        }
        let full = self.decode_step_s + self.decode_s_per_usage + self.decode_s_per_usage_squared;
        if full < 0.0 {
            return Err(crate::config::invalid(
                Self::SIGNED,
                self.decode_s_per_usage_squared,
                "decode terms of zero or more seconds at full usage",
            ));
        }
        Ok(())
    }
}

/// An engine profile: its name, where its numbers come from, and the numbers.
///
/// ```
/// use prefix_router::sim::EngineProfile;
///
/// let a100 = EngineProfile::builtin("llama3-8b-a100").expect("built in");
/// // 64 decodes at 1,344 tokens of context: Vidur measured 18.6 ms.
/// let step = a100.step.step_s(0.0, 0.0, 64.0, 64.0 * 1_344.0, 2e6);
/// assert!((step - 0.0195).abs() < 0.0005);
/// let file = r#"{"name": "mine", "source": "my bench", "base_s": 0.01, "prefill_s_per_token": 5e-5}"#;
/// let mine = EngineProfile::from_json(file)?;
/// assert_eq!(mine.step.decode_s_per_seq, 0.0); // a missing number is 0
/// assert!(EngineProfile::from_json(r#"{"name": "x", "source": "y", "speed": 2}"#).is_err());
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EngineProfile {
    /// The profile's name.
    pub name: String,
    /// Where its numbers come from.
    pub source: String,
    /// The numbers.
    pub step: StepProfile,
}

/// The built-in profiles' names, `default` first.
pub const ENGINE_PROFILES: [&str; 4] = [
    "default",
    "llama3-8b-a100",
    "llama2-70b-h100-tp4",
    "dynamo-mocker",
];

impl EngineProfile {
    /// A built-in profile by name (one of [`ENGINE_PROFILES`]).
    ///
    /// - `default`: the router's own step model ([`StepModel`](crate::StepModel)'s
    ///   defaults at 33,000 prefill tokens per second), so a default fleet runs by the
    ///   physics the router predicts with.
    /// - `llama3-8b-a100`: Llama-3-8B on one A100, from Vidur's profiled operator tables
    ///   (microsoft/vidur at 7d47513, `data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/`
    ///   `mlp.csv` and `attention.csv`), summed over 32 layers as Vidur composes a step
    ///   (embedding, sampling and CPU overheads left out, as Vidur leaves them by default):
    ///   the floor is the linear operators at 1 token (0.303 ms a layer: the weight read);
    ///   per prefill token the linear operators and KV write at 8,192 tokens above it
    ///   ((32 × (17.04 + 4.63) ms − 9.70 ms) / 8,192 = 83.5 µs); per attended pair the least
    ///   squares fit of the measured prefill attention over 21 chunks (3.0 ns; an 8,192-token
    ///   chunk's attention is 3.38 ms a layer with no earlier context and 9.42 ms after 8,192
    ///   tokens); per context token of decode the fit of 169 decode rows (2.6 ns a layer, 8.3
    ///   × 10⁻⁸ s); per decoding request the linear operators' slope at small batches and the
    ///   decode rows' per-request term (40.6 µs). The step times it gives are within 6 % of
    ///   Vidur's for decodes and chunks of 2,048 tokens or more, and up to 29 % above for
    ///   chunks of 200–500 tokens.
    /// - `llama2-70b-h100-tp4`: Llama-2-70B on four H100s (tensor parallel), from Vidur's
    ///   H100 operator and all-reduce tables (same commit, `h100/meta-llama/Llama-2-70b-hf/`
    ///   `mlp.csv`, `network/h100_dgx/all_reduce.csv`, two all-reduces a layer with
    ///   Vidur's 20 µs launch cost), 80 layers: floor 23.6 ms, 69.6 µs per prefill token. Its
    ///   attention terms are transferred from the A100 table (heads per GPU, and Vidur's own
    ///   A100-to-H100 ratios of its 70B linear operators: 2.92 when compute-bound, 1.74 when
    ///   memory-bound), since the H100 attention table was not available: 1.29 ns per
    ///   attended pair, 3.0 × 10⁻⁸ s per decode context token, 30.3 µs per decode.
    /// - `dynamo-mocker`: NVIDIA Dynamo's mocker with its default polynomial timing, as the
    ///   replay engine composes it (`aisimulate-core` 0.13.0 from crates.io,
    ///   `src/engine/common/perf_model.rs:139-156`, and ai-dynamo/dynamo
    ///   `lib/mocker/src/common/perf_model.rs` at f80944a): a pass with prefill takes
    ///   `4.209989e-7·P² + 1.518344e-2·P + 16.50142` ms for its `P` new prompt tokens (whatever
    ///   is cached), a pass with decodes `max(1, −25.74·u² + 54.01·u + 5.74)` ms at the
    ///   decodes' KV usage `u` (their tokens over the worker's KV capacity, at most 1: the
    ///   mocker's `num_gpu_blocks × block_size`), and a pass with both the sum of the two
    ///   (`src/engine/scheduler/vllm/core.rs:2245-2285`: the decode starts when the prefill
    ///   ends). The polynomial's decode floor of 1 ms never binds for `u` in `[0, 1]` (its
    ///   least is 5.74 ms, at `u = 0`), so the profile's floor is 0. Until 2026-12-07 this
    ///   profile was a fit of the polynomial to the six-number form (base 7.55 ms, 23.7 µs per
    ///   prefill token, 3.59 × 10⁻⁸ s per decode context token), which ran the replay's
    ///   round-robin placements 16 % slower at the median TTFT on the Mooncake conversation
    ///   (prompts of 2,000 tokens and more 17 % slower each): see `docs/simulator.md`,
    ///   "Cross-checked against NVIDIA's replay".
    #[must_use]
    pub fn builtin(name: &str) -> Option<EngineProfile> {
        let (source, step) = match name {
            "default" => (
                "the router's default step model (StepModel::default at 33,000 prefill tokens/s)",
                StepProfile {
                    floor_s: 0.0,
                    base_s: 0.008,
                    prefill_s_per_token: 1.0 / 33_000.0,
                    prefill_s_per_attended: 0.0,
                    decode_s_per_seq: 0.000_05,
                    decode_s_per_context_token: 0.000_000_006,
                    ..StepProfile::default()
                },
            ),
            "llama3-8b-a100" => (
                "Vidur's profiled tables, Meta-Llama-3-8B on A100, TP1 (microsoft/vidur 7d47513)",
                StepProfile {
                    floor_s: 9.7e-3,
                    base_s: 9.7e-3,
                    prefill_s_per_token: 8.35e-5,
                    prefill_s_per_attended: 3.00e-9,
                    decode_s_per_seq: 4.06e-5,
                    decode_s_per_context_token: 8.34e-8,
                    ..StepProfile::default()
                },
            ),
            "llama2-70b-h100-tp4" => (
                "Vidur's profiled tables, Llama-2-70b-hf on H100, TP4, attention transferred \
                 from A100 (microsoft/vidur 7d47513)",
                StepProfile {
                    floor_s: 2.36e-2,
                    base_s: 2.36e-2,
                    prefill_s_per_token: 6.96e-5,
                    prefill_s_per_attended: 1.29e-9,
                    decode_s_per_seq: 3.03e-5,
                    decode_s_per_context_token: 2.99e-8,
                    ..StepProfile::default()
                },
            ),
            "dynamo-mocker" => (
                "NVIDIA Dynamo's mocker, default polynomial timing (aisimulate-core 0.13.0 \
                 perf_model.rs; ai-dynamo/dynamo f80944a)",
                StepProfile {
                    prefill_s_per_token: 1.518_344e-5,
                    prefill_step_s: 1.650_142e-2,
                    prefill_s_per_token_squared: 4.209_989e-10,
                    decode_step_s: 5.74e-3,
                    decode_s_per_usage: 54.01e-3,
                    decode_s_per_usage_squared: -25.74e-3,
                    ..StepProfile::default()
                },
            ),
            _ => return None,
        };
        Some(EngineProfile {
            name: name.to_owned(),
            source: source.to_owned(),
            step,
        })
    }

    /// A profile from a JSON object with the keys `name` and `source` (strings) and any of
    /// the numbers (`floor_s`, `base_s`, `prefill_s_per_token`, `prefill_s_per_attended`,
    /// `decode_s_per_seq`, `decode_s_per_context_token`, `prefill_step_s`,
    /// `prefill_s_per_token_squared`, `decode_step_s`, `decode_s_per_usage`,
    /// `decode_s_per_usage_squared`; a missing number is 0).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for text that is not one JSON object, a missing or
    /// non-string `name` or `source`, an unknown key, or a number that is not a number or
    /// not finite, or that [`StepProfile::validate`] refuses.
    pub fn from_json(text: &str) -> Result<EngineProfile, Error> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            crate::config::invalid("engine_profile", e.to_string(), "one JSON object")
        })?;
        let Some(object) = value.as_object() else {
            return Err(crate::config::invalid(
                "engine_profile",
                "not an object",
                "one JSON object",
            ));
        };
        let text_key = |key: &'static str| -> Result<String, Error> {
            match object.get(key) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                _ => Err(crate::config::invalid(
                    key,
                    "missing or not a string",
                    "a string",
                )),
            }
        };
        let (name, source) = (text_key("name")?, text_key("source")?);
        let mut step = StepProfile::default();
        for (key, value) in object {
            if key == "name" || key == "source" {
                continue;
            }
            let Some(slot) = StepProfile::KEYS.iter().position(|k| k == key) else {
                return Err(crate::config::invalid(
                    "engine_profile",
                    format!("the key {key:?}"),
                    "name, source, floor_s, base_s, prefill_s_per_token, \
                     prefill_s_per_attended, decode_s_per_seq, decode_s_per_context_token, \
                     prefill_step_s, prefill_s_per_token_squared, decode_step_s, \
                     decode_s_per_usage, decode_s_per_usage_squared",
                ));
            };
            let number = value.as_f64().ok_or_else(|| {
                crate::config::invalid(StepProfile::KEYS[slot], value.to_string(), "a number")
            })?;
            *step.numbers_mut()[slot] = number;
        }
        step.validate()?;
        Ok(EngineProfile { name, source, step })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str) -> StepProfile {
        EngineProfile::builtin(name).expect("built in").step
    }

    /// Each built-in profile at points computed by hand from its six numbers.
    #[test]
    fn builtin_profiles_at_hand_computed_points() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.max(1.0);
        // A100 8B: 64 decodes at 1,344 context: 9.7e-3 + 64 × 4.06e-5 + 86,016 × 8.34e-8.
        let a100 = step("llama3-8b-a100");
        let d64 = 9.7e-3 + 64.0 * 4.06e-5 + 86_016.0 * 8.34e-8;
        assert!(close(a100.step_s(0.0, 0.0, 64.0, 86_016.0, 1e6), d64));
        // An 8,192-token chunk after 8,192 tokens: L·(E + L/2) = 8,192 × 12,288 pairs.
        let attended = 8_192.0 * (8_192.0 + 4_096.0);
        let chunk = 9.7e-3 + 8_192.0 * 8.35e-5 + attended * 3.00e-9;
        assert!(close(a100.step_s(8_192.0, attended, 0.0, 0.0, 1e6), chunk));
        assert!(
            (chunk - 0.9957).abs() < 1e-3,
            "Vidur measured 0.987 s: {chunk}"
        );
        // H100 70B TP4: one decode at 1,000 context.
        let h100 = step("llama2-70b-h100-tp4");
        let one = 2.36e-2 + 3.03e-5 + 1_000.0 * 2.99e-8;
        assert!(close(h100.step_s(0.0, 0.0, 1.0, 1_000.0, 1e6), one));
        // A floor binds for a short step (one decode: 23.6 ms under a floor of 30 ms).
        let floored = StepProfile {
            floor_s: 0.03,
            ..h100
        };
        assert!(close(floored.step_s(0.0, 0.0, 1.0, 1_000.0, 1e6), 0.03));
        // The default is the router's own step model.
        let default = step("default");
        let router = crate::fleet::StepModel::default().seconds(2_000.0, 10.0, 5_000.0, 33_000.0);
        assert!(close(
            default.step_s(2_000.0, 0.0, 10.0, 5_000.0, 1e6),
            router
        ));
        for name in ENGINE_PROFILES {
            step(name).validate().expect("built-in profiles validate");
        }
        assert!(EngineProfile::builtin("llama-9000").is_none());
    }

    /// aisimulate-core 0.13.0's polynomial timing (`src/engine/common/perf_model.rs:139-156`),
    /// in milliseconds, as its vLLM scheduler composes a pass
    /// (`src/engine/scheduler/vllm/core.rs:2245-2285`, `2978-2986`, `3315-3330`): the prefill
    /// of the pass's new tokens, then the decodes at their KV usage of the pool.
    fn replay_pass_ms(prefill: usize, decode_tokens: Option<usize>, pool_tokens: usize) -> f64 {
        let prefill_ms = if prefill == 0 {
            0.0
        } else {
            let t = prefill as f64;
            4.209989e-07 * t.powi(2) + 1.518344e-02 * t + 1.650142e+01
        };
        let decode_ms = decode_tokens.map_or(0.0, |tokens| {
            let u = (tokens as f64 / pool_tokens as f64).min(1.0);
            (-25.74 * u.powi(2) + 54.01 * u + 5.74).max(1.0)
        });
        prefill_ms + decode_ms
    }

    /// The `dynamo-mocker` profile is the replay's timing, not a fit of it: prefill-only,
    /// decode-only and mixed steps, short and long, at the replay's pool of 65,536 blocks of
    /// 16 tokens and at a smaller one, and past full usage (clamped, as the replay clamps).
    #[test]
    fn dynamo_mocker_profile_is_the_replays_polynomial() {
        let mocker = step("dynamo-mocker");
        for pool in [1_048_576_usize, 262_144] {
            for (prefill, decodes, context) in [
                (1, 0, 0),
                (100, 0, 0),
                (500, 0, 0),
                (7_000, 0, 0),
                (8_192, 0, 0),
                (0, 1, 600),
                (0, 10, 50_000),
                (0, 64, 500_000),
                (0, 256, 2_000_000),
                (2_048, 12, 120_000),
                (8_192, 200, 900_000),
            ] {
                let ours = mocker.step_s(
                    prefill as f64,
                    0.0,
                    decodes as f64,
                    context as f64,
                    pool as f64,
                );
                let decode = (decodes > 0).then_some(context);
                let theirs = replay_pass_ms(prefill, decode, pool) / 1e3;
                assert!(
                    (ours - theirs).abs() <= 1e-12,
                    "P {prefill}, D {decodes}, C {context}, pool {pool}: {ours} s against {theirs} s"
                );
            }
        }
        // An empty step takes nothing (the replay runs no pass).
        assert_eq!(mocker.step_s(0.0, 0.0, 0.0, 0.0, 1e6), 0.0);
    }

    /// The signed square term: allowed while the decode terms stay at least 0 at full usage.
    #[test]
    fn a_concave_decode_is_valid_only_while_it_stays_positive() {
        let concave = StepProfile {
            decode_step_s: 0.005,
            decode_s_per_usage: 0.05,
            decode_s_per_usage_squared: -0.055,
            ..StepProfile::default()
        };
        concave
            .validate()
            .expect("0.005 + 0.05 - 0.055 = 0 at full usage");
        let below = StepProfile {
            decode_s_per_usage_squared: -0.056,
            ..concave
        };
        assert!(matches!(
            below.validate(),
            Err(Error::InvalidConfig {
                field: "decode_s_per_usage_squared",
                ..
            })
        ));
        let negative_linear = StepProfile {
            decode_s_per_usage: -0.001,
            ..StepProfile::default()
        };
        assert!(
            negative_linear.validate().is_err(),
            "only the square is signed"
        );
        let file = r#"{"name": "m", "source": "s", "decode_step_s": 0.001, "decode_s_per_usage_squared": -0.0005}"#;
        let parsed = EngineProfile::from_json(file).expect("signed square within bounds");
        assert_eq!(parsed.step.decode_s_per_usage_squared, -0.0005);
        let file = r#"{"name": "m", "source": "s", "decode_s_per_usage_squared": -0.0005}"#;
        assert!(EngineProfile::from_json(file).is_err());
    }

    proptest::proptest! {
        /// A validated profile's step is finite, at least its floor and never shorter for
        /// more prefill (the terms are non-negative or, for the decode's square, bounded).
        #[test]
        fn a_validated_profile_gives_finite_steps_at_least_its_floor(
            numbers in proptest::collection::vec(0.0f64..0.1, 11),
            square in -0.2f64..0.1,
            prefill in 0.0f64..100_000.0,
            decodes in 0.0f64..512.0,
            context in 0.0f64..1e8,
            capacity in 0.0f64..1e7,
        ) {
            let mut profile = StepProfile::default();
            for (slot, value) in profile.numbers_mut().into_iter().zip(numbers) {
                *slot = value;
            }
            profile.decode_s_per_usage_squared = square;
            if profile.validate().is_ok() {
                let s = profile.step_s(prefill, 0.0, decodes, context, capacity);
                proptest::prop_assert!(s.is_finite() && s >= profile.floor_s && s >= 0.0);
                let more = profile.step_s(prefill + 1.0, 0.0, decodes, context, capacity);
                proptest::prop_assert!(more >= s);
            } else {
                proptest::prop_assert!(square < 0.0);
            }
        }
    }

    /// A file's profile, and every way a file can be wrong.
    #[test]
    fn profile_files_and_their_errors() {
        let ok = EngineProfile::from_json(
            r#"{"name": "lab", "source": "our bench", "floor_s": 0.005, "decode_s_per_seq": 1e-5}"#,
        )
        .expect("a valid file");
        assert_eq!((ok.name.as_str(), ok.source.as_str()), ("lab", "our bench"));
        assert_eq!(ok.step.floor_s, 0.005);
        assert_eq!(ok.step.base_s, 0.0, "a missing number is 0");
        for (bad, why) in [
            ("", "not JSON"),
            ("[1, 2]", "not an object"),
            (r#"{"source": "s"}"#, "no name"),
            (r#"{"name": "n"}"#, "no source"),
            (r#"{"name": 3, "source": "s"}"#, "a name that is no string"),
            (
                r#"{"name": "n", "source": "s", "base": 1}"#,
                "an unknown key",
            ),
            (
                r#"{"name": "n", "source": "s", "base_s": -1}"#,
                "a negative number",
            ),
            (
                r#"{"name": "n", "source": "s", "base_s": "1"}"#,
                "a string for a number",
            ),
            (
                r#"{"name": "n", "source": "s", "base_s": 1e999}"#,
                "not finite",
            ),
        ] {
            let err = EngineProfile::from_json(bad).expect_err(why);
            assert!(matches!(err, Error::InvalidConfig { .. }), "{why}: {err}");
        }
    }
}
