//! The mirror against vLLM's own code: `tests/conformance/run.sh` drives vLLM's real block
//! pool, KV cache manager and coordinators, offloading scheduler and event publisher (loaded
//! from the pinned vLLM wheel, downloaded at test time) through seeded workloads over a grid
//! of engine settings, and records every event batch vLLM published and vLLM's own
//! prefix-cache hit for probe prompts. This test replays each run's batches into a
//! [`CacheIndex`] through `sync::vllm` in the order they were published, each worker
//! configured with [`CacheSync::set_engine_settings`] as its engine was, and checks at every
//! probe that the mirror's answer for the probed worker equals vLLM's hit, token for token.
//! A second index replays the same batches with only the settings events cannot show (a
//! placeholder engine's chunk size, the report mode): what self-describing events teach
//! must give the same answers. `tests/conformance/README.md` says how to run the full grid
//! and another vLLM version.
//!
//! A failed download or install fails the test: it never passes by skipping.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use prefix_router::sync::vllm::{EngineEvent, EventBatch, apply_batch, decode_batch};
use prefix_router::{
    CacheIndex, CacheSync, EngineSettings, GroupKind, IndexConfig, RankLayout, SyncOutcome,
    WorkerId, namespace_salt,
};
use serde_json::Value;

/// Every family the harness's sample holds (`tests/conformance/scenarios.py`).
const FAMILIES: [&str; 11] = [
    "dp",
    "hybrid_mixed",
    "hybrid_offload",
    "hybrid_sw128",
    "hybrid_sw512",
    "mixed",
    "namespaces",
    "offload_mixed",
    "offload_placeholder",
    "offload_self_describing",
    "plain",
];
/// Probes every run must hold at least (a run has 41 rounds of 8 to 16 prompts, each
/// probed on every engine).
const MIN_PROBES: usize = 500;
/// The index's default chunk size, which no engine of the grid uses: a worker whose chunk
/// the mirror neither was told nor learned would be read wrongly.
const DEFAULT_CHUNK: usize = 3;
/// Batches kept per worker to print with a disagreement, and events printed per batch.
const KEPT_BATCHES: usize = 6;
const EVENTS_PER_BATCH: usize = 12;

/// Runs the harness (setting it up first if needed) and returns the folder of its output;
/// with `CONFORMANCE_OUT` set, replays that folder instead (the full grid, or a run kept
/// from another version or machine).
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

/// One engine as the header describes it.
#[derive(Clone, Debug)]
struct Engine {
    endpoint: u32,
    rank: u32,
    label: String,
    /// Each group beyond the main one, with its kind.
    groups: Vec<(u32, GroupKind)>,
    /// Blocks per CPU chunk, and whether CPU stores are self-describing.
    offload: Option<(usize, bool)>,
    full_reports: bool,
}

impl Engine {
    fn parse(e: &Value) -> Engine {
        let int = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("an integer: {e}"));
        let groups = e["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .enumerate()
            .skip(1)
            .map(|(g, spec)| {
                let kind = GroupKind::from_spec(
                    spec["kind"].as_str(),
                    spec["window"].as_u64().map(|w| w as u32),
                );
                (g as u32, kind)
            })
            .collect();
        let offload = e["offload"].as_object().map(|o| {
            (
                int(&o["chunk_blocks"]) as usize,
                o["self_describing"].as_bool().expect("a flag"),
            )
        });
        Engine {
            endpoint: int(&e["endpoint"]) as u32,
            rank: int(&e["rank"]) as u32,
            label: e["label"].as_str().expect("a label").to_owned(),
            groups,
            offload,
            full_reports: e["full_reports"].as_bool().expect("full_reports"),
        }
    }

    /// The settings a host sets for this engine: everything it was configured with.
    fn settings(&self) -> EngineSettings {
        let mut s = EngineSettings::default().with_full_reports(self.full_reports);
        if let Some((chunk, _)) = self.offload {
            s = s.with_host_chunk_blocks(chunk);
        }
        for &(g, kind) in &self.groups {
            s = s.with_group(g, kind);
        }
        s
    }

    /// Only the settings its events cannot show: the report mode, and the chunk size of
    /// placeholder CPU stores (vLLM's GPU stores state each group's kind and window, and
    /// self-describing CPU stores carry a chunk's blocks).
    fn unlearnable_settings(&self) -> EngineSettings {
        let mut s = EngineSettings::default().with_full_reports(self.full_reports);
        if let Some((chunk, false)) = self.offload {
            s = s.with_host_chunk_blocks(chunk);
        }
        s
    }
}

/// A run's header: how to build the mirror that follows it.
struct Header {
    scenario: String,
    family: String,
    seed: u64,
    block_size: usize,
    ranks: u32,
    engines: Vec<Engine>,
}

impl Header {
    fn parse(line: &Value) -> Header {
        assert_eq!(line["kind"], "header", "{line}");
        let int = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("an integer: {line}"));
        let text = |v: &Value| v.as_str().expect("a string").to_owned();
        Header {
            scenario: text(&line["scenario"]),
            family: text(&line["family"]),
            seed: int(&line["seed"]),
            block_size: int(&line["block_size"]) as usize,
            ranks: int(&line["ranks"]) as u32,
            engines: line["engines"]
                .as_array()
                .expect("engines")
                .iter()
                .map(Engine::parse)
                .collect(),
        }
    }

    fn engine(&self, endpoint: u32, rank: u32) -> &Engine {
        self.engines
            .iter()
            .find(|e| (e.endpoint, e.rank) == (endpoint, rank))
            .unwrap_or_else(|| panic!("the header describes engine {endpoint}/{rank}"))
    }
}

/// One probe the mirror got wrong, with what led there (printed when the test fails).
struct Miss {
    text: String,
}

/// What replaying one run found.
#[derive(Default)]
struct Replay {
    batches: usize,
    probes: usize,
    /// Probes taken while a CPU store they would load was in flight: vLLM defers such a
    /// request until the store completes, and no event says a store has begun, so they are
    /// checked against the chunks stored so far (the harness's `external_pending`).
    pending: usize,
    resets: usize,
    hit_tokens: u64,
    external_tokens: u64,
    outcome: SyncOutcome,
    learned_outcome: SyncOutcome,
    misses: Vec<Miss>,
    /// Probes the index with learned settings answered otherwise than the configured one.
    learned_misses: Vec<String>,
    /// Settings the learning index ended with that differ from the engine's.
    learned_settings: Vec<String>,
}

/// The last batches applied to each worker, decoded, for a disagreement's account.
#[derive(Default)]
struct Trail {
    by_target: BTreeMap<u32, VecDeque<String>>,
}

impl Trail {
    fn record(&mut self, target: WorkerId, seq: u64, batch: &EventBatch) {
        let mut text = format!("    batch seq {seq} ({} events)", batch.events.len());
        for event in batch.events.iter().take(EVENTS_PER_BATCH) {
            let _ = write!(text, "\n      {}", describe(event));
        }
        if batch.events.len() > EVENTS_PER_BATCH {
            let _ = write!(
                text,
                "\n      ... {} more",
                batch.events.len() - EVENTS_PER_BATCH
            );
        }
        let kept = self.by_target.entry(target.get()).or_default();
        kept.push_back(text);
        if kept.len() > KEPT_BATCHES {
            kept.pop_front();
        }
    }

    fn last(&self, target: WorkerId) -> String {
        self.by_target
            .get(&target.get())
            .map(|k| k.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_else(|| "    (no batch)".to_owned())
    }
}

/// A short hash (its low 32 bits in hex).
fn short(hash: u64) -> String {
    format!("{:08x}", hash as u32)
}

/// One event in a line: kind, medium, group, hashes (first and last), parent, tokens.
fn describe(event: &EngineEvent) -> String {
    let hashes = |h: &[u64]| match h {
        [] => "[]".to_owned(),
        [one] => format!("[{}]", short(*one)),
        [first, .., last] => format!("[{}..{} x{}]", short(*first), short(*last), h.len()),
    };
    match event {
        EngineEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            medium,
            lora_name,
            extra_keys,
            group_idx,
            kv_cache_spec_kind,
            kv_cache_spec_sliding_window,
            ..
        } => {
            let salted = extra_keys
                .as_ref()
                .and_then(|k| k.first().cloned().flatten())
                .is_some();
            format!(
                "Stored {} g{} {} parent {} tokens {}{}{}{}",
                medium.as_deref().unwrap_or("-"),
                group_idx.unwrap_or(0),
                hashes(block_hashes),
                parent_block_hash.map_or("none".to_owned(), short),
                token_ids.len(),
                lora_name
                    .as_ref()
                    .map_or(String::new(), |l| format!(" lora {l}")),
                if salted { " extra_keys" } else { "" },
                kv_cache_spec_kind
                    .as_ref()
                    .map_or(String::new(), |k| format!(
                        " {k}{}",
                        kv_cache_spec_sliding_window.map_or(String::new(), |w| format!("({w})"))
                    )),
            )
        }
        EngineEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
            ..
        } => format!(
            "Removed {} g{} {}",
            medium.as_deref().unwrap_or("-"),
            group_idx.unwrap_or(0),
            hashes(block_hashes)
        ),
        EngineEvent::AllBlocksCleared => "AllBlocksCleared".to_owned(),
        other => format!("{other:?}"),
    }
}

/// Both mirrors of one run: configured as the engines were, and left to learn what events
/// show.
struct Mirrors {
    layout: RankLayout,
    configured: CacheIndex,
    learned: CacheIndex,
}

impl Mirrors {
    fn new(header: &Header) -> Mirrors {
        let layout = RankLayout::new(header.ranks).expect("a rank layout");
        let config = IndexConfig::default()
            .with_block_size(header.block_size)
            .with_host_chunk_blocks(DEFAULT_CHUNK);
        let configured = CacheIndex::new(config).expect("an index");
        let learned = CacheIndex::new(config).expect("an index");
        for e in &header.engines {
            let target = layout.target(e.endpoint, e.rank).expect("a target");
            configured
                .set_engine_settings(target, &e.settings())
                .expect("valid settings");
            learned
                .set_engine_settings(target, &e.unlearnable_settings())
                .expect("valid settings");
        }
        Mirrors {
            layout,
            configured,
            learned,
        }
    }
}

/// Replays one run's file and checks every probe.
fn replay(path: &Path) -> (Header, Replay) {
    let text = std::fs::read_to_string(path).expect("the harness wrote the file");
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object a line"));
    let header = Header::parse(&lines.next().expect("a header line"));
    let mirrors = Mirrors::new(&header);
    let mut trail = Trail::default();
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
                let apply = |index: &CacheIndex| {
                    apply_batch(index, &mirrors.layout, endpoint, seq, &batch)
                        .unwrap_or_else(|e| panic!("batch {seq} of endpoint {endpoint}: {e}"))
                };
                replay.outcome.add(&apply(&mirrors.configured));
                replay.learned_outcome.add(&apply(&mirrors.learned));
                let rank = batch.data_parallel_rank.unwrap_or(0);
                let target = mirrors.layout.target(endpoint, rank).expect("a target");
                trail.record(target, seq, &batch);
                replay.batches += 1;
            }
            Some("reset") => reset(&header, &mirrors, &line, &mut replay),
            Some("probe") => probe(&header, &mirrors, &trail, &line, &mut replay),
            Some("end") => {
                assert_eq!(line["batches"].as_u64(), Some(replay.batches as u64));
                assert_eq!(line["probes"].as_u64(), Some(replay.probes as u64));
                ended = true;
            }
            _ => panic!("an unknown line in {}: {line}", path.display()),
        }
    }
    assert!(ended, "{} has no end line", path.display());
    // What the learning index ended with: every engine's settings, learned or set.
    for e in &header.engines {
        let target = mirrors.layout.target(e.endpoint, e.rank).expect("a target");
        let learned = mirrors.learned.engine_settings(target);
        let configured = mirrors.configured.engine_settings(target);
        // A self-describing engine that never stored a CPU chunk shows no chunk size.
        let chunk_shown = learned.host_chunk_blocks != Some(DEFAULT_CHUNK);
        let chunk_ok = e.offload.is_none() || !chunk_shown || {
            learned.host_chunk_blocks == configured.host_chunk_blocks
        };
        if learned.groups != configured.groups || !chunk_ok {
            replay.learned_settings.push(format!(
                "engine {}/{} ({}): learned {learned:?}, configured {configured:?}",
                e.endpoint, e.rank, e.label
            ));
        }
    }
    (header, replay)
}

/// A prefix-cache reset: one that dropped the connector's CPU copies publishes no removal
/// for them, so the host that made it tells the mirror (`replace_worker_cache` with
/// nothing), as `docs/mirror-and-sync.md` says.
fn reset(header: &Header, mirrors: &Mirrors, line: &Value, replay: &mut Replay) {
    let endpoint = line["endpoint"].as_u64().expect("an endpoint") as u32;
    let rank = line["rank"].as_u64().expect("a rank") as u32;
    let engine = header.engine(endpoint, rank);
    replay.resets += 1;
    if line["reset_connector"].as_bool() == Some(true) && engine.offload.is_some() {
        let target = mirrors.layout.target(endpoint, rank).expect("a target");
        for index in [&mirrors.configured, &mirrors.learned] {
            index
                .replace_worker_cache(target, &[])
                .expect("a known worker");
        }
    }
}

/// Checks one probe: each mirror's reusable tokens for the probed target against vLLM's
/// hit.
fn probe(header: &Header, mirrors: &Mirrors, trail: &Trail, line: &Value, replay: &mut Replay) {
    let tokens: Vec<u32> = line["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("a token") as u32)
        .collect();
    let endpoint = line["endpoint"].as_u64().expect("an endpoint") as u32;
    let rank = line["rank"].as_u64().unwrap_or(0) as u32;
    let lora = line["lora_name"].as_str();
    let cache_salt = line["cache_salt"].as_str();
    let salt = namespace_salt(lora, cache_salt);
    let target = mirrors.layout.target(endpoint, rank).expect("a target");
    let mirror = mirrors.configured.reusable_tokens(target, &salt, &tokens);
    let learned = mirrors.learned.reusable_tokens(target, &salt, &tokens);
    let vllm_hit = line["hit_tokens"].as_u64().expect("a hit");
    let device = line["device_hit_tokens"].as_u64().unwrap_or(0);
    let external = line["external_hit_tokens"].as_u64().unwrap_or(0);
    let pending = line["external_pending"].as_bool() == Some(true);
    let id = line["id"].as_u64().unwrap_or(0);
    replay.probes += 1;
    replay.pending += usize::from(pending);
    replay.hit_tokens += vllm_hit;
    replay.external_tokens += external;
    if learned != mirror {
        replay.learned_misses.push(format!(
            "probe {id} on {endpoint}/{rank}: configured {mirror}, learned {learned}"
        ));
    }
    if mirror as u64 == vllm_hit {
        return;
    }
    let engine = header.engine(endpoint, rank);
    let text = format!(
        "{scenario} (seed {seed}) probe {id} ({kind}, {len} tokens, lora {lora:?}, salt \
         {cache_salt:?}) on engine {endpoint}/{rank} [{label}; settings {settings:?}]: vLLM \
         hit {vllm_hit} (device {device}, external {external}{pend}), the mirror {mirror}\n  \
         the last batches applied to that worker, oldest first:\n{batches}",
        scenario = header.scenario,
        seed = header.seed,
        kind = line["probe_kind"].as_str().unwrap_or("?"),
        len = tokens.len(),
        label = engine.label,
        settings = mirrors.configured.engine_settings(target),
        pend = if pending {
            ", a CPU store in flight"
        } else {
            ""
        },
        batches = trail.last(target),
    );
    replay.misses.push(Miss { text });
}

/// Replays every file, spread over the machine's threads.
fn replay_all(files: &[PathBuf]) -> Vec<(Header, Replay)> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<(Header, Replay)>> = files.iter().map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(file) = files.get(i) else { break };
                    let result = replay(file);
                    slots.lock().expect("no replay panicked")[i] = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every file replayed"))
        .collect()
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
    let results = replay_all(&files);
    eprintln!(
        "run [engines]: probes exact, batches, mean vLLM hit and external hit (tokens), \
         probes during a CPU store in flight (vLLM defers them; checked against the chunks \
         stored so far), resets"
    );
    let mut families: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for (h, r) in &results {
        let labels: Vec<String> = h
            .engines
            .iter()
            .map(|e| format!("{}/{}: {}", e.endpoint, e.rank, e.label))
            .collect();
        eprintln!(
            "{} [{}]: {}/{} exact, {} batches, {:.1} / {:.1}, {} in flight, {} resets",
            h.scenario,
            labels.join(" | "),
            r.probes - r.misses.len(),
            r.probes,
            r.batches,
            r.hit_tokens as f64 / r.probes.max(1) as f64,
            r.external_tokens as f64 / r.probes.max(1) as f64,
            r.pending,
            r.resets,
        );
        for m in r.misses.iter().take(3) {
            eprintln!("  {}", m.text);
        }
        for m in r.learned_misses.iter().take(3) {
            eprintln!("  learned settings answer otherwise: {m}");
        }
        for m in &r.learned_settings {
            eprintln!("  learned settings differ: {m}");
        }
        let f = families.entry(h.family.as_str()).or_default();
        f.0 += 1;
        f.1 += r.probes;
        f.2 += r.probes - r.misses.len();
    }
    eprintln!("family: runs, probes exact");
    for (name, (runs, probes, exact)) in &families {
        eprintln!("{name}: {runs} runs, {exact}/{probes} exact");
    }
    assert_eq!(
        families.keys().copied().collect::<Vec<_>>(),
        FAMILIES,
        "the harness wrote every family"
    );
    for (h, r) in &results {
        let name = &h.scenario;
        for o in [&r.outcome, &r.learned_outcome] {
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
        }
        assert_eq!(
            r.outcome.settings_conflicts, 0,
            "{name}: no event contradicts the engines' settings"
        );
        assert!(r.probes >= MIN_PROBES, "{name}: only {} probes", r.probes);
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
        assert!(
            r.learned_misses.is_empty() && r.learned_settings.is_empty(),
            "{name}: the settings events show, learned, answer otherwise than set"
        );
    }
}
