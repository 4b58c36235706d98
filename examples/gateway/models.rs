//! `GET /v1/models` (OpenAI clients ask it first), answered from upstream endpoints: the
//! models they list, each id once.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::app::error;

/// The models `endpoints` (base URLs) list at their `/v1/models`, each endpoint asked once
/// in turn and each model id listed once, in the order the endpoints and their lists give
/// them. An endpoint that does not answer 2xx with JSON is left out; with none answering
/// the answer is a `503`.
pub(crate) async fn list(client: &reqwest::Client, endpoints: &[String]) -> Response {
    let mut asked: Vec<&str> = Vec::new();
    let mut data: Vec<Value> = Vec::new();
    let mut answered = false;
    for url in endpoints {
        if asked.contains(&url.as_str()) {
            continue;
        }
        asked.push(url);
        let Some(listed) = models_of(client, url).await else {
            continue;
        };
        answered = true;
        for model in listed["data"].as_array().into_iter().flatten() {
            if !data.iter().any(|m| m["id"] == model["id"]) {
                data.push(model.clone());
            }
        }
    }
    if !answered {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no upstream worker listed its models",
        );
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// What the endpoint at `url` answers at `/v1/models`; `None` for no 2xx JSON answer.
async fn models_of(client: &reqwest::Client, url: &str) -> Option<Value> {
    let response = client.get(format!("{url}/v1/models")).send().await.ok()?;
    let bytes = response.error_for_status().ok()?.bytes().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}
