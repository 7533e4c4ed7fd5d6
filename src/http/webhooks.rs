//! Gateway webhooks: `POST /v1/webhooks/http`, and on-call's list of orphan charges
//! (`GET /admin/cargos-huerfanos`).
//!
//! The signature is checked over the raw bytes before anything is parsed, and nothing is
//! written for a request refused with 401, 400 or 413. Every event that is accepted —
//! applied, duplicate, stale, orphan — answers 200, so the gateway stops redelivering it;
//! only a failure to write answers 503, and the redelivery starts over from nothing.

use super::AppState;
use super::auth::Admin;
use super::problem::{ApiError, Kind, Problem};
use crate::domain::FieldError;
use crate::entities::webhook_charge;
use crate::webhooks::event::{GatewayEvent, Payload};
use crate::webhooks::signature::{self, SignatureError};
use crate::webhooks::{self, ChargeEvent, SOURCE_HTTP};
use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use chrono::SecondsFormat;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Gateway events are small; anything larger is not one.
pub const MAX_EVENT_BODY: usize = 64 * 1024;
pub const DEFAULT_LIMIT: u64 = 100;
pub const MAX_LIMIT: u64 = 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(receive_http_event))
        .routes(routes!(list_orphan_charges))
}

/// The answer to an accepted event.
#[derive(Serialize, utoipa::ToSchema)]
struct Acuse {
    /// `aplicado`, `revision_manual`, `sin_cambios`, `duplicado`, `obsoleto`, `huerfano`
    /// or `ignorado` (a type pagos does not act on).
    #[schema(example = "aplicado")]
    resultado: &'static str,
}

/// A gateway event (documentation only: the handler verifies the raw bytes first).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(as = EventoPasarela)]
struct EventoPasarela {
    /// Unique per event: a repeated id changes nothing.
    #[schema(example = "evt_1Q2w3E4r")]
    id: String,
    /// `charge.updated`; other types are acknowledged and ignored.
    #[schema(rename = "type", example = "charge.updated")]
    kind: String,
    /// Increases with each change of one charge: an event at or below the last one
    /// applied for its charge changes nothing.
    #[schema(minimum = 0, example = 2)]
    sequence: i64,
    /// The charge as it stands after the change (`POST /v1/charges`' answer).
    #[schema(value_type = Object)]
    data: serde_json::Value,
}

fn unauthorized(detail: impl Into<String>) -> ApiError {
    Problem::new(Kind::Unauthorized).detail(detail).into()
}

async fn read_raw(body: Body) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_EVENT_BODY)
        .await
        .map_err(|err| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
            while let Some(e) = source {
                if e.is::<http_body_util::LengthLimitError>() {
                    return Problem::new(Kind::BodyTooLarge)
                        .detail(format!("An event must be at most {MAX_EVENT_BODY} bytes."))
                        .into();
                }
                source = e.source();
            }
            Problem::new(Kind::MalformedJson)
                .detail("The body could not be read.")
                .into()
        })
}

/// Receive a gateway event (reference protocol), delivered at least once, in any order.
#[utoipa::path(
    post,
    path = "/v1/webhooks/http",
    tag = "webhooks",
    params(
        ("Gateway-Signature" = String, Header,
         description = "`t=<unix seconds>,v1=<hex HMAC-SHA256(PAGOS_WEBHOOK_SECRET, \"<t>.<raw body>\")>`; one or more `v1`, any may match; `t` within 5 minutes of now.")
    ),
    request_body(content = EventoPasarela, content_type = "application/json"),
    responses(
        (status = 200, description = "Accepted: applied, or already applied, stale, orphan or ignored. Stop delivering it.", body = Acuse),
        (status = 400, description = "Signed, but not a gateway event; nothing was recorded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Signature missing, malformed, wrong or outside the 5-minute tolerance, or webhooks disabled (PAGOS_WEBHOOK_SECRET unset); nothing was recorded", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Could not be applied now; nothing was recorded. Deliver it again.", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64))),
    )
)]
async fn receive_http_event(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(secret) = state
        .settings
        .webhook_secret
        .as_deref()
        .filter(|s| !s.is_empty())
    else {
        tracing::warn!("webhook refused: PAGOS_WEBHOOK_SECRET is not set");
        return Err(unauthorized(
            "Webhooks are disabled: PAGOS_WEBHOOK_SECRET is not set.",
        ));
    };
    let raw = read_raw(body).await?;
    let values = headers
        .get_all(signature::HEADER)
        .iter()
        .map(|v| v.as_bytes());
    if let Err(err) = signature::verify_header(values, secret.as_bytes(), &raw, unix_now()) {
        // Never log the header or the body: they are an attacker's to choose.
        tracing::warn!(reason = %err, kind = signature_failure(err), "webhook signature refused");
        state.metrics.webhook_event(match err {
            SignatureError::OutsideTolerance => "refused_timestamp",
            _ => "refused_signature",
        });
        return Err(unauthorized(format!(
            "{err}. Sign \"<t>.<raw body>\" with HMAC-SHA256 and the shared secret."
        )));
    }
    let event = GatewayEvent::parse(&raw).map_err(|err| {
        tracing::warn!(error = %err, "signed webhook is not a gateway event");
        state.metrics.webhook_event("malformed");
        ApiError::from(
            Problem::new(Kind::MalformedJson).detail(format!("{err}. Nothing was recorded.")),
        )
    })?;
    let charge = match &event.payload {
        Payload::ChargeUpdated(charge) => charge,
        Payload::Other(kind) => {
            tracing::info!(event_id = event.id, kind, "event type ignored");
            state.metrics.webhook_event("ignorado");
            return Ok(acknowledge("ignorado"));
        }
    };
    let consumed = webhooks::consume(
        &state.db,
        ChargeEvent {
            source: SOURCE_HTTP,
            event_id: &event.id,
            sequence: event.sequence,
            charge,
        },
    )
    .await;
    match consumed {
        Ok(outcome) => {
            state.metrics.webhook_event(outcome.as_str());
            Ok(acknowledge(outcome.as_str()))
        }
        Err(err) => {
            state.metrics.webhook_event("error");
            tracing::error!(event_id = event.id, error = %err, "webhook could not be applied; the gateway will deliver it again");
            Err(Problem::new(Kind::Unavailable)
                .detail(
                    "The event could not be applied now; nothing was recorded. Deliver it again.",
                )
                .retry_after(1)
                .into())
        }
    }
}

fn acknowledge(resultado: &'static str) -> Response {
    Json(Acuse { resultado }).into_response()
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A stable label for logs (and, later, a metric).
fn signature_failure(err: SignatureError) -> &'static str {
    match err {
        SignatureError::Missing => "missing",
        SignatureError::Repeated => "repeated",
        SignatureError::Malformed(_) => "malformed",
        SignatureError::OutsideTolerance => "timestamp",
        SignatureError::Mismatch => "mismatch",
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct OrphanQuery {
    /// How many, 1–1000 (default 100).
    limite: Option<String>,
}

/// A charge the gateway reported whose reference matches no payment: money may have
/// been taken without a payment of ours.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct CargoHuerfano {
    /// The gateway (`http`).
    fuente: String,
    cargo_id: String,
    /// The reference the gateway holds for the charge.
    referencia: String,
    /// As of the last event applied: `succeeded`, `declined` or `pending`.
    estado: String,
    monto: i64,
    moneda: String,
    codigo_rechazo: Option<String>,
    ultima_secuencia: i64,
    ultimo_evento: String,
    /// RFC 3339.
    visto_primero_en: String,
    /// RFC 3339.
    actualizado_en: String,
}

impl From<webhook_charge::Model> for CargoHuerfano {
    fn from(c: webhook_charge::Model) -> Self {
        CargoHuerfano {
            fuente: c.source,
            cargo_id: c.charge_id,
            referencia: c.reference,
            estado: c.status,
            monto: c.amount,
            moneda: c.currency,
            codigo_rechazo: c.decline_code,
            ultima_secuencia: c.last_sequence,
            ultimo_evento: c.last_event_id,
            visto_primero_en: c.first_seen_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            actualizado_en: c.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

/// Orphan charges, oldest first: charges reported by a gateway for a reference no
/// payment has. See `runbooks/webhooks.md`.
#[utoipa::path(
    get,
    path = "/admin/cargos-huerfanos",
    tag = "admin",
    security(("admin_token" = [])),
    params(OrphanQuery),
    responses(
        (status = 200, description = "Orphan charges, oldest first", body = [CargoHuerfano]),
        (status = 401, description = "Missing or wrong admin token, or PAGOS_ADMIN_TOKEN unset", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`limite` is not a whole number between 1 and 1000", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_orphan_charges(
    State(state): State<AppState>,
    _admin: Admin,
    Query(query): Query<OrphanQuery>,
) -> Result<Response, ApiError> {
    let limit = match query.limite.as_deref() {
        None => DEFAULT_LIMIT,
        Some(raw) => match raw.parse::<u64>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(Problem::new(Kind::Validation)
                    .detail("Correct the parameters listed in `errores`.")
                    .with(
                        "errores",
                        [FieldError {
                            campo: "limite".into(),
                            detalle: format!("a whole number between 1 and {MAX_LIMIT}"),
                        }],
                    )
                    .into());
            }
        },
    };
    let orphans = webhooks::orphan_charges(&state.db, limit).await?;
    let body: Vec<CargoHuerfano> = orphans.into_iter().map(CargoHuerfano::from).collect();
    let mut response = Json(body).into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}
