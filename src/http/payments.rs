//! The merchant API: `POST /v1/pagos` (idempotent) and `GET /v1/pagos/{id}`.
//!
//! A request rejected before any work (401, 413, 415, 400, validation 422) stores nothing.
//! The saga runs in its own task: a client that hangs up never cancels a payment halfway.

use super::AppState;
use super::auth::{ApiKeyRefused, Merchant, TooManyFailedAuthentications};
use super::extract::PathId;
use super::problem::{
    ApiError, BodyTooLarge, NoSuchPayment, NotJson, Problem, ProblemType, RetryWithSameKey,
};
use crate::domain::{FieldError, NewPayment};
use crate::entities::payment;
use crate::idempotency::{self, Begin, IdempotencyKey, KeyError};
use crate::metrics::Keyed;
use crate::representation::{Answer, Pago, answer};
use crate::saga::state::PaymentState;
use crate::saga::store::{Actor, When};
use crate::saga::{self};
use axum::Json;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pagos_types::body::Read;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::value::RawValue;
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub const MAX_BODY: usize = 64 * 1024;
pub const PAYMENTS_PATH: &str = "/v1/pagos";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_payment))
        .routes(routes!(get_payment))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

/// The body of `POST /v1/pagos` (documentation only: the handler parses JSON itself to
/// report every bad field at once). A member it does not know is refused (422).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(as = PagoRequest)]
#[serde(deny_unknown_fields)]
struct PagoRequest {
    /// The credit this payment pays: 1–64 characters, not only white space, no control
    /// characters.
    #[schema(
        rename = "creditoId",
        min_length = 1,
        max_length = 64,
        pattern = r"\S",
        example = "42"
    )]
    credito_id: String,
    /// Positive whole number of minor units of `moneda`; at most 2^53 − 1, at most
    /// `PAGOS_MAX_MONTO`, and at most the gateway's maximum for the currency (422 listing
    /// `monto` above the lowest of them).
    #[schema(minimum = 1, maximum = 9007199254740991_i64, example = 250000)]
    monto: i64,
    moneda: Moneda,
    /// At most 255 characters, without NUL.
    #[schema(max_length = 255)]
    descripcion: Option<String>,
    /// How the payer pays; absent or null with the sandbox and the reference protocol,
    /// required by the Stripe and Mercado Pago gateways (422 listing `medioPago` without
    /// it). Stripe: a saved PaymentMethod, `"pm_…"` or `{"id":"pm_…","cliente":"cus_…"}`.
    /// Mercado Pago: `{"id":"visa","token":"…","cuotas":1,"email":"payer@example.com",
    /// "documento":{"tipo":"CC","numero":"…"}}` (`token`, `cuotas`, `emisor` for cards;
    /// `documento` when the method needs it).
    #[schema(rename = "medioPago")]
    medio_pago: Option<MedioPagoRequest>,
}

/// `moneda` of a payment request: the ISO 4217 code of a currency pagos supports
/// (`pagos_types::request::CURRENCIES`; documentation only). Mercado Pago charges in
/// fewer (422 listing `moneda`).
struct Moneda;

impl utoipa::PartialSchema for Moneda {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "ISO 4217 code of a currency pagos supports; Mercado Pago charges in ARS, BRL, CLP, COP, MXN, PEN and UYU only",
            ))
            .enum_values(Some(crate::domain::CURRENCIES.iter().map(|(code, _)| *code)))
            .examples(["COP"])
            .into()
    }
}

impl utoipa::ToSchema for Moneda {
    fn name() -> std::borrow::Cow<'static, str> {
        "Moneda".into()
    }
}

/// `medioPago` of a payment request: a payment method id (the same as `{"id": …}`), or an
/// object (documentation only: `pagos_types::request::PaymentMethod` reads it).
#[derive(utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum MedioPagoRequest {
    Id(IdMedioPago),
    Objeto(MedioPagoObjeto),
}

/// A gateway's payment method id: Stripe's saved PaymentMethod (`pm_…`), Mercado Pago's
/// `payment_method_id` (`visa`, `master`, `efecty`, `pix`, …). 1–255 ASCII letters,
/// digits, `_`, `-` or `.`.
#[derive(utoipa::ToSchema)]
#[schema(
    pattern = "^[A-Za-z0-9_.-]{1,255}$",
    min_length = 1,
    max_length = 255,
    example = "pm_1Q0PsIJvEtkwdCNYMSaVuRz6"
)]
#[allow(dead_code)]
struct IdMedioPago(String);

/// `medioPago` as an object: `id`, and what the configured gateway uses (a member it does
/// not use is a 422; a member pagos does not know too).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct MedioPagoObjeto {
    id: IdMedioPago,
    /// Stripe: the Customer (`cus_…`) the saved method is attached to.
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,255}$")]
    cliente: Option<String>,
    /// Mercado Pago: the card token made by Mercado Pago's JS SDK (cards only).
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,255}$")]
    token: Option<String>,
    /// Mercado Pago: installments of a card payment (with `token` only).
    #[schema(minimum = 1, maximum = 48)]
    cuotas: Option<u32>,
    /// Mercado Pago: the card issuer, `issuer_id` (with `token` only).
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    emisor: Option<String>,
    /// Mercado Pago (required there): the payer's e-mail, at most 254 characters.
    #[schema(max_length = 254, example = "payer@example.com")]
    email: Option<String>,
    /// Mercado Pago: the payer's identification document, when the method needs it.
    documento: Option<DocumentoPagador>,
}

/// A payer's identification document (`{"tipo":"CC","numero":"1020304050"}`).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct DocumentoPagador {
    /// `CC`, `CE`, `NIT` (Colombia), `CPF` (Brazil), `DNI` (Argentina), …
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,20}$", example = "CC")]
    tipo: String,
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,30}$", example = "1020304050")]
    numero: String,
}

pub(super) fn problem(kind: ProblemType, detail: impl Into<String>) -> ApiError {
    Problem::new(kind).detail(detail).into()
}

/// The body as JSON, read by axum's `Json` under `DefaultBodyLimit` (`MAX_BODY`). Its
/// rejections become the contract's problems: a content type that is not JSON (`json` or
/// `+json`) 415, a body over the limit 413, anything else that is not JSON 400. A body
/// that is not JSON is reported after the key (a request with neither gets the key's 400),
/// so the answer is the same as when the body was read by hand.
pub(super) struct Body<T>(pub(super) Result<T, ApiError>);

pub(super) fn body<T>(extracted: Result<Json<T>, JsonRejection>) -> Result<Body<T>, ApiError> {
    match extracted {
        Ok(Json(value)) => Ok(Body(Ok(value))),
        Err(JsonRejection::MissingJsonContentType(_)) => Err(problem(
            ProblemType::UnsupportedMediaType,
            "Send the body as `Content-Type: application/json`.",
        )),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(problem(
            ProblemType::BodyTooLarge,
            format!("The body must be at most {MAX_BODY} bytes."),
        )),
        Err(JsonRejection::BytesRejection(_)) => Err(problem(
            ProblemType::MalformedJson,
            "The body could not be read.",
        )),
        Err(rejection) => {
            // The parser's own words (line and column), without axum's prefix.
            let text = rejection.body_text();
            let reason = text.rsplit_once(": ").map_or(text.as_str(), |(_, r)| r);
            Ok(Body(Err(not_json(reason))))
        }
    }
}

/// 400 for a body that is not JSON, in the parser's own words.
pub(super) fn not_json(reason: &str) -> ApiError {
    problem(
        ProblemType::MalformedJson,
        format!("The body is not valid JSON: {reason}."),
    )
}

/// The request's `Idempotency-Key`: 400 when it is missing, repeated or malformed, telling
/// to send one key per `intent` (`payment`, `refund`) on every retry of it.
pub(super) fn idempotency_key(
    headers: &HeaderMap,
    intent: &str,
) -> Result<IdempotencyKey, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let parsed = match (values.next(), values.next()) {
        (None, _) => Err(KeyError::Missing),
        (Some(_), Some(_)) => Err(KeyError::Repeated),
        (Some(value), None) => IdempotencyKey::parse(value.as_bytes()),
    };
    parsed.map_err(|err| {
        let kind = if err == KeyError::Missing {
            ProblemType::MissingKey
        } else {
            ProblemType::MalformedKey
        };
        problem(
            kind,
            format!(
                "{err}. Generate one key (a UUID v4) per {intent} and send it on every retry of that {intent}."
            ),
        )
    })
}

/// `parsed`, refused with the body's own faults (`refused`, listed first) when it has any.
pub(super) fn with_refused<T>(
    parsed: Result<T, Vec<FieldError>>,
    mut refused: Vec<FieldError>,
) -> Result<T, Vec<FieldError>> {
    match parsed {
        Ok(parsed) if refused.is_empty() => Ok(parsed),
        Ok(_) => Err(refused),
        Err(errors) => {
            refused.extend(errors);
            Err(refused)
        }
    }
}

/// How long a retry of a payment or refund not settled yet (a `202`) should wait: until
/// pagos looks at it next (asking sooner only gets the same answer), 1 s to an hour. One
/// under review waits for on-call, not for pagos, which never asks about it again: its
/// `next_attempt_at` is long past and would say 1 s to every retry until on-call acts.
pub(super) fn retry_after(
    next_attempt_at: chrono::DateTime<chrono::Utc>,
    under_review: bool,
) -> i64 {
    if under_review {
        return UNDER_REVIEW_RETRY_AFTER;
    }
    (next_attempt_at - crate::db::now())
        .num_seconds()
        .clamp(1, 3600)
}

/// `Retry-After` of a payment or refund in REVISION_MANUAL: five minutes (the `pago.*` and
/// `reembolso.*` events say at once when on-call settles it).
pub(super) const UNDER_REVIEW_RETRY_AFTER: i64 = 300;

pub(super) fn validation_failed(errors: Vec<FieldError>) -> ApiError {
    Problem::new(ProblemType::Validation)
        .detail("Correct the fields listed in `errores` and send the request again; nothing was stored.")
        .with("errores", errors)
        .into()
}

/// An answer to `POST /v1/pagos`, with `Location` and, for replays, `Idempotent-Replayed`.
fn respond(payment_id: Uuid, answer: Answer, replayed: bool) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = answer.content_type();
    let mut response = (status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Written without `format!`: every replay answers with it.
    let mut location = String::with_capacity(PAYMENTS_PATH.len() + 37);
    location.push_str(PAYMENTS_PATH);
    location.push('/');
    location.push_str(
        payment_id
            .hyphenated()
            .encode_lower(&mut Uuid::encode_buffer()),
    );
    if let Ok(location) = HeaderValue::try_from(location) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// What a request whose body the replay cache did not recognise by its bytes gets:
/// `sent` parsed, then a replay from memory if its fingerprint is the frozen one's, else
/// what the database says (a new key registered, a taken key's answer).
async fn begin(
    state: &AppState,
    merchant: Uuid,
    key: &IdempotencyKey,
    sent: &str,
) -> Result<Begin, ApiError> {
    // Valid JSON already (the raw value was read by the same parser); read again into a
    // value, which may still be refused for its nesting. A member written twice or a NUL
    // is refused with the fields (`pagos_types::body`).
    let Read { value, refused } =
        pagos_types::body::read(sent).map_err(|err| not_json(&err.to_string()))?;
    let request = idempotency::fingerprint::Fingerprinted::new("POST", PAYMENTS_PATH, &value, sent);
    if let Some(begun) = saga::registry::remembered(&state.replay_cache, merchant, key, &request) {
        return Ok(begun);
    }
    // What the configured gateway needs is checked here, before anything is stored.
    let parsed = NewPayment::from_json_for(
        &value,
        state.settings.gateway.needs(),
        state.settings.max_amount,
    );
    let parsed = match parsed {
        // A body refused for its own faults (a member written twice) is answered so: no
        // need of the account's currency, nor of a 503 while it is not known.
        Ok(new_payment) if !refused.is_empty() => Ok(new_payment),
        Ok(new_payment) => match in_the_accounts_currency(state, &new_payment).await {
            Ok(None) => Ok(new_payment),
            Ok(Some(refused)) => Err(vec![refused]),
            // Not known now: a key already taken still answers as its row says.
            Err(why) => {
                if let Some(begun) =
                    saga::registry::taken(&state.db, &state.replay_cache, merchant, key, &request)
                        .await?
                {
                    return Ok(begun);
                }
                tracing::warn!(%merchant, error = %why, "the gateway's account currency is not known: payment refused with 503");
                return Err(Problem::new(ProblemType::Unavailable)
                    .detail("The gateway did not say which currency its account charges in; nothing was stored. Send the request again.")
                    .retry_after(5)
                    .into());
            }
        },
        Err(errors) => Err(errors),
    };
    match with_refused(parsed, refused) {
        Ok(new_payment) => Ok(saga::registry::begin(
            &state.db,
            &state.replay_cache,
            merchant,
            key,
            &request,
            &new_payment,
            state.settings.lease,
        )
        .await?),
        // Today's settings refuse the body; a key already taken still answers as its row
        // says (a retry of a payment made under other settings, or written otherwise):
        // only a new key's request is refused, and nothing is stored.
        Err(errors) => {
            match saga::registry::taken(&state.db, &state.replay_cache, merchant, key, &request)
                .await?
            {
                Some(begun) => Ok(begun),
                None => {
                    let campos: Vec<&str> = errors.iter().map(|e| e.campo.as_str()).collect();
                    tracing::info!(%merchant, ?campos, "payment request failed validation");
                    Err(validation_failed(errors))
                }
            }
        }
    }
}

/// The field error of a payment in another currency than the gateway's account charges
/// in (Mercado Pago: the amount would be charged in the account's currency, 250000 CLP as
/// 250000 COP); None when it is the account's, or each request names its own. Err: the
/// gateway could not say.
async fn in_the_accounts_currency(
    state: &AppState,
    payment: &NewPayment,
) -> Result<Option<FieldError>, crate::gateway::GatewayError> {
    let Some(account) = state.gateway.account_currency().await? else {
        return Ok(None);
    };
    let asked = payment.currency.code();
    Ok((asked != account).then(|| FieldError {
        campo: "moneda".into(),
        detalle: format!(
            "this Mercado Pago account charges in {account}; a payment in {asked} would be charged its amount in {account}"
        ),
    }))
}

/// Make a payment, safe to retry with the same `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/v1/pagos",
    tag = "pagos",
    security(("api_key" = [])),
    params(
        ("Idempotency-Key" = String, Header,
         description = "One key per payment intent (a UUID v4 is best), sent again on every retry. 1–255 visible ASCII characters; the quoted sf-string form (without parameters) is the same key, and a value beginning with a quote that is not that form is refused (400).")
    ),
    request_body(content = PagoRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Charged (COMPLETADA)", body = Pago,
         headers(("Location" = String, description = "`/v1/pagos/{id}`"), ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 202, description = "Outcome not known yet (ENVIADA, or REVISION_MANUAL on a retry): the gateway timed out, kept failing, or answered about another payment's charge; the reconciler settles it. A retry with the same key answers the payment as it stands", body = Pago,
         headers(
             ("Location" = String, description = "`/v1/pagos/{id}`"),
             ("Idempotent-Replayed" = String, description = "`true` on a retry with the same key"),
             ("Retry-After" = u64, description = "On a retry with the same key: seconds until pagos looks at the payment again (asking sooner gets the same answer)")
         )),
        (status = 400, description = "Idempotency-Key missing (`idempotency-key-missing`) or malformed (`idempotency-key-malformed`), or body not JSON (`malformed-json`)", body = Problem, content_type = "application/problem+json"),
        ApiKeyRefused,
        (status = 402, description = "Declined (`payment-declined`, or `gateway-rejected` for a charge the gateway refused outright): FALLIDA, the payment under `pago`, the gateway's code in `declineCode`", body = Problem, content_type = "application/problem+json",
         headers(("Location" = String, description = "`/v1/pagos/{id}`"), ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 409, description = "The first request with this key is still in progress (`request-in-flight`)", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying with the same key"))),
        BodyTooLarge,
        NotJson,
        (status = 422, description = "Validation failed (`validation-failed`, every field at fault in `errores`) or the key was used with another body (`idempotency-key-reused`)", body = Problem, content_type = "application/problem+json"),
        TooManyFailedAuthentications,
        RetryWithSameKey,
    )
)]
async fn create_payment(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    headers: HeaderMap,
    json: Result<Json<Box<RawValue>>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Body(sent) = body(json)?;
    let key = idempotency_key(&headers, "payment")?;
    let sent = sent?;
    // A replay from memory first, by the bytes sent, before the body is parsed: a client
    // retrying sends what it sent. Without a future either: the paths below are boxed, so
    // this handler's future stays small. Its size is copied whole each time the request
    // passes a layer, and with the database's futures inline that copying was about a
    // seventh of a replay's instructions.
    let begun =
        match saga::registry::remembered_as_sent(&state.replay_cache, merchant, &key, sent.get()) {
            Some(begun) => begun,
            None => Box::pin(begin(&state, merchant, &key, sent.get())).await?,
        };
    let key_hash = idempotency::key_hash(&key);
    state
        .metrics
        .idempotency_outcome(Keyed::Payment, begun.outcome());
    match begun {
        Begin::Started(p) => {
            tracing::info!(payment_id = %p.id, %key_hash, "payment registered");
            crate::failpoint::hit("after_register");
            let deps = state.saga_deps();
            // Its own task: axum drops this handler if the client hangs up; the saga
            // must still run to its end. Boxed where it is made: the saga's future is
            // large, and each move into the span and the task copied it whole.
            let saga = Box::pin(async move { saga::send(&deps, *p, Actor::Request).await });
            let settled = state
                .tasks
                .spawn(saga.in_current_span())
                .await
                .map_err(|e| ApiError::Internal(e.into()))?
                .map_err(|e| ApiError::Internal(e.into()))?;
            Ok(respond(settled.id, answer(&settled), false))
        }
        Begin::Replay {
            payment_id,
            answer,
            from_memory,
        } => {
            state.metrics.replay(
                Keyed::Payment,
                if from_memory { "memory" } else { "database" },
            );
            // DEBUG: a replay changes nothing and is counted in `pagos_replays_total`;
            // a line per replay cost more than the replay itself.
            tracing::debug!(%payment_id, %key_hash, from_memory, "replaying the stored answer");
            Ok(respond(payment_id, answer.into(), true))
        }
        Begin::Unsettled { payment_id } => {
            let find = || {
                Box::pin(async {
                    crate::saga::store::find_payment(&state.db, payment_id)
                        .await?
                        .ok_or_else(|| {
                            ApiError::Internal(anyhow::anyhow!(
                                "key points to a missing payment {payment_id}"
                            ))
                        })
                })
            };
            let mut current = find().await?;
            // Due (its request died, or its next look is now): settle it now rather than
            // make the client wait for the next pass. Only if due, and only the retry that
            // claims it: however often a client retries, the provider is asked about a
            // payment at most once per backoff step.
            let due = current.next_attempt_at <= crate::db::now();
            if due && current.state != PaymentState::RevisionManual {
                let reconciler = state.reconciler.clone();
                tracing::info!(%payment_id, %key_hash, "client retry found the payment due; reconciling it now");
                state
                    .tasks
                    .spawn(
                        async move {
                            saga::reconcile::reconcile_one(&reconciler, payment_id, When::IfDue)
                                .await
                        }
                        .in_current_span(),
                    )
                    .await
                    .map_err(|e| ApiError::Internal(e.into()))??;
                current = find().await?;
            }
            tracing::info!(%payment_id, %key_hash, estado = %current.state, "answering the current state");
            let mut response = respond(payment_id, answer(&current), true);
            if response.status() == StatusCode::ACCEPTED {
                let seconds = retry_after(
                    current.next_attempt_at,
                    current.state == PaymentState::RevisionManual,
                );
                if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
            }
            Ok(response)
        }
        Begin::InFlight { retry_after } => {
            tracing::info!(operation = "payment", %merchant, %key_hash, "duplicate while the first request is in flight");
            // The lease bounds how long the first request can take; most finish far
            // sooner, so suggest a short wait (a 409 costs one query).
            let seconds = retry_after.as_secs_f64().ceil().clamp(1.0, 2.0) as u64;
            Err(Problem::new(ProblemType::RequestInFlight)
                .detail("The first request with this Idempotency-Key is still being processed. Retry after the time in Retry-After.")
                .retry_after(seconds)
                .into())
        }
        Begin::Mismatch => {
            tracing::info!(operation = "payment", %merchant, %key_hash, "key reused with another body");
            Err(problem(
                ProblemType::KeyReused,
                "This Idempotency-Key was already used with a different request. Use a new key for a new payment.",
            ))
        }
    }
}

/// A payment of the caller's.
#[utoipa::path(
    get,
    path = "/v1/pagos/{id}",
    tag = "pagos",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The payment id")),
    responses(
        (status = 200, description = "The payment", body = Pago),
        ApiKeyRefused,
        NoSuchPayment,
        TooManyFailedAuthentications,
    )
)]
async fn get_payment(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    PathId(id): PathId,
) -> Result<Response, ApiError> {
    let not_found = || problem(ProblemType::NotFound, "No payment with this id.");
    let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
    let found = payment::Entity::find_by_id(id)
        .filter(payment::Column::MerchantId.eq(merchant))
        .one(&state.db)
        .await?
        .ok_or_else(not_found)?;
    let refunded = crate::saga::refund::store::refunded_amount(&state.db, found.id).await?;
    Ok(axum::Json(crate::representation::pago_with_refunds(&found, refunded)).into_response())
}
