//! What the mirror must know of each engine that its KV events may not say, on the command
//! line of the examples that follow vLLM engines' events (`vllm_events`, `gateway`): the
//! defaults for every engine (`--host-chunk-blocks`, `--full-reports`) and, for an engine
//! configured otherwise, `--engine-settings N:SETTING,...`.
//!
//! `N` is the worker (`vllm_events`) or the upstream (`gateway`, from 0 in the order of the
//! `--upstream` flags; its data-parallel ranks share its engine's settings). The settings:
//!
//! - `host-chunk-blocks=B`: the engine offloads to CPU in chunks of `B` blocks (vLLM's
//!   `blocks_per_chunk`: its offloaded block size over its GPU block size);
//! - `full-reports` (or `full-reports=true|false`): its requests are sent with
//!   `kv_cache_report_mode=full`;
//! - `window=G:T`: its KV-cache group `G` (1 and up) keeps a sliding window of `T` tokens;
//!   `mamba=G`: group `G` is a Mamba layer's; `full-attention=G`: group `G` is full attention.
//!
//! For example `--engine-settings 1:host-chunk-blocks=4,full-reports,window=1:512`.

use prefix_router::{EngineSettings, GroupKind};

/// The syntax of one `--engine-settings` value, for errors.
const SYNTAX: &str = "N:SETTING,... with settings host-chunk-blocks=B, full-reports[=true|false], \
                      window=G:TOKENS, mamba=G, full-attention=G";

/// The flags every engine-following example takes, beside its block size.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Engine settings (as the engines are configured)")]
pub(crate) struct EngineArgs {
    /// Blocks per chunk of every engine's CPU offloading (vLLM's blocks_per_chunk), unless
    /// --engine-settings says otherwise.
    #[arg(long, value_name = "B", default_value_t = 1, value_parser = chunk_blocks)]
    pub(crate) host_chunk_blocks: usize,
    /// Every engine's requests are sent with kv_cache_report_mode=full (a prefix hit is
    /// reported again as a store), unless --engine-settings says otherwise.
    #[arg(long)]
    pub(crate) full_reports: bool,
    /// A worker's engine settings where they differ from the defaults (N: the worker):
    /// N:SETTING,... with host-chunk-blocks=B, full-reports[=true|false], window=G:TOKENS
    /// (KV-cache group G keeps a sliding window), mamba=G, full-attention=G. Once per
    /// worker.
    #[arg(long = "engine-settings", value_name = "N:SETTINGS", value_parser = parse)]
    pub(crate) engines: Vec<EngineFlag>,
}

/// One `--engine-settings` value: which engine, and its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineFlag {
    /// The worker, or the upstream.
    pub(crate) engine: u32,
    pub(crate) settings: EngineSettings,
}

/// `--host-chunk-blocks`: 1 to 65536.
fn chunk_blocks(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=1 << 16).contains(&n) => Ok(n),
        _ => Err("a number of blocks from 1 to 65536".to_owned()),
    }
}

/// A number at least 1, for `what`.
fn positive<T: std::str::FromStr + PartialOrd + From<u8>>(
    value: &str,
    what: &str,
) -> Result<T, String> {
    match value.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("{value:?}: {what} must be a number, at least 1")),
    }
}

/// Parses one `--engine-settings` value (`N:SETTING,...`).
///
/// # Errors
/// A one-line message naming what is wrong and the syntax.
pub(crate) fn parse(value: &str) -> Result<EngineFlag, String> {
    let Some((engine, list)) = value.split_once(':') else {
        return Err(format!("expected {SYNTAX}"));
    };
    let engine = engine.trim().parse::<u32>().map_err(|_| {
        format!("{engine:?} before ':' must be the engine's number; expected {SYNTAX}")
    })?;
    let mut settings = EngineSettings::default();
    let mut seen: Vec<String> = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let (key, v) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (item, None),
        };
        let mut once = |name: String| {
            if seen.contains(&name) {
                return Err(format!("{name} is given twice for engine {engine}"));
            }
            seen.push(name);
            Ok(())
        };
        match (key, v) {
            ("host-chunk-blocks", Some(v)) => {
                once(key.to_owned())?;
                settings = settings.with_host_chunk_blocks(
                    chunk_blocks(v).map_err(|e| format!("host-chunk-blocks={v}: {e}"))?,
                );
            }
            ("full-reports", None | Some("true")) => {
                once(key.to_owned())?;
                settings = settings.with_full_reports(true);
            }
            ("full-reports", Some("false")) => {
                once(key.to_owned())?;
                settings = settings.with_full_reports(false);
            }
            ("full-reports", Some(v)) => {
                return Err(format!("full-reports={v}: true or false"));
            }
            ("window", Some(v)) => {
                let (group, tokens) = v.split_once(':').ok_or_else(|| {
                    format!("window={v}: expected window=G:TOKENS (group G, TOKENS tokens)")
                })?;
                let group: u32 =
                    positive(group, "the group (1 and up: group 0 is full attention)")?;
                let tokens: usize = positive(tokens, "the window, in tokens,")?;
                once(format!("group {group}"))?;
                settings = settings.with_group(group, GroupKind::SlidingWindow { tokens });
            }
            ("mamba" | "full-attention", Some(v)) => {
                let group: u32 = positive(v, "the group (1 and up: group 0 is full attention)")?;
                once(format!("group {group}"))?;
                let kind = if key == "mamba" {
                    GroupKind::Mamba
                } else {
                    GroupKind::FullAttention
                };
                settings = settings.with_group(group, kind);
            }
            _ => return Err(format!("unknown setting {item:?}; expected {SYNTAX}")),
        }
    }
    if seen.is_empty() {
        return Err(format!(
            "no settings for engine {engine}; expected {SYNTAX}"
        ));
    }
    settings.validate().map_err(|e| e.to_string())?;
    Ok(EngineFlag { engine, settings })
}

/// `settings` in `--engine-settings`'s syntax (what is left unset is left out).
pub(crate) fn describe(settings: &EngineSettings) -> String {
    let mut parts = Vec::new();
    if let Some(b) = settings.host_chunk_blocks {
        parts.push(format!("host-chunk-blocks={b}"));
    }
    if let Some(full) = settings.full_reports {
        parts.push(format!("full-reports={full}"));
    }
    for &(group, kind) in &settings.groups {
        parts.push(match kind {
            GroupKind::SlidingWindow { tokens } => format!("window={group}:{tokens}"),
            GroupKind::Mamba => format!("mamba={group}"),
            _ => format!("full-attention={group}"),
        });
    }
    parts.join(",")
}

/// The settings given for each of `engines` engines (`None`: the defaults), from the
/// `--engine-settings` values `flags`; `what` names an engine in errors (`worker`,
/// `upstream`).
///
/// # Errors
/// When a value names an engine past the last, or one engine twice.
pub(crate) fn per_engine(
    flags: &[EngineFlag],
    engines: u32,
    what: &str,
) -> Result<Vec<Option<EngineSettings>>, String> {
    let mut out = vec![None; engines as usize];
    for flag in flags {
        let Some(slot) = out.get_mut(flag.engine as usize) else {
            return Err(format!(
                "--engine-settings {}: there is no {what} {} ({what}s 0 to {})",
                flag.engine,
                flag.engine,
                engines.saturating_sub(1)
            ));
        };
        if slot.is_some() {
            return Err(format!(
                "--engine-settings names {what} {} twice: give its settings in one value",
                flag.engine
            ));
        }
        *slot = Some(flag.settings.clone());
    }
    Ok(out)
}

/// What is assumed of `who`'s engine, engine `engine` of `--engine-settings`: `effective`,
/// every setting filled, and where it comes from (`given`, or the defaults).
pub(crate) fn assumed(
    who: &str,
    engine: u32,
    effective: &EngineSettings,
    given: Option<&EngineSettings>,
) -> String {
    let from = match given {
        Some(given) => format!(
            "--engine-settings {engine}:{}, the rest by default",
            describe(given)
        ),
        None => "the defaults".to_owned(),
    };
    format!("{who}: assuming {} ({from})", describe(effective))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_parses_and_reads_back_in_the_same_syntax() {
        let f = parse("2:host-chunk-blocks=4,full-reports,window=1:512,mamba=3").unwrap();
        assert_eq!(f.engine, 2);
        let expected = EngineSettings::default()
            .with_host_chunk_blocks(4)
            .with_full_reports(true)
            .with_group(1, GroupKind::SlidingWindow { tokens: 512 })
            .with_group(3, GroupKind::Mamba);
        assert_eq!(f.settings, expected);
        assert_eq!(
            describe(&f.settings),
            "host-chunk-blocks=4,full-reports=true,window=1:512,mamba=3"
        );
        let again = parse(&format!("2:{}", describe(&f.settings))).unwrap();
        assert_eq!(again, f);
        let off = parse("0:full-reports=false,full-attention=2").unwrap();
        assert_eq!(
            describe(&off.settings),
            "full-reports=false,full-attention=2"
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let err = |v: &str| parse(v).err().unwrap_or_default();
        assert!(
            err("host-chunk-blocks=4").contains("expected N:SETTING"),
            "{}",
            err("host-chunk-blocks=4")
        );
        assert!(err("x:full-reports").contains("engine's number"));
        assert!(err("1:").contains("no settings"));
        assert!(err("1:host-chunk-blocks=0").contains("from 1 to 65536"));
        assert!(err("1:window=0:512").contains("group"));
        assert!(err("1:window=1:0").contains("window"));
        assert!(err("1:window=512").contains("window=G:TOKENS"));
        assert!(err("1:mamba=1,window=1:8").contains("group 1 is given twice"));
        assert!(err("1:full-reports=maybe").contains("true or false"));
        assert!(err("1:chunk=4").contains("unknown setting \"chunk=4\""));
    }

    #[test]
    fn each_engine_once_and_in_range() {
        let flags = [parse("1:host-chunk-blocks=2").unwrap()];
        let got = per_engine(&flags, 3, "worker").unwrap();
        assert_eq!(got[0], None);
        assert_eq!(
            got[1],
            Some(EngineSettings::default().with_host_chunk_blocks(2))
        );
        assert!(
            per_engine(&flags, 1, "upstream")
                .unwrap_err()
                .contains("no upstream 1 (upstreams 0 to 0)")
        );
        let twice = [flags[0].clone(), flags[0].clone()];
        assert!(
            per_engine(&twice, 3, "worker")
                .unwrap_err()
                .contains("worker 1 twice")
        );
    }
}
