//! Loading Mooncake request traces.

use std::io::BufRead;
use std::path::Path;

use super::request::{Prompt, Request};
use crate::error::Error;

/// Tokens per hash id in the Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// Reads a Mooncake trace (JSONL: `timestamp` in ms, `input_length`, `output_length`,
/// `hash_ids`, 512 tokens per hash id; other fields ignored) from `path`.
///
/// Token IDs are synthesised deterministically from each hash id (equal ids give equal
/// tokens; the last block is cut to `input_length`), so hashing, the tree and routing run on
/// the trace's real prefix structure.
///
/// # Errors
///
/// [`Error::Trace`] with the line number for a malformed line, or the I/O error when the
/// file cannot be read.
pub fn load_mooncake(path: impl AsRef<Path>) -> Result<Vec<Request>, Error> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| Error::Trace {
        line: 0,
        message: format!("cannot open {}: {e}", path.display()),
    })?;
    parse_mooncake(std::io::BufReader::new(file))
}

/// Like [`load_mooncake`], from any reader.
///
/// # Errors
///
/// As [`load_mooncake`].
pub fn parse_mooncake(reader: impl BufRead) -> Result<Vec<Request>, Error> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let fail = |message: String| Error::Trace { line: n, message };
        let line = line.map_err(|e| fail(format!("cannot read: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| fail(format!("not JSON: {e}")))?;
        let number = |key: &str| -> Result<u64, Error> {
            value
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| fail(format!("missing or non-integer \"{key}\"")))
        };
        let timestamp = match value.get("timestamp").and_then(serde_json::Value::as_f64) {
            Some(t) if t.is_finite() && t >= 0.0 => t,
            _ => return Err(fail("missing or negative \"timestamp\"".into())),
        };
        let input = usize::try_from(number("input_length")?)
            .map_err(|_| fail("input_length too large".into()))?;
        let output = u32::try_from(number("output_length")?)
            .map_err(|_| fail("output_length too large".into()))?;
        let ids = value
            .get("hash_ids")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| fail("missing \"hash_ids\" array".into()))?
            .iter()
            .map(|h| {
                h.as_u64()
                    .ok_or_else(|| fail("a hash id is not an integer".into()))
            })
            .collect::<Result<Vec<u64>, _>>()?;
        if input > ids.len() * MOONCAKE_BLOCK_TOKENS {
            return Err(fail(format!(
                "input_length {input} exceeds {} hash ids of {MOONCAKE_BLOCK_TOKENS} tokens",
                ids.len()
            )));
        }
        out.push(Request {
            arrival_s: timestamp / 1000.0,
            prompt: Prompt::Blocks {
                ids,
                tokens_per_id: MOONCAKE_BLOCK_TOKENS,
                len: input,
            },
            output_tokens: output,
            session: None,
            follows: None,
        });
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(out)
}
