//! The merchant's webhook endpoints (`/v1/webhook-endpoints`): register one (its secret
//! shown only in that answer), list them (no secrets), remove one, rotate its secret (a
//! replaced secret signs beside the new one for 24 h, whatever rotations follow), reactivate it (optionally delivering again every event
//! since a time).
//!
//! A URL is checked by the delivery's address guard before anything is stored: not
//! https, or resolving to a loopback, private or link-local address (unless
//! `PAGOS_WEBHOOKS_ALLOW_PRIVATE`), is a 422 and nothing is written.

use super::AppState;
use super::auth::{ApiKeyRefused, Merchant, TooManyFailedAuthentications};
use super::extract::{self, PathId, WhenEmpty, field_error as field, validation_failed as invalid};
use super::problem::{ApiError, MalformedBody, NotJson, Problem, ProblemType, RawBodyTooLarge};
use crate::delivery::guard::{self, SystemResolver};
use crate::delivery::signing::Secret;
use crate::entities::webhook_endpoint as endpoints;
use crate::outbox::endpoints::{self as store, NewEndpoint};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use pagos_types::{EventType, WebhookEndpoint};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

/// How long a secret a rotation replaced goes on signing beside the new one (a later
/// rotation does not cut it short; at most two replaced secrets sign).
pub const ROTATION_OVERLAP: chrono::TimeDelta = chrono::TimeDelta::hours(24);

pub const ENDPOINTS_PATH: &str = "/v1/webhook-endpoints";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_endpoint, list_endpoints))
        .routes(routes!(delete_endpoint))
        .routes(routes!(rotate_secret))
        .routes(routes!(reactivate))
        .layer(DefaultBodyLimit::max(extract::RAW_BODY_LIMIT))
}

/// The body of `POST /v1/webhook-endpoints` (documentation only: the handler reads the
/// JSON object itself, `extract::json_object`, to list every bad field at once).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct NuevoEndpoint {
    /// `https://…` (plain http and private addresses only with
    /// `PAGOS_WEBHOOKS_ALLOW_PRIVATE`); at most 2048 characters as stored (normalised: a
    /// character outside ASCII counts as its percent-encoding).
    #[schema(example = "https://example.com/webhooks/pagos")]
    url: String,
    /// The event types to deliver (absent or null: every type; at least one when given).
    #[schema(min_items = 1)]
    eventos: Option<Vec<EventType>>,
}

/// The body of `POST /v1/webhook-endpoints/{id}/reactivar` (may be empty; documentation
/// only, as `NuevoEndpoint`).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct Reactivacion {
    /// Deliver again every event since then (RFC 3339), delivered before or not.
    #[serde(rename = "reenviarDesde")]
    #[schema(format = DateTime)]
    reenviar_desde: Option<String>,
}

/// `GET /v1/webhook-endpoints`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaEndpoints {
    endpoints: Vec<WebhookEndpoint>,
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The representation; `secreto` only when just made.
fn shown(e: &endpoints::Model, with_secret: bool) -> WebhookEndpoint {
    let now = crate::db::now();
    WebhookEndpoint {
        id: e.id,
        url: e.url.clone(),
        eventos: store::wanted(e),
        estado: e.state,
        secreto: with_secret.then(|| e.secret.clone()),
        creado_en: rfc3339(e.created_at),
        secreto_anterior_hasta: store::previous_secret_at(e, now)
            .and(e.previous_secret_until)
            .map(rfc3339),
        motivo_desactivacion: e.disabled_reason.clone(),
    }
}

fn not_found() -> ApiError {
    Problem::new(ProblemType::NotFound)
        .detail("No webhook endpoint with this id.")
        .into()
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| not_found())
}

/// The 404 of an endpoint's route for an id that is not the merchant's (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 404,
    description = "No such endpoint for this merchant",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
struct NoSuchEndpoint(Problem);

/// Registers an endpoint; its secret is in this answer only. A merchant has at most 16
/// endpoints.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints",
    tag = "webhooks",
    security(("api_key" = [])),
    request_body = NuevoEndpoint,
    responses(
        (status = 201, description = "Registered, `ACTIVO`; `secreto` is shown only here", body = WebhookEndpoint,
         headers(("Location" = String))),
        MalformedBody,
        ApiKeyRefused,
        TooManyFailedAuthentications,
        NotJson,
        RawBodyTooLarge,
        (status = 422, description = "`validation-failed`, every field at fault listed in `errores`: a body that is not a JSON object (`(cuerpo)`), a member written twice or unknown, `url` missing or not a string, `eventos` not an array of strings, empty, or naming an unknown event type, a bad URL (not https, resolving to a non-public address, longer than 2048 characters as stored); or a merchant that has 16 endpoints already (the most it may have: `limite`). Nothing stored", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn create_endpoint(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut fields = extract::json_object(&headers, body, WhenEmpty::Refused)?;
    let policy = state.settings.webhooks.policy();
    let url = fields.required::<String>("url").and_then(|asked| {
        match guard::parse(asked.trim(), policy) {
            Ok(url) => Some(url),
            Err(refusal) => {
                fields.refuse("url", refusal.to_string());
                None
            }
        }
    });
    let mut types: Option<Vec<EventType>> = None;
    if let Some(names) = fields.optional::<Vec<String>>("eventos") {
        if names.is_empty() {
            fields.refuse(
                "eventos",
                "name at least one event type, or leave `eventos` out for all",
            );
        }
        let mut wanted = Vec::new();
        for name in &names {
            match name.parse::<EventType>() {
                Ok(t) if !wanted.contains(&t) => wanted.push(t),
                Ok(_) => {}
                Err(_) => fields.refuse(
                    "eventos",
                    format!(
                        "{name:?} is not an event type; the types are {}",
                        EventType::ALL.map(EventType::as_str).join(", ")
                    ),
                ),
            }
        }
        types = Some(wanted);
    }
    let url = fields.finish(url)?;
    // The addresses now; every delivery checks again.
    if let Err(refusal) = guard::check(&url, policy, &SystemResolver).await {
        tracing::info!(merchant_id = %merchant, %refusal, "a webhook endpoint's URL refused");
        return Err(invalid(vec![field("url", refusal.for_merchant())]));
    }
    let secret = Secret::generate();
    let made = store::create(
        &state.db,
        NewEndpoint {
            merchant,
            url: url.as_str(),
            types: types.as_deref(),
            secret: secret.expose(),
        },
    )
    .await?
    .ok_or_else(|| {
        ApiError::from(
            Problem::new(ProblemType::Validation)
                .detail(format!(
                    "A merchant has at most {} webhook endpoints; remove one (DELETE /v1/webhook-endpoints/{{id}}) before registering another. Nothing was stored.",
                    store::MAX_PER_MERCHANT
                ))
                .with("limite", store::MAX_PER_MERCHANT)
                .with(
                    "errores",
                    vec![field(
                        "url",
                        format!(
                            "this merchant has {} webhook endpoints already, the most it may have",
                            store::MAX_PER_MERCHANT
                        ),
                    )],
                ),
        )
    })?;
    tracing::info!(endpoint_id = %made.id, %merchant, "webhook endpoint registered");
    let location = format!("{ENDPOINTS_PATH}/{}", made.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        axum::Json(shown(&made, true)),
    )
        .into_response())
}

/// The merchant's endpoints, without their secrets.
#[utoipa::path(
    get,
    path = "/v1/webhook-endpoints",
    tag = "webhooks",
    security(("api_key" = [])),
    responses(
        (status = 200, description = "Every endpoint of the merchant, oldest first", body = ListaEndpoints),
        ApiKeyRefused,
        TooManyFailedAuthentications,
    )
)]
async fn list_endpoints(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
) -> Result<axum::Json<ListaEndpoints>, ApiError> {
    let all = store::list(&state.db, merchant).await?;
    Ok(axum::Json(ListaEndpoints {
        endpoints: all.iter().map(|e| shown(e, false)).collect(),
    }))
}

/// Removes an endpoint, with its deliveries and attempts.
#[utoipa::path(
    delete,
    path = "/v1/webhook-endpoints/{id}",
    tag = "webhooks",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 204, description = "Removed"),
        ApiKeyRefused,
        TooManyFailedAuthentications,
        NoSuchEndpoint,
    )
)]
async fn delete_endpoint(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<StatusCode, ApiError> {
    let id = parse_id(&id)?;
    if store::delete(&state.db, merchant, id).await? {
        tracing::info!(endpoint_id = %id, %merchant, "webhook endpoint removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}

/// A new secret, shown in this answer only; the one it replaces also signs for 24 h, and
/// one replaced by an earlier rotation goes on signing until 24 h after its replacement
/// (at most two replaced secrets: a third rotation within 24 h stops the oldest).
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{id}/rotar-secreto",
    tag = "webhooks",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The endpoint id")),
    responses(
        (status = 200, description = "The endpoint with its new `secreto` and until when the secret it replaced signs too (`secretoAnteriorHasta`); a secret replaced by an earlier rotation within 24 h keeps signing until 24 h after its own replacement, so deliveries may carry three signatures", body = WebhookEndpoint),
        ApiKeyRefused,
        TooManyFailedAuthentications,
        NoSuchEndpoint,
    )
)]
async fn rotate_secret(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<axum::Json<WebhookEndpoint>, ApiError> {
    let id = parse_id(&id)?;
    let secret = Secret::generate();
    let until = crate::db::now() + ROTATION_OVERLAP;
    let rotated = store::rotate(&state.db, merchant, id, secret.expose(), until)
        .await?
        .ok_or_else(not_found)?;
    tracing::info!(endpoint_id = %id, %merchant, "webhook endpoint secret rotated");
    Ok(axum::Json(shown(&rotated, true)))
}

/// `ACTIVO` again; with `reenviarDesde`, every event since then is delivered again.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{id}/reactivar",
    tag = "webhooks",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The endpoint id")),
    request_body(content = Option<Reactivacion>, content_type = "application/json", description = "Optional: `{}` (or no body, whatever its content type), or `{\"reenviarDesde\":\"<RFC 3339>\"}`"),
    responses(
        (status = 200, description = "The endpoint, `ACTIVO`", body = WebhookEndpoint),
        MalformedBody,
        ApiKeyRefused,
        TooManyFailedAuthentications,
        NoSuchEndpoint,
        RawBodyTooLarge,
        NotJson,
        (status = 422, description = "`validation-failed`, every field at fault listed in `errores`: a body that is not a JSON object (`(cuerpo)`), a member written twice or unknown, `reenviarDesde` not an RFC 3339 time. Nothing changed", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn reactivate(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<WebhookEndpoint>, ApiError> {
    let id = parse_id(&id)?;
    let mut fields = extract::json_object(&headers, body, WhenEmpty::Object)?;
    let since = match fields.optional::<String>("reenviarDesde") {
        None => Some(None),
        Some(text) => match DateTime::parse_from_rfc3339(&text) {
            Ok(t) => Some(Some(t.with_timezone(&Utc))),
            Err(e) => {
                fields.refuse(
                    "reenviarDesde",
                    format!("not an RFC 3339 time ({e}); e.g. 2026-12-01T00:00:00Z"),
                );
                None
            }
        },
    };
    let since = fields.finish(since)?;
    let done = store::reactivate(&state.db, merchant, id, since)
        .await?
        .ok_or_else(not_found)?;
    tracing::info!(endpoint_id = %id, %merchant, resend_since = ?since, "webhook endpoint reactivated");
    Ok(axum::Json(shown(&done, false)))
}
