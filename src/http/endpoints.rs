//! The merchant's webhook endpoints (`/v1/webhook-endpoints`): register one (its secret
//! shown only in that answer), list them (no secrets), remove one, rotate its secret (a
//! replaced secret signs beside the new one for 24 h, whatever rotations follow), reactivate it (optionally delivering again every event
//! since a time).
//!
//! A URL is checked by the delivery's address guard before anything is stored: not
//! https, or resolving to a loopback, private or link-local address (unless
//! `PAGOS_WEBHOOKS_ALLOW_PRIVATE`), is a 422 and nothing is written.

use super::AppState;
use super::auth::{ApiKeyRefused, Merchant};
use super::extract::{self, PathId};
use super::problem::{ApiError, NotJson, NotThisShape, Problem, ProblemType, RawBodyTooLarge};
use crate::delivery::guard::{self, SystemResolver};
use crate::delivery::signing::Secret;
use crate::domain::FieldError;
use crate::entities::webhook_endpoint as endpoints;
use crate::outbox::endpoints::{self as store, NewEndpoint};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use pagos_types::{EventType, WebhookEndpoint};
use serde::{Deserialize, Serialize};
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

/// The body of `POST /v1/webhook-endpoints`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NuevoEndpoint {
    /// `https://…` (plain http and private addresses only with
    /// `PAGOS_WEBHOOKS_ALLOW_PRIVATE`); at most 2048 characters as stored (normalised: a
    /// character outside ASCII counts as its percent-encoding).
    #[schema(example = "https://example.com/webhooks/pagos")]
    url: String,
    /// The event types to deliver (absent: every type).
    eventos: Option<Vec<String>>,
}

/// The body of `POST /v1/webhook-endpoints/{id}/reactivar` (may be empty).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reactivacion {
    /// Deliver again every event since then (RFC 3339), delivered before or not.
    #[serde(rename = "reenviarDesde")]
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

fn invalid(errors: Vec<FieldError>) -> ApiError {
    Problem::new(ProblemType::Validation)
        .detail("Correct the fields listed in `errores` and send the request again; nothing was stored.")
        .with("errores", errors)
        .into()
}

fn field(campo: &str, detalle: impl Into<String>) -> FieldError {
    FieldError {
        campo: campo.to_owned(),
        detalle: detalle.into(),
    }
}

/// A JSON body of `T`: 415 for another content type, 400 for what is not JSON of that
/// shape. An empty body is `T::default()` when `empty` allows it.
fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
    empty: Option<T>,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace)
        && let Some(default) = empty
    {
        return Ok(default);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    // A body that does not say it is JSON is refused as `POST /v1/pagos` refuses it
    // (axum's `Json`): 415, whether its type is another or missing.
    if !content_type.is_some_and(|c| c == "application/json" || c.ends_with("+json")) {
        return Err(Problem::new(ProblemType::UnsupportedMediaType)
            .detail("Send the body as application/json.")
            .into());
    }
    serde_json::from_slice(body).map_err(|e| {
        Problem::new(ProblemType::MalformedJson)
            .detail(format!("The body is not the JSON expected: {e}"))
            .into()
    })
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
        NotThisShape,
        ApiKeyRefused,
        NotJson,
        RawBodyTooLarge,
        (status = 422, description = "A bad URL (not https, resolving to a non-public address, longer than 2048 characters as stored), an unknown event type, or a merchant that has 16 endpoints already (the most it may have: `limite`); nothing stored", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn create_endpoint(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: NuevoEndpoint = json_body(&headers, &extract::bytes(body)?, None)?;
    let policy = state.settings.webhooks.policy();
    let mut errors = Vec::new();
    let url = match guard::parse(request.url.trim(), policy) {
        Ok(url) => Some(url),
        Err(refusal) => {
            errors.push(field("url", refusal.to_string()));
            None
        }
    };
    let mut types: Option<Vec<EventType>> = None;
    if let Some(names) = &request.eventos {
        if names.is_empty() {
            errors.push(field(
                "eventos",
                "name at least one event type, or leave `eventos` out for all",
            ));
        }
        let mut wanted = Vec::new();
        for name in names {
            match name.parse::<EventType>() {
                Ok(t) if !wanted.contains(&t) => wanted.push(t),
                Ok(_) => {}
                Err(_) => errors.push(field(
                    "eventos",
                    format!(
                        "{name:?} is not an event type; the types are {}",
                        EventType::ALL.map(EventType::as_str).join(", ")
                    ),
                )),
            }
        }
        types = Some(wanted);
    }
    let Some(url) = url.filter(|_| errors.is_empty()) else {
        return Err(invalid(errors));
    };
    // The addresses now; every delivery checks again.
    if let Err(refusal) = guard::check(&url, policy, &SystemResolver).await {
        return Err(invalid(vec![field("url", refusal.to_string())]));
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
    request_body(content = Reactivacion, description = "`{}` (or no body), or `{\"reenviarDesde\":\"<RFC 3339>\"}`"),
    responses(
        (status = 200, description = "The endpoint, `ACTIVO`", body = WebhookEndpoint),
        NotThisShape,
        ApiKeyRefused,
        NoSuchEndpoint,
        RawBodyTooLarge,
        (status = 422, description = "`reenviarDesde` is not an RFC 3339 time", body = Problem, content_type = "application/problem+json"),
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
    let request: Reactivacion = json_body(
        &headers,
        &extract::bytes(body)?,
        Some(Reactivacion::default()),
    )?;
    let since = match request.reenviar_desde.as_deref() {
        None => None,
        Some(text) => Some(
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    invalid(vec![field(
                        "reenviarDesde",
                        format!("not an RFC 3339 time ({e}); e.g. 2026-12-01T00:00:00Z"),
                    )])
                })?,
        ),
    };
    let done = store::reactivate(&state.db, merchant, id, since)
        .await?
        .ok_or_else(not_found)?;
    tracing::info!(endpoint_id = %id, %merchant, resend_since = ?since, "webhook endpoint reactivated");
    Ok(axum::Json(shown(&done, false)))
}
