//! Every field of the engines' current wire formats, by committed payloads with expected
//! decodings (`tests/data/vllm/`, written by msgspec from `generate.py`): vLLM 0.33
//! (positional and map, unsigned and signed hashes), SGLang (its rank field and mediums),
//! TensorRT-LLM's push mode (coalesced blocks).

#![cfg(feature = "vllm")]
#![allow(clippy::unwrap_used)]

use prefix_router::sync::vllm::{EngineEvent, KeyPart, apply_batch, decode_batch};
use prefix_router::*;
use serde_json::Value;

const FOLDERS: [&str; 6] = [
    "v033_array_u64",
    "v033_map_u64",
    "v033_array_i64",
    "sglang_array_i64",
    "sglang_map_i64",
    "trtllm_coalesced_u64",
];

fn dir(folder: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/vllm")
        .join(folder)
}

fn key_part(v: &Value) -> KeyPart {
    match v {
        Value::String(s) => KeyPart::Str(s.clone()),
        Value::Number(n) => KeyPart::Int(i128::from(n.as_i64().unwrap())),
        Value::Array(items) => KeyPart::Tuple(items.iter().map(key_part).collect()),
        other => panic!("unexpected extra key {other}"),
    }
}

fn opt_str(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn opt_u32(v: &Value) -> Option<u32> {
    v.as_u64().map(|n| n as u32)
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

fn u32s(v: &Value) -> Option<Vec<u32>> {
    v.as_array()
        .map(|a| a.iter().map(|t| t.as_u64().unwrap() as u32).collect())
}

/// Compares every field of a decoded event with its expectation.
fn check(event: &EngineEvent, want: &Value, at: &str) {
    match (event, want["type"].as_str().unwrap()) {
        (
            EngineEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
                extra_keys,
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                locality,
                ownership,
                session_id,
                lookahead_token_ids,
                ..
            },
            "BlockStored",
        ) => {
            assert_eq!(block_hashes, &u64s(&want["block_hashes"]), "{at}");
            assert_eq!(
                *parent_block_hash,
                want["parent_block_hash"].as_u64(),
                "{at}"
            );
            assert_eq!(Some(token_ids.clone()), u32s(&want["token_ids"]), "{at}");
            assert_eq!(
                *block_size as u64,
                want["block_size"].as_u64().unwrap(),
                "{at}"
            );
            assert_eq!(*lora_id, want["lora_id"].as_i64(), "{at}");
            assert_eq!(*medium, opt_str(&want["medium"]), "{at}");
            assert_eq!(*lora_name, opt_str(&want["lora_name"]), "{at}");
            let keys = want["extra_keys"].as_array().map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        e.as_array()
                            .map(|parts| parts.iter().map(key_part).collect())
                    })
                    .collect::<Vec<_>>()
            });
            assert_eq!(*extra_keys, keys, "{at}");
            assert_eq!(*group_idx, opt_u32(&want["group_idx"]), "{at}");
            assert_eq!(
                *kv_cache_spec_kind,
                opt_str(&want["kv_cache_spec_kind"]),
                "{at}"
            );
            let window = opt_u32(&want["kv_cache_spec_sliding_window"]);
            assert_eq!(*kv_cache_spec_sliding_window, window, "{at}");
            assert_eq!(*locality, opt_str(&want["locality"]), "{at}");
            assert_eq!(*ownership, opt_str(&want["ownership"]), "{at}");
            assert_eq!(*session_id, opt_str(&want["session_id"]), "{at}");
            assert_eq!(
                *lookahead_token_ids,
                u32s(&want["lookahead_token_ids"]),
                "{at}"
            );
        }
        (
            EngineEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
                locality,
                ownership,
                ..
            },
            "BlockRemoved",
        ) => {
            assert_eq!(block_hashes, &u64s(&want["block_hashes"]), "{at}");
            assert_eq!(*medium, opt_str(&want["medium"]), "{at}");
            assert_eq!(*group_idx, opt_u32(&want["group_idx"]), "{at}");
            assert_eq!(*locality, opt_str(&want["locality"]), "{at}");
            assert_eq!(*ownership, opt_str(&want["ownership"]), "{at}");
        }
        (EngineEvent::AllBlocksCleared, "AllBlocksCleared") => {}
        (got, want) => panic!("{at}: decoded {got:?}, expected a {want}"),
    }
}

#[test]
fn every_field_of_every_engine_decodes_as_expected_and_applies() {
    for folder in FOLDERS {
        let expected: Value = serde_json::from_str(
            &std::fs::read_to_string(dir(folder).join("expected.json")).unwrap(),
        )
        .unwrap();
        let layout = RankLayout::new(4).unwrap();
        let router = BalancedRouter::new(layout.targets(1))
            .unwrap()
            .with_rank_layout(layout);
        for batch in expected.as_array().unwrap() {
            let file = batch["file"].as_str().unwrap();
            let at = format!("{folder}/{file}");
            let decoded = decode_batch(&std::fs::read(dir(folder).join(file)).unwrap()).unwrap();
            assert_eq!(decoded.ts, batch["ts"].as_f64().unwrap(), "{at}");
            assert_eq!(
                decoded.data_parallel_rank,
                opt_u32(&batch["data_parallel_rank"]),
                "{at}"
            );
            let events = batch["events"].as_array().unwrap();
            assert_eq!(decoded.events.len(), events.len(), "{at}");
            for (event, want) in decoded.events.iter().zip(events) {
                check(event, want, &at);
            }
            let seq = batch["seq"].as_u64().unwrap();
            let outcome = apply_batch(&router, &layout, 0, seq, &decoded).unwrap();
            assert_eq!(outcome.unknown_parent_blocks, 0, "{at}: {outcome:?}");
            router.index().with_tree(|t| t.validate()).unwrap();
        }
    }
}

/// The decoded events in the router's terms: tiers from mediums, groups and their kinds,
/// the namespace from the LoRA name and the cache salt, the image's block key, the
/// placeholder copy.
#[test]
fn the_v033_fields_map_onto_the_mirror() {
    let decoded =
        decode_batch(&std::fs::read(dir("v033_map_u64").join("batch_00.msgpack")).unwrap())
            .unwrap();
    let CacheEvent::Stored {
        tier,
        group,
        salt,
        keys,
        ..
    } = decoded.events[0].to_cache_event()
    else {
        panic!("a store")
    };
    assert_eq!((tier, group), (Tier::Device, 0));
    assert_eq!(salt, namespace_salt(Some("finance"), Some("tenant-9")));
    assert_eq!(keys, [BlockKey::from_parts(0, &[b"img-7f3a", b"0"])]);
    let CacheEvent::Stored { group, kind, .. } = decoded.events[1].to_cache_event() else {
        panic!("a store")
    };
    assert_eq!((group, kind), (1, GroupKind::SlidingWindow { tokens: 512 }));
    let second =
        decode_batch(&std::fs::read(dir("v033_map_u64").join("batch_01.msgpack")).unwrap())
            .unwrap();
    let placeholder = second.events[0].to_cache_event();
    assert!(placeholder.is_placeholder());
    assert!(matches!(
        placeholder,
        CacheEvent::Stored {
            tier: Tier::Host,
            ..
        }
    ));
    let sglang =
        decode_batch(&std::fs::read(dir("sglang_map_i64").join("batch_01.msgpack")).unwrap())
            .unwrap();
    assert_eq!(sglang.data_parallel_rank, Some(3));
    let tiers: Vec<Tier> = sglang
        .events
        .iter()
        .map(|e| match e.to_cache_event() {
            CacheEvent::Stored { tier, .. } | CacheEvent::Removed { tier, .. } => tier,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(tiers, [Tier::Disk, Tier::Host, Tier::Device]);
}

/// A request routed in the namespace and with the image key that the engine's events carry
/// finds the blocks those events stored.
#[test]
fn a_request_in_the_events_namespace_finds_their_blocks() {
    let router = BalancedRouter::new(1).unwrap();
    let batch =
        decode_batch(&std::fs::read(dir("v033_array_u64").join("batch_00.msgpack")).unwrap())
            .unwrap();
    let CacheEvent::Stored { tokens, .. } = batch.events[0].to_cache_event() else {
        panic!("a store")
    };
    router
        .apply_event(WorkerId::new(0), 0, &batch.events[0].to_cache_event())
        .unwrap();
    let salt = namespace_salt(Some("finance"), Some("tenant-9"));
    let keys = [BlockKey::from_parts(0, &[b"img-7f3a", b"0"])];
    let request = RouteRequest::new(&tokens).with_salt(&salt).with_keys(&keys);
    let d = router.route(&request).unwrap();
    assert_eq!(d.cached_tokens(), 32);
    router.complete(&d);
    let plain = router.route(&RouteRequest::new(&tokens)).unwrap();
    assert_eq!(plain.cached_tokens(), 0, "another namespace");
    router.complete(&plain);
}
