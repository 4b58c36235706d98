//! The cheapest plan ([`PairView::cheapest`]) without costing every pair: the first plan of
//! least [`PlanCost::total_s`] in [`PairView::plans`]' order, as a search over every plan
//! finds it, in time linear in the decode workers times the prefill workers worth pairing.
//!
//! A split plan's cost is nondecreasing in its prefill worker's predicted prefill leg and
//! harm once the decode worker and the link's bandwidth are fixed (every step of
//! [`PairView::cost`] is, and rounding is monotone). So among prefill workers with the same
//! bandwidth to every worker (the same topology labels), one that is no better in both than
//! an earlier one is never the first cheapest: only the others are paired.

use super::plan::{PairView, Plan, PlanCost};

/// The prefill workers worth pairing, by bandwidth class: those no earlier worker of their
/// class matches or beats in both prefill leg and harm.
struct Shortlist {
    /// Each class's members in index order, as (candidate index, prefill leg, harm).
    classes: Vec<Vec<(usize, f64, f64)>>,
    /// Each class's members worth pairing.
    kept: Vec<Vec<usize>>,
}

impl Shortlist {
    fn of(view: &PairView<'_>) -> Shortlist {
        let mut classes: Vec<Vec<(usize, f64, f64)>> = Vec::new();
        for p in view.prefillers() {
            let sides = &view.sides[p];
            let point = (p, sides.prefill_leg.total_s(), view.harm_s(p, sides.miss));
            let domain = view.topology.domain(view.candidates[p].worker());
            let class = classes.iter_mut().find(|members| {
                let first = view.candidates[members[0].0].worker();
                view.topology.domain(first) == domain
            });
            match class {
                Some(members) => members.push(point),
                None => classes.push(vec![point]),
            }
        }
        let kept = classes.iter().map(|c| worth_pairing(c, None)).collect();
        Shortlist { classes, kept }
    }
}

/// The members of `class` (index order) no earlier member matches or beats in both prefill
/// leg and harm, leaving out `without`.
fn worth_pairing(class: &[(usize, f64, f64)], without: Option<usize>) -> Vec<usize> {
    let mut kept: Vec<(usize, f64, f64)> = Vec::new();
    for &(p, leg, harm) in class {
        if Some(p) == without {
            continue;
        }
        if !kept.iter().any(|&(_, l, h)| l <= leg && h <= harm) {
            kept.push((p, leg, harm));
        }
    }
    kept.into_iter().map(|(p, _, _)| p).collect()
}

/// The best plan so far and its place in [`PairView::plans`]' order.
struct Best {
    plan: Plan,
    cost: PlanCost,
    /// (decode worker, 0 aggregated or 1 + prefill worker).
    order: (usize, usize),
}

impl Best {
    /// Keeps `plan` when it is cheaper, or as cheap and earlier.
    fn consider(best: &mut Option<Best>, view: &PairView<'_>, plan: Plan) {
        let order = (plan.decode(), plan.prefill().map_or(0, |p| p + 1));
        let cost = view.cost(plan);
        let better =
            best.as_ref()
                .is_none_or(|b| match cost.total_s().total_cmp(&b.cost.total_s()) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Equal => order < b.order,
                    std::cmp::Ordering::Greater => false,
                });
        if better {
            *best = Some(Best { plan, cost, order });
        }
    }
}

impl PairView<'_> {
    /// The cheapest plan by [`PlanCost::total_s`] among [`plans`](Self::plans), the first
    /// in their order among equals; aggregated plans only when `aggregate`, split ones only
    /// when `split`. `None` when no plan is allowed. It does not cost every pair (see the
    /// module's docs), and chooses as costing every pair would.
    #[must_use]
    pub fn cheapest(&self, aggregate: bool, split: bool) -> Option<(Plan, PlanCost)> {
        cheapest(self, aggregate, split)
    }
}

/// [`PairView::cheapest`].
fn cheapest(view: &PairView<'_>, aggregate: bool, split: bool) -> Option<(Plan, PlanCost)> {
    let shortlist = split.then(|| Shortlist::of(view));
    let mut best = None;
    for decode in view.decoders() {
        if aggregate {
            Best::consider(&mut best, view, Plan::Aggregated { decode });
        }
        let Some(shortlist) = &shortlist else {
            continue;
        };
        for (class, kept) in shortlist.classes.iter().zip(&shortlist.kept) {
            // A worker that prefills and decodes is not paired with itself: without it,
            // others of its class may be worth pairing.
            let own = class.iter().any(|&(p, _, _)| p == decode);
            let redone;
            let kept = if own {
                redone = worth_pairing(class, Some(decode));
                &redone
            } else {
                kept
            };
            for &prefill in kept {
                Best::consider(&mut best, view, Plan::Split { prefill, decode });
            }
        }
    }
    best.map(|b| (b.plan, b.cost))
}
