//! Operations endpoints: liveness, readiness, metrics.
//!
//! They never need credentials and never touch payment data; liveness and metrics never
//! touch the database at all.

use super::AppState;
use super::problem::{Problem, ProblemResponse, ProblemType};
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// `/healthz`: answers from memory, so the doors never shed or time it out (a liveness
/// probe that failed under load would get a healthy process killed).
pub fn liveness() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz))
}

/// `/readyz`: asks the database, so it counts against the limits like any request.
pub fn readiness() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(readyz))
}

/// `/metrics`: renders memory only, so it is never shed either (overload is when it is
/// needed). Served on the admin door when `PAGOS_ADMIN_BIND` is set.
pub fn metrics_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Prometheus metrics (OpenMetrics text). Never runs a query: the gauges of stored state
/// are refreshed in the background every `PAGOS_METRICS_REFRESH`.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text")))]
async fn metrics(State(state): State<AppState>) -> Response {
    let limit = i64::from(state.settings.max_in_flight);
    let free = i64::try_from(state.in_flight.available_permits()).unwrap_or(limit);
    state.metrics.http_in_flight.set(limit - free);
    let (entries, bytes) = state.replay_cache.size();
    state.metrics.observe_replay_cache(entries, bytes);
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /healthz`'s answer (documentation only: the handler writes it).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Vivo {
    #[schema(inline)]
    status: VivoStatus,
}

#[derive(utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum VivoStatus {
    Ok,
}

/// `GET /readyz`'s answer when ready (documentation only: the handler writes it).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Listo {
    #[schema(inline)]
    status: ListoStatus,
}

#[derive(utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum ListoStatus {
    Ready,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "Alive", body = Vivo)))]
async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// The database is reachable.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "ops",
    responses(
        (status = 200, description = "Ready", body = Listo),
        (status = 503, description = "The process is shutting down (from SIGTERM or Ctrl-C on; it still serves requests for `PAGOS_DRAIN_DELAY`), or the database is unreachable, or accepts no writes (a replica, a failover in progress): `service-unavailable`, without Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Only on `overloaded`: seconds to wait; absent on this endpoint's own answer and on `request-timeout`"))),
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    if *state.draining.borrow() {
        return Problem::new(ProblemType::Unavailable)
            .detail("The process is shutting down: send new requests to another one.")
            .into_response();
    }
    if let Err(err) = state.db.ping().await {
        tracing::warn!(error = %err, "readiness check failed");
        return Problem::new(ProblemType::Unavailable)
            .detail("The database is not reachable.")
            .into_response();
    }
    if read_only(&state).await {
        tracing::warn!("readiness check failed: the database is a read-only replica");
        return Problem::new(ProblemType::Unavailable)
            .detail("The database accepts no writes (a replica, or a failover in progress).")
            .into_response();
    }
    Json(json!({"status": "ready"})).into_response()
}

/// PostgreSQL in recovery (a replica) accepts reads only: every payment would fail.
async fn read_only(state: &AppState) -> bool {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    if state.db.get_database_backend() != DbBackend::Postgres {
        return false;
    }
    let statement = Statement::from_string(DbBackend::Postgres, "SELECT pg_is_in_recovery() AS r");
    match state.db.query_one_raw(statement).await {
        Ok(Some(row)) => row.try_get::<bool>("", "r").unwrap_or(false),
        _ => false,
    }
}
