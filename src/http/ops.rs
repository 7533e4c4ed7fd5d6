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
        .routes(routes!(metrics))
}

/// Prometheus metrics (OpenMetrics text). Gauges of stored state are read now.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text")))]
async fn metrics(State(state): State<AppState>) -> Response {
    match refresh_gauges(&state).await {
        Ok(()) => {
            state.metrics.database_up.set(1);
        }
        Err(err) => {
            // Stale gauges would look healthy exactly when they matter: drop them.
            tracing::warn!(error = %err, "metrics: could not read payment gauges");
            state.metrics.database_up.set(0);
            state.metrics.payments.clear();
            state.metrics.oldest_unsettled_age.set(f64::NAN);
        }
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn refresh_gauges(state: &AppState) -> Result<(), sea_orm::DbErr> {
    use crate::entities::payment;
    use crate::metrics::StateLabel;
    use crate::saga::state::PaymentState;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

    let counts: Vec<(String, i64)> = payment::Entity::find()
        .select_only()
        .column(payment::Column::State)
        .column_as(payment::Column::Id.count(), "n")
        .group_by(payment::Column::State)
        .into_tuple()
        .all(&state.db)
        .await?;
    for estado in PaymentState::ALL {
        let n = counts
            .iter()
            .find(|(s, _)| s == estado.as_str())
            .map_or(0, |(_, n)| *n);
        state
            .metrics
            .payments
            .get_or_create(&StateLabel {
                estado: estado.as_str(),
            })
            .set(n);
    }
    let oldest: Option<chrono::DateTime<chrono::Utc>> = payment::Entity::find()
        .select_only()
        .column_as(payment::Column::CreatedAt.min(), "oldest")
        .filter(payment::Column::State.is_in(crate::saga::store::RECONCILABLE.map(|s| s.as_str())))
        .into_tuple::<Option<chrono::DateTime<chrono::Utc>>>()
        .one(&state.db)
        .await?
        .flatten();
    let age = oldest.map_or(0.0, |t| (crate::db::now() - t).as_seconds_f64().max(0.0));
    state.metrics.oldest_unsettled_age.set(age);
    Ok(())
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
    if let Err(err) = state.db.ping().await {
        tracing::warn!(error = %err, "readiness check failed");
        return Problem::new(Kind::Unavailable)
            .detail("The database is not reachable.")
            .into_response();
    }
    if read_only(&state).await {
        tracing::warn!("readiness check failed: the database is a read-only replica");
        return Problem::new(Kind::Unavailable)
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
