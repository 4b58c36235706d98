//! Engine metrics: every upstream's Prometheus endpoint scraped at an interval into the
//! router's load reports ([`Router::report_load`](prefix_router::Router::report_load)).
//!
//! From vLLM's metrics: `vllm:num_requests_waiting` and `vllm:num_requests_running` are a
//! rank's waiting and running requests, and `vllm:kv_cache_usage_perc`
//! (`vllm:gpu_cache_usage_perc` before v1) its KV usage; a report is timed on the gateway's
//! clock when the scrape's text arrived. A data-parallel endpoint labels each rank's samples with `engine="<rank>"`;
//! samples without the label are rank 0's. The text is parsed by `prometheus-parse`, which
//! reads metric names of word characters only: the colon of vLLM's `vllm:` prefix is read
//! as an underscore.

use std::sync::Arc;
use std::time::Duration;

use prefix_router::EngineLoad;

use super::app::Gateway;

/// Each rank's load in a scrape of `text` read at `at`, for an endpoint of `ranks` ranks;
/// `None` when the text is not Prometheus text or names none of the metrics.
pub(crate) fn parse_load(text: &str, ranks: u32, at: Duration) -> Option<Vec<EngineLoad>> {
    let lines = text.lines().map(|l| Ok(l.replacen("vllm:", "vllm_", 1)));
    let scrape = prometheus_parse::Scrape::parse(lines).ok()?;
    let mut waiting = vec![0.0f64; ranks as usize];
    let mut running = vec![0.0f64; ranks as usize];
    let mut kv = vec![0.0f64; ranks as usize];
    let mut seen = false;
    for sample in &scrape.samples {
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v)
            | prometheus_parse::Value::Counter(v) => v,
            _ => continue,
        };
        let rank = sample
            .labels
            .get("engine")
            .and_then(|r| r.parse::<usize>().ok())
            .unwrap_or(0);
        if rank >= ranks as usize || !value.is_finite() {
            continue;
        }
        match sample.metric.as_str() {
            "vllm_num_requests_waiting" => waiting[rank] += value,
            "vllm_num_requests_running" => running[rank] += value,
            "vllm_kv_cache_usage_perc" | "vllm_gpu_cache_usage_perc" => {
                kv[rank] = kv[rank].max(value);
            }
            _ => continue,
        }
        seen = true;
    }
    seen.then(|| {
        (0..ranks as usize)
            .map(|r| {
                let count = |v: f64| v.max(0.0) as u64;
                EngineLoad::new(count(waiting[r]), count(running[r]), at)
                    .with_kv_usage(kv[r].clamp(0.0, 1.0))
            })
            .collect()
    })
}

/// Scrapes every upstream's `path` every `interval`, forever, reporting each rank's load
/// to the router. An upstream that cannot be read, or whose text names no metric, is
/// skipped until the next round.
pub(crate) async fn scrape_forever(gw: Arc<Gateway>, path: String, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        for endpoint in 0..gw.endpoints() {
            let Some(text) = gw.get_text(endpoint, &path).await else {
                continue;
            };
            let ranks = gw.layout().ranks();
            let Some(loads) = parse_load(&text, ranks, gw.clock()) else {
                continue;
            };
            for (rank, load) in loads.into_iter().enumerate() {
                if let Ok(target) = gw.layout().target(endpoint, rank as u32) {
                    gw.scraped(target, load);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_metrics_give_each_rank_its_queue_and_kv_usage() {
        let text = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.25
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 999.0
";
        let at = Duration::from_millis(1_500);
        let loads = parse_load(text, 2, at).unwrap_or_default();
        assert_eq!(
            loads,
            [
                EngineLoad::new(2, 3, at),
                EngineLoad::new(0, 1, at).with_kv_usage(0.25)
            ]
        );
        assert_eq!(parse_load("# nothing here\n", 1, at), None);
        let unlabelled = "vllm:num_requests_waiting 4\nvllm:gpu_cache_usage_perc 1.5\n";
        assert_eq!(
            parse_load(unlabelled, 1, at),
            Some(vec![EngineLoad::new(4, 0, at).with_kv_usage(1.0)])
        );
    }
}
