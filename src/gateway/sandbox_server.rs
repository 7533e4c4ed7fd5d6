//! `pagos sandbox-gateway`: the reference protocol served over HTTP from memory, with
//! fault injection for tests and demos.
//!
//! Faults are drawn per request: `error` answers 503 without charging; `timeout` charges
//! then hangs past any client's patience; `reset` charges then breaks the connection
//! mid-answer. Each leaves the client not knowing, which is the point.

use super::sandbox::{Begin, Outcomes, SandboxCore};
use super::{Charge, ChargeBody};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Fault rates, each in [0, 1].
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub latency: Duration,
    pub error_rate: f64,
    pub timeout_rate: f64,
    pub reset_rate: f64,
}

pub struct SandboxServer {
    core: SandboxCore,
    faults: Faults,
    secret: Option<String>,
}

impl SandboxServer {
    pub fn new(outcomes: Outcomes, faults: Faults, secret: Option<String>) -> Arc<Self> {
        Arc::new(SandboxServer {
            core: SandboxCore::new(outcomes),
            faults,
            secret,
        })
    }

    pub fn core(&self) -> &SandboxCore {
        &self.core
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/charges", post(create_charge).get(list_charges))
            .route("/sandbox/stats", get(stats))
            .with_state(self)
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn authorized(server: &SandboxServer, headers: &HeaderMap) -> bool {
    let Some(secret) = &server.secret else {
        return true;
    };
    let expected = format!("Bearer {secret}");
    headers
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == expected.as_bytes())
}

async fn create_charge(
    State(server): State<Arc<SandboxServer>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&server, &headers) {
        return error(StatusCode::UNAUTHORIZED, "bad or missing bearer secret");
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "Idempotency-Key is required");
    };
    let Ok(body) = serde_json::from_slice::<ChargeBody>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not a charge request");
    };
    if server.core.roll() < server.faults.error_rate {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected fault: unavailable",
        );
    }
    let charge = match server.core.begin(&key, &body) {
        Begin::New => {
            if !server.faults.latency.is_zero() {
                tokio::time::sleep(server.faults.latency).await;
            }
            server.core.complete(&key, &body)
        }
        Begin::Replay(charge) => charge,
        Begin::InFlight => {
            return error(StatusCode::CONFLICT, "a request with this key is in flight");
        }
        Begin::Mismatch => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this key was used with another body",
            );
        }
    };
    if server.core.roll() < server.faults.timeout_rate {
        // Charged; the answer never comes in time.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if server.core.roll() < server.faults.reset_rate {
        return broken_answer();
    }
    (StatusCode::CREATED, Json(charge)).into_response()
}

/// Headers go out, then the body fails: the client's connection breaks mid-answer.
fn broken_answer() -> Response {
    let stream = futures::stream::once(async {
        Err::<bytes::Bytes, std::io::Error>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected fault: connection reset",
        ))
    });
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[derive(Deserialize)]
struct ReferenceQuery {
    reference: String,
}

async fn list_charges(
    State(server): State<Arc<SandboxServer>>,
    headers: HeaderMap,
    Query(query): Query<ReferenceQuery>,
) -> Response {
    if !authorized(&server, &headers) {
        return error(StatusCode::UNAUTHORIZED, "bad or missing bearer secret");
    }
    if server.core.roll() < server.faults.error_rate {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected fault: unavailable",
        );
    }
    let data: Vec<Charge> = server.core.charges_for(&query.reference);
    Json(json!({ "data": data })).into_response()
}

/// Counts for soak tests and demos: charges made and references charged twice.
async fn stats(State(server): State<Arc<SandboxServer>>) -> Response {
    let charges = server.core.all_charges();
    let (total, duplicated) = server.core.totals();
    let count = |status| charges.iter().filter(|c| c.status == status).count();
    Json(json!({
        "charges": total,
        "duplicatedReferences": duplicated,
        "succeeded": count(super::ChargeStatus::Succeeded),
        "declined": count(super::ChargeStatus::Declined),
        "pending": count(super::ChargeStatus::Pending),
    }))
    .into_response()
}

/// `pagos sandbox-gateway`: serves until Ctrl-C or SIGTERM.
pub async fn run(args: crate::config::SandboxArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let server = SandboxServer::new(
        Outcomes {
            decline_rate: args.decline_rate,
            pending_rate: args.pending_rate,
            pending_for: args.pending_for,
            seed: args.seed,
        },
        Faults {
            latency: args.latency,
            error_rate: args.error_rate,
            timeout_rate: args.timeout_rate,
            reset_rate: args.reset_rate,
        },
        args.secret,
    );
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {} (PAGOS_SANDBOX_BIND)", args.bind))?;
    tracing::info!(addr = %listener.local_addr()?, "sandbox gateway listening");
    axum::serve(listener, server.router())
        .with_graceful_shutdown(crate::app::shutdown_signal())
        .await
        .context("serving the sandbox gateway")
}
