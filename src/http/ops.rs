//! Operations endpoints: liveness, readiness, the OpenAPI document.
//!
//! They never need credentials and never touch payment data.

use super::AppState;
use super::problem::{Kind, Problem};
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "Alive")))]
async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// The database is reachable.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "ops",
    responses(
        (status = 200, description = "Ready"),
        (status = 503, description = "Database unreachable", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.db.ping().await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "readiness check failed");
            Problem::new(Kind::Unavailable)
                .detail("The database is not reachable.")
                .into_response()
        }
    }
}
