//! Needless sheds: of a run with admission, the requests refused that the same run without
//! admission served within the targets they were held to (time to first token and per
//! output token).
//!
//! The two runs are of the same policy, workload, load, fleet and seed; they are joined by
//! request index ([`RequestRecord::index`], as `--requests-out` writes it). A request's
//! priority is drawn from the seed and its index, so it is the same in both runs; it is
//! read from the run with admission, whose shed records carry it.

use std::time::Duration;

use prefix_router::AdmissionConfig;
use prefix_router::sim::RequestRecord;

/// The share, of all `with`'s requests, of those shed in `with` (a run with admission, every
/// request asking for a time to first token of `ttft_target_s` and a time per output token
/// of `tpot_target_s`) that met the targets they were held to in `without` (the same run
/// without admission): a first token within `admission.target_of(priority, ttft_target_s)`
/// (a share of the target for a sheddable request, the whole of it otherwise) and, past
/// it, a time per output token within `tpot_target_s` (whatever the priority), and not
/// dropped as too large. 0 for no requests.
///
/// # Errors
///
/// A message when the runs are not of the same requests: their counts differ, or an index
/// of `with` is not in `without`.
pub(crate) fn needless_shed(
    with: &[RequestRecord],
    without: &[RequestRecord],
    (ttft_target_s, tpot_target_s): (f64, f64),
    admission: &AdmissionConfig,
) -> Result<f64, String> {
    if with.len() != without.len() {
        return Err(format!(
            "needless sheds: {} requests with admission, {} without",
            with.len(),
            without.len()
        ));
    }
    // Records come in trace order, index k at position k; a run that breaks that is joined
    // all the same, by index.
    let mut by_index: Vec<Option<&RequestRecord>> = vec![None; without.len()];
    for r in without {
        if let Some(slot) = by_index.get_mut(r.index) {
            *slot = Some(r);
        }
    }
    let held = |priority, target_s: f64| {
        let target = Duration::try_from_secs_f64(target_s).unwrap_or(Duration::MAX);
        admission.target_of(priority, target).as_secs_f64()
    };
    let mut needless = 0usize;
    for shed in with.iter().filter(|r| r.shed) {
        let twin =
            by_index.get(shed.index).copied().flatten().ok_or_else(|| {
                format!("needless sheds: request {} not in both runs", shed.index)
            })?;
        let ttft = held(shed.priority, ttft_target_s);
        let tpot = tpot_target_s;
        // A request of one output token has no time per output token: it meets any.
        if !twin.rejected
            && twin.ttft_s.is_some_and(|t| t <= ttft)
            && twin.tpot_s.is_none_or(|t| t <= tpot)
        {
            needless += 1;
        }
    }
    Ok(if with.is_empty() {
        0.0
    } else {
        needless as f64 / with.len() as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router::Priority;

    /// A record of request `index` of `priority`: shed, or with a first token after
    /// `ttft_s`.
    fn record(index: usize, priority: Priority, shed: bool, ttft_s: Option<f64>) -> RequestRecord {
        let mut r = RequestRecord::default();
        r.index = index;
        r.priority = priority;
        r.shed = shed;
        r.ttft_s = ttft_s;
        r
    }

    /// Eight requests, four of them shed with admission; without it (target 2 s, sheddable
    /// requests held to half of it) the shed standard one served in 1.9 s and the shed
    /// sheddable one in 0.9 s were needless, the shed sheddable one served in 1.5 s and the
    /// shed standard one served in 2.5 s were not; requests served in both runs count for
    /// nothing whatever their times.
    #[test]
    fn counts_the_sheds_the_run_without_admission_served_in_time() {
        use Priority::{Sheddable, Standard};
        let with = vec![
            record(0, Standard, true, None),
            record(1, Sheddable, true, None),
            record(2, Sheddable, true, None),
            record(3, Standard, true, None),
            record(4, Standard, false, Some(5.0)),
            record(5, Sheddable, false, Some(0.1)),
            record(6, Standard, false, Some(1.0)),
            record(7, Priority::Critical, false, Some(9.0)),
        ];
        // The run without admission draws no priority into its records: the default.
        let served = [1.9, 0.9, 1.5, 2.5, 0.1, 0.1, 3.0, 0.1];
        let mut without: Vec<RequestRecord> = served
            .iter()
            .enumerate()
            .map(|(i, &t)| record(i, Standard, false, Some(t)))
            .collect();
        let config = AdmissionConfig::default().with_sheddable_share(0.5);
        assert_eq!(
            needless_shed(&with, &without, (2.0, 0.1), &config),
            Ok(2.0 / 8.0)
        );
        // Joined by index, not by position.
        without.reverse();
        assert_eq!(
            needless_shed(&with, &without, (2.0, 0.1), &config),
            Ok(2.0 / 8.0)
        );
        // At a share of 0.8 the sheddable request served in 1.5 s was needless too.
        let lenient = AdmissionConfig::default().with_sheddable_share(0.8);
        assert_eq!(
            needless_shed(&with, &without, (2.0, 0.1), &lenient),
            Ok(3.0 / 8.0)
        );
        // A request dropped as too large without admission met no target.
        let k = without.iter().position(|r| r.index == 0).unwrap_or(0);
        without[k].rejected = true;
        assert_eq!(
            needless_shed(&with, &without, (2.0, 0.1), &config),
            Ok(1.0 / 8.0)
        );
    }

    /// A shed request served in time without admission but decoding slower than its time
    /// per output token target (the whole of it, whatever the priority) met no target; one
    /// that decoded within it, or had a single output token, did.
    #[test]
    fn holds_the_run_without_admission_to_the_tpot_target_too() {
        use Priority::{Sheddable, Standard};
        let with: Vec<RequestRecord> = [Standard, Standard, Sheddable, Sheddable, Standard]
            .into_iter()
            .enumerate()
            .map(|(i, p)| record(i, p, true, None))
            .collect();
        let mut without: Vec<RequestRecord> = (0..5)
            .map(|i| record(i, Standard, false, Some(1.0)))
            .collect();
        let tpots = [Some(0.2), Some(0.08), Some(0.08), Some(0.04), None];
        for (r, tpot) in without.iter_mut().zip(tpots) {
            r.tpot_s = tpot;
        }
        let config = AdmissionConfig::default().with_sheddable_share(0.5);
        // Needless: the standard one at 0.08 s, both sheddable ones (their first tokens
        // within half the target), the one token.
        assert_eq!(
            needless_shed(&with, &without, (2.0, 0.1), &config),
            Ok(4.0 / 5.0)
        );
    }

    #[test]
    fn refuses_runs_of_other_requests() {
        let config = AdmissionConfig::default();
        let with = vec![record(0, Priority::Standard, true, None)];
        assert!(needless_shed(&with, &[], (2.0, 0.1), &config).is_err());
        let other = vec![record(3, Priority::Standard, false, Some(0.1))];
        assert!(needless_shed(&with, &other, (2.0, 0.1), &config).is_err());
        assert_eq!(needless_shed(&[], &[], (2.0, 0.1), &config), Ok(0.0));
    }
}
