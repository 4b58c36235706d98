//! Health probes: every upstream's `GET /health` (vLLM and SGLang serve it) at an interval.
//! An endpoint that answers 200 has its ranks made available to the router; one that does
//! not answer, or answers otherwise, has them taken out of routing until it answers again.
//! A request that cannot reach its upstream also takes that target out (`app.rs`); the next
//! good probe brings it back.

use std::sync::Arc;
use std::time::Duration;

use super::app::Gateway;

/// Probes every upstream's `/health` every `interval`, forever.
pub(crate) async fn probe_forever(gw: Arc<Gateway>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        for endpoint in 0..gw.endpoints() {
            let healthy = gw.get_text(endpoint, "/health").await.is_some();
            gw.set_endpoint_available(endpoint, healthy);
        }
    }
}
