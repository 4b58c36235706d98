//! Receipts: why a router chose what it chose, for a host to log or check.

use core::fmt;

use crate::tree::{Tier, WorkerId};

/// One term of a policy's cost for a candidate (lower costs win).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostTerm {
    /// What the term measures (`"ttft_s"`, `"decode_s"`, `"reload_s"`, ...).
    pub name: &'static str,
    /// Its value.
    pub value: f64,
}

/// A policy's cost of one candidate: the terms and their sum, lowest wins.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cost {
    /// The terms.
    pub terms: Vec<CostTerm>,
}

impl Cost {
    /// A cost made of `terms`.
    #[must_use]
    pub fn of(terms: &[(&'static str, f64)]) -> Cost {
        Cost {
            terms: terms
                .iter()
                .map(|&(name, value)| CostTerm { name, value })
                .collect(),
        }
    }

    /// The sum of the terms.
    #[must_use]
    pub fn total(&self) -> f64 {
        self.terms.iter().map(|t| t.value).sum()
    }
}

/// What the router saw of one candidate when it chose.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReceiptLine {
    /// The candidate.
    pub worker: WorkerId,
    /// Its requests (this router's in flight, or the worker's reported queue if larger).
    pub requests: u64,
    /// Its outstanding prefill tokens.
    pub prefill_tokens: u64,
    /// Prompt tokens predicted cached there, by [`Tier::index`].
    pub cached_tokens: [usize; 4],
    /// The policy's cost of it, when the policy explains itself
    /// ([`Policy::cost`](crate::Policy::cost)).
    pub cost: Option<Cost>,
}

/// Why a request went where it went: every candidate the policy saw, with its figures and
/// cost, and the chosen one. `Display` gives one line to log.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Receipt {
    /// The policy's name.
    pub policy: &'static str,
    /// The chosen worker.
    pub chosen: WorkerId,
    /// Prompt tokens of the request.
    pub prompt_tokens: usize,
    /// Every candidate, in the order the policy saw them.
    pub candidates: Vec<ReceiptLine>,
}

impl Receipt {
    /// The chosen candidate's line.
    #[must_use]
    pub fn chosen_line(&self) -> Option<&ReceiptLine> {
        self.candidates.iter().find(|c| c.worker == self.chosen)
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} chose worker {} for {} tokens:",
            self.policy,
            self.chosen.get(),
            self.prompt_tokens
        )?;
        for line in &self.candidates {
            let mark = if line.worker == self.chosen { "*" } else { "" };
            write!(
                f,
                " [{mark}w{} req {} prefill {} cached",
                line.worker.get(),
                line.requests,
                line.prefill_tokens
            )?;
            for tier in Tier::ALL {
                let tokens = line.cached_tokens[tier.index()];
                if tokens > 0 || tier == Tier::Device {
                    write!(f, " {tier:?}={tokens}")?;
                }
            }
            if let Some(cost) = &line.cost {
                write!(f, " cost {:.6}", cost.total())?;
                for term in &cost.terms {
                    write!(f, " {}={:.6}", term.name, term.value)?;
                }
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}
