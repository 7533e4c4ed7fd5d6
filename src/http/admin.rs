//! The admin API for on-call: list payments by state, run a reconciliation now, settle a
//! payment under review by hand, read one payment with its audit trail.
//!
//! Every endpoint requires the admin token. A manual resolution is only possible for a
//! payment in REVISION_MANUAL and is written to the audit trail with its reason.

use super::AppState;
use super::actions::{self, Asked};
use super::auth::{Admin, AdminTokenRefused, PaymentNotFound, ReadOnlyRole};
use super::extract::{self, PathId, WhenEmpty, field_error};
use super::problem::{ApiError, MalformedBody, NotJson, Problem, ProblemType, RawBodyTooLarge};
use super::provider_check::{self, Choice};
use crate::domain::FieldError;
use crate::entities::{payment, payment_transition as transitions};
use crate::operators::actions::Action;
use crate::representation::{Pago, RESOLVED_FAILED};
use crate::saga::reconcile::{self, Report};
use crate::saga::refund::{AfterFailure, Compensation};
use crate::saga::state::{Event, PaymentState};
use crate::saga::store::{self, Actor, Changes, Written};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::HeaderMap;
use chrono::SecondsFormat;
use sea_orm::Order;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_payments))
        .routes(routes!(payment_detail))
        .routes(routes!(run_reconciliation))
        .routes(routes!(resolve))
        .layer(DefaultBodyLimit::max(extract::RAW_BODY_LIMIT))
}

/// A payment as on-call sees it: the merchant's view plus what the reconciler knows.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PagoAdmin {
    #[serde(flatten)]
    pub pago: Pago,
    pub merchant_id: Uuid,
    pub intentos: i32,
    /// When the reconciler looks at it next (RFC 3339).
    #[schema(format = DateTime)]
    pub proximo_intento: String,
    /// While a worker (a request, a reconciliation pass, a "reconcile now") holds it:
    /// until when (RFC 3339). Nobody else sends it meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub retenido_hasta: Option<String>,
    pub decline_code: Option<String>,
    /// Seconds since it was created.
    pub edad_segundos: i64,
    /// The last error of a look-up or a send at the provider (a 5xx, a timeout, a refused
    /// connection): why it is still waiting. Left out when none failed, and once it is
    /// settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ultimo_error: Option<UltimoError>,
}

/// An error of a call to the provider, and when.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UltimoError {
    /// What the call failed with (at most 500 characters).
    pub mensaje: String,
    /// When (RFC 3339).
    #[schema(format = DateTime)]
    pub en: String,
}

impl PagoAdmin {
    /// `p` as on-call sees it, `refunded` of it given back (`montoReembolsado`: its
    /// refunds `COMPLETADO`, as the merchant's `GET /v1/pagos/{id}` shows it).
    pub fn of(p: &payment::Model, refunded: i64) -> Self {
        PagoAdmin {
            pago: crate::representation::pago_with_refunds(p, refunded),
            merchant_id: p.merchant_id,
            intentos: p.attempts,
            proximo_intento: p
                .next_attempt_at
                .to_rfc3339_opts(SecondsFormat::Millis, true),
            retenido_hasta: p
                .claimed_until
                .filter(|until| *until > crate::db::now())
                .map(|until| until.to_rfc3339_opts(SecondsFormat::Millis, true)),
            decline_code: p.decline_code.clone(),
            edad_segundos: reconcile::age(p.created_at).num_seconds(),
            ultimo_error: p.last_error.clone().map(|mensaje| UltimoError {
                mensaje,
                en: p
                    .last_error_at
                    .unwrap_or(p.updated_at)
                    .to_rfc3339_opts(SecondsFormat::Millis, true),
            }),
        }
    }
}

/// On-call's list of payments in a state. Named apart from the merchant's search page
/// (`ListaPagos`): the OpenAPI document keeps one schema per name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaPagosAdmin {
    pub pagos: Vec<PagoAdmin>,
    /// The `cursor` of the next page; null on the last one.
    pub siguiente: Option<String>,
}

/// The query of `GET /admin/pagos` (documentation only: the handler reads the query
/// itself, `list_query`, to name every parameter at fault).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListQuery {
    /// EN_PROCESO, ENVIADA, COMPLETADA, FALLIDA or REVISION_MANUAL
    estado: PaymentState,
    /// At most this many (default 50, at most 1000)
    #[param(minimum = 1, maximum = 1000)]
    limite: Option<u64>,
    /// The `siguiente` of the page before
    cursor: Option<String>,
}

const DEFAULT_LIST_LIMIT: u64 = 50;
const MAX_LIST_LIMIT: u64 = 1000;

/// What `GET /admin/pagos` asks for, parsed.
struct Listing {
    estado: PaymentState,
    limit: u64,
    cursor: Option<Uuid>,
}

/// The query of `GET /admin/pagos`, as the merchant's list reads its own: every parameter
/// once, none unknown, `estado` required; a 422 naming each at fault (`errores`).
fn list_query(query: &str) -> Result<Listing, ApiError> {
    let mut estado = None;
    let mut limit = None;
    let mut cursor = None;
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let mut error = |detalle: String| errors.push(field_error(&name, detalle));
        if !seen.insert(name.clone().into_owned()) {
            error("given more than once".into());
            continue;
        }
        match name.as_ref() {
            "estado" => match value.parse::<PaymentState>() {
                Ok(state) => estado = Some(state),
                Err(_) => error(format!(
                    "one of {}",
                    PaymentState::ALL.map(PaymentState::as_str).join(", ")
                )),
            },
            "limite" => match value.parse::<u64>() {
                Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => limit = Some(n),
                _ => error(format!("a whole number from 1 to {MAX_LIST_LIMIT}")),
            },
            "cursor" => match Uuid::parse_str(&value) {
                Ok(id) => cursor = Some(id),
                Err(_) => error("not a cursor: use the `siguiente` of a page".into()),
            },
            _ => error("unknown parameter; known: estado, limite, cursor".into()),
        }
    }
    if estado.is_none() && !seen.contains("estado") {
        errors.push(field_error(
            "estado",
            format!(
                "required: one of {}",
                PaymentState::ALL.map(PaymentState::as_str).join(", ")
            ),
        ));
    }
    match estado {
        Some(estado) if errors.is_empty() => Ok(Listing {
            estado,
            limit: limit.unwrap_or(DEFAULT_LIST_LIMIT),
            cursor,
        }),
        _ => Err(super::search::invalid(errors)),
    }
}

/// Payments in a state, oldest first, a page at a time (`siguiente` is the next page's
/// `cursor`).
#[utoipa::path(
    get,
    path = "/admin/pagos",
    tag = "admin",
    security(("admin_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "A page of payments, oldest first, each with `montoReembolsado`; `siguiente` is the next page's `cursor` (null on the last page)", body = ListaPagosAdmin),
        AdminTokenRefused,
        super::auth::TooManyFailedAuthentications,
        (status = 422, description = "`estado` missing or not a state, `limite` not a whole number from 1 to 1000, `cursor` not the `siguiente` of a page, a parameter given twice or unknown (`errores` names each)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_payments(
    State(state): State<AppState>,
    _admin: Admin,
    RawQuery(query): RawQuery,
) -> Result<Json<ListaPagosAdmin>, ApiError> {
    let Listing {
        estado,
        limit,
        cursor,
    } = list_query(&query.unwrap_or_default())?;
    let mut find = payment::Entity::find().filter(payment::Column::State.eq(estado.as_str()));
    if let Some(cursor) = cursor {
        // The page goes on after the cursor's payment, in the same order. A payment that
        // left the state since is still a place in that order.
        let Some(last) = payment::Entity::find_by_id(cursor).one(&state.db).await? else {
            return Err(super::search::invalid(vec![field_error(
                "cursor",
                "not a cursor: use the `siguiente` of a page",
            )]));
        };
        find = find.filter(super::search::after(&last, Order::Asc));
    }
    let rows = find
        .order_by_asc(payment::Column::CreatedAt)
        .order_by_asc(payment::Column::Id)
        .limit(limit)
        .all(&state.db)
        .await?;
    let (pagos, siguiente) = super::search::shown(&state, rows, limit, PagoAdmin::of).await?;
    Ok(Json(ListaPagosAdmin { pagos, siguiente }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transicion {
    pub desde: Option<String>,
    pub hacia: String,
    /// request, reconciler, webhook or admin
    pub quien: String,
    pub motivo: String,
    #[schema(format = DateTime)]
    pub en: String,
    /// Who of on-call, for a row by `admin`: the operator's name, or `admin` for the
    /// break-glass token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operador: Option<String>,
}

impl Transicion {
    /// A row of an audit trail (a payment's, a refund's: its states `from` and `to` by
    /// name), as on-call reads it; a row by `admin` names the operator its reason names.
    pub fn of<S: std::fmt::Display>(
        from: Option<S>,
        to: S,
        actor: Actor,
        reason: String,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        Transicion {
            desde: from.map(|s| s.to_string()),
            hacia: to.to_string(),
            quien: actor.as_str().to_owned(),
            operador: (actor == Actor::Admin)
                .then(|| operator_in(&reason).map(str::to_owned))
                .flatten(),
            motivo: reason,
            en: at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

/// The reason an on-call resolution writes: it names who resolved.
pub fn resolution_reason(who: &str, motivo: &str) -> String {
    format!("resolved by {who} (on-call): {motivo}")
}

/// On-call's reason for a resolution (`motivo`), trimmed; the field at fault when it is
/// blank or longer than 1000 characters.
pub fn resolution_motivo(asked: &str) -> Result<&str, FieldError> {
    let motivo = asked.trim();
    if motivo.is_empty() || motivo.chars().count() > 1000 {
        return Err(field_error(
            "motivo",
            "is required (1–1000 characters): say why, for the audit trail",
        ));
    }
    if motivo.contains('\0') {
        return Err(field_error(
            "motivo",
            "must not contain the NUL character (\\u0000)",
        ));
    }
    Ok(motivo)
}

/// The operator a resolution's reason names (`resolution_reason`), also in the reason of a
/// refund it started, or the one who asked for a refund (its first move: `refund of 5000
/// COP asked by ana: …`); none for rows written before operators existed. Only read in an
/// `admin` row: a merchant's refund is asked by `merchant`, under its own actor.
pub fn operator_in(reason: &str) -> Option<&str> {
    if let Some(asked) = reason.strip_prefix("refund of ") {
        let (_, who) = asked.split_once(" asked by ")?;
        // Operator names hold no ':' (nor spaces): the reason's words follow one.
        return Some(who.split_once(':').map_or(who, |(who, _)| who));
    }
    // A refund on-call's resolution started: `compensation: resolved by …`.
    let reason = reason.strip_prefix("compensation: ").unwrap_or(reason);
    let rest = reason.strip_prefix("resolved by ")?;
    let (who, _) = rest.split_once(" (on-call): ")?;
    Some(who)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DetallePago {
    pub pago: PagoAdmin,
    /// The audit trail, oldest first.
    pub transiciones: Vec<Transicion>,
    /// The payment's refunds, oldest first (left out when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reembolsos: Vec<pagos_types::Reembolso>,
}

fn not_found() -> ApiError {
    Problem::new(ProblemType::NotFound)
        .detail("No payment with this id.")
        .into()
}

/// One payment with its audit trail.
#[utoipa::path(
    get,
    path = "/admin/pagos/{id}",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = Uuid, Path, description = "The payment id")),
    responses(
        (status = 200, description = "The payment and its audit trail", body = DetallePago),
        AdminTokenRefused,
        super::auth::TooManyFailedAuthentications,
        PaymentNotFound,
    )
)]
async fn payment_detail(
    State(state): State<AppState>,
    _admin: Admin,
    PathId(id): PathId,
) -> Result<Json<DetallePago>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
    let p = store::find_payment(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(detail(&state, &p).await?))
}

pub async fn detail(state: &AppState, p: &payment::Model) -> Result<DetallePago, ApiError> {
    let trail = transitions::Entity::find()
        .filter(transitions::Column::PaymentId.eq(p.id))
        .order_by_asc(transitions::Column::CreatedAt)
        .order_by_asc(transitions::Column::Id)
        .all(&state.db)
        .await?;
    let refunds = crate::saga::refund::store::of_payment(&state.db, p.id).await?;
    // `montoReembolsado` from the refunds read for the list, as
    // `saga::refund::store::refunded_amount` sums them.
    let refunded = refunds
        .iter()
        .filter(|r| r.state == crate::saga::refund::state::RefundState::Completado)
        .map(|r| r.amount)
        .sum();
    let reembolsos = refunds
        .iter()
        .map(crate::representation::reembolso)
        .collect();
    Ok(DetallePago {
        reembolsos,
        pago: PagoAdmin::of(p, refunded),
        transiciones: trail
            .into_iter()
            .map(|t| Transicion::of(t.from_state, t.to_state, t.actor, t.reason, t.created_at))
            .collect(),
    })
}

/// The body of `POST /admin/reconciliaciones` (documentation only: the handler reads the
/// JSON object itself, `extract::json_object`, as the merchant API reads its bodies).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
pub struct PedidoReconciliacion {
    /// This payment now, due or not; absent: every due payment.
    pago_id: Option<Uuid>,
    /// This refund now, due or not (its report under `reembolsos`).
    reembolso_id: Option<Uuid>,
}

/// Runs one reconciliation pass now and answers its report.
#[utoipa::path(
    post,
    path = "/admin/reconciliaciones",
    tag = "admin",
    security(("admin_token" = [])),
    request_body(content = Option<PedidoReconciliacion>, content_type = "application/json", description = "Optional: `{}` (or no body, whatever its content type) for every due payment and refund, `{\"pagoId\":\"…\"}` for one payment, `{\"reembolsoId\":\"…\"}` for one refund"),
    responses(
        (status = 200, description = "The pass's report; who asked, and what came of it, is recorded (`GET /admin/acciones`)", body = Report),
        MalformedBody,
        AdminTokenRefused,
        super::auth::TooManyFailedAuthentications,
        ReadOnlyRole,
        (status = 404, description = "No payment (refund) with this `pagoId` (`reembolsoId`)", body = Problem, content_type = "application/problem+json"),
        RawBodyTooLarge,
        NotJson,
        (status = 422, description = "`validation-failed`, every field at fault listed in `errores`: a body that is not a JSON object (`(cuerpo)`), a member written twice or unknown, `pagoId` or `reembolsoId` not a UUID (null included), both given. Nothing was done, nor recorded", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Who asked could not be recorded, so nothing was done (Retry-After); or the database failed", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn run_reconciliation(
    State(state): State<AppState>,
    admin: Admin,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Report>, ApiError> {
    admin.may_act()?;
    let mut fields = extract::json_object(&headers, body, WhenEmpty::Object)?;
    // Each narrows the pass to one row: a null (a script's unset variable) is refused, not
    // run as a pass over everything, and both at once are refused, not one dropped.
    let pago_id = fields.optional_not_null::<Uuid>("pagoId");
    let reembolso_id = fields.optional_not_null::<Uuid>("reembolsoId");
    if pago_id.is_some() && reembolso_id.is_some() {
        fields.refuse(
            "reembolsoId",
            "one of pagoId and reembolsoId, not both: reconcile the payment and the refund one at a time",
        );
    }
    fields.finish(Some(()))?;
    if let Some(id) = reembolso_id {
        return Ok(Json(reconcile_refund_now(&state, &admin, id).await?));
    }
    let report = reconcile_now(&state, &admin, pago_id).await?;
    Ok(Json(report))
}

/// The body of `POST /admin/pagos/{id}/resolucion` (documentation only: the handler reads
/// the JSON object itself, `extract::json_object`, into a `HandResolution`).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct Resolucion {
    /// COMPLETADA or FALLIDA
    #[schema(value_type = super::extract::EstadoResolucion)]
    estado: String,
    /// Why (what the provider's dashboard showed, the ticket): kept in the audit trail.
    /// 1–1000 characters once trimmed, without NUL.
    #[schema(min_length = 1, max_length = 1000, pattern = r"\S")]
    motivo: String,
    /// The provider's charge id. With `COMPLETADA` it must be a succeeded charge of the
    /// payment's amount and currency that the provider holds for this payment (absent: the
    /// payment's own charge if it is one, else the one such charge); with `FALLIDA`, a
    /// charge the provider holds for this payment. It is the charge a later refund of the
    /// payment refunds.
    #[serde(rename = "gatewayRef")]
    #[schema(min_length = 1, max_length = 255, pattern = r"\S")]
    gateway_ref: Option<String>,
    /// With `FALLIDA`: refund every charge the provider holds for the payment (asked now,
    /// and those its webhooks reported that its search does not show yet), each for what
    /// pagos' refunds of it have not given back yet, so the failed answer is
    /// true. Each refund is a saga of its own (`pagos` asked it; on-call's `motivo` in its
    /// audit trail). A charge whose compensation refund failed is refunded again, by a new
    /// refund (a refund that fails sends the payment back to REVISION_MANUAL). A charge
    /// that cannot be refunded now (a refund of it in flight or under review), or that an
    /// earlier resolution settled outside pagos overruling the provider, refuses the whole
    /// resolution: 409, nothing written. Absent or null: false.
    reembolsar: Option<bool>,
    /// On-call overrules what the provider shows (money returned outside pagos, a
    /// provider search that does not find a charge its dashboard shows): why, 1–1000
    /// characters, written to the audit row with the charges the provider showed. Without
    /// it a resolution the provider contradicts is refused (409 `provider-disagrees`).
    /// Not with `reembolsar`.
    #[serde(rename = "contraProveedor")]
    #[schema(min_length = 1, max_length = 1000, pattern = r"\S")]
    contra_proveedor: Option<String>,
}

/// On-call settles a payment under review, after pagos asked the provider about it.
#[utoipa::path(
    post,
    path = "/admin/pagos/{id}/resolucion",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = Uuid, Path, description = "The payment id")),
    request_body = Resolucion,
    responses(
        (status = 200, description = "Settled; the payment and its audit trail, as they stand once the refunds `reembolsar` made were sent (a refund the provider failed at once sends the payment back to REVISION_MANUAL). Who asked, what, and what came of it (a refusal too) is recorded (`GET /admin/acciones`, `resolve_payment`)", body = DetallePago),
        AdminTokenRefused,
        super::auth::TooManyFailedAuthentications,
        ReadOnlyRole,
        PaymentNotFound,
        MalformedBody,
        RawBodyTooLarge,
        NotJson,
        (status = 409, description = "Nothing was changed: the payment is not in REVISION_MANUAL (`not-under-review`); or what the provider shows for it contradicts the resolution (`provider-disagrees`, with `cargos`: the charges found): `COMPLETADA` with no succeeded charge of the payment's amount, a `gatewayRef` that is not one, `FALLIDA` without `reembolsar` while a charge succeeded, `FALLIDA` (with or without `reembolsar`) while a charge is still pending; or with `reembolsar` a charge cannot be refunded now (`payment-not-refundable`, with `cargo` and `reembolsoId`), or was settled outside pagos by an earlier resolution overruling the provider (`payment-not-refundable`, with `cargo`); or the charge named (or taken) is already another payment's, by pagos' records or the provider's webhooks, overruled or not, the provider asked or not (`charge-belongs-to-another-payment`, with `cargo`, `fuente`, and `pagoId` only when it is the same merchant's payment); or `COMPLETADA` for a payment that was ever FALLIDA, whose merchant was told it failed and whose key replays that 402 (`payment-told-failed`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`validation-failed`, every field at fault listed in `errores` (and said in `detail`): a body that is not a JSON object (`(cuerpo)`), a member written twice, unknown or of another type, `estado` or `motivo` missing; bad estado, empty motivo, gatewayRef or contraProveedor, reembolsar with COMPLETADA or with contraProveedor (these recorded as a refusal, `GET /admin/acciones`); COMPLETADA without gatewayRef when neither the provider's answer nor the payment names its charge. Nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Who asked could not be recorded (`GET /admin/acciones`), so nothing was done (Retry-After). With `reembolsar`: the provider could not be asked what it charged; nothing was changed (Retry-After). Without it, a provider that cannot be asked leaves the resolution to on-call, its audit row saying so", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn resolve(
    State(state): State<AppState>,
    admin: Admin,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetallePago>, ApiError> {
    admin.may_act()?;
    let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
    let asked = extract::resolution(&headers, body, true)?;
    let p = resolve_by_hand(
        &state,
        &admin,
        id,
        HandResolution {
            estado: &asked.estado,
            motivo: &asked.motivo,
            gateway_ref: asked.gateway_ref,
            reembolsar: asked.reembolsar,
            contra_proveedor: asked.contra_proveedor,
        },
    )
    .await?;
    Ok(Json(detail(&state, &p).await?))
}

/// Whether payment `id` was ever FALLIDA: its merchant was told it failed (the key's
/// frozen answer, a 402 that never changes, and the `pago.fallido` event), so it can
/// never be COMPLETADA without that answer turning false.
async fn told_failed(state: &AppState, id: Uuid) -> Result<bool, ApiError> {
    let failed = transitions::Entity::find()
        .filter(transitions::Column::PaymentId.eq(id))
        .filter(transitions::Column::ToState.eq(PaymentState::Fallida))
        .one(&state.db)
        .await?;
    Ok(failed.is_some())
}

/// What on-call asks of a resolution (the admin API's body, the console's form).
#[derive(Debug, Default)]
pub struct HandResolution<'a> {
    /// COMPLETADA or FALLIDA.
    pub estado: &'a str,
    /// Why, for the audit trail.
    pub motivo: &'a str,
    /// The provider's charge id on-call names.
    pub gateway_ref: Option<String>,
    /// With FALLIDA: refund what the provider charged.
    pub reembolsar: bool,
    /// Why on-call overrules what the provider shows.
    pub contra_proveedor: Option<String>,
}

/// A charge as a refusal lists it: what the provider's search shows now, or what its
/// webhooks reported succeeded that the search does not show so.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CargoVisto<'a> {
    id: &'a str,
    status: crate::gateway::ChargeStatus,
    amount: i64,
    currency: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<&'a str>,
    /// `busqueda` (the provider's search, now) or `webhook` (its events).
    fuente: &'static str,
}

impl<'a> CargoVisto<'a> {
    fn of(c: &'a crate::gateway::Charge, fuente: &'static str) -> Self {
        CargoVisto {
            id: &c.id,
            status: c.status,
            amount: c.amount,
            currency: &c.currency,
            decline_code: c.decline_code.as_deref(),
            fuente,
        }
    }
}

/// What the provider shows for one payment: every charge its search finds (only the
/// payment's own), and the succeeded ones, those its webhooks reported included.
struct ProviderSays {
    found: Vec<crate::gateway::Charge>,
    succeeded: Vec<crate::gateway::Charge>,
    /// Why the provider could not be asked (its look-up failed): only an overrule
    /// resolves the payment then.
    unreachable: Option<crate::gateway::GatewayError>,
}

impl ProviderSays {
    /// Asks the provider about `payment`, and adds what its webhooks reported succeeded
    /// that its search does not show yet (a search lags behind its events). A look-up that
    /// fails is said (`unreachable`), with what the webhooks reported.
    async fn ask(state: &AppState, payment: Uuid) -> Result<ProviderSays, ApiError> {
        use crate::gateway::ChargeStatus;
        let (found, unreachable) = match state.gateway.lookup(payment).await {
            Ok(found) => (found, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let succeeded = found
            .iter()
            .filter(|c| c.status == ChargeStatus::Succeeded)
            .cloned()
            .collect();
        let succeeded = with_reported_charges(&state.db, payment, succeeded).await?;
        Ok(ProviderSays {
            found,
            succeeded,
            unreachable,
        })
    }

    /// A 503 that changes nothing, when the provider could not be asked for a resolution
    /// with `reembolsar` (which refunds what the provider shows): it waits for the
    /// provider, never for `contraProveedor`, which records the charges as settled outside
    /// pagos and so would leave them unrefunded.
    fn unavailable(&self) -> Option<ApiError> {
        self.unreachable.as_ref().map(|e| {
            provider_check::unreachable(
                "payment",
                e,
                "reembolsar refunds what the provider shows, so it needs the provider's answer: try again in a few minutes. Do not drop reembolsar to close the payment meanwhile: a FALLIDA without it, overruling the provider, records its charges as settled outside pagos, and pagos never refunds them.",
            )
        })
    }

    /// Every charge, as a refusal lists them.
    fn seen(&self) -> Vec<CargoVisto<'_>> {
        let mut seen: Vec<CargoVisto<'_>> = self
            .found
            .iter()
            .map(|c| CargoVisto::of(c, "busqueda"))
            .collect();
        for c in &self.succeeded {
            if !self
                .found
                .iter()
                .any(|f| f.id == c.id && f.status == c.status)
            {
                seen.push(CargoVisto::of(c, "webhook"));
            }
        }
        seen
    }

    /// The charges in words, for a refusal's detail and an audit row.
    fn in_words(&self) -> String {
        let seen = self.seen();
        let asked = match &self.unreachable {
            Some(e) => format!("nothing: it could not be asked ({e})"),
            None => String::new(),
        };
        if seen.is_empty() {
            return if asked.is_empty() {
                "no charge for this payment".to_owned()
            } else {
                asked
            };
        }
        let charges = seen
            .iter()
            .map(|c| {
                let status = serde_json::to_value(c.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let source = if c.fuente == "webhook" {
                    " (reported by a webhook)"
                } else {
                    ""
                };
                format!("{} {status} for {} {}{source}", c.id, c.amount, c.currency)
            })
            .collect::<Vec<_>>()
            .join(", ");
        if asked.is_empty() {
            charges
        } else {
            format!("{charges}; its search {asked}")
        }
    }

    /// A 409 `provider-disagrees`: `why`, then what the provider shows; nothing changed.
    fn disagrees(&self, why: &str) -> ApiError {
        provider_check::disagrees(why, &self.in_words(), "payment", "cargos", self.seen())
    }
}

/// The refusal of a COMPLETADA while more than one charge of the payment took the money
/// (the provider's search, or its webhooks): a COMPLETADA payment is not looked at again,
/// so the others would stay with the customer charged twice, nobody told. On-call refunds
/// them first; a provider that still shows them succeeded (Stripe keeps a refunded
/// PaymentIntent `succeeded`) is overruled, naming the refunds.
fn several_charged(provider: &ProviderSays) -> ApiError {
    let ids: Vec<&str> = provider.succeeded.iter().map(|c| c.id.as_str()).collect();
    provider.disagrees(&format!(
        "The provider holds {} succeeded charges for this payment ({}): the customer is charged more than once, and a COMPLETADA payment is not looked at again. Refund all but one in the provider's dashboard, then resolve COMPLETADA naming the one that stays with gatewayRef and, while the provider still shows the others succeeded, contraProveedor naming their refunds; or resolve FALLIDA with reembolsar to refund them all.",
        ids.len(),
        ids.join(", ")
    ))
}

/// The charge a resolution records, or the refusal of what on-call asked because the
/// provider contradicts it (`provider` shows otherwise), unless on-call overrules it.
fn checked_against(
    provider: &ProviderSays,
    current: &payment::Model,
    event: Event,
    asked: &HandResolution<'_>,
    gateway_ref: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let overruled = asked.contra_proveedor.is_some();
    let fits =
        |c: &&crate::gateway::Charge| c.amount == current.amount && c.currency == current.currency;
    if event == Event::ResolveFailed {
        if let Some(named) = gateway_ref
            && !overruled
            && !provider
                .found
                .iter()
                .chain(&provider.succeeded)
                .any(|c| c.id == named)
        {
            return Err(provider.disagrees(&format!(
                "gatewayRef {named} is not a charge the provider holds for this payment (a typo, or another payment's charge?)."
            )));
        }
        // A charge still pending may yet take the money, and a payment resolved FALLIDA is
        // never looked at again: told no money was taken, the customer could be charged
        // with nobody refunding it. With `reembolsar` too: only a succeeded charge can be
        // refunded.
        if !overruled
            && let Some(pending) = provider
                .found
                .iter()
                .find(|c| c.status == crate::gateway::ChargeStatus::Pending)
        {
            return Err(provider.disagrees(&format!(
                "Charge {} is still pending at the provider: it may yet take the money, and a FALLIDA payment is not looked at again. Resolve once it settles (FALLIDA if it fails, COMPLETADA if it succeeds), or cancel it in the provider's dashboard first; to close the payment anyway, overrule with contraProveedor saying why.",
                pending.id
            )));
        }
        if !asked.reembolsar
            && !overruled
            && let Some(charged) = provider.succeeded.first()
        {
            return Err(provider.disagrees(&format!(
                "The provider shows money taken for this payment: charge {} succeeded. FALLIDA would tell the merchant no money was taken while the customer is charged: resolve FALLIDA with reembolsar (the console's \"Failed — refund what the provider charged\") to refund it; or, if the charge stands, COMPLETADA (a payment that was answered FALLIDA is resolved FALLIDA with contraProveedor saying who agreed); or, if the money went back outside pagos (a refund in the provider's dashboard), FALLIDA with contraProveedor naming it, without reembolsar.",
                charged.id
            )));
        }
        return Ok(gateway_ref.map(str::to_owned));
    }
    let fitting: Vec<&str> = provider
        .succeeded
        .iter()
        .filter(fits)
        .map(|c| c.id.as_str())
        .collect();
    let own = current.gateway_ref.as_deref();
    match provider_check::choose(&fitting, gateway_ref, own, overruled) {
        Choice::Record(_) | Choice::KeepOwn if !overruled && provider.succeeded.len() > 1 => {
            Err(several_charged(provider))
        }
        Choice::Record(id) => Ok(Some(id.to_owned())),
        Choice::KeepOwn => Ok(None),
        Choice::NamedUnfit(named) => {
            let why = match provider.succeeded.iter().find(|c| c.id == named) {
                Some(c) => format!(
                    "Charge {named} is for {} {}, but the payment is for {} {}: it is not this payment's charge.",
                    c.amount, c.currency, current.amount, current.currency
                ),
                None => format!(
                    "gatewayRef {named} is not a succeeded charge the provider holds for this payment (a typo, another payment's charge, or not succeeded): a later refund of this payment would refund it."
                ),
            };
            Err(provider.disagrees(&why))
        }
        Choice::NoneFits if overruled => Ok(None),
        Choice::NoneFits => Err(provider.disagrees(&format!(
            "COMPLETADA needs a succeeded charge of the payment's {} {}, and the provider shows no succeeded charge of it: the merchant would be told it was paid while no money was taken. Wait while a charge is pending; resolve FALLIDA if none was taken.",
            current.amount, current.currency
        ))),
        Choice::Several => Err(provider.disagrees(
            "The provider holds several succeeded charges for this payment: say which one is its charge with gatewayRef (and refund the others).",
        )),
    }
}

/// On-call settles a payment under review (the admin API's and the console's one way):
/// `estado` COMPLETADA or FALLIDA, a reason for the audit trail, which names `who`. The
/// provider is asked first: a resolution it contradicts is refused (409
/// `provider-disagrees`) unless on-call overrules it, saying why.
///
/// Recorded with who asked (`actions::audited`, `resolve_payment` on the payment): the
/// row is written before anything else (none written: 503, nothing done) and completed
/// with the state the payment was left in and the refunds `reembolsar` asked, or with why
/// it was refused. Runs in a task of its own. No payment with this id: a 404, no row.
pub async fn resolve_by_hand(
    state: &AppState,
    who: &Admin,
    id: Uuid,
    asked: HandResolution<'_>,
) -> Result<payment::Model, ApiError> {
    who.may_act()?;
    store::find_payment(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    let what = asked_in_words(&asked);
    let (estado, motivo) = (asked.estado.to_owned(), asked.motivo.to_owned());
    let (gateway_ref, reembolsar, contra_proveedor) =
        (asked.gateway_ref, asked.reembolsar, asked.contra_proveedor);
    let (task_state, task_who) = (state.clone(), who.clone());
    let work = async move {
        let asked = HandResolution {
            estado: &estado,
            motivo: &motivo,
            gateway_ref,
            reembolsar,
            contra_proveedor,
        };
        resolve_unrecorded(&task_state, &task_who, id, asked).await
    };
    let asked = Asked {
        action: Action::ResolvePayment,
        target: Some(id),
        what,
    };
    let resolved = actions::audited(state, who, asked, work, Resolved::in_words).await?;
    Ok(resolved.payment)
}

/// What on-call asked of a resolution, for its audit row: `resolve the payment
/// COMPLETADA: <motivo>`, with the charge named, the refunds asked, the overrule.
fn asked_in_words(asked: &HandResolution<'_>) -> String {
    let mut what = format!("resolve the payment {}", actions::said(asked.estado));
    if asked.reembolsar {
        what.push_str(" and refund what the provider charged");
    }
    if let Some(charge) = &asked.gateway_ref {
        what.push_str(&format!(" (charge {})", actions::said(charge)));
    }
    provider_check::asked_in_words(&what, asked.contra_proveedor.as_deref(), asked.motivo)
}

/// A resolution done: the payment as it stands once the refunds it asked were sent.
pub struct Resolved {
    pub payment: payment::Model,
    /// The state the resolution wrote.
    as_asked: PaymentState,
    /// The compensation refunds `reembolsar` started.
    refunds: Vec<Uuid>,
}

impl Resolved {
    /// What came of it, for the audit row.
    fn in_words(&self) -> String {
        let mut words = format!("resolved {}", self.as_asked);
        if !self.refunds.is_empty() {
            let ids: Vec<String> = self.refunds.iter().map(Uuid::to_string).collect();
            words.push_str(&format!("; refunds asked: {}", ids.join(", ")));
        }
        if self.payment.state != self.as_asked {
            words.push_str(&format!(
                "; the payment is {} now (a refund the provider failed at once)",
                self.payment.state
            ));
        }
        words
    }
}

/// What on-call asked of a resolution, its fields checked.
struct Checked<'a> {
    event: Event,
    motivo: &'a str,
    gateway_ref: Option<&'a str>,
    overrule: Option<String>,
}

/// `asked`'s fields checked, before anything is read: a 422 listing every one at fault.
fn checked<'a>(asked: &'a HandResolution<'_>) -> Result<Checked<'a>, ApiError> {
    let mut faults = Vec::new();
    let event = match asked.estado {
        "COMPLETADA" => Some(Event::ResolveCompleted),
        "FALLIDA" => Some(Event::ResolveFailed),
        _ => {
            faults.push(field_error("estado", "must be COMPLETADA or FALLIDA"));
            None
        }
    };
    let motivo = resolution_motivo(asked.motivo)
        .map_err(|e| faults.push(e))
        .ok();
    let gateway_ref = provider_check::gateway_ref(asked.gateway_ref.as_deref())
        .map_err(|e| faults.push(e))
        .ok();
    if asked.reembolsar && event == Some(Event::ResolveCompleted) {
        faults.push(field_error(
            "reembolsar",
            "goes with estado FALLIDA: a COMPLETADA payment keeps its charge",
        ));
    }
    let overrule = provider_check::overrule(asked.contra_proveedor.as_deref())
        .map_err(|e| faults.push(e))
        .ok();
    if asked.reembolsar && matches!(overrule, Some(Some(_))) {
        faults.push(field_error(
            "contraProveedor",
            "goes without reembolsar: reembolsar refunds what the provider shows",
        ));
    }
    match (event, motivo, gateway_ref, overrule) {
        (Some(event), Some(motivo), Some(gateway_ref), Some(overrule)) if faults.is_empty() => {
            Ok(Checked {
                event,
                motivo,
                gateway_ref,
                overrule,
            })
        }
        _ => Err(provider_check::invalid(faults)),
    }
}

/// `resolve_by_hand`'s work, once its row is written.
/// The `source` under which the webhooks of `gateway` report its charges.
fn webhook_source(gateway: crate::config::GatewayKind) -> &'static str {
    use crate::config::GatewayKind;
    match gateway {
        GatewayKind::Sandbox | GatewayKind::Http => crate::webhooks::SOURCE_HTTP,
        GatewayKind::Stripe => crate::webhooks::SOURCE_STRIPE,
        GatewayKind::MercadoPago => crate::webhooks::SOURCE_MERCADOPAGO,
    }
}

async fn resolve_unrecorded(
    state: &AppState,
    who: &Admin,
    id: Uuid,
    asked: HandResolution<'_>,
) -> Result<Resolved, ApiError> {
    let Checked {
        event,
        motivo,
        gateway_ref,
        overrule,
    } = checked(&asked)?;
    let current = store::find_payment(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    if current.state != PaymentState::RevisionManual {
        return Err(Problem::new(ProblemType::NotUnderReview)
            .detail(format!(
                "The payment is {}, not REVISION_MANUAL: only payments under review are resolved by hand.",
                current.state
            ))
            .into());
    }
    if event == Event::ResolveCompleted && told_failed(state, current.id).await? {
        return Err(Problem::new(ProblemType::ToldFailed)
            .detail("The merchant was told this payment failed (FALLIDA: its key answers 402, no money taken, for as long as the key is kept, and pago.fallido was sent): COMPLETADA would make that answer false, and a merchant who charged again with a new key would have charged twice. Resolve FALLIDA with reembolsar to give the charge back, or FALLIDA with contraProveedor if the money already went back outside pagos. Nothing was changed.")
            .into());
    }
    let reembolsar = asked.reembolsar;
    // What the provider says, asked before anything is written. When it cannot be asked
    // (down, or an answer pagos cannot store), nothing contradicts on-call, who read the
    // provider's dashboard: the resolution is theirs, as the contract has it, and its
    // audit row says the provider could not be asked. Only `reembolsar`, which refunds
    // what the provider shows, needs an answer (503 until then); and a charge its webhooks
    // reported succeeded still refuses a plain FALLIDA.
    let provider = ProviderSays::ask(state, current.id).await?;
    let unreachable = provider.unreachable.as_ref().map(ToString::to_string);
    if reembolsar && let Some(unavailable) = provider.unavailable() {
        return Err(unavailable);
    }
    let recorded = match &unreachable {
        Some(_) if event == Event::ResolveFailed && overrule.is_none() => {
            if let Some(charged) = provider.succeeded.first() {
                return Err(provider.disagrees(&format!(
                    "The provider's webhooks reported charge {} succeeded for this payment: resolve FALLIDA with reembolsar once the provider answers, or overrule with contraProveedor.",
                    charged.id
                )));
            }
            gateway_ref.map(str::to_owned)
        }
        // What its webhooks reported still counts: the charge kept must be of the
        // payment's amount, and a second charge that succeeded is a customer charged twice.
        Some(_) if event == Event::ResolveCompleted && overrule.is_none() => {
            let kept = gateway_ref.or(current.gateway_ref.as_deref());
            if let Some(other) = provider.succeeded.iter().find(|c| {
                Some(c.id.as_str()) == kept
                    && (c.amount != current.amount || c.currency != current.currency)
            }) {
                return Err(provider.disagrees(&format!(
                    "The provider's webhooks reported charge {} succeeded for {} {}, but the payment is for {} {}: it is not this payment's charge (a later refund of the payment would refund it). Name the payment's own charge with gatewayRef, or overrule with contraProveedor.",
                    other.id, other.amount, other.currency, current.amount, current.currency
                )));
            }
            if provider.succeeded.len() > 1 {
                return Err(several_charged(&provider));
            }
            gateway_ref.map(str::to_owned)
        }
        Some(_) => gateway_ref.map(str::to_owned),
        None => checked_against(&provider, &current, event, &asked, gateway_ref)?,
    };
    // A payment COMPLETADA with no charge id could never be refunded (a refund refunds the
    // payment's charge): when neither the provider nor the payment names one, on-call does.
    if event == Event::ResolveCompleted && recorded.is_none() && current.gateway_ref.is_none() {
        return Err(provider_check::invalid(vec![field_error(
            "gatewayRef",
            "is required here: COMPLETADA needs the provider's charge id (from its dashboard), which a refund of this payment refunds, and neither the provider's answer nor the payment names one",
        )]));
    }
    let changes = Changes {
        decline_code: (event == Event::ResolveFailed).then(|| RESOLVED_FAILED.to_owned()),
        gateway_ref: recorded.clone(),
        ..Changes::default()
    };
    let mut reason = resolution_reason(&who.name, motivo);
    if let (Some(err), None) = (&unreachable, &overrule) {
        reason = format!("{reason} [the provider could not be asked ({err}): on-call's word]");
        tracing::warn!(payment_id = %current.id, operator = %who.name, estado = asked.estado, "payment resolved while the provider could not be asked");
    }
    if let Some(why) = &overrule {
        let which = format!("showed {}", provider.in_words());
        reason = provider_check::overruled(&reason, &which, why);
        tracing::warn!(payment_id = %current.id, operator = %who.name, estado = asked.estado, "on-call overruled what the provider shows");
    }
    // With reembolsar, every charge the provider shows succeeded is refunded, never left
    // out of a FALLIDA.
    let charged = if reembolsar {
        provider.succeeded.clone()
    } else {
        Vec::new()
    };
    // A charge already another payment's is never recorded on this one, whatever on-call
    // overrules and whether the provider answered: a refund of this payment would refund
    // that payment's customer (`charge_of_another`). Pagos' records are read once the
    // provider was asked, and the provider's reports again in the write transaction.
    if let Some(charge) = &recorded
        && let Some(refusal) = charge_of_another(&state.db, &current, charge).await?
    {
        tracing::warn!(payment_id = %current.id, operator = %who.name, charge = %charge, "resolution refused: the charge is another payment's");
        return Err(refusal);
    }
    let tx = crate::db::begin_write(&state.db).await?;
    if let Some(charge) = &recorded
        && let Some(refusal) = charge_reported_for_another(&tx, &current, charge).await?
    {
        tx.rollback().await?;
        tracing::warn!(payment_id = %current.id, operator = %who.name, charge = %charge, "resolution refused: the provider reported the charge for another payment while it was written");
        return Err(refusal);
    }
    let resolved =
        match crate::saga::apply(&tx, &current, event, changes, Actor::Admin, &reason).await {
            Ok(Written::Applied(p)) => *p,
            Ok(Written::Fenced) => {
                tx.rollback().await?;
                return Err(Problem::new(ProblemType::NotUnderReview)
                    .detail("The payment changed while resolving it; read it again and retry.")
                    .into());
            }
            Err(store::StoreError::Illegal(e)) => {
                tx.rollback().await?;
                return Err(Problem::new(ProblemType::NotUnderReview)
                    .detail(e.to_string())
                    .into());
            }
            Err(store::StoreError::Db(e)) => return Err(e.into()),
        };
    // The charge COMPLETADA stands on, reported by the provider's webhooks as failed
    // since it succeeded (refunded or charged back in its own dashboard, a reversal),
    // while its search still shows it succeeded (a search lags behind its events), or
    // reported while this was written (the consumer locks the payment before it writes
    // the report, as below): COMPLETADA would tell the merchant money was taken that the
    // provider says is not, and nothing would look at the payment again.
    // On Stripe once it answered, only a dispute's report: a PaymentIntent its search
    // showed succeeded never fails afterwards (a refund or a dispute is an object of its
    // own; Stripe keeps the PaymentIntent `succeeded`), so another failure reported for it
    // is an older attempt's, whose success is still being delivered. A dispute's report
    // (`dispute_<status>`) is the money withdrawn, which the search never shows. While
    // Stripe cannot be asked, every report is all there is.
    let stripe_answered = state.settings.gateway == crate::config::GatewayKind::Stripe
        && provider.unreachable.is_none();
    if event == Event::ResolveCompleted
        && overrule.is_none()
        && let Some(charge) = resolved.gateway_ref.as_deref()
        && let Some(code) = reported_failed(&tx, current.id, charge).await?
        && (!stripe_answered || code.starts_with(crate::webhooks::stripe::DISPUTED))
    {
        tx.rollback().await?;
        tracing::warn!(payment_id = %current.id, operator = %who.name, charge = %charge, "COMPLETADA refused: the provider's webhooks reported the charge failed");
        return Err(provider.disagrees(&format!(
            "The provider's webhooks reported charge {charge} failed ({code}) after its search showed it succeeded: refunded or charged back at the provider, or a failure its search does not show yet. COMPLETADA would tell the merchant money was taken that the provider says is not. Check the provider's dashboard: if the money is not taken, FALLIDA with contraProveedor saying so (a plain FALLIDA is refused while the search still shows the charge succeeded); if the charge stands (a dispute won), COMPLETADA with contraProveedor. Nothing was changed."
        )));
    }
    // A second charge a webhook reported succeeded since the provider was asked (read as
    // below): COMPLETADA would leave it with the customer, and nothing looks at a
    // COMPLETADA payment again (`several_charged`).
    if event == Event::ResolveCompleted && overrule.is_none() {
        let now = with_reported_charges(&tx, current.id, provider.succeeded.clone()).await?;
        if now.len() > 1 && now.len() > provider.succeeded.len() {
            tx.rollback().await?;
            let mut provider = provider;
            provider.succeeded = now;
            tracing::warn!(payment_id = %current.id, operator = %who.name, "COMPLETADA refused: a second charge was reported succeeded while it was written");
            return Err(several_charged(&provider));
        }
    }
    // A charge a webhook reported succeeded since the provider was asked: its consumer
    // locks the payment before it writes the report and keeps a payment under review as
    // it is, so one that committed before this write (which waited for its lock, or on
    // SQLite for its transaction) is read here; one after it finds the payment FALLIDA and
    // compensates the charge itself. Read here, it refuses a FALLIDA on-call wrote without
    // having seen it, which nothing would ever compensate.
    if event == Event::ResolveFailed {
        let known = provider.succeeded.clone();
        let now = with_reported_charges(&tx, current.id, known).await?;
        if let Some(late) = now
            .iter()
            .find(|c| provider.succeeded.iter().all(|s| s.id != c.id))
            .map(|c| c.id.clone())
        {
            tx.rollback().await?;
            let mut provider = provider;
            provider.succeeded = now;
            return Err(provider.disagrees(&format!(
                "The provider's webhooks reported charge {late} succeeded while this resolution was being written: nothing was changed. Read the payment again; FALLIDA with reembolsar refunds it."
            )));
        }
        let source = webhook_source(state.settings.gateway);
        // A charge an earlier resolution settled outside pagos, overruling the provider
        // (kept by agreement, money returned another way), is not refunded now: how much
        // of it went back is on-call's record, not pagos'; a refund of all that is left of
        // it could give it back twice.
        if reembolsar
            && let Some(settled) =
                crate::webhooks::consumer::settled_outside_pagos(&tx, source, &charged).await?
        {
            tx.rollback().await?;
            tracing::warn!(payment_id = %current.id, operator = %who.name, charge = %settled, "reembolsar refused: an earlier resolution settled the charge outside pagos");
            return Err(Problem::new(ProblemType::PaymentNotRefundable)
                .detail(format!(
                    "Charge {settled} was settled outside pagos by an earlier FALLIDA resolution that overruled the provider (kept by agreement, or money returned another way: the payment's audit trail says how): pagos does not know how much of it went back, and does not refund it again. Give back what is still owed in the provider's dashboard, then resolve the payment FALLIDA with contraProveedor saying so. Nothing was changed: the payment is still REVISION_MANUAL."
                ))
                .with("cargo", &settled)
                .into());
        }
        // Made FALLIDA knowing of these charges: the provider's later report of one
        // changes nothing (a second refund of money returned, or the payment reopened).
        crate::webhooks::consumer::record_known_charges(
            &tx,
            source,
            current.id,
            &provider.succeeded,
            overrule.is_some(),
        )
        .await?;
    }
    // The refunds commit with the resolution: a FALLIDA answer is never written without
    // the refunds that make it true. Each charge is refunded (what is left of it), given
    // back already, or the whole resolution is refused and nothing is written.
    let mut refunds = Vec::new();
    for charge in &charged {
        // Names the operator as a resolution's reason does, so the refund's trail and the
        // console name who asked, not only the break-glass actor `admin`.
        let why = resolution_reason(
            &who.name,
            &format!(
                "FALLIDA, and asked to refund charge {} ({motivo})",
                charge.id
            ),
        );
        // On-call asked, having read why any earlier compensation of the charge failed:
        // a failed one is refunded again (a new refund, a key of its own).
        let compensation = crate::saga::refund::compensate_in(
            &tx,
            &resolved,
            charge,
            Actor::Admin,
            &why,
            AfterFailure::RefundAgain,
            false,
        )
        .await?;
        if !compensation.gives_back() {
            tx.rollback().await?;
            let blocking = match &compensation {
                Compensation::Taken(r) | Compensation::Unsettled(r) => Some(r.id),
                _ => None,
            };
            let mut problem = Problem::new(ProblemType::PaymentNotRefundable).detail(format!(
                "Charge {} cannot be refunded now: {}. Nothing was changed: the payment is still REVISION_MANUAL.",
                charge.id,
                compensation.why_not()
            ));
            problem = problem.with("cargo", &charge.id);
            if let Some(id) = blocking {
                problem = problem.with("reembolsoId", id);
            }
            return Err(problem.into());
        }
        if let Compensation::Started(r) = compensation {
            refunds.push(r.id);
        }
    }
    tx.commit().await?;
    tracing::info!(payment_id = %resolved.id, estado = %resolved.state, refunds = refunds.len(), operator = %who.name, "payment resolved by on-call");
    // Sent now rather than at the next pass; what is left in between the reconciler
    // settles as any refund.
    let deps = state.saga_deps();
    let limits = state.reconciler.refund_limits();
    let sent = refunds.clone();
    for id in refunds {
        let (deps, limits) = (deps.clone(), limits);
        let sent = state
            .tasks
            .spawn(async move {
                crate::saga::refund::reconcile::reconcile_one(&deps, &limits, id, false).await
            })
            .await;
        match sent {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                tracing::error!(refund_id = %id, error = %err, "sending a compensation refund failed; the reconciler will");
            }
            Err(err) => {
                tracing::error!(refund_id = %id, error = %err, "sending a compensation refund stopped; the reconciler will");
            }
        }
    }
    // As it stands after the sends: a compensation refund the provider failed at once
    // took it back to REVISION_MANUAL. The resolution is committed: a read that fails now
    // answers what was written, never an error that would say nothing changed.
    let as_asked = resolved.state;
    let payment = match store::find_payment(&state.db, resolved.id).await {
        Ok(Some(now)) => now,
        Ok(None) => resolved,
        Err(err) => {
            tracing::warn!(payment_id = %resolved.id, error = %err, "reading the resolved payment again failed; answering it as written");
            resolved
        }
    };
    Ok(Resolved {
        payment,
        as_asked,
        refunds: sent,
    })
}

/// Runs a reconciliation now, for one payment (404 if there is none) or every due one, in
/// a task of its own, recorded with who asked (`actions::audited`).
pub async fn reconcile_now(
    state: &AppState,
    who: &Admin,
    pago_id: Option<Uuid>,
) -> Result<Report, ApiError> {
    who.may_act()?;
    if let Some(id) = pago_id {
        store::find_payment(&state.db, id)
            .await?
            .ok_or_else(not_found)?;
    }
    tracing::info!(operator = %who.name, pago_id = ?pago_id, "reconciliation asked by on-call");
    let asked = match pago_id {
        Some(id) => Asked {
            action: Action::ReconcilePayment,
            target: Some(id),
            what: "reconcile the payment now".to_owned(),
        },
        None => Asked {
            action: Action::ReconcilePass,
            target: None,
            what: "run a pass now".to_owned(),
        },
    };
    // Its own task: a caller that hangs up (curl timeout, Ctrl-C) must not stop a pass
    // halfway and leave its claimed payments waiting out their lease.
    // A pass claims nothing more once `serve` is told to stop, as the periodic one: what it
    // claimed and had not taken up is due again when its claims run out.
    let reconciler = state.reconciler.clone();
    let stopping = state.stopping.subscribe();
    let work = async move {
        match pago_id {
            Some(id) => reconcile::reconcile_one(&reconciler, id, store::When::Now).await,
            // What it did before is logged: on-call is answered the error.
            None => reconcile::run_pass(&reconciler, Some(&stopping)).await.map_err(|err| {
                tracing::error!(error = %err.source, done = ?err.report, "reconciliation pass cut short");
                err.source
            }),
        }
    };
    actions::audited(state, who, asked, work, Report::in_words).await
}

/// Reconciles one refund now, due or not (404 if there is none), recorded with who asked.
pub(crate) async fn reconcile_refund_now(
    state: &AppState,
    who: &Admin,
    id: Uuid,
) -> Result<Report, ApiError> {
    who.may_act()?;
    crate::saga::refund::store::find(&state.db, id)
        .await?
        .ok_or_else(|| {
            ApiError::from(Problem::new(ProblemType::NotFound).detail("No refund with this id."))
        })?;
    tracing::info!(operator = %who.name, reembolso_id = %id, "refund reconciliation asked by on-call");
    // Its own task: a caller that hangs up must not stop the refund's work halfway.
    let (deps, limits) = (state.saga_deps(), state.reconciler.refund_limits());
    let work = async move {
        let reembolsos =
            crate::saga::refund::reconcile::reconcile_one(&deps, &limits, id, false).await?;
        Ok::<_, sea_orm::DbErr>(Report {
            reembolsos,
            ..Report::default()
        })
    };
    let asked = Asked {
        action: Action::ReconcileRefund,
        target: Some(id),
        what: "reconcile the refund now".to_owned(),
    };
    actions::audited(state, who, asked, work, Report::in_words).await
}

/// Whose a charge is when it is not the payment's that a resolution would record it on.
enum ChargeHolder {
    /// Another payment: pagos recorded the charge as its own (`reported` false), or the
    /// provider's webhooks reported the charge for it (`reported` true).
    Payment {
        payment: Box<payment::Model>,
        reported: bool,
    },
    /// The provider's webhooks reported the charge for this reference, which names no
    /// payment of pagos.
    Reference(String),
}

/// The refusal (409 `charge-belongs-to-another-payment`, nothing written) of recording
/// `charge` on `current` when it is already another payment's, any merchant's: the
/// provider's webhooks reported it for another reference (`charge_reported_for_another`:
/// the gateway's own word on whose it is, which no `contraProveedor` overrules), or pagos
/// recorded it as another payment's charge (`payments.gateway_ref`). None when it is no
/// other payment's.
///
/// The refusal names the other payment (`pagoId`) only when it is the same merchant's:
/// the refusal is kept in the audit trail (`GET /admin/acciones`, which every operator
/// reads, the read-only ones too), shown on the console and pasted into tickets about
/// this merchant's payment; another merchant's payment id is of no use to settle this one
/// (the provider's dashboard shows the charge's reference, should on-call need it) and is
/// not this merchant's to see.
///
/// Cost: the payments are read by `gateway_ref`, which has no index: a full scan of the
/// table (`saga::store::others_with_charge` says what it measured), fine for a resolution
/// by hand. That is why it is read before the write transaction, not in it: on SQLite the
/// write transaction holds the database's write lock, and every payment would wait for
/// the scan.
///
/// What that leaves: a payment settled with this very charge after this read and before
/// the resolution commits is not seen. A webhook's report is (the resolution reads the
/// reports again in its write transaction, `charge_reported_for_another`); what is left
/// is a request or the reconciler settling another payment with it from the provider's
/// answer about that payment, in the milliseconds of the resolution's own write. Closing
/// that would take a unique index on `payments.gateway_ref`, or a lock every writer of it
/// takes; neither is kept for it.
async fn charge_of_another(
    db: &impl sea_orm::ConnectionTrait,
    current: &payment::Model,
    charge: &str,
) -> Result<Option<ApiError>, ApiError> {
    if let Some(refusal) = charge_reported_for_another(db, current, charge).await? {
        return Ok(Some(refusal));
    }
    let mut others = store::others_with_charge(db, charge, current.id).await?;
    let same_merchant = others
        .iter()
        .position(|p| p.merchant_id == current.merchant_id);
    let Some(payment) = (match same_merchant {
        Some(at) => Some(others.swap_remove(at)),
        None => others.pop(),
    }) else {
        return Ok(None);
    };
    Ok(Some(charge_refused(
        current,
        charge,
        ChargeHolder::Payment {
            payment: Box::new(payment),
            reported: false,
        },
    )))
}

/// The refusal of recording `charge` on `current` when the provider's webhooks reported it
/// for another reference (`webhook_charges`), read by its primary key. The resolution
/// reads it in its write transaction too: a webhook's consumer writes its report in the
/// transaction that settles the payment it names, so a webhook settling another payment
/// with this charge while the provider was asked is seen (on SQLite, whose write
/// transactions take turns, whenever it committed before the resolution's; on PostgreSQL,
/// when it committed before this read).
async fn charge_reported_for_another(
    db: &impl sea_orm::ConnectionTrait,
    current: &payment::Model,
    charge: &str,
) -> Result<Option<ApiError>, ApiError> {
    use crate::entities::webhook_charge as reported;
    use crate::webhooks::{SOURCE_HTTP, SOURCE_MERCADOPAGO, SOURCE_STRIPE};
    // Every source named: the primary key is (source, charge id), and PostgreSQL reads
    // it by its first column.
    let reports = reported::Entity::find()
        .filter(reported::Column::Source.is_in([SOURCE_HTTP, SOURCE_STRIPE, SOURCE_MERCADOPAGO]))
        .filter(reported::Column::ChargeId.eq(charge))
        .all(db)
        .await?;
    for report in reports {
        // The payment the report's reference names, even one written after the report
        // (a payment restored after its charge was reported).
        let tied = report
            .payment_id
            .or_else(|| Uuid::parse_str(report.reference.trim()).ok());
        if tied == Some(current.id) {
            continue;
        }
        let holder = match tied {
            Some(other) => match store::find_payment(db, other).await? {
                Some(payment) => ChargeHolder::Payment {
                    payment: Box::new(payment),
                    reported: true,
                },
                None => ChargeHolder::Reference(report.reference),
            },
            None => ChargeHolder::Reference(report.reference),
        };
        return Ok(Some(charge_refused(current, charge, holder)));
    }
    Ok(None)
}

/// The 409 `charge-belongs-to-another-payment` of recording `charge` on `current`, which
/// `holder` holds: with `cargo`, `fuente` (`pagos`: another payment's recorded charge;
/// `webhook`: the provider's reports) and, for the same merchant's payment only, `pagoId`.
fn charge_refused(current: &payment::Model, charge: &str, holder: ChargeHolder) -> ApiError {
    let (said, fuente, pago) = match &holder {
        ChargeHolder::Payment { payment, reported } => {
            let whose = if payment.merchant_id == current.merchant_id {
                format!(
                    "payment {} of this merchant ({})",
                    payment.id, payment.state
                )
            } else {
                "a payment of another merchant".to_owned()
            };
            let said = if *reported {
                format!("The provider's webhooks reported charge {charge} for {whose}")
            } else {
                format!("Charge {charge} is already the charge of {whose}")
            };
            let pago = (payment.merchant_id == current.merchant_id).then_some(payment.id);
            (said, if *reported { "webhook" } else { "pagos" }, pago)
        }
        ChargeHolder::Reference(reference) => (
            format!(
                "The provider's webhooks reported charge {charge} for reference {reference}, which is not this payment"
            ),
            "webhook",
            None,
        ),
    };
    let mut problem = Problem::new(ProblemType::ChargeOfAnotherPayment)
        .detail(format!(
            "{said}: it is not this payment's charge, and recorded here a refund of this payment would refund another customer's charge. Nothing was changed: the payment is still REVISION_MANUAL. Check the charge in the provider's dashboard (its reference is the payment it was made for), then resolve naming this payment's own charge, or without gatewayRef."
        ))
        .with("cargo", charge)
        .with("fuente", fuente);
    if let Some(id) = pago {
        problem = problem.with("pagoId", id);
    }
    problem.into()
}

/// The code (or `declined`) of `charge` when the provider's webhooks last reported it
/// failed for `payment`.
async fn reported_failed(
    db: &impl sea_orm::ConnectionTrait,
    payment: uuid::Uuid,
    charge: &str,
) -> Result<Option<String>, ApiError> {
    use crate::entities::webhook_charge::{self as reported, ReportedStatus};
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let row = reported::Entity::find()
        .filter(reported::Column::PaymentId.eq(payment))
        .filter(reported::Column::ChargeId.eq(charge))
        .filter(reported::Column::Status.eq(ReportedStatus::Declined))
        .one(db)
        .await?;
    Ok(row.map(|r| r.decline_code.unwrap_or_else(|| "declined".to_owned())))
}

/// `charged` (what the provider's search showed) and every charge of `payment` its
/// webhooks reported succeeded that the search did not show.
async fn with_reported_charges(
    db: &impl sea_orm::ConnectionTrait,
    payment: uuid::Uuid,
    mut charged: Vec<crate::gateway::Charge>,
) -> Result<Vec<crate::gateway::Charge>, ApiError> {
    use crate::entities::webhook_charge::{self as reported, ReportedStatus};
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let rows = reported::Entity::find()
        .filter(reported::Column::PaymentId.eq(payment))
        .filter(reported::Column::Status.eq(ReportedStatus::Succeeded))
        .all(db)
        .await?;
    for row in rows {
        if charged.iter().all(|c| c.id != row.charge_id) {
            charged.push(crate::gateway::Charge {
                id: row.charge_id,
                status: crate::gateway::ChargeStatus::Succeeded,
                amount: row.amount,
                currency: row.currency,
                reference: row.reference,
                decline_code: None,
                charged_back: false,
            });
        }
    }
    Ok(charged)
}
