//! The engines' settings into the router's mirror, for the KV events the gateway follows
//! (`events.rs`): `--host-chunk-blocks` and `--full-reports` for every engine (the mirror's
//! defaults, set when the router is built) and `--engine-settings N:SETTING,...` for upstream
//! `N`'s engine (`common/engine_settings.rs`), set on each of its data-parallel ranks'
//! targets.

use prefix_router::{EngineSettings, RankLayout, Router};

use super::engine_settings::{EngineFlag, assumed, per_engine};
use super::policy::PolicyOptions;

/// Sets the settings `flags` give on every rank of their upstreams in `router`'s mirror
/// (`upstreams` in `--upstream` order, each with `layout`'s ranks), and returns what the
/// gateway assumes of each upstream's engine: a line for the block size, then one per
/// upstream (the defaults are `options`').
///
/// # Errors
/// When a value names an upstream past the last or one twice, when the policy keeps no
/// mirror to set them on, or when the mirror refuses them.
pub(crate) fn apply(
    router: &dyn Router,
    layout: &RankLayout,
    upstreams: &[String],
    flags: &[EngineFlag],
    options: &PolicyOptions,
) -> Result<Vec<String>, String> {
    let given = per_engine(flags, upstreams.len() as u32, "upstream")?;
    let Some(sync) = router.cache_sync() else {
        if flags.is_empty() {
            return Ok(vec![format!(
                "the {} policy keeps no cache mirror: KV events change nothing",
                router.name()
            )]);
        }
        return Err(format!(
            "--engine-settings: the {} policy keeps no cache mirror to apply them to",
            router.name()
        ));
    };
    let mut lines = vec![format!(
        "KV events: block size {} tokens, every engine",
        options.block_size
    )];
    for (endpoint, (url, given)) in upstreams.iter().zip(&given).enumerate() {
        let endpoint = endpoint as u32;
        if let Some(settings) = given {
            for rank in 0..layout.ranks() {
                let target = layout
                    .target(endpoint, rank)
                    .map_err(|e| format!("upstream {endpoint} rank {rank}: {e}"))?;
                sync.set_engine_settings(target, settings)
                    .map_err(|e| format!("--engine-settings {endpoint}: {e}"))?;
            }
        }
        let effective = in_effect(given.as_ref(), options);
        let who = match layout.ranks() {
            1 => format!("upstream {endpoint} {url}"),
            ranks => format!("upstream {endpoint} {url} (its {ranks} ranks)"),
        };
        lines.push(assumed(&who, endpoint, &effective, given.as_ref()));
    }
    Ok(lines)
}

/// The settings in effect for an engine before its events say more: `given`, the defaults
/// of `options` for the rest.
fn in_effect(given: Option<&EngineSettings>, options: &PolicyOptions) -> EngineSettings {
    let given = given.cloned().unwrap_or_default();
    let mut settings = EngineSettings::default()
        .with_host_chunk_blocks(given.host_chunk_blocks.unwrap_or(options.host_chunk_blocks))
        .with_full_reports(given.full_reports.unwrap_or(options.full_reports));
    for (group, kind) in given.groups {
        settings = settings.with_group(group, kind);
    }
    settings
}
