//! The mirror against vLLM's own code: `tests/conformance/run.sh` drives vLLM's real block
//! pool, KV cache manager and coordinators, offloading scheduler and event publisher (loaded
//! from the pinned vLLM wheel, downloaded at test time) through seeded workloads, and records
//! every event batch vLLM published and vLLM's own prefix-cache hit for probe prompts. This
//! test replays the batches into a [`CacheIndex`] through `sync::vllm` in the order they were
//! published and checks, at every probe, that the mirror's belief about the probed worker
//! equals vLLM's hit, token for token. `tests/conformance/README.md` says how to run it for
//! another vLLM version.
//!
//! A failed download or install fails the test: it never passes by skipping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use prefix_router::sync::vllm::{apply_batch, decode_batch};
use prefix_router::{CacheIndex, IndexConfig, RankLayout, SyncOutcome, namespace_salt};
use serde_json::Value;

/// Runs the harness (setting it up first if needed) and returns the folder of its output;
/// with `CONFORMANCE_OUT` set, replays that folder instead (a run kept from another version
/// or machine).
fn harness_output() -> PathBuf {
    if let Some(dir) = std::env::var_os("CONFORMANCE_OUT") {
        return PathBuf::from(dir);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance/run.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("bash runs tests/conformance/run.sh");
    assert!(
        out.status.success(),
        "tests/conformance/run.sh failed (it downloads the vLLM wheel and installs the \
         harness's Python dependencies from the package registry):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("run.sh prints a path");
    let dir = stdout
        .lines()
        .last()
        .expect("run.sh prints its output folder");
    PathBuf::from(dir.trim())
}

/// A scenario's header: how to build the mirror that follows it.
struct Header {
    scenario: String,
    block_size: usize,
    ranks: u32,
    chunk_blocks: usize,
    /// Whether some requests report their prefix hit again (`kv_cache_report_mode=full`).
    full_reports: bool,
}

impl Header {
    fn parse(line: &Value) -> Header {
        assert_eq!(line["kind"], "header", "{line}");
        let int = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("an integer: {line}"));
        Header {
            scenario: line["scenario"]
                .as_str()
                .expect("a scenario name")
                .to_owned(),
            block_size: int(&line["block_size"]) as usize,
            ranks: int(&line["ranks"]) as u32,
            chunk_blocks: line["offload"]
                .get("chunk_blocks")
                .map_or(1, |c| int(c) as usize),
            full_reports: line["full_reports"].as_bool().unwrap_or(false),
        }
    }
}

/// One probe the mirror got wrong (printed when the test fails).
#[derive(Debug)]
#[allow(dead_code)]
struct Miss {
    probe: u64,
    endpoint: u32,
    rank: u32,
    prompt_tokens: usize,
    vllm_device: u64,
    vllm_hit: u64,
    mirror: usize,
}

/// What replaying one scenario found.
#[derive(Debug, Default)]
struct Replay {
    batches: usize,
    probes: usize,
    /// Probes taken while a CPU store they would load was in flight: vLLM defers such a
    /// request until the store completes, and no event says a store has begun, so they are
    /// checked against the chunks stored so far (the harness's `external_pending`).
    pending: usize,
    hit_tokens: u64,
    outcome: SyncOutcome,
    misses: Vec<Miss>,
}

/// Replays one scenario's file and checks every probe.
fn replay(path: &Path) -> (Header, Replay) {
    let text = std::fs::read_to_string(path).expect("the harness wrote the file");
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object a line"));
    let header = Header::parse(&lines.next().expect("a header line"));
    let layout = RankLayout::new(header.ranks).expect("a rank layout");
    let config = IndexConfig::default()
        .with_block_size(header.block_size)
        .with_host_chunk_blocks(header.chunk_blocks)
        .with_full_reports(header.full_reports);
    let index = CacheIndex::new(config).expect("an index");
    let mut replay = Replay::default();
    let mut ended = false;
    for line in lines {
        match line["kind"].as_str() {
            Some("batch") => {
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(line["payload"].as_str().expect("a payload"))
                    .expect("base64");
                let batch = decode_batch(&payload).expect("vLLM's payload decodes");
                let endpoint = line["endpoint"].as_u64().expect("an endpoint") as u32;
                let seq = line["seq"].as_u64().expect("a seq");
                let outcome = apply_batch(&index, &layout, endpoint, seq, &batch)
                    .unwrap_or_else(|e| panic!("batch {seq} of endpoint {endpoint}: {e}"));
                replay.outcome.add(&outcome);
                replay.batches += 1;
            }
            Some("probe") => probe(&index, &layout, &line, &mut replay),
            Some("end") => {
                assert_eq!(line["batches"].as_u64(), Some(replay.batches as u64));
                assert_eq!(line["probes"].as_u64(), Some(replay.probes as u64));
                ended = true;
            }
            _ => panic!("an unknown line in {}: {line}", path.display()),
        }
    }
    assert!(ended, "{} has no end line", path.display());
    (header, replay)
}

/// Checks one probe: the mirror's cached tokens for the probed target against vLLM's hit.
fn probe(index: &CacheIndex, layout: &RankLayout, line: &Value, replay: &mut Replay) {
    let tokens: Vec<u32> = line["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("a token") as u32)
        .collect();
    let endpoint = line["endpoint"].as_u64().expect("an endpoint") as u32;
    let rank = line["rank"].as_u64().unwrap_or(0) as u32;
    let salt = namespace_salt(line["lora_name"].as_str(), line["cache_salt"].as_str());
    let target = layout.target(endpoint, rank).expect("a target");
    let mirror = index.reusable_tokens(target, &salt, &tokens);
    let vllm_hit = line["hit_tokens"].as_u64().expect("a hit");
    replay.probes += 1;
    replay.pending += usize::from(line["external_pending"].as_bool() == Some(true));
    replay.hit_tokens += vllm_hit;
    if mirror as u64 != vllm_hit {
        replay.misses.push(Miss {
            probe: line["id"].as_u64().unwrap_or(0),
            endpoint,
            rank,
            prompt_tokens: tokens.len(),
            vllm_device: line["device_hit_tokens"].as_u64().unwrap_or(0),
            vllm_hit,
            mirror,
        });
    }
}

#[test]
fn the_mirror_predicts_vllms_own_hit_for_every_probe() {
    let dir = harness_output();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    let mut results = BTreeMap::new();
    for file in &files {
        let (header, replay) = replay(file);
        results.insert(header.scenario, replay);
    }
    eprintln!(
        "scenario: probes exact, batches, mean vLLM hit (tokens), probes during a CPU store \
         in flight (vLLM defers them; checked against the chunks stored so far), sync outcome"
    );
    for (name, r) in &results {
        eprintln!(
            "{name}: {}/{} exact, {} batches, {:.1}, {} in flight, {:?}",
            r.probes - r.misses.len(),
            r.probes,
            r.batches,
            r.hit_tokens as f64 / r.probes.max(1) as f64,
            r.pending,
            r.outcome
        );
        for m in r.misses.iter().take(5) {
            eprintln!("  {m:?}");
        }
    }
    let expected = [
        "dp",
        "hybrid_sw128",
        "hybrid_sw512",
        "namespaces",
        "offload_placeholder",
        "offload_self_describing",
        "plain",
    ];
    assert_eq!(
        results.keys().map(String::as_str).collect::<Vec<_>>(),
        expected,
        "the harness wrote every scenario"
    );
    for (name, r) in &results {
        let o = &r.outcome;
        assert_eq!(
            (
                o.unknown_parent_blocks,
                o.unknown_removed_blocks,
                o.unknown_blocks,
                o.skipped_blocks
            ),
            (0, 0, 0, 0),
            "{name}: every event vLLM published was applied"
        );
        assert!(r.probes >= 500, "{name}: only {} probes", r.probes);
        assert!(
            r.hit_tokens > 0,
            "{name}: vLLM never hit, so nothing was tested"
        );
        assert!(
            r.misses.is_empty(),
            "{name}: {} of {} probes differ from vLLM's own hit",
            r.misses.len(),
            r.probes
        );
    }
}
