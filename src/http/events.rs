//! The merchant's events (`/v1/eventos`): the list, in the order they were committed,
//! with a cursor (`pendientes=true` keeps those not yet delivered to every endpoint), and
//! one event with its deliveries and every attempt. What a merchant reads to find what it
//! missed.

use super::AppState;
use super::auth::{ApiKeyRefused, Merchant, TooManyFailedAuthentications};
use super::extract::PathId;
use super::problem::{ApiError, Problem, ProblemType};
use crate::domain::FieldError;
use crate::outbox::events as store;
use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::{DateTime, SecondsFormat, Utc};
use pagos_types::Evento;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(get_event))
}

/// A page of events.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaEventos {
    eventos: Vec<Evento>,
    /// The `desde` of the next page; null when this page is the last one for now (poll
    /// again later with the id of the last event read).
    siguiente: Option<String>,
}

/// One event's delivery to one endpoint.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entrega {
    endpoint_id: Uuid,
    /// None when the endpoint was removed.
    url: Option<String>,
    /// `PENDIENTE`, `ENTREGADA` or `ABANDONADA` (the schedule ran out, or the endpoint
    /// was `DESACTIVADO` when the event was written: no attempt).
    estado: String,
    intentos: i32,
    /// When the next attempt is due, while `PENDIENTE` (RFC 3339).
    #[schema(format = DateTime)]
    proximo_intento: Option<String>,
    /// When it was delivered (RFC 3339), while `ENTREGADA`: a delivery sent again
    /// (`reenviarDesde`) is not delivered until its new round is.
    #[schema(format = DateTime)]
    entregada_en: Option<String>,
}

/// One attempt, as it was kept.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Intento {
    endpoint_id: Uuid,
    /// 1 for the first attempt of the delivery.
    numero: i32,
    /// When it was made (RFC 3339; its `webhook-timestamp` in seconds).
    #[schema(format = DateTime)]
    en: String,
    /// The answer's status; null when there was no answer.
    estado_http: Option<i32>,
    latencia_ms: i64,
    /// The first 1 KiB of the answer.
    respuesta: String,
    error: Option<String>,
    /// `delivered`, `gone`, `failed` or `refused`.
    resultado: String,
}

/// `GET /v1/eventos/{id}`: the event and its deliveries.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DetalleEvento {
    #[serde(flatten)]
    evento: Evento,
    entregas: Vec<Entrega>,
    intentos: Vec<Intento>,
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn wire(body: &str) -> Result<Evento, ApiError> {
    serde_json::from_str(body).map_err(|e| ApiError::Internal(e.into()))
}

fn invalid(campo: &str, detalle: impl Into<String>) -> ApiError {
    Problem::new(ProblemType::Validation)
        .detail("Correct the parameters listed in `errores`.")
        .with(
            "errores",
            vec![FieldError {
                campo: campo.to_owned(),
                detalle: detalle.into(),
            }],
        )
        .into()
}

/// A cursor is an event id.
pub fn is_event_id(text: &str) -> bool {
    text.len() <= 40
        && text
            .strip_prefix("evt_")
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The merchant's events, in the order they were committed (oldest first).
#[utoipa::path(
    get,
    path = "/v1/eventos",
    tag = "webhooks",
    security(("api_key" = [])),
    params(
        ("desde" = Option<String>, Query, description = "The `siguiente` of the page before, or the id of the last event a page showed you: the events committed after it. Not the id of an event known only from a webhook or `GET /v1/eventos/{id}`: an event committed just before it may not be listed yet (422 while it is not)"),
        ("limite" = Option<u64>, Query, minimum = 1, maximum = 500, description = "At most this many (1–500, default 50)"),
        ("pendientes" = Option<bool>, Query, description = "`true`: only events not yet delivered to every endpoint"),
    ),
    responses(
        (status = 200, description = "A page of events", body = ListaEventos),
        ApiKeyRefused,
        TooManyFailedAuthentications,
        (status = 422, description = "A bad parameter", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_events(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    RawQuery(query): RawQuery,
) -> Result<Json<ListaEventos>, ApiError> {
    let mut after = None;
    let mut limit = DEFAULT_LIMIT;
    let mut pending = false;
    let mut seen = std::collections::HashSet::new();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if !seen.insert(name.clone().into_owned()) {
            return Err(invalid(&name, "given more than once"));
        }
        match name.as_ref() {
            "desde" if is_event_id(&value) => after = Some(value.into_owned()),
            "desde" => {
                return Err(invalid(
                    "desde",
                    "not a cursor: use the `siguiente` of a page",
                ));
            }
            "limite" => {
                limit = value
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        invalid("limite", format!("a whole number from 1 to {MAX_LIMIT}"))
                    })?;
            }
            "pendientes" => {
                pending = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid("pendientes", "true or false")),
                }
            }
            other => {
                return Err(invalid(
                    other,
                    "unknown parameter; known: desde, limite, pendientes",
                ));
            }
        }
    }
    let after = match after {
        Some(id) => match store::cursor(&state.db, merchant, &id).await? {
            store::Cursor::At(position) => Some(position),
            store::Cursor::NotListedYet => {
                return Err(invalid(
                    "desde",
                    "this event is not listed yet (a write begun before it has not ended): use the `siguiente` of a page, or the id of the last event a page showed you",
                ));
            }
            store::Cursor::Unknown => {
                return Err(invalid(
                    "desde",
                    "no event of yours has this id: use the `siguiente` of a page",
                ));
            }
        },
        None => None,
    };
    let page = store::list(&state.db, merchant, after.as_ref(), limit, pending).await?;
    let siguiente = (page.len() as u64 == limit)
        .then(|| page.last().map(|e| e.id.clone()))
        .flatten();
    let eventos = page
        .iter()
        .map(|e| wire(&e.body))
        .collect::<Result<_, _>>()?;
    Ok(Json(ListaEventos { eventos, siguiente }))
}

/// One event of the merchant's, its deliveries and every attempt.
#[utoipa::path(
    get,
    path = "/v1/eventos/{id}",
    tag = "webhooks",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The event id (`evt_…`, the `webhook-id`)")),
    responses(
        (status = 200, description = "The event with its deliveries and attempts", body = DetalleEvento),
        ApiKeyRefused,
        TooManyFailedAuthentications,
        (status = 404, description = "No such event for this merchant", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_event(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<Json<DetalleEvento>, ApiError> {
    let not_found = || -> ApiError {
        Problem::new(ProblemType::NotFound)
            .detail("No event with this id.")
            .into()
    };
    if !is_event_id(&id) {
        return Err(not_found());
    }
    let detail = store::find(&state.db, merchant, &id)
        .await?
        .ok_or_else(not_found)?;
    let entregas = detail
        .deliveries
        .iter()
        .map(|(d, endpoint)| Entrega {
            endpoint_id: d.endpoint_id,
            url: endpoint.as_ref().map(|e| e.url.clone()),
            estado: d.state.as_str().to_owned(),
            intentos: d.attempts,
            proximo_intento: (d.state == crate::entities::webhook_delivery::DeliveryState::Pending)
                .then(|| rfc3339(d.next_attempt_at)),
            entregada_en: d
                .delivered_at
                .filter(|_| d.state == crate::entities::webhook_delivery::DeliveryState::Delivered)
                .map(rfc3339),
        })
        .collect();
    let intentos = detail
        .attempts
        .iter()
        .map(|a| Intento {
            endpoint_id: a.endpoint_id,
            numero: a.number,
            en: rfc3339(a.attempted_at),
            estado_http: a.status,
            latencia_ms: a.latency_ms,
            respuesta: a.answer.clone(),
            error: a.error.clone(),
            resultado: a.outcome.clone(),
        })
        .collect();
    Ok(Json(DetalleEvento {
        evento: wire(&detail.event.body)?,
        entregas,
        intentos,
    }))
}
