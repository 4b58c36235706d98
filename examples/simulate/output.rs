//! What a run prints and writes: the table, JSON or CSV of the reports, the per-request
//! records, the plot.

use prefix_router::sim::SimReport;

/// Prints `rows` (workload, report) in `format` (table, json or csv).
pub(crate) fn print(rows: &[(String, SimReport)], format: &str) {
    match format {
        "json" => {
            let objects: Vec<String> = rows
                .iter()
                .map(|(w, r)| {
                    let json = r.to_json();
                    format!("{{\"workload\":\"{w}\",{}", &json[1..])
                })
                .collect();
            println!("[{}]", objects.join(",\n"));
        }
        "csv" => print_csv(rows),
        _ => print_table(rows),
    }
}

/// One CSV line per report.
fn print_csv(rows: &[(String, SimReport)]) {
    println!(
        "workload,policy,requests,prompt_tokens,prefill_tokens,hit_ratio,ideal_hit_ratio,\
         pooled_ideal_hit_ratio,imbalance,ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_s,\
         tpot_p99_s,e2e_p99_s,short_tpot_p99_s,short_e2e_p99_s,critical_requests,\
         critical_ttft_p99_s,critical_tpot_p99_s,goodput,goodput_rps,shed,preemptions,makespan_s,\
         decision_ns,ttft_error_p50,ttft_error_p90,sessions,session_p50_s,session_p99_s"
    );
    for (w, r) in rows {
        println!(
            "{w},{},{},{},{},{:.4},{:.4},{:.4},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{},{:.4},{:.4},{:.4},{:.4},{},{},{:.1},{:.0},{:.4},{:.4},{},{:.4},{:.4}",
            r.policy,
            r.requests,
            r.prompt_tokens,
            r.prefill_tokens,
            r.hit_ratio,
            r.ideal_hit_ratio,
            r.pooled_ideal_hit_ratio,
            r.imbalance,
            r.ttft_p50_s,
            r.ttft_p90_s,
            r.ttft_p99_s,
            r.tpot_p50_s,
            r.tpot_p99_s,
            r.e2e_p99_s,
            r.short_tpot_p99_s,
            r.short_e2e_p99_s,
            r.critical_requests,
            r.critical_ttft_p99_s,
            r.critical_tpot_p99_s,
            r.goodput,
            r.goodput_rps,
            r.shed,
            r.preemptions,
            r.makespan_s,
            r.decision_ns,
            r.ttft_error_p50,
            r.ttft_error_p90,
            r.sessions,
            r.session_p50_s,
            r.session_p99_s
        );
    }
}

/// A table per workload, a line per policy.
fn print_table(rows: &[(String, SimReport)]) {
    let mut last = "";
    for (w, r) in rows {
        if w != last {
            println!(
                "\n{w}: {} requests, {} prompt tokens; ideal hit ratio {:.3}, pooled {:.3}",
                r.requests, r.prompt_tokens, r.ideal_hit_ratio, r.pooled_ideal_hit_ratio
            );
            println!(
                "{:<18} {:>14} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>7} {:>8} {:>9} {:>11} {:>11}",
                "policy",
                "prefill tokens",
                "hit",
                "/pooled",
                "imbalance",
                "ttft p50",
                "ttft p99",
                "tpot p99",
                "short tpot",
                "goodput",
                "shed",
                "preempt",
                "route µs",
                "ttft error",
                "session p99"
            );
            last = w;
        }
        let pooled = r.ratio_to_pooled();
        println!(
            "{:<18} {:>14} {:>7.3} {:>8.1}% {:>9.3} {:>8.3}s {:>8.3}s {:>8.3}s {:>9.3}s {:>8.3} {:>7} {:>8} {:>9.2} {:>4.0}%/{:>4.0}% {:>10.1}s",
            r.policy,
            r.prefill_tokens,
            r.hit_ratio,
            pooled * 100.0,
            r.imbalance,
            r.ttft_p50_s,
            r.ttft_p99_s,
            r.tpot_p99_s,
            r.short_tpot_p99_s,
            r.goodput,
            r.shed,
            r.preemptions,
            r.decision_ns / 1000.0,
            r.ttft_error_p50 * 100.0,
            r.ttft_error_p90 * 100.0,
            r.session_p99_s
        );
    }
    print_notes(rows);
}

/// Under the tables, what their latency columns leave out: the critical requests, where
/// any were served.
fn print_notes(rows: &[(String, SimReport)]) {
    let critical: Vec<_> = rows
        .iter()
        .filter(|(_, r)| r.critical_requests > 0)
        .collect();
    if critical.is_empty() {
        return;
    }
    println!(
        "\nLatency columns count standard and sheddable requests, TPOT answers of {} tokens or more (`short tpot`: the shorter ones' p99). Critical requests apart:",
        prefix_router::sim::LONG_ANSWER_TOKENS
    );
    for (w, r) in critical {
        println!(
            "  {w} {}: {} critical, ttft p99 {:.3}s, tpot p99 {:.3}s",
            r.policy, r.critical_requests, r.critical_ttft_p99_s, r.critical_tpot_p99_s
        );
    }
}

/// Writes one JSON line per request of every run: its workload, policy and record.
pub(crate) fn write_requests(path: &str, rows: &[(String, SimReport)]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (workload, report) in rows {
        let policy = report.policy.replace(['"', '\\'], "");
        let workload = workload.replace(['"', '\\'], "");
        for record in &report.request_records {
            let json = record.to_json();
            writeln!(
                out,
                "{{\"workload\":\"{workload}\",\"policy\":\"{policy}\",{}",
                &json[1..]
            )?;
        }
    }
    out.flush()
}

/// Draws each workload's policies as points of hit ratio against TTFT p99, with the alpha
/// sweep of the weighted score as a line.
pub(crate) fn plot(
    path: &str,
    rows: &[(String, SimReport)],
    sweeps: &[(String, Vec<(f64, SimReport)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let height = 420 * sweeps.len().max(1) as u32;
    let root = SVGBackend::new(path, (760, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((sweeps.len().max(1), 1));
    for (area, (name, sweep)) in areas.iter().zip(sweeps) {
        let points: Vec<&SimReport> = rows
            .iter()
            .filter(|(w, _)| w == name)
            .map(|(_, r)| r)
            .collect();
        let max_p99 = points
            .iter()
            .copied()
            .chain(sweep.iter().map(|(_, r)| r))
            .map(|r| r.ttft_p99_s)
            .fold(0.0, f64::max)
            * 1.15
            + 1e-3;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{name}: hit ratio vs TTFT p99"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..1f64, 0f64..max_p99)?;
        chart
            .configure_mesh()
            .x_desc("hit ratio")
            .y_desc("TTFT p99 (s)")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                sweep.iter().map(|(_, r)| (r.hit_ratio, r.ttft_p99_s)),
                &BLUE,
            ))?
            .label("balanced_weighted, alpha 0.0 to 1.0")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
        chart.draw_series(sweep.iter().map(|(alpha, r)| {
            EmptyElement::at((r.hit_ratio, r.ttft_p99_s))
                + Circle::new((0, 0), 2, BLUE.filled())
                + Text::new(format!("{alpha:.1}"), (4, 4), ("sans-serif", 9))
        }))?;
        chart.draw_series(points.iter().map(|r| {
            EmptyElement::at((r.hit_ratio, r.ttft_p99_s))
                + Circle::new((0, 0), 4, RED.filled())
                + Text::new(r.policy.clone(), (6, -12), ("sans-serif", 11))
        }))?;
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// One run of a load sweep: its workload, its load and its row in the results.
pub(crate) struct LoadPoint {
    pub(crate) workload: String,
    pub(crate) load: f64,
    pub(crate) row: usize,
}

/// Draws each workload's TTFT p99 against load, a line per policy, on a logarithmic time
/// axis (policies differ by orders of magnitude once the fleet saturates).
pub(crate) fn plot_loads(
    path: &str,
    rows: &[(String, SimReport)],
    points: &[LoadPoint],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let mut workloads: Vec<&str> = points.iter().map(|p| p.workload.as_str()).collect();
    workloads.dedup();
    let root =
        SVGBackend::new(path, (760, 460 * workloads.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((workloads.len().max(1), 1));
    for (area, workload) in areas.iter().zip(&workloads) {
        let mine: Vec<&LoadPoint> = points.iter().filter(|p| p.workload == *workload).collect();
        let report = |p: &LoadPoint| &rows[p.row].1;
        let (lo, hi) = mine
            .iter()
            .map(|p| report(p).ttft_p99_s)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), t| {
                (lo.min(t), hi.max(t))
            });
        let max_load = mine.iter().map(|p| p.load).fold(1.0, f64::max);
        let title = workload.strip_suffix(".jsonl").unwrap_or(workload);
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{title}: TTFT p99 against load"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                0.0..max_load * 1.05,
                ((lo * 0.8).max(1e-3)..hi * 1.25).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("load (× the recorded arrival rate)")
            .y_desc("TTFT p99 (s)")
            .draw()?;
        let mut policies: Vec<&str> = mine.iter().map(|p| report(p).policy.as_str()).collect();
        policies.sort_unstable();
        policies.dedup();
        for (k, policy) in policies.iter().enumerate() {
            // The recommended policy in black, the others in the palette's colours.
            let color = if *policy == "balanced" {
                BLACK.to_rgba()
            } else {
                Palette99::pick(k).to_rgba()
            };
            let mut line: Vec<(f64, f64)> = mine
                .iter()
                .filter(|p| report(p).policy == *policy)
                .map(|p| (p.load, report(p).ttft_p99_s))
                .collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let width = if *policy == "balanced" { 3 } else { 1 };
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(width)))?
                .label(policy.to_string())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(width))
                });
            chart.draw_series(
                line.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
