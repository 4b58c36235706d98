//! The engines' settings on the gateway's command line (`--host-chunk-blocks`,
//! `--full-reports`, `--engine-settings`) into its mirror: every rank of an upstream gets
//! the upstream's settings, and what the gateway says at start it assumes is what the mirror
//! has in effect.

use super::fleet::*;
use prefix_router::{BalancedRouter, GroupKind, RankLayout, RoundRobinRouter, WorkerId};

fn flags_of(args: &[&str]) -> flags::Flags {
    flags::parse_from(std::iter::once("gateway").chain(args.iter().copied())).unwrap()
}

/// Two upstreams of two ranks, following KV events.
const FLEET: [&str; 10] = [
    "--upstream",
    "http://a:1",
    "--upstream",
    "http://b:2",
    "--dp-ranks",
    "2",
    "--kv-events",
    "tcp://a:5557",
    "--kv-events",
    "tcp://b:5557",
];

/// The gateway's mirror for `f`, and what `engines::apply` says of it.
fn applied(f: &flags::Flags) -> (BalancedRouter, RankLayout, Result<Vec<String>, String>) {
    let layout = RankLayout::new(f.ranks).unwrap();
    let targets = layout.targets(f.upstreams.len() as u32);
    let router = BalancedRouter::with_config(targets, policy::balanced_config(&f.options)).unwrap();
    let lines = engines::apply(
        &router,
        &layout,
        &f.upstreams,
        &f.engine_settings,
        &f.options,
    );
    (router, layout, lines)
}

#[test]
fn every_rank_of_an_upstream_takes_its_settings_as_the_start_says() {
    let mut args = FLEET.to_vec();
    args.extend([
        "--host-chunk-blocks",
        "2",
        "--engine-settings",
        "1:host-chunk-blocks=4,full-reports,window=1:512",
    ]);
    let f = flags_of(&args);
    let (router, layout, lines) = applied(&f);
    let lines = lines.unwrap();
    assert_eq!(
        lines,
        [
            "KV events: block size 16 tokens, every engine",
            "upstream 0 http://a:1 (its 2 ranks): assuming host-chunk-blocks=2,full-reports=false \
             (the defaults)",
            "upstream 1 http://b:2 (its 2 ranks): assuming \
             host-chunk-blocks=4,full-reports=true,window=1:512 (--engine-settings \
             1:host-chunk-blocks=4,full-reports=true,window=1:512, the rest by default)",
        ]
    );
    // What the start says is what the mirror has in effect, for every rank.
    for endpoint in 0..2u32 {
        for rank in 0..2 {
            let target = layout.target(endpoint, rank).unwrap();
            let in_effect = router.index().engine_settings(target);
            let said = format!("assuming {} (", engine_settings::describe(&in_effect));
            assert!(
                lines[1 + endpoint as usize].contains(&said),
                "upstream {endpoint} rank {rank}: {said} in {lines:?}"
            );
        }
    }
    let rank1 = router.index().engine_settings(layout.target(1, 1).unwrap());
    assert_eq!(rank1.host_chunk_blocks, Some(4));
    assert_eq!(rank1.full_reports, Some(true));
    assert_eq!(
        rank1.group(1),
        Some(GroupKind::SlidingWindow { tokens: 512 })
    );
    let other = router.index().engine_settings(WorkerId::new(1));
    assert_eq!(
        (other.host_chunk_blocks, other.full_reports, other.group(1)),
        (Some(2), Some(false), None),
        "upstream 0's rank 1 keeps the defaults"
    );
}

#[test]
fn settings_no_mirror_can_take_are_errors() {
    let with = |extra: &[&str]| {
        let mut args = FLEET.to_vec();
        args.extend(extra);
        applied(&flags_of(&args)).2
    };
    let e = with(&["--engine-settings", "2:full-reports"]).unwrap_err();
    assert_eq!(
        e,
        "--engine-settings 2: there is no upstream 2 (upstreams 0 to 1)"
    );
    let e = with(&[
        "--engine-settings",
        "1:full-reports",
        "--engine-settings",
        "1:mamba=1",
    ])
    .unwrap_err();
    assert!(e.contains("names upstream 1 twice"), "{e}");
    // A policy without a mirror has nothing to apply them to.
    let layout = RankLayout::new(1).unwrap();
    let router = RoundRobinRouter::new(1).unwrap();
    let f = flags_of(&[
        "--upstream",
        "http://a:1",
        "--kv-events",
        "tcp://a:5557",
        "--engine-settings",
        "0:full-reports",
    ]);
    let e = engines::apply(
        &router,
        &layout,
        &f.upstreams,
        &f.engine_settings,
        &f.options,
    )
    .unwrap_err();
    assert!(
        e.contains("round_robin policy keeps no cache mirror"),
        "{e}"
    );
    let said = engines::apply(&router, &layout, &f.upstreams, &[], &f.options).unwrap();
    assert_eq!(
        said,
        ["the round_robin policy keeps no cache mirror: KV events change nothing"]
    );
}
