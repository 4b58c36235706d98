//! The msgpack side: a payload's values into [`EventBatch`]es.

use rmpv::Value;

use super::{EngineEvent, EventBatch, KeyPart};
use crate::error::Error;
use crate::hash::TokenId;

/// Nesting allowed in a payload (a batch is 4 levels deep).
const MAX_DEPTH: usize = 16;

/// Decodes one msgpack payload of a vLLM KV-event batch.
///
/// # Errors
///
/// [`Error::Decode`] for anything that is not a well-formed batch: truncated or trailing
/// bytes, wrong types, an unknown event tag, a hash that fits no accepted encoding, a token
/// ID out of `u32` range.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, Error> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut reader, MAX_DEPTH)
        .map_err(|e| Error::Decode(format!("malformed msgpack: {e}")))?;
    if !reader.is_empty() {
        return Err(Error::Decode(format!(
            "{} trailing bytes after the batch",
            reader.len()
        )));
    }
    let (ts, events, rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            field(&value, "ts"),
            field(&value, "events"),
            field(&value, "data_parallel_rank").or_else(|| field(&value, "attn_dp_rank")),
        ),
        other => return Err(wrong("batch", "an array or a map", other)),
    };
    let ts = match ts {
        Some(Value::F64(t)) => *t,
        Some(Value::F32(t)) => f64::from(*t),
        Some(v) if v.as_i64().is_some() || v.as_u64().is_some() => v.as_f64().unwrap_or_default(),
        Some(other) => return Err(wrong("ts", "a number", other)),
        None => return Err(Error::Decode("batch has no ts".into())),
    };
    let events = match events {
        Some(Value::Array(events)) => events
            .iter()
            .enumerate()
            .map(|(i, e)| decode_event(e).map_err(|err| context(err, &format!("event {i}"))))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(wrong("events", "an array", other)),
        None => return Err(Error::Decode("batch has no events".into())),
    };
    let data_parallel_rank = optional_u32(rank, "data_parallel_rank")?;
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank,
    })
}

/// Field names in positional order after the tag (vLLM 0.33's declaration order; older
/// versions and SGLang send a prefix of it).
const STORED: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];
const REMOVED: [&str; 5] = [
    "block_hashes",
    "medium",
    "group_idx",
    "locality",
    "ownership",
];

/// An event's fields, whether it came as a positional array or as a map.
enum Fields<'v> {
    Array(&'v [Value], &'static [&'static str]),
    Map(&'v Value),
}

impl<'v> Fields<'v> {
    fn get(&self, name: &str) -> Option<&'v Value> {
        match self {
            Fields::Array(items, names) => {
                let position = names.iter().position(|&n| n == name)?;
                items.get(position + 1)
            }
            Fields::Map(map) => field(map, name),
        }
    }
}

fn decode_event(event: &Value) -> Result<EngineEvent, Error> {
    let (tag, fields) = match event {
        Value::Array(items) => {
            let Some(tag) = items.first().and_then(Value::as_str) else {
                return Err(Error::Decode(
                    "event array does not start with a tag".into(),
                ));
            };
            let names: &'static [&'static str] = if tag == "BlockRemoved" {
                &REMOVED
            } else {
                &STORED
            };
            (tag, Fields::Array(items, names))
        }
        Value::Map(_) => {
            let Some(tag) = field(event, "type").and_then(Value::as_str) else {
                return Err(Error::Decode("event map has no \"type\" string".into()));
            };
            (tag, Fields::Map(event))
        }
        other => return Err(wrong("event", "an array or a map", other)),
    };
    let get = |name: &str| fields.get(name);
    match tag {
        "BlockStored" => stored(&get),
        "BlockRemoved" => Ok(EngineEvent::BlockRemoved {
            block_hashes: hashes(get("block_hashes"), "block_hashes")?,
            medium: optional_str(get("medium"), "medium")?,
            group_idx: optional_u32(get("group_idx"), "group_idx")?,
            locality: optional_str(get("locality"), "locality")?,
            ownership: optional_str(get("ownership"), "ownership")?,
        }),
        "AllBlocksCleared" => Ok(EngineEvent::AllBlocksCleared),
        other => Err(Error::Decode(format!("unknown event type {other:?}"))),
    }
}

/// A `BlockStored` event's fields.
fn stored<'v>(get: &impl Fn(&str) -> Option<&'v Value>) -> Result<EngineEvent, Error> {
    let parent_block_hash = match get("parent_block_hash") {
        None | Some(Value::Nil) => None,
        Some(v) => Some(hash(v, "parent_block_hash")?),
    };
    let block_size = match get("block_size").and_then(Value::as_u64) {
        Some(b) => usize::try_from(b).map_err(|_| Error::Decode("huge block_size".into()))?,
        None => {
            return Err(Error::Decode(
                "BlockStored has no integer block_size".into(),
            ));
        }
    };
    Ok(EngineEvent::BlockStored {
        block_hashes: hashes(get("block_hashes"), "block_hashes")?,
        parent_block_hash,
        token_ids: token_list(get("token_ids"), "token_ids")?
            .ok_or_else(|| Error::Decode("BlockStored has no token_ids".into()))?,
        block_size,
        lora_id: get("lora_id").and_then(Value::as_i64),
        medium: optional_str(get("medium"), "medium")?,
        lora_name: optional_str(get("lora_name"), "lora_name")?,
        extra_keys: extra_keys(get("extra_keys"))?,
        group_idx: optional_u32(get("group_idx"), "group_idx")?,
        kv_cache_spec_kind: optional_str(get("kv_cache_spec_kind"), "kv_cache_spec_kind")?,
        kv_cache_spec_sliding_window: optional_u32(
            get("kv_cache_spec_sliding_window"),
            "kv_cache_spec_sliding_window",
        )?,
        locality: optional_str(get("locality"), "locality")?,
        ownership: optional_str(get("ownership"), "ownership")?,
        session_id: optional_str(get("session_id"), "session_id")?,
        lookahead_token_ids: token_list(get("lookahead_token_ids"), "lookahead_token_ids")?,
    })
}

/// A list of token IDs (`None` when absent or nil).
fn token_list(value: Option<&Value>, what: &str) -> Result<Option<Vec<TokenId>>, Error> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| TokenId::try_from(t).ok())
                    .ok_or_else(|| wrong("token id", "an integer in u32 range", t))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(wrong(what, "an array", other)),
    }
}

/// `extra_keys`: nil, or one entry (nil or a tuple) per block.
fn extra_keys(value: Option<&Value>) -> Result<Option<Vec<Option<Vec<KeyPart>>>>, Error> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::Array(entries)) => entries
            .iter()
            .map(|entry| match entry {
                Value::Nil => Ok(None),
                Value::Array(parts) => Ok(Some(parts.iter().map(key_part).collect())),
                other => Err(wrong("an extra_keys entry", "nil or an array", other)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(wrong("extra_keys", "nil or an array", other)),
    }
}

/// One element of an extra-keys tuple.
fn key_part(value: &Value) -> KeyPart {
    match value {
        Value::String(s) => match s.as_str() {
            Some(s) => KeyPart::Str(s.to_owned()),
            None => KeyPart::Bytes(s.as_bytes().to_vec()),
        },
        Value::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(v), _) => KeyPart::Int(i128::from(v)),
            (None, Some(v)) => KeyPart::Int(i128::from(v)),
            (None, None) => KeyPart::Other(i.to_string()),
        },
        Value::Binary(b) => KeyPart::Bytes(b.clone()),
        Value::Array(items) => KeyPart::Tuple(items.iter().map(key_part).collect()),
        other => KeyPart::Other(other.to_string()),
    }
}

/// The value of `name` in a msgpack map (string keys).
fn field<'v>(map: &'v Value, name: &str) -> Option<&'v Value> {
    match map {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn hashes(value: Option<&Value>, what: &str) -> Result<Vec<u64>, Error> {
    match value {
        Some(Value::Array(items)) => items.iter().map(|h| hash(h, what)).collect(),
        Some(other) => Err(wrong(what, "an array", other)),
        None => Err(Error::Decode(format!("missing {what}"))),
    }
}

/// A block hash: unsigned, signed (two's complement) or bytes (last 8, big-endian).
fn hash(value: &Value, what: &str) -> Result<u64, Error> {
    if let Some(h) = value.as_u64() {
        return Ok(h);
    }
    if let Some(h) = value.as_i64() {
        return Ok(h as u64);
    }
    if let Value::Binary(bytes) = value {
        if let Some(last) = bytes.last_chunk::<8>() {
            return Ok(u64::from_be_bytes(*last));
        }
        return Err(Error::Decode(format!(
            "{what}: a byte-string hash needs at least 8 bytes, got {}",
            bytes.len()
        )));
    }
    Err(wrong(what, "an integer or a byte string", value))
}

fn optional_str(value: Option<&Value>, what: &str) -> Result<Option<String>, Error> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            Some(s) => Ok(Some(s.to_owned())),
            None => Err(Error::Decode(format!("{what} is not valid UTF-8"))),
        },
        Some(other) => Err(wrong(what, "a string", other)),
    }
}

fn optional_u32(value: Option<&Value>, what: &str) -> Result<Option<u32>, Error> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| wrong(what, "an integer in u32 range", v)),
    }
}

fn wrong(what: &str, expected: &str, got: &Value) -> Error {
    let kind = match got {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "a byte string",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension value",
    };
    Error::Decode(format!("{what} must be {expected}, got {kind}"))
}

fn context(err: Error, at: &str) -> Error {
    match err {
        Error::Decode(msg) => Error::Decode(format!("{at}: {msg}")),
        other => other,
    }
}
