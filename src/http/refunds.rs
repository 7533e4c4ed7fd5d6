//! Refunds (contract section 6): `POST /v1/pagos/{id}/reembolsos` (idempotent, keys in a
//! key space of their own), `GET /v1/reembolsos/{id}`, `GET /v1/pagos/{id}/reembolsos`,
//! and on-call's `POST /admin/pagos/{id}/reembolsos`. On-call's settlement of a refund
//! under review is `refund_resolution`.
//!
//! A request rejected before any work (401, 413, 415, 400, validation 422), and one
//! refused by the check of what is left (404, 409, 422 `refund-exceeds-remaining`),
//! stores nothing: the same key can be sent again. The saga runs in its own task: a client
//! that hangs up never cancels a refund halfway.

use super::AppState;
use super::auth::{
    Admin, AdminTokenRefused, ApiKeyRefused, Merchant, PaymentNotFound, ReadOnlyRole,
    TooManyFailedAuthentications,
};
use super::extract::PathId;
use super::payments::{
    Body, MAX_BODY, body, idempotency_key, not_json, problem, validation_failed, with_refused,
};
use super::problem::{
    ApiError, BodyTooLarge, NoSuchPayment, NotJson, Problem, ProblemType, RetryWithSameKey,
};
use crate::entities::idempotency_key as keys;
use crate::entities::refund::{self, KeyScope};
use crate::idempotency::{self, Begin, IdempotencyKey};
use crate::metrics::Keyed;
use crate::operators::actions::Action;
use crate::representation::{Answer, reembolso, refund_answer};
use crate::saga::refund::state::RefundState;
use crate::saga::refund::store::{self, Registered, Registration};
use crate::saga::refund::{self as refunds, Actor};
use crate::saga::state::PaymentState;
use axum::Json;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pagos_types::body::Read;
use pagos_types::{NewRefund, Reembolso};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub const REFUNDS_PATH: &str = "/v1/reembolsos";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_refund))
        .routes(routes!(get_refund))
        .routes(routes!(list_refunds))
        .routes(routes!(admin_refund))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

/// The body of a merchant's refund request (documentation only: the handler parses JSON
/// itself to report every bad field at once). A member it does not know is refused (422).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(as = ReembolsoRequest)]
#[serde(deny_unknown_fields)]
struct ReembolsoRequest {
    /// Minor units, positive, at most what is left of the payment; absent or null:
    /// everything not yet refunded.
    #[schema(minimum = 1, maximum = 9007199254740991_i64, example = 50000)]
    monto: Option<i64>,
    /// Why, at most 255 characters, without NUL.
    #[schema(max_length = 255, example = "solicitud del cliente")]
    motivo: Option<String>,
}

/// The body of on-call's refund, `POST /admin/pagos/{id}/reembolsos` (documentation only,
/// as `ReembolsoRequest`): `motivo` is required.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(as = ReembolsoAdminRequest)]
#[serde(deny_unknown_fields)]
struct ReembolsoAdminRequest {
    /// Minor units, positive, at most what is left of the payment; absent or null:
    /// everything not yet refunded.
    #[schema(minimum = 1, maximum = 9007199254740991_i64, example = 50000)]
    monto: Option<i64>,
    /// Why on-call refunds, for the refund's audit trail: required, 1–255 characters, not
    /// only white space, without NUL (422 `motivo` otherwise).
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = r"\S",
        example = "cobro duplicado, ticket 4821"
    )]
    motivo: String,
}

/// A payment's refunds, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaReembolsos {
    pub reembolsos: Vec<Reembolso>,
}

fn not_found(what: &str) -> ApiError {
    problem(ProblemType::NotFound, format!("No {what} with this id."))
}

/// An answer with `Location` and, for replays, `Idempotent-Replayed`.
fn respond(refund_id: Uuid, answer: Answer, replayed: bool) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = answer.content_type();
    let mut response = (status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(location) = HeaderValue::from_str(&format!("{REFUNDS_PATH}/{refund_id}")) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// The key columns of a refund's row, read as a key row, so `idempotency::decide` says
/// what a request with this key gets, exactly as for payments.
fn key_row(r: &refund::Model) -> keys::Model {
    keys::Model {
        merchant_id: r.merchant_id,
        key: r.idempotency_key.clone(),
        fingerprint: r.fingerprint.clone(),
        payment_id: r.id,
        status: r.key_status,
        response_code: r.response_code,
        response_body: r.response_body.clone(),
        lease_until: r.lease_until,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

/// Everything a refund request carries, parsed; the refund itself, or why its body is
/// refused (a key already taken answers as its row says before that counts).
struct Asked {
    key: IdempotencyKey,
    value: Value,
    refund: Result<NewRefund, ApiError>,
}

fn parse(
    headers: &HeaderMap,
    json: Result<Json<Box<RawValue>>, JsonRejection>,
    reason_required: bool,
) -> Result<Asked, ApiError> {
    let Body(sent) = body(json)?;
    let key = idempotency_key(headers, "refund")?;
    // A member written twice or a NUL is refused with the fields (`pagos_types::body`).
    let Read { value, refused } =
        pagos_types::body::read(sent?.get()).map_err(|err| not_json(&err.to_string()))?;
    let refund = with_refused(NewRefund::from_json(&value, reason_required), refused)
        .map_err(validation_failed);
    Ok(Asked { key, value, refund })
}

/// Why the configured gateway cannot refund `monto` of the merchant's payment for its
/// precision (Mercado Pago refunds Colombian pesos in whole pesos only), as a payment's
/// `monto` is checked: refused before anything is stored, not sent to be refused with a
/// 400 and answered FALLIDO. The payment is read only where the gateway has such a rule.
async fn precision_refused(
    state: &AppState,
    merchant: Uuid,
    payment: Uuid,
    new_refund: &NewRefund,
) -> Result<Option<String>, ApiError> {
    let needs = state.settings.gateway.needs();
    let Some(amount) = new_refund.amount else {
        return Ok(None);
    };
    if !needs.steps_amounts() {
        return Ok(None);
    }
    let Some(p) = crate::saga::store::find_payment(&state.db, payment).await? else {
        return Ok(None);
    };
    if p.merchant_id != merchant {
        return Ok(None);
    }
    Ok(pagos_types::Currency::parse(&p.currency)
        .and_then(|currency| needs.amount_precision_error(amount, currency)))
}

/// Registers (or finds) the refund and answers as the contract says.
async fn begin_and_answer(
    state: &AppState,
    merchant: Uuid,
    scope: KeyScope,
    path: &str,
    payment: Uuid,
    asked: Asked,
    requested_by: String,
) -> Result<Response, ApiError> {
    let fingerprint = idempotency::fingerprint("POST", path, &asked.value);
    let key_hash = idempotency::key_hash(&asked.key);
    let new_refund = match asked.refund {
        Ok(new_refund) => match precision_refused(state, merchant, payment, &new_refund).await? {
            None => Ok(new_refund),
            Some(why) => Err(validation_failed(vec![super::extract::field_error(
                "monto", why,
            )])),
        },
        Err(refused) => Err(refused),
    };
    let new_refund = match new_refund {
        Ok(new_refund) => new_refund,
        // The body is refused; a key already taken still gets what its row says (a retry
        // written otherwise, `100.0` for `100`, or checked by a later version's rules):
        // only a new key's request is refused, and nothing is stored.
        Err(refused) => {
            return match store::find_key(&state.db, merchant, scope, asked.key.as_str()).await? {
                Some(existing) => answer_taken(state, existing, &fingerprint, &key_hash).await,
                None => Err(refused),
            };
        }
    };
    let registered = store::register(
        &state.db,
        Registration {
            merchant,
            scope,
            key: asked.key.as_str(),
            fingerprint: &fingerprint,
            payment,
            amount: new_refund.amount,
            reason: new_refund.reason.clone(),
            audit: None,
            requested_by,
            lease: state.settings.lease,
            payment_states: &[PaymentState::Completada],
            charge: None,
            charge_amount: None,
        },
    )
    .await?;
    match registered {
        Registered::NoPayment => Err(not_found("payment")),
        Registered::NotRefundable(estado) => Err(Problem::new(ProblemType::PaymentNotRefundable)
            .detail(format!(
                "The payment is {estado}: only a COMPLETADA payment with a charge at the gateway can be refunded."
            ))
            .with("estado", estado)
            .into()),
        Registered::ExceedsRemaining { remaining } => {
            Err(Problem::new(ProblemType::RefundExceedsRemaining)
                .detail(format!(
                    "At most {remaining} is left to refund (the payment's monto less its refunds COMPLETADO, ENVIADO, EN_PROCESO and REVISION_MANUAL); nothing was stored."
                ))
                .with("restante", remaining)
                .into())
        }
        Registered::Started(r) => {
            state.metrics.idempotency_outcome(Keyed::Refund, "new");
            tracing::info!(refund_id = %r.id, payment_id = %r.payment_id, %key_hash, "refund registered");
            crate::failpoint::hit("refund_after_register");
            let deps = state.saga_deps();
            // Tracked: on SIGTERM `serve` waits for it, as for a payment's saga.
            let settled = state
                .tasks
                .spawn(async move { refunds::send(&deps, *r, Actor::Request).await })
                .await
                .map_err(|e| ApiError::Internal(e.into()))?
                .map_err(|e| ApiError::Internal(e.into()))?;
            Ok(respond(settled.id, refund_answer(&settled), false))
        }
        Registered::Taken(existing) => answer_taken(state, *existing, &fingerprint, &key_hash).await,
    }
}

/// What a request with a key already taken gets: its frozen answer, 409 while the first
/// request works, 422 for another body, else the refund's current state. Counted and
/// logged as a payment's (`pagos_idempotency_requests_total{operation="refund"}`,
/// `pagos_replays_total`), with the same log lines: a merchant looping on a refund key
/// shows as one looping on a payment's. The lines also name the refund, its payment and
/// the key's scope, so on-call need not look the key up.
async fn answer_taken(
    state: &AppState,
    existing: refund::Model,
    fingerprint: &str,
    key_hash: &impl std::fmt::Display,
) -> Result<Response, ApiError> {
    let begun = idempotency::decide(&key_row(&existing), fingerprint, crate::db::now());
    state
        .metrics
        .idempotency_outcome(Keyed::Refund, begun.outcome());
    let (merchant, refund_id, payment_id, scope) = (
        existing.merchant_id,
        existing.id,
        existing.payment_id,
        existing.key_scope.as_str(),
    );
    match begun {
        Begin::Mismatch => {
            tracing::info!(operation = "refund", %merchant, %refund_id, %payment_id, scope, %key_hash, "key reused with another body");
            Err(problem(
                ProblemType::KeyReused,
                "This Idempotency-Key was already used with a different request. Use a new key for a new refund.",
            ))
        }
        Begin::Replay { answer, .. } => {
            // Refund answers are not cached: every replay is read from the database.
            state.metrics.replay(Keyed::Refund, "database");
            // DEBUG, as a payment's replay: it changes nothing and is counted.
            tracing::debug!(%refund_id, %key_hash, "replaying the stored refund answer");
            Ok(respond(refund_id, answer.into(), true))
        }
        Begin::InFlight { retry_after } => {
            tracing::info!(operation = "refund", %merchant, %refund_id, %payment_id, scope, %key_hash, "duplicate while the first request is in flight");
            let seconds = retry_after.as_secs_f64().ceil().clamp(1.0, 2.0) as u64;
            Err(Problem::new(ProblemType::RequestInFlight)
                .detail("The first request with this Idempotency-Key is still being processed. Retry after the time in Retry-After.")
                .retry_after(seconds)
                .into())
        }
        Begin::Unsettled { .. } | Begin::Started(_) => {
            answer_current(state, existing, &key_hash.to_string()).await
        }
    }
}

/// A retry of a refund nobody is working on: settle it first if it is due, then answer
/// its state (202 with `Retry-After` while it is not final).
async fn answer_current(
    state: &AppState,
    mut current: refund::Model,
    key_hash: &str,
) -> Result<Response, ApiError> {
    let id = current.id;
    // Under review, on-call decides: nothing to settle.
    if current.next_attempt_at <= crate::db::now()
        && !current.state.is_terminal()
        && current.state != RefundState::RevisionManual
    {
        tracing::info!(refund_id = %id, key_hash, "client retry found the refund due; reconciling it now");
        let deps = state.saga_deps();
        let limits = state.reconciler.refund_limits();
        state
            .tasks
            .spawn(async move {
                crate::saga::refund::reconcile::reconcile_one(&deps, &limits, id, true).await
            })
            .await
            .map_err(|e| ApiError::Internal(e.into()))??;
        current = store::find(&state.db, id)
            .await?
            .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("refund {id} vanished")))?;
    }
    let mut response = respond(id, refund_answer(&current), true);
    if response.status() == StatusCode::ACCEPTED {
        let seconds = super::payments::retry_after(
            current.next_attempt_at,
            current.state == RefundState::RevisionManual,
        );
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    Ok(response)
}

/// Refund part or all of a `COMPLETADA` payment, safe to retry with the same
/// `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/v1/pagos/{id}/reembolsos",
    tag = "reembolsos",
    security(("api_key" = [])),
    params(
        ("id" = Uuid, Path, description = "The payment to refund"),
        ("Idempotency-Key" = String, Header,
         description = "One key per refund intent, sent again on every retry. Refund keys are a key space of their own: the key of a payment names nothing here.")
    ),
    request_body(content = ReembolsoRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Refunded (COMPLETADO)", body = Reembolso,
         headers(("Location" = String, description = "`/v1/reembolsos/{id}`"), ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 202, description = "Outcome not known yet (the gateway timed out, kept failing, or answered about another refund) or pending at the gateway (ENVIADO; REVISION_MANUAL on a retry); the reconciler settles it. A retry with the same key answers the refund as it stands", body = Reembolso,
         headers(
             ("Location" = String, description = "`/v1/reembolsos/{id}`"),
             ("Idempotent-Replayed" = String, description = "`true` on a retry with the same key"),
             ("Retry-After" = u64, description = "On a retry with the same key: seconds until pagos looks at the refund again")
         )),
        (status = 400, description = "Idempotency-Key missing (`idempotency-key-missing`) or malformed (`idempotency-key-malformed`), or body not JSON (`malformed-json`)", body = Problem, content_type = "application/problem+json"),
        ApiKeyRefused,
        NoSuchPayment,
        (status = 409, description = "The payment is not COMPLETADA (`payment-not-refundable`, its state in `estado`), or the first request with this key is still in progress (`request-in-flight`, with Retry-After)", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "`request-in-flight`: seconds to wait before retrying with the same key"))),
        BodyTooLarge,
        NotJson,
        (status = 422, description = "The gateway refused the refund (`refund-refused`: FALLIDO under `reembolso`, the gateway's code in `failureCode`; with Location, and Idempotent-Replayed on a replay), `monto` over what is left (`refund-exceeds-remaining`, with `restante`), validation failed (`validation-failed`, `errores`), or the key was used with another body (`idempotency-key-reused`)", body = Problem, content_type = "application/problem+json",
         headers(
             ("Location" = String, description = "`refund-refused`: `/v1/reembolsos/{id}`"),
             ("Idempotent-Replayed" = String, description = "`refund-refused`: `true` on a replay")
         )),
        TooManyFailedAuthentications,
        RetryWithSameKey,
    )
)]
async fn create_refund(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
    headers: HeaderMap,
    json: Result<Json<Box<RawValue>>, JsonRejection>,
) -> Result<Response, ApiError> {
    let asked = parse(&headers, json, false)?;
    let payment = Uuid::parse_str(&id).map_err(|_| not_found("payment"))?;
    let path = format!("/v1/pagos/{payment}/reembolsos");
    begin_and_answer(
        &state,
        merchant,
        KeyScope::Merchant,
        &path,
        payment,
        asked,
        "merchant".to_owned(),
    )
    .await
}

/// A refund of the caller's.
#[utoipa::path(
    get,
    path = "/v1/reembolsos/{id}",
    tag = "reembolsos",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The refund id")),
    responses(
        (status = 200, description = "The refund", body = Reembolso),
        ApiKeyRefused,
        (status = 404, description = "No such refund for this merchant", body = Problem, content_type = "application/problem+json"),
        TooManyFailedAuthentications,
    )
)]
async fn get_refund(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<Json<Reembolso>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| not_found("refund"))?;
    let found = store::find_for_merchant(&state.db, merchant, id)
        .await?
        .ok_or_else(|| not_found("refund"))?;
    Ok(Json(reembolso(&found)))
}

/// A payment's refunds, oldest first.
#[utoipa::path(
    get,
    path = "/v1/pagos/{id}/reembolsos",
    tag = "reembolsos",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The payment id")),
    responses(
        (status = 200, description = "The payment's refunds, oldest first", body = ListaReembolsos),
        ApiKeyRefused,
        NoSuchPayment,
        TooManyFailedAuthentications,
    )
)]
async fn list_refunds(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<Json<ListaReembolsos>, ApiError> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let id = Uuid::parse_str(&id).map_err(|_| not_found("payment"))?;
    crate::entities::payment::Entity::find_by_id(id)
        .filter(crate::entities::payment::Column::MerchantId.eq(merchant))
        .one(&state.db)
        .await?
        .ok_or_else(|| not_found("payment"))?;
    let rows = store::of_payment(&state.db, id).await?;
    Ok(Json(ListaReembolsos {
        reembolsos: rows.iter().map(reembolso).collect(),
    }))
}

/// On-call refunds part or all of a `COMPLETADA` payment; `motivo` is required and goes
/// to the refund's audit trail with who asked.
#[utoipa::path(
    post,
    path = "/admin/pagos/{id}/reembolsos",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("id" = Uuid, Path, description = "The payment to refund"),
        ("Idempotency-Key" = String, Header, description = "One key per refund intent; on-call's keys are a key space of their own")
    ),
    request_body(content = ReembolsoAdminRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Refunded (COMPLETADO). Who asked, what, and what came of it (a refusal, a replay too) is recorded (`GET /admin/acciones`, `refund_payment`)", body = Reembolso,
         headers(("Location" = String, description = "`/v1/reembolsos/{id}`"), ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 202, description = "Outcome not known yet (ENVIADO; REVISION_MANUAL on a retry); the reconciler settles it. A retry with the same key answers the refund as it stands", body = Reembolso,
         headers(
             ("Location" = String, description = "`/v1/reembolsos/{id}`"),
             ("Idempotent-Replayed" = String, description = "`true` on a retry with the same key"),
             ("Retry-After" = u64, description = "On a retry with the same key: seconds until pagos looks at the refund again")
         )),
        (status = 400, description = "Idempotency-Key missing (`idempotency-key-missing`) or malformed (`idempotency-key-malformed`), or body not JSON (`malformed-json`); nothing was done", body = Problem, content_type = "application/problem+json"),
        AdminTokenRefused,
        ReadOnlyRole,
        PaymentNotFound,
        (status = 409, description = "Not COMPLETADA (`payment-not-refundable`, its state in `estado`), or the first request with this key is in progress (`request-in-flight`, with Retry-After)", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "`request-in-flight`: seconds to wait before retrying with the same key"))),
        BodyTooLarge,
        NotJson,
        (status = 422, description = "Refused by the gateway (`refund-refused`: FALLIDO under `reembolso`, with Location, and Idempotent-Replayed on a replay), over what is left (`refund-exceeds-remaining`, with `restante`), `motivo` missing or another field at fault (`validation-failed`, `errores`), or the key used with another body (`idempotency-key-reused`)", body = Problem, content_type = "application/problem+json",
         headers(
             ("Location" = String, description = "`refund-refused`: `/v1/reembolsos/{id}`"),
             ("Idempotent-Replayed" = String, description = "`refund-refused`: `true` on a replay")
         )),
        TooManyFailedAuthentications,
        (status = 503, description = "Who asked could not be recorded (`GET /admin/acciones`), so nothing was done: send it again with the same key after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying; absent on `request-timeout`"))),
    )
)]
async fn admin_refund(
    State(state): State<AppState>,
    admin: Admin,
    PathId(id): PathId,
    headers: HeaderMap,
    json: Result<Json<Box<RawValue>>, JsonRejection>,
) -> Result<Response, ApiError> {
    admin.may_act()?;
    let asked = parse(&headers, json, true)?;
    let payment = Uuid::parse_str(&id).map_err(|_| not_found("payment"))?;
    refund_asked_by_on_call(&state, &admin, payment, asked).await
}

/// On-call refunds from the console: the admin API's own way, with the key the form was
/// rendered with (a form sent twice is one refund). `monto` absent: all that is left.
pub async fn refund_by_hand(
    state: &AppState,
    who: &Admin,
    payment: Uuid,
    key: &str,
    monto: Option<i64>,
    motivo: &str,
) -> Result<Response, ApiError> {
    who.may_act()?;
    let key = IdempotencyKey::parse(key.as_bytes()).map_err(|e| {
        problem(
            ProblemType::MalformedKey,
            format!("{e}. Load the page again and resend the form."),
        )
    })?;
    let mut value = serde_json::json!({ "motivo": motivo });
    if let Some(monto) = monto {
        value["monto"] = monto.into();
    }
    let refund = NewRefund::from_json(&value, true).map_err(validation_failed);
    let asked = Asked { key, value, refund };
    refund_asked_by_on_call(state, who, payment, asked).await
}

/// On-call's refund (the admin API's and the console's one way), recorded with who asked
/// (`actions::audited`, `refund_payment` on the payment): the row is written before the
/// refund is registered (none written: 503, nothing done) and completed with the refund
/// and its state, with a replay's (the same key again: nothing new refunded), or with why
/// it was refused. No payment with this id: a 404, no row.
async fn refund_asked_by_on_call(
    state: &AppState,
    who: &Admin,
    payment: Uuid,
    asked: Asked,
) -> Result<Response, ApiError> {
    who.may_act()?;
    tracing::info!(operator = %who.name, payment_id = %payment, "refund asked by on-call");
    let Some(found) = crate::saga::store::find_payment(&state.db, payment).await? else {
        return Err(not_found("payment"));
    };
    let recorded = super::actions::Asked {
        action: Action::RefundPayment,
        target: Some(payment),
        what: asked_in_words(&asked.value, &found),
    };
    let path = format!("/admin/pagos/{payment}/reembolsos");
    let (task_state, name, merchant) = (state.clone(), who.name.clone(), found.merchant_id);
    let work = async move {
        let response = begin_and_answer(
            &task_state,
            merchant,
            KeyScope::Admin,
            &path,
            payment,
            asked,
            name,
        )
        .await?;
        let words = refund_in_words(&task_state, response.status(), response.headers()).await;
        Ok::<_, ApiError>(Refunded { response, words })
    };
    let done =
        super::actions::audited(state, who, recorded, work, |r: &Refunded| r.words.clone()).await?;
    Ok(done.response)
}

/// What on-call asked of a refund, for its audit row: `refund 5000 COP: <motivo>`, or all
/// that is left of the payment.
fn asked_in_words(value: &Value, payment: &crate::entities::payment::Model) -> String {
    let how_much = match value.get("monto") {
        None | Some(Value::Null) => format!(
            "all that is left of {} {}",
            payment.amount, payment.currency
        ),
        Some(monto) => match monto.as_i64() {
            Some(n) => format!("{n} {}", payment.currency),
            None => format!(
                "monto {} ({})",
                super::actions::said(&monto.to_string()),
                payment.currency
            ),
        },
    };
    let motivo = match value.get("motivo").and_then(Value::as_str) {
        Some(motivo) => super::actions::said(motivo),
        None => "(no motivo)".to_owned(),
    };
    format!("refund {how_much}: {motivo}")
}

/// An on-call refund's answer, and what came of it in words.
struct Refunded {
    response: Response,
    words: String,
}

/// What came of an on-call refund, for its audit row, from its answer: the refund and its
/// state; an answer replayed (the same key again) says nothing new was refunded.
async fn refund_in_words(state: &AppState, status: StatusCode, headers: &HeaderMap) -> String {
    let status = status.as_u16();
    let refund_id = headers
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .and_then(|l| l.rsplit('/').next())
        .and_then(|id| Uuid::parse_str(id).ok());
    let replayed = headers.contains_key("idempotent-replayed");
    let Some(id) = refund_id else {
        return format!("answered {status}");
    };
    let refund = match store::find(&state.db, id).await {
        Ok(Some(refund)) => refund,
        _ => return format!("refund {id}, answered {status}"),
    };
    let mut words = if replayed {
        format!(
            "nothing new was refunded: the same Idempotency-Key as refund {id} ({} {}), which is {}",
            refund.amount, refund.currency, refund.state
        )
    } else {
        format!(
            "refund {id} of {} {}: {}",
            refund.amount, refund.currency, refund.state
        )
    };
    if refund.state == RefundState::Fallido {
        let code = refund.failure_code.as_deref().unwrap_or("failed");
        words.push_str(&format!(
            " (the gateway did not refund: {code}; no money went back)"
        ));
    }
    words
}
