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

use crate::error::Error;

/// The six numbers of a step's time (see the module docs), in seconds.
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
}

impl StepProfile {
    /// The profile's six numbers by name, in the order of the JSON keys.
    const KEYS: [&'static str; 6] = [
        "floor_s",
        "base_s",
        "prefill_s_per_token",
        "prefill_s_per_attended",
        "decode_s_per_seq",
        "decode_s_per_context_token",
    ];

    fn numbers_mut(&mut self) -> [&mut f64; 6] {
        [
            &mut self.floor_s,
            &mut self.base_s,
            &mut self.prefill_s_per_token,
            &mut self.prefill_s_per_attended,
            &mut self.decode_s_per_seq,
            &mut self.decode_s_per_context_token,
        ]
    }

    fn numbers(&self) -> [f64; 6] {
        [
            self.floor_s,
            self.base_s,
            self.prefill_s_per_token,
            self.prefill_s_per_attended,
            self.decode_s_per_seq,
            self.decode_s_per_context_token,
        ]
    }

    /// Seconds of a step with `prefill` prompt tokens whose chunks attend to `attended`
    /// pairs (`Σ L·(E + L/2)`), and `decodes` decoding requests attending to `context`
    /// tokens.
    #[must_use]
    pub fn step_s(&self, prefill: f64, attended: f64, decodes: f64, context: f64) -> f64 {
        let work = self.base_s
            + self.prefill_s_per_token * prefill
            + self.prefill_s_per_attended * attended
            + self.decode_s_per_seq * decodes
            + self.decode_s_per_context_token * context;
        work.max(self.floor_s)
    }

    /// Checks every number.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first number that is negative or not finite.
    pub fn validate(&self) -> Result<(), Error> {
        for (key, value) in Self::KEYS.into_iter().zip(self.numbers()) {
            crate::config::float(key, value, 0.0..=f64::MAX, "zero or more seconds")?;
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
/// let step = a100.step.step_s(0.0, 0.0, 64.0, 64.0 * 1_344.0);
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
    /// - `dynamo-mocker`: NVIDIA Dynamo's mocker with its default polynomial timing
    ///   (ai-dynamo/dynamo `lib/mocker/src/common/perf_model.rs` at f80944a: prefill
    ///   `4.21e-7·T² + 1.518e-2·T + 16.5` ms for the pass's `T` new tokens, decode
    ///   `max(1, −25.74·u² + 54.01·u + 5.74)` ms at KV usage `u` of its default 1,048,576-token
    ///   pool), fitted to this form by least squares on the log ratio over prompts of 100 to
    ///   30,000 tokens chunked by 8,192, decode batches of 1 to 256 at 500 to 30,000 tokens of
    ///   context, and mixed steps: floor 1 ms (its decode floor), base 7.55 ms, 23.7 µs per
    ///   prefill token, 3.59 × 10⁻⁸ s per decode context token. The form cannot express the
    ///   mocker's 16.5 ms constant on every pass with prefill nor its concave decode: the fit
    ///   is within 15 % at the median and 58 % at worst (short prompts).
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
                },
            ),
            "dynamo-mocker" => (
                "NVIDIA Dynamo's mocker, default polynomial timing, fitted to this form \
                 (ai-dynamo/dynamo f80944a)",
                StepProfile {
                    floor_s: 1.0e-3,
                    base_s: 7.55e-3,
                    prefill_s_per_token: 2.37e-5,
                    prefill_s_per_attended: 0.0,
                    decode_s_per_seq: 0.0,
                    decode_s_per_context_token: 3.59e-8,
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
    /// the six numbers (`floor_s`, `base_s`, `prefill_s_per_token`,
    /// `prefill_s_per_attended`, `decode_s_per_seq`, `decode_s_per_context_token`; a
    /// missing number is 0).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for text that is not one JSON object, a missing or
    /// non-string `name` or `source`, an unknown key, or a number that is not a number,
    /// negative or not finite.
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
                     prefill_s_per_attended, decode_s_per_seq, decode_s_per_context_token",
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
        assert!(close(a100.step_s(0.0, 0.0, 64.0, 86_016.0), d64));
        // An 8,192-token chunk after 8,192 tokens: L·(E + L/2) = 8,192 × 12,288 pairs.
        let attended = 8_192.0 * (8_192.0 + 4_096.0);
        let chunk = 9.7e-3 + 8_192.0 * 8.35e-5 + attended * 3.00e-9;
        assert!(close(a100.step_s(8_192.0, attended, 0.0, 0.0), chunk));
        assert!(
            (chunk - 0.9957).abs() < 1e-3,
            "Vidur measured 0.987 s: {chunk}"
        );
        // H100 70B TP4: one decode at 1,000 context.
        let h100 = step("llama2-70b-h100-tp4");
        let one = 2.36e-2 + 3.03e-5 + 1_000.0 * 2.99e-8;
        assert!(close(h100.step_s(0.0, 0.0, 1.0, 1_000.0), one));
        // The mocker fit: its floor binds for an empty step, not for one decode.
        let mocker = step("dynamo-mocker");
        assert!(close(mocker.step_s(0.0, 0.0, 0.0, 0.0), 7.55e-3));
        let floored = StepProfile {
            floor_s: 0.02,
            ..mocker
        };
        assert!(close(floored.step_s(0.0, 0.0, 1.0, 1_000.0), 0.02));
        // The default is the router's own step model.
        let default = step("default");
        let router = crate::fleet::StepModel::default().seconds(2_000.0, 10.0, 5_000.0, 33_000.0);
        assert!(close(default.step_s(2_000.0, 0.0, 10.0, 5_000.0), router));
        for name in ENGINE_PROFILES {
            step(name).validate().expect("built-in profiles validate");
        }
        assert!(EngineProfile::builtin("llama-9000").is_none());
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
