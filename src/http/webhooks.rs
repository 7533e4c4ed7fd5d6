//! Gateway webhooks: `POST /v1/webhooks/http` (reference protocol), `/v1/webhooks/stripe`
//! and `/v1/webhooks/mercadopago`, and on-call's list of orphan charges
//! (`GET /admin/cargos-huerfanos`).
//!
//! The signature is checked over the raw bytes before anything is parsed, and nothing is
//! written for a request refused with 401, 400 or 413. Every event that is accepted —
//! applied, duplicate, stale, orphan — answers 200, so the gateway stops redelivering it;
//! only a failure to write (or, for Mercado Pago, to ask the payment's state) answers 503,
//! and the redelivery starts over from nothing.

use super::AppState;
use super::auth::{Admin, AdminTokenRefused, TooManyFailedAuthentications};
use super::problem::{ApiError, BodyTimeout, BodyTooLarge, Problem, ProblemType};
use crate::config::exposed;
use crate::domain::FieldError;
use crate::entities::webhook_charge;
use crate::webhooks::event::{GatewayEvent, Payload};
use crate::webhooks::mercadopago::{self as mp, Notification};
use crate::webhooks::signature::{self, SignatureError};
use crate::webhooks::stripe::{self as stripe_event, StripeEvent};
use crate::webhooks::{self, ChargeEvent, SOURCE_HTTP, SOURCE_MERCADOPAGO, SOURCE_STRIPE};
use axum::Json;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use chrono::SecondsFormat;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Gateway events are small; anything larger is not one.
pub const MAX_EVENT_BODY: usize = 64 * 1024;
pub const DEFAULT_LIMIT: u64 = 100;
pub const MAX_LIMIT: u64 = 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(receive_http_event))
        .routes(routes!(receive_stripe_event))
        .routes(routes!(receive_mercadopago_notification))
        .routes(routes!(list_orphan_charges))
        .layer(DefaultBodyLimit::max(MAX_EVENT_BODY))
}

/// The 200 of a gateway's webhook, as its OpenAPI operation documents it.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 200,
    description = "Accepted: applied, or already applied, stale, orphan or ignored. Stop delivering it."
)]
#[allow(dead_code)]
struct Accepted(Acuse);

/// The 503 of a gateway's webhook that could not be applied (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 503,
    description = "Could not be applied now; nothing was recorded. Deliver it again.",
    content_type = "application/problem+json",
    headers(("Retry-After" = u64))
)]
#[allow(dead_code)]
struct DeliverAgain(Problem);

/// The answer to an accepted event.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Acuse {
    /// What applying the event came to.
    #[schema(value_type = Resultado, example = "aplicado")]
    resultado: &'static str,
}

/// What an accepted event came to (documentation only: `Acuse::resultado` carries the
/// word, `webhooks::Consumed::as_str` and `webhooks::refunds::RefundConsumed::as_str`
/// name it).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum Resultado {
    /// The payment (or refund) moved: settled.
    Aplicado,
    /// The payment (or refund) moved to REVISION_MANUAL: on-call decides.
    RevisionManual,
    /// Already known: nothing to change.
    SinCambios,
    /// This event id was applied before.
    Duplicado,
    /// Older than an event already applied for its charge (refund).
    Obsoleto,
    /// No payment has this reference: kept as an orphan charge (`GET /admin/cargos-huerfanos`).
    Huerfano,
    /// A charge that succeeded for a payment answered FALLIDA: pagos refunds it in full
    /// (`PAGOS_ORPHAN_CHARGES=refund`); the payment stays FALLIDA.
    Reembolsando,
    /// A refund event whose reference names no refund of pagos (one made in the
    /// provider's dashboard): kept, nothing else changed.
    Desconocido,
    /// An event type pagos does not act on.
    Ignorado,
}

/// A gateway event (documentation only: the handler verifies the raw bytes first).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(as = EventoPasarela)]
struct EventoPasarela {
    /// Unique per event: a repeated id changes nothing.
    #[schema(example = "evt_1Q2w3E4r")]
    id: String,
    /// `charge.updated` (`data` is a charge) or `refund.updated` (`data` is a refund);
    /// other types are acknowledged (`ignorado`) and ignored.
    #[schema(rename = "type", example = "charge.updated")]
    kind: String,
    /// Increases with each change of one charge (refund): an event at or below the last
    /// one applied for its charge (refund) changes nothing.
    #[schema(minimum = 0, example = 2)]
    sequence: i64,
    /// The charge or the refund as it stands after the change: `charge.updated`, the
    /// charge as `POST /v1/charges` answers it (`id`, `status`, `amount`, `currency`,
    /// `reference`: the payment id, `declineCode`); `refund.updated`, the refund as
    /// `POST /v1/refunds` answers it (`id`, `status`: `succeeded`, `failed` or `pending`,
    /// `charge`, `amount`, `currency`, `reference`: the refund id, `failureCode`).
    #[schema(value_type = Object)]
    data: serde_json::Value,
}

fn unauthorized(detail: impl Into<String>) -> ApiError {
    Problem::new(ProblemType::Unauthorized)
        .detail(detail)
        .into()
}

/// The raw bytes the signature is checked over, read by axum under `DefaultBodyLimit`
/// (`MAX_EVENT_BODY`): a larger body is 413, one that could not be read 400.
fn raw(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(ProblemType::BodyTooLarge)
                .detail(format!("An event must be at most {MAX_EVENT_BODY} bytes."))
                .into()
        } else {
            Problem::new(ProblemType::MalformedJson)
                .detail("The body could not be read.")
                .into()
        }
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
        Accepted,
        (status = 400, description = "Signed, but not a gateway event; nothing was recorded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Signature missing, malformed, wrong or outside the 5-minute tolerance, or webhooks disabled (PAGOS_WEBHOOK_SECRET unset); nothing was recorded", body = Problem, content_type = "application/problem+json"),
        BodyTooLarge,
        BodyTimeout,
        DeliverAgain,
    )
)]
async fn receive_http_event(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = Signed::Reference.raw_body(&state, &headers, body)?;
    let event = GatewayEvent::parse(&raw).map_err(|err| {
        tracing::warn!(error = %err, "signed webhook is not a gateway event");
        malformed(&state, err)
    })?;
    let charge = match &event.payload {
        Payload::ChargeUpdated(charge) => charge,
        Payload::RefundUpdated(refund) => {
            return apply_refund(
                &state,
                webhooks::refunds::RefundEvent {
                    source: SOURCE_HTTP,
                    event_id: &event.id,
                    sequence: event.sequence,
                    refund,
                },
            )
            .await;
        }
        Payload::Other(kind) => {
            tracing::info!(event_id = event.id, kind, "event type ignored");
            return Ok(ignored(&state));
        }
    };
    apply(
        &state,
        ChargeEvent {
            source: SOURCE_HTTP,
            event_id: &event.id,
            sequence: event.sequence,
            charge,
            returned: None,
        },
    )
    .await
}

/// Applies an accepted event and answers it: 200 with what it came to, or 503 when it
/// could not be written (nothing was; the provider delivers it again).
async fn apply(state: &AppState, event: ChargeEvent<'_>) -> Result<Response, ApiError> {
    let consumed = webhooks::consume(&state.db, event, state.settings.orphan_charges).await;
    answer(state, consumed.map(|outcome| outcome.as_str()), |err| {
        tracing::error!(source = event.source, event_id = event.event_id, error = %err, "webhook could not be applied; the gateway will deliver it again");
    })
}

/// Applies an accepted refund event and answers it, as `apply` does a charge's.
async fn apply_refund(
    state: &AppState,
    event: webhooks::refunds::RefundEvent<'_>,
) -> Result<Response, ApiError> {
    let consumed = webhooks::refunds::consume(&state.db, event).await;
    answer(state, consumed.map(|outcome| outcome.as_str()), |err| {
        tracing::error!(source = event.source, event_id = event.event_id, error = %err, "refund webhook could not be applied; the gateway will deliver it again");
    })
}

/// The answer to an accepted event, counted: 200 with what applying it came to, or 503
/// when it could not be written (`failed` logs why).
fn answer<E>(
    state: &AppState,
    consumed: Result<&'static str, E>,
    failed: impl FnOnce(E),
) -> Result<Response, ApiError> {
    match consumed {
        Ok(outcome) => {
            state.metrics.webhook_event(outcome);
            Ok(acknowledge(outcome))
        }
        Err(err) => {
            state.metrics.webhook_event("error");
            failed(err);
            Err(unavailable(
                "The event could not be applied now; nothing was recorded. Deliver it again.",
            ))
        }
    }
}

fn unavailable(detail: &str) -> ApiError {
    Problem::new(ProblemType::Unavailable)
        .detail(detail)
        .retry_after(1)
        .into()
}

fn malformed(state: &AppState, err: impl std::fmt::Display) -> ApiError {
    state.metrics.webhook_event("malformed");
    Problem::new(ProblemType::MalformedJson)
        .detail(format!("{err}. Nothing was recorded."))
        .into()
}

fn ignored(state: &AppState) -> Response {
    state.metrics.webhook_event("ignorado");
    acknowledge("ignorado")
}

/// The providers that sign `t=<unix seconds>,v1=<hex HMAC-SHA256>` over
/// `"<t>.<raw body>"`: the reference protocol and Stripe.
#[derive(Clone, Copy)]
enum Signed {
    Reference,
    Stripe,
}

impl Signed {
    /// The raw body of a request signed by this provider: 401 while its secret is unset
    /// or when its signature header does not verify, 413 or 400 when the body cannot be
    /// read (the doors read it first, within `PAGOS_HEADER_TIMEOUT`: `http::unauthenticated`).
    fn raw_body(
        self,
        state: &AppState,
        headers: &HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Bytes, ApiError> {
        let (secret, env, header) = match self {
            Signed::Reference => (
                &state.settings.webhook_secret,
                "PAGOS_WEBHOOK_SECRET",
                signature::HEADER,
            ),
            Signed::Stripe => (
                &state.settings.stripe_webhook_secret,
                "PAGOS_STRIPE_WEBHOOK_SECRET",
                "stripe-signature",
            ),
        };
        let secret = secret_of(state, exposed(secret), env)?;
        self.of_this_gateway(state)?;
        let raw = raw(body)?;
        let values = headers.get_all(header).iter().map(|v| v.as_bytes());
        let verified = match self {
            Signed::Reference => {
                signature::verify_header(values, secret.as_bytes(), &raw, unix_now())
            }
            Signed::Stripe => {
                signature::verify_stripe_header(values, secret.as_bytes(), &raw, unix_now())
            }
        };
        if let Err(err) = verified {
            return Err(match self {
                // The reference protocol's own texts name its header.
                Signed::Reference => refuse_signature(
                    state,
                    err,
                    err.to_string(),
                    "Sign \"<t>.<raw body>\" with HMAC-SHA256 and the shared secret.",
                ),
                Signed::Stripe => refuse_signature(
                    state,
                    err,
                    signature_detail(err),
                    "Stripe signs \"<t>.<raw body>\" with the endpoint's signing secret (whsec_…).",
                ),
            });
        }
        Ok(raw)
    }
}

impl Signed {
    /// Refused (401, counted as a refused signature) unless this provider is the one the
    /// payments go through (checked once its secret is set): a reference-protocol secret left set on a Stripe deployment
    /// (or a Stripe one on another) let whoever holds it settle payments with events about
    /// charges the real provider never made — the merchant told paid, and no event of the
    /// real provider ever correcting it (its reports are kept under another source).
    fn of_this_gateway(self, state: &AppState) -> Result<(), ApiError> {
        use crate::config::GatewayKind;
        let gateway = state.settings.gateway;
        let (ours, name, path) = match self {
            Signed::Reference => (
                matches!(gateway, GatewayKind::Http | GatewayKind::Sandbox),
                "the reference protocol's",
                "/v1/webhooks/http",
            ),
            Signed::Stripe => (
                gateway == GatewayKind::Stripe,
                "Stripe's",
                "/v1/webhooks/stripe",
            ),
        };
        if ours {
            return Ok(());
        }
        tracing::warn!(endpoint = path, gateway = ?gateway, "webhook refused: not this deployment's gateway");
        state.metrics.webhook_event("refused_signature");
        Err(unauthorized(format!(
            "This pagos's payments go through {gateway:?} (PAGOS_GATEWAY): {name} events are not its provider's, and are refused at {path} whatever their signature."
        )))
    }
}

/// The secret of a webhook endpoint, or the 401 it answers while the secret is unset
/// (counted as `secret_unset`, beside the refused signatures: either way the provider's
/// events are not getting in).
fn secret_of<'a>(
    state: &AppState,
    secret: Option<&'a str>,
    env: &str,
) -> Result<&'a str, ApiError> {
    match secret.filter(|s| !s.is_empty()) {
        Some(secret) => Ok(secret),
        None => {
            tracing::warn!(setting = env, "webhook refused: its secret is not set");
            state.metrics.webhook_event("secret_unset");
            Err(unauthorized(format!(
                "Webhooks are disabled: {env} is not set."
            )))
        }
    }
}

/// A refused signature: logged and counted, answered 401 with `detail` and how to sign.
fn refuse_signature(state: &AppState, err: SignatureError, detail: String, how: &str) -> ApiError {
    // Never log the header or the body: they are an attacker's to choose.
    tracing::warn!(reason = %err, kind = signature_failure(err), "webhook signature refused");
    state.metrics.webhook_event(match err {
        SignatureError::OutsideTolerance => "refused_timestamp",
        _ => "refused_signature",
    });
    unauthorized(format!("{detail}. {how}"))
}

/// The refusal in words that name no particular header (the variants' own texts name
/// the reference protocol's).
fn signature_detail(err: SignatureError) -> String {
    match err {
        SignatureError::Missing => "The signature header is missing".into(),
        SignatureError::Repeated => "Send exactly one signature header".into(),
        SignatureError::Malformed(why) => format!("The signature header is malformed: {why}"),
        SignatureError::OutsideTolerance => {
            "The signature's timestamp is more than 5 minutes away from now".into()
        }
        SignatureError::Mismatch => "No signature matches this request".into(),
    }
}

/// Receive a Stripe event (`payment_intent.*`), delivered at least once, in any order.
#[utoipa::path(
    post,
    path = "/v1/webhooks/stripe",
    tag = "webhooks",
    params(
        ("Stripe-Signature" = String, Header,
         description = "`t=<unix seconds>,v1=<hex HMAC-SHA256(PAGOS_STRIPE_WEBHOOK_SECRET, \"<t>.<raw body>\")>`; other schemes (`v0`) ignored; `t` within 5 minutes of now.")
    ),
    request_body(content = Object, content_type = "application/json",
                 description = "A Stripe event (the endpoint on API version 2024-10-28.acacia). `payment_intent.succeeded`, `.payment_failed`, `.processing`, `.requires_action` and `.canceled` of PaymentIntents, and `refund.created`, `refund.updated`, `refund.failed` and `charge.refund.updated` of Refunds, with `metadata.pagos_reference`, are applied; so are `charge.dispute.created`, `.updated`, `.closed`, `.funds_withdrawn` and `.funds_reinstated` of Disputes, whose PaymentIntent is asked from Stripe; anything else is acknowledged and ignored."),
    responses(
        Accepted,
        (status = 400, description = "Signed, but not a Stripe event pagos can read; nothing was recorded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Signature missing, malformed, wrong or outside the 5-minute tolerance, or PAGOS_STRIPE_WEBHOOK_SECRET unset; nothing was recorded", body = Problem, content_type = "application/problem+json"),
        BodyTooLarge,
        BodyTimeout,
        DeliverAgain,
    )
)]
async fn receive_stripe_event(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = Signed::Stripe.raw_body(&state, &headers, body)?;
    // Refund events (`refund.*`, `charge.refund.updated`) carry a Refund, not a charge.
    match crate::gateway::stripe::refund_event(&raw) {
        Ok(Some(mut refund_event)) => {
            let id = refund_event.id.clone();
            if let Err(err) = webhooks::event::storable_refund(&id, &mut refund_event.refund) {
                tracing::warn!(error = %err, "signed webhook is a Stripe refund event pagos cannot store");
                return Err(malformed(&state, err));
            }
            return apply_refund(
                &state,
                webhooks::refunds::RefundEvent {
                    source: SOURCE_STRIPE,
                    event_id: &refund_event.id,
                    sequence: refund_event.sequence,
                    refund: &refund_event.refund,
                },
            )
            .await;
        }
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(error = %err, "signed webhook is a Stripe refund event pagos cannot read");
            return Err(malformed(&state, err));
        }
    }
    let event = StripeEvent::parse(&raw).map_err(|err| {
        tracing::warn!(error = %err, "signed webhook is not a Stripe event pagos can read");
        malformed(&state, err)
    })?;
    match &event.payload {
        stripe_event::Payload::Ignored(why) => {
            tracing::info!(
                event_id = event.id,
                kind = event.kind,
                why,
                "Stripe event ignored"
            );
            Ok(ignored(&state))
        }
        stripe_event::Payload::Dispute {
            dispute,
            payment_intent,
            status,
            withdrawn,
            created,
        } => {
            let charge = disputed(
                &state,
                &event.id,
                dispute,
                payment_intent,
                status,
                *withdrawn,
            )
            .await?;
            let Some(charge) = charge else {
                return Ok(ignored(&state));
            };
            apply(
                &state,
                ChargeEvent {
                    source: SOURCE_STRIPE,
                    event_id: &event.id,
                    sequence: stripe_event::sequence(charge.status, *created),
                    charge: &charge,
                    returned: None,
                },
            )
            .await
        }
        stripe_event::Payload::Charge { charge, sequence } => {
            apply(
                &state,
                ChargeEvent {
                    source: SOURCE_STRIPE,
                    event_id: &event.id,
                    sequence: *sequence,
                    charge,
                    returned: None,
                },
            )
            .await
        }
    }
}

/// The charge a Stripe dispute event reports, its PaymentIntent asked from Stripe (a
/// Dispute carries no pagos reference). None: not a PaymentIntent of pagos' (logged; the
/// event is acknowledged). Stripe could not be asked, or its answer cannot be read: 503,
/// nothing recorded, Stripe delivers the event again (for three days).
async fn disputed(
    state: &AppState,
    event_id: &str,
    dispute: &str,
    payment_intent: &str,
    status: &str,
    withdrawn: bool,
) -> Result<Option<crate::gateway::Charge>, ApiError> {
    let Some(client) = state.stripe.as_ref() else {
        tracing::error!(
            event_id,
            dispute,
            "a Stripe dispute event, but no Stripe client (PAGOS_GATEWAY is not stripe, or the client failed at start)"
        );
        return Err(unavailable(
            "Stripe could not be asked about the disputed payment now; nothing was recorded. Deliver it again.",
        ));
    };
    let pi = match client.fetch_intent(payment_intent).await {
        Ok(Some(pi)) if pi.reference().is_some() => pi,
        Ok(_) => {
            tracing::info!(
                event_id,
                dispute,
                payment_intent,
                "a dispute of a PaymentIntent pagos did not make; ignored"
            );
            return Ok(None);
        }
        Err(err) => {
            state.metrics.webhook_event("error");
            tracing::warn!(event_id, dispute, payment_intent, error = %err, "could not ask Stripe about a disputed PaymentIntent; it will deliver the event again");
            return Err(unavailable(
                "Stripe could not be asked about the disputed payment now; nothing was recorded. Deliver it again.",
            ));
        }
    };
    let read = stripe_event::disputed_charge(&pi, status, withdrawn)
        .and_then(crate::gateway::storable::charge)
        .map_err(|err| err.to_string())
        .and_then(|mut charge| {
            webhooks::event::reference("metadata.pagos_reference", &mut charge.reference)
                .map(|()| charge)
                .map_err(|err| err.to_string())
        });
    match read {
        Ok(charge) => {
            tracing::warn!(
                event_id,
                dispute,
                payment_intent,
                status,
                withdrawn,
                "Stripe dispute of a pagos payment"
            );
            Ok(Some(charge))
        }
        Err(err) => {
            state.metrics.webhook_event("error");
            tracing::error!(event_id, dispute, payment_intent, error = %err, "disputed PaymentIntent pagos cannot read");
            Err(unavailable(
                "The disputed payment's state could not be read; nothing was recorded. Deliver it again.",
            ))
        }
    }
}

/// Receive a Mercado Pago notification; the payment's state is asked from Mercado Pago.
#[utoipa::path(
    post,
    path = "/v1/webhooks/mercadopago",
    tag = "webhooks",
    params(
        ("data.id" = String, Query, description = "The notified payment's id, as Mercado Pago puts it in the URL (signed)."),
        ("type" = Option<String>, Query, description = "`payment`"),
        ("x-signature" = String, Header,
         description = "`ts=<timestamp>,v1=<hex HMAC-SHA256(PAGOS_MERCADOPAGO_WEBHOOK_SECRET, \"id:<data.id>;request-id:<x-request-id>;ts:<ts>;\")>`; `ts` (unix seconds, or milliseconds) within 5 minutes of now."),
        ("x-request-id" = String, Header, description = "Signed with the manifest; a request id already answered is a duplicate (Mercado Pago is not asked again)."),
    ),
    request_body(content = Object, content_type = "application/json",
                 description = "A Mercado Pago notification (`{\"id\":…,\"type\":\"payment\",\"action\":\"payment.updated\",\"data\":{\"id\":\"…\"}}`). Deduplicated by `x-request-id` and by `id`; types other than `payment` are acknowledged and ignored."),
    responses(
        Accepted,
        (status = 400, description = "Signed, but not a payment notification pagos can read; nothing was recorded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Signature missing, malformed, wrong or outside the 5-minute tolerance, or PAGOS_MERCADOPAGO_WEBHOOK_SECRET unset; nothing was recorded and Mercado Pago was not asked", body = Problem, content_type = "application/problem+json"),
        BodyTooLarge,
        BodyTimeout,
        (status = 503, description = "Mercado Pago could not be asked, or the database failed; nothing was recorded. Deliver it again.", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64))),
    )
)]
async fn receive_mercadopago_notification(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let secret = secret_of(
        &state,
        exposed(&state.settings.mercadopago_webhook_secret),
        "PAGOS_MERCADOPAGO_WEBHOOK_SECRET",
    )?;
    let raw = raw(body)?;
    let data_id = query.as_deref().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(name, _)| name == "data.id")
            .map(|(_, value)| value.into_owned())
    });
    let request_id = headers
        .get(mp::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok());
    let values = headers
        .get_all(mp::SIGNATURE_HEADER)
        .iter()
        .map(|v| v.as_bytes());
    let signature = match mp::verify_request(
        values,
        secret.as_bytes(),
        data_id.as_deref(),
        request_id,
        unix_now(),
    ) {
        Ok(signature) => signature,
        Err(err) => {
            return Err(refuse_signature(
                &state,
                err,
                signature_detail(err),
                "Mercado Pago signs \"id:<data.id>;request-id:<x-request-id>;ts:<ts>;\" with the application's webhook secret.",
            ));
        }
    };
    let notification = Notification::parse(&raw).map_err(|err| {
        tracing::warn!(error = %err, "signed webhook is not a Mercado Pago notification");
        malformed(&state, err)
    })?;
    if notification.kind != mp::PAYMENT {
        tracing::info!(
            notification_id = notification.id,
            kind = notification.kind,
            "Mercado Pago notification ignored"
        );
        return Ok(ignored(&state));
    }
    let Some(payment_id) = data_id else {
        return Err(malformed(
            &state,
            "`data.id` is missing from the URL's query",
        ));
    };
    if notification
        .data_id
        .as_deref()
        .is_some_and(|id| id != payment_id)
    {
        return Err(malformed(
            &state,
            "`data.id` of the body and of the URL differ",
        ));
    }
    // The signed request (a replay of it carries the same key, whatever its unsigned
    // body says) and the notification's own id (Mercado Pago delivering it again).
    let replay_key = mp::replay_key(request_id, &signature);
    let mut seen = false;
    for key in [replay_key.as_str(), notification.id.as_str()] {
        let known = webhooks::already_processed(&state.db, SOURCE_MERCADOPAGO, key)
            .await
            .map_err(|err| {
                tracing::error!(notification_id = notification.id, error = %err, "webhook dedupe read failed");
                unavailable("The notification could not be applied now; nothing was recorded. Deliver it again.")
            })?;
        if known {
            seen = true;
            break;
        }
    }
    if seen {
        tracing::info!(
            notification_id = notification.id,
            replay_key,
            "Mercado Pago notification already processed; Mercado Pago not asked again"
        );
        state.metrics.webhook_event("duplicado");
        return Ok(acknowledge("duplicado"));
    }
    // The notification names the payment; Mercado Pago's API says what state it is in.
    let Some(client) = state.mercadopago.as_ref() else {
        tracing::error!(
            notification_id = notification.id,
            "a Mercado Pago notification, but no Mercado Pago client (PAGOS_GATEWAY is not mercadopago)"
        );
        return Err(unavailable(
            "Mercado Pago could not be asked about the payment now; nothing was recorded. Deliver it again.",
        ));
    };
    let payment = match client.fetch(&payment_id).await {
        Ok(Some(payment)) => payment,
        // Mercado Pago's reads lag behind its notifications: a payment it notified a
        // moment ago may not be found yet. Acknowledged, the notification would never
        // come again, and what it reported (a charge pagos did not record, a charge-back)
        // would be lost: a recent one is refused, so Mercado Pago delivers it again.
        Ok(None)
            if notification
                .date_created
                .is_some_and(|at| crate::db::now() - at < mp::READ_LAG) =>
        {
            state.metrics.webhook_event("error");
            tracing::warn!(
                notification_id = notification.id,
                payment_id,
                "notified payment not found at Mercado Pago yet; refused so that it notifies again"
            );
            return Err(unavailable(
                "Mercado Pago does not show the notified payment yet (its reads lag behind its notifications); nothing was recorded. Deliver it again.",
            ));
        }
        Ok(None) => {
            tracing::warn!(
                notification_id = notification.id,
                payment_id,
                "notified payment not found at Mercado Pago; ignored (the reconciler still asks about pending payments)"
            );
            remember_request(&state, &replay_key).await;
            return Ok(ignored(&state));
        }
        Err(err) => {
            state.metrics.webhook_event("error");
            tracing::warn!(notification_id = notification.id, payment_id, error = %err, "could not ask Mercado Pago about a notified payment; it will notify again");
            return Err(unavailable(
                "Mercado Pago could not be asked about the payment now; nothing was recorded. Deliver it again.",
            ));
        }
    };
    let is_ours = payment
        .external_reference
        .as_deref()
        .is_some_and(|r| uuid::Uuid::parse_str(r).is_ok());
    if !is_ours {
        tracing::info!(
            notification_id = notification.id,
            payment_id,
            "a Mercado Pago payment pagos did not make; ignored"
        );
        remember_request(&state, &replay_key).await;
        return Ok(ignored(&state));
    }
    // Held to what pagos stores, as every adapter's answers are (`gateway::storable`).
    let read = payment
        .to_charge()
        .and_then(crate::gateway::storable::charge)
        .and_then(|charge| Ok((charge, payment.returned()?)));
    let (charge, returned) = match read {
        Ok(read) => read,
        Err(err) => {
            state.metrics.webhook_event("error");
            tracing::error!(notification_id = notification.id, payment_id, error = %err, "Mercado Pago payment pagos cannot read");
            return Err(unavailable(
                "The payment's state could not be read; nothing was recorded. Deliver it again.",
            ));
        }
    };
    let answer = apply(
        &state,
        ChargeEvent {
            source: SOURCE_MERCADOPAGO,
            event_id: &notification.id,
            sequence: mp::sequence(&payment),
            charge: &charge,
            returned,
        },
    )
    .await?;
    remember_request(&state, &replay_key).await;
    Ok(answer)
}

/// Records a Mercado Pago notification request as answered, so that a replay of it is a
/// duplicate without asking Mercado Pago again. A failure costs only that: a replay
/// within the 5-minute tolerance would ask once more, and apply nothing new (the
/// notification's id and its payment's sequence are recorded with its effect).
async fn remember_request(state: &AppState, replay_key: &str) {
    if let Err(err) = webhooks::remember_processed(&state.db, SOURCE_MERCADOPAGO, replay_key).await
    {
        tracing::warn!(replay_key, error = %err, "could not record a Mercado Pago notification request as processed");
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

/// `limite` of `GET /admin/cargos-huerfanos`: once at most, 1–1000 (default 100); any
/// other parameter is refused (a typo such as `limit=5` listed 100 rows), each named in
/// `errores`.
fn orphan_limit(query: &str) -> Result<u64, ApiError> {
    let (mut limit, mut given) = (None, false);
    let mut errors = Vec::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let mut error = |detalle: String| {
            errors.push(FieldError {
                campo: name.clone().into_owned(),
                detalle,
            })
        };
        match name.as_ref() {
            "limite" if given => error("given more than once".into()),
            "limite" => {
                given = true;
                match value.parse::<u64>() {
                    Ok(n) if (1..=MAX_LIMIT).contains(&n) => limit = Some(n),
                    _ => error(format!("a whole number between 1 and {MAX_LIMIT}")),
                }
            }
            _ => error("unknown parameter; known: limite".into()),
        }
    }
    if !errors.is_empty() {
        return Err(Problem::new(ProblemType::Validation)
            .detail("Correct the parameters listed in `errores`.")
            .with("errores", errors)
            .into());
    }
    Ok(limit.unwrap_or(DEFAULT_LIMIT))
}

/// A charge the gateway reported whose reference matches no payment: money may have
/// been taken without a payment of ours.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct CargoHuerfano {
    /// The gateway (`http`, `stripe`, `mercadopago`).
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
    #[schema(format = DateTime)]
    visto_primero_en: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    actualizado_en: String,
    /// The payment the reference names, registered after the charge was reported (the
    /// database restored from before it, and the client's retry registered it again with
    /// its key): a payment of ours stands for this charge; do not refund it. Null: none.
    pago_id: Option<uuid::Uuid>,
}

impl CargoHuerfano {
    fn of(c: webhook_charge::Model, pago_id: Option<uuid::Uuid>) -> Self {
        CargoHuerfano {
            pago_id,
            fuente: c.source,
            cargo_id: c.charge_id,
            referencia: c.reference,
            estado: c.status.as_str().to_owned(),
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

/// Orphan charges, newest first: charges reported by a gateway for a reference no
/// payment has. See `runbooks/webhooks.md`.
#[utoipa::path(
    get,
    path = "/admin/cargos-huerfanos",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("limite" = Option<u64>, Query, minimum = 1, maximum = 1000, description = "How many, 1–1000 (default 100)."),
    ),
    responses(
        (status = 200, description = "Orphan charges, newest first (by when first seen)", body = [CargoHuerfano]),
        AdminTokenRefused,
        TooManyFailedAuthentications,
        (status = 422, description = "`limite` is not a whole number between 1 and 1000, or is given more than once, or an unknown parameter is given (`errores` names each)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_orphan_charges(
    State(state): State<AppState>,
    _admin: Admin,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let limit = orphan_limit(query.as_deref().unwrap_or_default())?;
    let orphans = webhooks::orphan_charges(&state.db, limit).await?;
    let registered = webhooks::registered_since(&state.db, &orphans).await?;
    let body: Vec<CargoHuerfano> = orphans
        .into_iter()
        .map(|c| {
            let named = uuid::Uuid::parse_str(&c.reference)
                .ok()
                .filter(|id| registered.contains(id));
            CargoHuerfano::of(c, named)
        })
        .collect();
    let mut response = Json(body).into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}
