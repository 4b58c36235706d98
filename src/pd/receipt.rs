//! [`PairReceipt`]: why a request went where it went on a disaggregated fleet, every plan
//! the roles allowed with its predicted cost.

use std::fmt;

use super::plan::{PairView, Plan, PlanCost};
use crate::tree::WorkerId;

/// One plan a pair routing weighed: its workers and its predicted cost.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct PlanLine {
    /// The decode worker.
    pub decode: WorkerId,
    /// The prefill worker, for a split plan.
    pub prefill: Option<WorkerId>,
    /// The plan's predicted cost.
    pub cost: PlanCost,
}

/// Why a request went where it went on a disaggregated fleet
/// ([`PdRouter::route_pair_with_receipt`](crate::PdRouter::route_pair_with_receipt)):
/// every plan the roles allowed, with its predicted cost, the decider's choice and the plan
/// that ran (another, when admission overrode the decider). `Display` gives one line to
/// log.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PairReceipt {
    /// The decider's name.
    pub decider: &'static str,
    /// Prompt tokens of the request.
    pub prompt_tokens: usize,
    /// Index into `plans` of the decider's choice.
    pub decided: usize,
    /// Index into `plans` of the plan that ran.
    pub chosen: usize,
    /// Every plan, decode worker by decode worker, aggregated first.
    pub plans: Vec<PlanLine>,
}

impl PairReceipt {
    /// The receipt of `view`'s plans, `decided` by `decider` and `chosen` to run.
    pub(super) fn of(
        view: &PairView<'_>,
        decider: &'static str,
        (decided, chosen): (Plan, Plan),
    ) -> Self {
        let worker = |i: usize| view.candidates()[i].worker();
        let mut plans = Vec::new();
        let (mut decided_at, mut chosen_at) = (0, 0);
        for plan in view.plans() {
            if plan == decided {
                decided_at = plans.len();
            }
            if plan == chosen {
                chosen_at = plans.len();
            }
            plans.push(PlanLine {
                decode: worker(plan.decode()),
                prefill: plan.prefill().map(worker),
                cost: view.cost(plan),
            });
        }
        Self {
            decider,
            prompt_tokens: view.request.tokens().len(),
            decided: decided_at,
            chosen: chosen_at,
            plans,
        }
    }

    /// The line of the plan that ran.
    #[must_use]
    pub fn chosen_line(&self) -> Option<&PlanLine> {
        self.plans.get(self.chosen)
    }
}

impl fmt::Display for PlanLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", PlanShort(self))?;
        let c = &self.cost;
        write!(
            f,
            " ttft {:.4} tpot {:.4} decode {:.4} harm {:.4} total {:.4}",
            c.ttft_s,
            c.tpot_s,
            c.decode_s,
            c.harm_s,
            c.total_s()
        )?;
        if self.prefill.is_some() {
            write!(
                f,
                " transfer {:.4} bytes {}",
                c.transfer_s, c.transfer_bytes
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for PairReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.decider)?;
        match self.chosen_line() {
            Some(line) => write!(f, "ran {}", PlanShort(line))?,
            None => f.write_str("ran nothing")?,
        }
        if self.decided != self.chosen {
            if let Some(line) = self.plans.get(self.decided) {
                write!(f, " (admission; decided {})", PlanShort(line))?;
            }
        }
        write!(f, " for {} tokens:", self.prompt_tokens)?;
        for (i, line) in self.plans.iter().enumerate() {
            let mark = if i == self.chosen { "*" } else { "" };
            write!(f, " [{mark}{line}]")?;
        }
        Ok(())
    }
}

/// A plan's workers alone: `w3` aggregated, `w0->w3` split.
struct PlanShort<'a>(&'a PlanLine);

impl fmt::Display for PlanShort<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.prefill {
            Some(p) => write!(f, "w{}->w{}", p.get(), self.0.decode.get()),
            None => write!(f, "w{}", self.0.decode.get()),
        }
    }
}
