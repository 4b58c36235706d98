//! A warm start: the workload's first seconds, at 1× and with prompts of their own, replayed
//! before the measured load, so that the router meets the measured load with what it
//! learned of the fleet ([`ClusterConfig::warmup_s`](super::ClusterConfig::warmup_s)).
//!
//! The replayed list is the warm-up copies first, then the measured requests, shifted to
//! arrive after the warm-up. A copy's tokens (or content ids) are the original's moved by a
//! fixed offset, a bijection: prompts that shared a prefix still do, and none shares one
//! with a measured prompt, so that the measured part's hits are its own. Its session is
//! renamed for the same reason.

use super::request::{Follows, Prompt, Request};
use crate::hash::TokenId;

/// The offset a warm-up copy's token IDs move by (modulo the vocabulary).
const TOKEN_SHIFT: u64 = 7_919;
/// What a warm-up copy's content ids are xored with.
const ID_SALT: u64 = 0x7761_726d_7570_5f31;
/// The vocabulary token IDs are taken modulo (the synthetic prompts' and beyond).
const VOCAB: u64 = 151_936;

/// `requests` (arrival times as stored, replayed at `speedup`) preceded by the copies of
/// those arriving in their first `warmup_s` seconds at 1×, which replay at 1×; and how many
/// copies come first. A follower is copied only with every request it waits for.
pub(super) fn with_warmup(
    requests: Vec<Request>,
    warmup_s: f64,
    speedup: f64,
) -> (Vec<Request>, usize) {
    if warmup_s <= 0.0 || requests.is_empty() {
        return (requests, 0);
    }
    let start = requests
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    // Where each original landed among the copies, if it was copied.
    let mut copied: Vec<Option<usize>> = vec![None; requests.len()];
    let mut warm = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if r.arrival_s - start >= warmup_s {
            continue;
        }
        let follows = match &r.follows {
            None => None,
            Some(f) => {
                let Some(waits) = f.requests.iter().map(|&p| copied[p]).collect() else {
                    continue;
                };
                Some(Follows::new(waits, f.gap_s * speedup))
            }
        };
        copied[i] = Some(warm.len());
        warm.push(copy(r, follows, start, speedup));
    }
    let k = warm.len();
    let shift = warmup_s * speedup;
    warm.extend(requests.into_iter().map(|mut r| {
        r.arrival_s += shift;
        if let Some(f) = r.follows.as_mut() {
            for p in &mut f.requests {
                *p += k;
            }
        }
        r
    }));
    (warm, k)
}

/// `r`'s warm-up copy, waiting as `follows` says: arriving at its 1× offset from `start`
/// (stored times are divided by `speedup` when replayed), its prompt and session its own.
fn copy(r: &Request, follows: Option<Follows>, start: f64, speedup: f64) -> Request {
    let prompt = match &r.prompt {
        Prompt::Tokens(t) => Prompt::Tokens(t.iter().map(|&t| shifted(t)).collect()),
        Prompt::Blocks {
            ids,
            tokens_per_id,
            len,
        } => Prompt::Blocks {
            ids: ids.iter().map(|id| id ^ ID_SALT).collect(),
            tokens_per_id: *tokens_per_id,
            len: *len,
        },
    };
    Request {
        arrival_s: start + (r.arrival_s - start) * speedup,
        prompt,
        output_tokens: r.output_tokens,
        session: r.session.as_ref().map(|s| format!("warmup/{s}")),
        follows,
    }
}

/// Token `t` moved by [`TOKEN_SHIFT`] within the vocabulary (IDs beyond it move within
/// their own range, which keeps the map one-to-one).
fn shifted(t: TokenId) -> TokenId {
    let t = u64::from(t);
    let moved = if t < VOCAB {
        (t + TOKEN_SHIFT) % VOCAB
    } else {
        VOCAB + (t - VOCAB + TOKEN_SHIFT) % (u64::from(TokenId::MAX) - VOCAB + 1)
    };
    moved as TokenId
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(at: f64, tokens: &[TokenId]) -> Request {
        Request::new(at, tokens.to_vec(), 4)
    }

    #[test]
    fn copies_the_first_seconds_at_one_x_and_shifts_the_measured_part() {
        let requests = vec![
            request(0.0, &[1, 2, 3]),
            request(4.0, &[1, 2, 9]),
            request(12.0, &[5]).with_follows(Follows::new(vec![0], 2.0)),
            request(40.0, &[7]),
        ];
        let (all, k) = with_warmup(requests.clone(), 10.0, 4.0);
        assert_eq!(
            k, 2,
            "the two arriving before 10 s at 1×; the follower's at 12 s"
        );
        assert_eq!(all.len(), 6);
        assert_eq!(all[1].arrival_s, 16.0, "4 s at 1× is 16 stored at 4×");
        assert_eq!(
            all[2].arrival_s, 40.0,
            "the measured part starts after 10 s at 1×"
        );
        let Prompt::Tokens(a) = &all[0].prompt else {
            panic!("tokens")
        };
        let Prompt::Tokens(b) = &all[1].prompt else {
            panic!("tokens")
        };
        assert_eq!(a[..2], b[..2], "shared prefixes stay shared");
        assert_ne!(a[..], [1, 2, 3], "and differ from the measured prompts");
        assert_eq!(
            all[4].follows.as_ref().map(|f| f.requests.clone()),
            Some(vec![2])
        );
    }

    #[test]
    fn a_follower_is_copied_with_what_it_waits_for() {
        let requests = vec![
            request(0.0, &[1]),
            request(0.0, &[2]).with_follows(Follows::new(vec![0], 1.5)),
        ];
        let (all, k) = with_warmup(requests, 5.0, 2.0);
        assert_eq!(k, 2);
        let f = all[1].follows.as_ref().expect("copied with its wait");
        assert_eq!((f.requests.clone(), f.gap_s), (vec![0], 3.0));
        assert_eq!(
            all[3].follows.as_ref().map(|f| f.requests.clone()),
            Some(vec![2])
        );
    }

    #[test]
    fn no_warmup_is_the_requests_unchanged() {
        let requests = vec![request(1.0, &[1, 2])];
        assert_eq!(with_warmup(requests.clone(), 0.0, 8.0), (requests, 0));
    }

    #[test]
    fn shifting_is_one_to_one_at_the_edges() {
        let edges = [0, 1, VOCAB as TokenId - 1, VOCAB as TokenId, TokenId::MAX];
        let moved: std::collections::HashSet<_> = edges.iter().map(|&t| shifted(t)).collect();
        assert_eq!(moved.len(), edges.len());
    }
}
