//! On-call's settlement of a refund under review, `POST /admin/reembolsos/{id}/resolucion`,
//! checked against the provider first as a payment's is (`admin::resolve_by_hand`, the
//! pieces both share in `provider_check`).
//!
//! pagos asks the provider what it holds for the refund before it writes anything, adds
//! the refunds its webhooks reported succeeded or pending that its search does not show
//! (a search lags behind its events; `webhooks::refunds::reported_for_refund`), and
//! refuses a resolution the provider contradicts (409 `provider-disagrees`, the refunds
//! under `reembolsos`, each with its `fuente`, nothing written): `FALLIDO` frees what is
//! left to refund and tells the merchant `reembolso.fallido`, who refunds again with a new
//! key — written while the provider shows the refund made, the customer gets the money
//! twice; `COMPLETADO` tells the merchant money went back. A look-up that fails is a 503
//! that changes nothing (a `FALLIDO` while a webhook reported the refund succeeded or
//! pending: the 409). On-call overrules the provider only by saying why
//! (`contraProveedor`), kept in the refund's audit row with what the provider showed — or,
//! when it cannot be asked, with the look-up's error.
//!
//! Mercado Pago's refunds carry no pagos reference: its look-up finds a refund only by the
//! id an answer gave. For a refund whose answer was lost, on-call names the refund found
//! in Mercado Pago's panel (`gatewayRef`, which pagos asks Mercado Pago about) or
//! overrules.

use super::AppState;
use super::actions;
use super::admin::{Transicion, resolution_motivo, resolution_reason};
use super::auth::{Admin, AdminTokenRefused, ReadOnlyRole};
use super::extract::{self, PathId, field_error};
use super::problem::{ApiError, BodyTooLarge, MalformedBody, NotJson, Problem, ProblemType};
use super::provider_check::{self, Choice};
use crate::entities::refund;
use crate::gateway::{GatewayError, Refund, RefundStatus};
use crate::operators::actions::Action;
use crate::representation::reembolso;
use crate::saga::refund::reconcile::lookup_of;
use crate::saga::refund::state::{Event, RefundState};
use crate::saga::refund::store::{self, Changes, Written};
use crate::saga::refund::{self as refunds, Actor};
use crate::saga::store::SagaRow;
use crate::webhooks::refunds::{as_refund, reported_for_refund};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use pagos_types::Reembolso;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(resolve_refund))
        .layer(DefaultBodyLimit::max(super::payments::MAX_BODY))
}

/// On-call's settlement of a refund under review: the body of
/// `POST /admin/reembolsos/{id}/resolucion` (read by `extract::json_object`, as the
/// merchant API reads its bodies) and the console's form.
#[derive(Debug, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolucionReembolso {
    /// COMPLETADO (the provider shows the money went back) or FALLIDO (it shows none did)
    #[schema(value_type = super::extract::EstadoResolucionReembolso)]
    pub(crate) estado: String,
    /// Why (what the provider's dashboard showed, the ticket): kept in the audit trail.
    /// 1–1000 characters once trimmed, without NUL.
    #[schema(min_length = 1, max_length = 1000, pattern = r"\S")]
    pub(crate) motivo: String,
    /// The provider's refund id. With `COMPLETADO` it must be a succeeded refund of the
    /// refund's amount and currency that the provider holds for this refund (absent: the
    /// refund's own if it is one, else the one such refund); with `FALLIDO`, a refund the
    /// provider holds for this refund. Never the provider's refund of another of the
    /// payment's refunds. With Mercado Pago, whose refunds carry no pagos reference, it is
    /// how pagos finds a refund whose id its answer never gave: the refund named is asked
    /// of Mercado Pago.
    #[serde(rename = "gatewayRef")]
    #[schema(min_length = 1, max_length = 255, pattern = r"\S")]
    pub(crate) gateway_ref: Option<String>,
    /// On-call overrules what the provider shows (money returned another way, a search that
    /// does not find a refund its dashboard shows), or a provider that cannot be asked (a
    /// look-up that keeps failing; Mercado Pago without the refund's id): why, 1–1000
    /// characters, written to the audit row with what the provider showed or the
    /// look-up's error. Without it a resolution the provider contradicts is refused (409
    /// `provider-disagrees`), and one it cannot be asked about is a 503.
    #[serde(rename = "contraProveedor")]
    #[schema(min_length = 1, max_length = 1000, pattern = r"\S")]
    pub(crate) contra_proveedor: Option<String>,
}

/// A refund with its audit trail, as on-call sees it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DetalleReembolso {
    pub reembolso: Reembolso,
    /// The audit trail, oldest first.
    pub transiciones: Vec<Transicion>,
}

fn not_found() -> ApiError {
    Problem::new(ProblemType::NotFound)
        .detail("No refund with this id.")
        .into()
}

fn not_under_review(detail: impl Into<String>) -> ApiError {
    Problem::new(ProblemType::NotUnderReview)
        .detail(detail)
        .into()
}

/// On-call settles a refund in `REVISION_MANUAL`, after pagos asked the provider about it.
#[utoipa::path(
    post,
    path = "/admin/reembolsos/{id}/resolucion",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = Uuid, Path, description = "The refund id")),
    request_body = ResolucionReembolso,
    responses(
        (status = 200, description = "Settled; the refund and its audit trail. Who asked, what, and what came of it (a refusal too) is recorded (`GET /admin/acciones`, `resolve_refund`)", body = DetalleReembolso),
        AdminTokenRefused,
        super::auth::TooManyFailedAuthentications,
        ReadOnlyRole,
        MalformedBody,
        (status = 404, description = "No such refund", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing was changed: the refund is not in REVISION_MANUAL (`not-under-review`); or what the provider shows for it contradicts the resolution (`provider-disagrees`, with `reembolsos`: the provider's refunds found for it): `COMPLETADO` with no succeeded refund of its amount and currency, a `gatewayRef` that is not one (or is already the provider's refund of another refund, of this payment or another, overruled or not), `FALLIDO` while the provider shows it succeeded or still pending (its search, or its webhooks: `fuente`), or Mercado Pago without the refund's id (name it with `gatewayRef`, or overrule)", body = Problem, content_type = "application/problem+json"),
        BodyTooLarge,
        NotJson,
        (status = 422, description = "`validation-failed`, every field at fault listed in `errores` (and said in `detail`): a body that is not a JSON object (`(cuerpo)`), a member written twice, unknown or of another type, `estado` or `motivo` missing; bad estado, empty motivo, gatewayRef or contraProveedor, or either too long (these recorded as a refusal, `GET /admin/acciones`); COMPLETADO overruling a provider that answers, without gatewayRef. Nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Who asked could not be recorded (`GET /admin/acciones`), so nothing was done (Retry-After); or the provider could not be asked about the refund; nothing was changed (Retry-After). `contraProveedor` resolves it without the provider (a `FALLIDO` while its webhooks reported the refund succeeded or pending is the 409; a `COMPLETADO` its webhooks reported succeeded, for its amount and currency, is taken, the audit row saying the provider could not be asked)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn resolve_refund(
    State(state): State<AppState>,
    admin: Admin,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetalleReembolso>, ApiError> {
    admin.may_act()?;
    let id = Uuid::parse_str(&id).map_err(|_| not_found())?;
    let asked = extract::resolution(&headers, body, false)?;
    let request = ResolucionReembolso {
        estado: asked.estado,
        motivo: asked.motivo,
        gateway_ref: asked.gateway_ref,
        contra_proveedor: asked.contra_proveedor,
    };
    Ok(Json(resolve_by_hand(&state, &admin, id, request).await?))
}

/// On-call settles refund `id` under review (the admin API's and the console's one way):
/// `estado` COMPLETADO or FALLIDO, a reason for the audit trail, which names `admin`.
/// The provider is asked first: a resolution it contradicts is refused (409
/// `provider-disagrees`) unless on-call overrules it, saying why; one it cannot be asked
/// about is a 503. Either refusal changes nothing.
///
/// Recorded with who asked (`actions::audited`, `resolve_refund` on the refund): the row
/// is written before anything else (none written: 503, nothing done) and completed with
/// the state the refund was left in, or with why it was refused. Runs in a task of its
/// own. No refund with this id: a 404, no row.
pub(crate) async fn resolve_by_hand(
    state: &AppState,
    admin: &Admin,
    id: Uuid,
    request: ResolucionReembolso,
) -> Result<DetalleReembolso, ApiError> {
    admin.may_act()?;
    store::find(&state.db, id).await?.ok_or_else(not_found)?;
    let asked = actions::Asked {
        action: Action::ResolveRefund,
        target: Some(id),
        what: asked_in_words(&request),
    };
    let (task_state, operator) = (state.clone(), admin.name.clone());
    let work = async move { resolve_unrecorded(&task_state, &operator, id, request).await };
    actions::audited(state, admin, asked, work, came_of).await
}

/// What on-call asked of a refund's resolution, for its audit row: `resolve the refund
/// COMPLETADO: <motivo>`, with the provider's refund named, the overrule.
fn asked_in_words(request: &ResolucionReembolso) -> String {
    let mut what = format!("resolve the refund {}", actions::said(&request.estado));
    if let Some(named) = &request.gateway_ref {
        what.push_str(&format!(" (provider's refund {})", actions::said(named)));
    }
    provider_check::asked_in_words(&what, request.contra_proveedor.as_deref(), &request.motivo)
}

/// What came of a refund's resolution, for its audit row.
fn came_of(done: &DetalleReembolso) -> String {
    format!("resolved {}", done.reembolso.state)
}

/// What on-call asked of a refund's resolution, its fields checked.
struct Checked<'a> {
    event: Event,
    motivo: &'a str,
    /// The provider's refund on-call names (`gatewayRef`).
    named: Option<&'a str>,
    overrule: Option<String>,
}

/// `request`'s fields checked, before anything is read: a 422 listing every one at fault.
fn checked(request: &ResolucionReembolso) -> Result<Checked<'_>, ApiError> {
    let mut faults = Vec::new();
    let event = match request.estado.as_str() {
        "COMPLETADO" => Some(Event::ResolveCompleted),
        "FALLIDO" => Some(Event::ResolveFailed),
        _ => {
            faults.push(field_error("estado", "must be COMPLETADO or FALLIDO"));
            None
        }
    };
    let motivo = resolution_motivo(&request.motivo)
        .map_err(|e| faults.push(e))
        .ok();
    let named = provider_check::gateway_ref(request.gateway_ref.as_deref())
        .map_err(|e| faults.push(e))
        .ok();
    let overrule = provider_check::overrule(request.contra_proveedor.as_deref())
        .map_err(|e| faults.push(e))
        .ok();
    match (event, motivo, named, overrule) {
        (Some(event), Some(motivo), Some(named), Some(overrule)) if faults.is_empty() => {
            Ok(Checked {
                event,
                motivo,
                named,
                overrule,
            })
        }
        _ => Err(provider_check::invalid(faults)),
    }
}

/// `resolve_by_hand`'s work, once its row is written, as `operator` (who may act: checked
/// before the row was).
async fn resolve_unrecorded(
    state: &AppState,
    operator: &str,
    id: Uuid,
    request: ResolucionReembolso,
) -> Result<DetalleReembolso, ApiError> {
    let Checked {
        event,
        motivo,
        named,
        overrule,
    } = checked(&request)?;
    let current = store::find(&state.db, id).await?.ok_or_else(not_found)?;
    if current.state != RefundState::RevisionManual {
        return Err(not_under_review(format!(
            "The refund is {}, not REVISION_MANUAL: only refunds under review are resolved by hand.",
            current.state
        )));
    }
    // What the provider says, asked before anything is written: a look-up that fails
    // changes nothing (503) unless on-call overrules it; a FALLIDO its webhooks contradict
    // is refused then too, as it is when the provider answers.
    let provider = ProviderSays::ask(state, &current, named).await?;
    // While the provider cannot be asked, its own event that the refund succeeded is
    // evidence enough for COMPLETADO (`checked_against` holds it to the refund's amount
    // and currency, and to a named one); anything else waits for its answer or an
    // overrule.
    let mut unasked = None;
    if let Search::Unreachable(err) = &provider.search {
        let reported_success = event == Event::ResolveCompleted
            && provider.reported.iter().any(|r| {
                r.status == RefundStatus::Succeeded
                    && r.amount == current.amount
                    && r.currency == current.currency
            });
        if overrule.is_none() && !reported_success {
            return Err(provider.unreachable(event, err));
        }
        if overrule.is_some() {
            tracing::warn!(refund_id = %current.id, error = %err, "the provider could not be asked about a refund on-call resolves overruling it");
        } else {
            unasked = Some(err.to_string());
        }
    }
    let siblings = store::of_payment(&state.db, current.payment_id).await?;
    let asked = Asked {
        event,
        named,
        overruled: overrule.is_some(),
        blind: current.gateway_ref.is_none() && !state.settings.gateway.refunds_carry_reference(),
    };
    let recorded = checked_against(&provider, &current, &asked, &siblings)?;
    if let Some(why) = money_unheld_of_this_amount(state, &current, &asked, &siblings).await? {
        return Err(provider.disagrees(&why));
    }
    // A provider refund already another refund's, another payment's or merchant's too, is
    // never this one's, overruled or not (the siblings are refused above, named). Read
    // before the write transaction: a refund settled with the same provider id in between
    // is not seen, which would count one provider refund twice but move no money.
    if let Some(id) = &recorded {
        let others = store::others_with_gateway_ref(&state.db, id, current.id).await?;
        if let Some(why) = another_refunds(&current, id, &others) {
            return Err(provider.disagrees(&why));
        }
    }
    let changes = Changes {
        failure_code: (event == Event::ResolveFailed).then(|| refunds::RESOLVED_FAILED.to_owned()),
        gateway_ref: recorded,
        ..Changes::default()
    };
    let mut reason = resolution_reason(operator, motivo);
    if let Some(err) = &unasked {
        reason = format!(
            "{reason} [the provider could not be asked ({err}); settled on what its webhooks reported: {}]",
            provider.listed()
        );
    }
    if let Some(why) = &overrule {
        reason = provider_check::overruled(&reason, &provider.which(), why);
        tracing::warn!(refund_id = %current.id, operator = %operator, estado = %request.estado, "on-call overruled what the provider shows about a refund");
    }
    let plan = current
        .plan(
            event,
            changes.into(),
            Actor::Admin,
            &reason,
            refunds::RENDER,
        )
        .map_err(|e| not_under_review(e.to_string()))?;
    let tx = crate::db::begin_write(&state.db).await?;
    let resolved = match plan.write(&tx, &current).await? {
        Written::Applied(r) => *r,
        Written::Fenced => {
            tx.rollback().await?;
            return Err(not_under_review(
                "The refund changed while resolving it; read it again and retry.",
            ));
        }
    };
    // A refund a webhook reported succeeded or pending since the provider was asked: the
    // webhook's consumer writes its report under the refund's lock and keeps a refund under
    // review as it is, so one committed before this write is read here (one after it finds
    // the refund settled). FALLIDO over it would free money that went back, or may yet.
    if event == Event::ResolveFailed
        && let Some(late) = reported_for_refund(&tx, current.id)
            .await?
            .iter()
            .map(as_refund)
            .filter(|w| w.status != RefundStatus::Failed)
            .find(|w| {
                !provider
                    .refunds()
                    .any(|seen| seen.id == w.id && seen.status == w.status)
            })
    {
        tx.rollback().await?;
        let mut provider = provider;
        provider.reported.push(late.clone());
        return Err(provider.disagrees(&format!(
            "The provider's webhooks reported refund {} {} while this resolution was being written: nothing was changed. Read the refund again.",
            late.id,
            status_word(late.status)
        )));
    }
    // The provider refund COMPLETADO stands on, reported failed by the provider's webhooks
    // while its search still shows it succeeded (a search lags behind its events), or
    // reported while this was written: COMPLETADO would count as given back money the
    // provider says never went back, and the customer would be owed it with nothing to say
    // so.
    if event == Event::ResolveCompleted
        && overrule.is_none()
        && let Some(own) = resolved.gateway_ref.as_deref()
        && let Some(failed) = reported_for_refund(&tx, current.id)
            .await?
            .iter()
            .map(as_refund)
            .find(|w| w.id == own && w.status == RefundStatus::Failed)
    {
        tx.rollback().await?;
        tracing::warn!(refund_id = %current.id, operator = %operator, provider_refund = %own, "COMPLETADO refused: the provider's webhooks reported the refund failed");
        let code = failed
            .failure_code
            .clone()
            .unwrap_or_else(|| "failed".to_owned());
        let mut provider = provider;
        provider.reported.push(failed);
        return Err(provider.disagrees(&format!(
            "The provider's webhooks reported refund {own} failed ({code}): COMPLETADO would count money as given back that the provider says never went back. Check the provider's dashboard: FALLIDO if the refund failed, or overrule with contraProveedor if the money went back. Nothing was changed."
        )));
    }
    // Read in the transaction, before the commit: nothing after it can fail and answer an
    // error that would say nothing changed.
    let trail = store::trail(&tx, resolved.id).await?;
    tx.commit().await?;
    tracing::info!(refund_id = %resolved.id, estado = %resolved.state, operator = %operator, "refund resolved by on-call");
    Ok(DetalleReembolso {
        reembolso: reembolso(&resolved),
        transiciones: trail
            .into_iter()
            .map(|t| Transicion::of(t.from_state, t.to_state, t.actor, t.reason, t.created_at))
            .collect(),
    })
}

/// Why the provider refund `id` cannot be `current`'s, when `others` (the refunds whose
/// provider refund it is) hold it: one provider refund is one pagos refund. Names the
/// other refund only when it is the same merchant's: the refusal is kept in the audit
/// trail and pasted into this merchant's tickets, and another merchant's ids are not
/// theirs to see.
fn another_refunds(current: &refund::Model, id: &str, others: &[refund::Model]) -> Option<String> {
    let other = others
        .iter()
        .find(|r| r.payment_id == current.payment_id)
        .or_else(|| others.iter().find(|r| r.merchant_id == current.merchant_id))
        .or_else(|| others.first())?;
    let whose = if other.payment_id == current.payment_id {
        format!("refund {} of this payment ({})", other.id, other.state)
    } else if other.merchant_id == current.merchant_id {
        format!(
            "refund {} of payment {} of this merchant ({})",
            other.id, other.payment_id, other.state
        )
    } else {
        "a refund of another merchant's payment".to_owned()
    };
    Some(format!(
        "Refund {id} at the provider is already the provider's refund of {whose}: one provider refund is one pagos refund, and recorded here too its money would count twice."
    ))
}

/// What on-call asked of the provider's word.
struct Asked<'a> {
    event: Event,
    /// The provider's refund id on-call named (`gatewayRef`, trimmed).
    named: Option<&'a str>,
    /// On-call overrules the provider (`contraProveedor`).
    overruled: bool,
    /// The provider's refunds carry no pagos reference and this refund's own id was never
    /// learned (Mercado Pago, its answer lost): a refund named is told from a sibling's
    /// only by what on-call read in the provider's panel.
    blind: bool,
}

/// A provider's refund as a refusal lists it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ReembolsoVisto<'a> {
    id: &'a str,
    status: RefundStatus,
    amount: i64,
    currency: &'a str,
    /// The provider's id of the charge refunded.
    charge: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_code: Option<&'a str>,
    /// `busqueda` (the provider's search, now) or `webhook` (its events).
    fuente: &'static str,
}

impl<'a> ReembolsoVisto<'a> {
    fn of(r: &'a Refund, fuente: &'static str) -> Self {
        ReembolsoVisto {
            id: &r.id,
            status: r.status,
            amount: r.amount,
            currency: &r.currency,
            charge: &r.charge,
            failure_code: r.failure_code.as_deref(),
            fuente,
        }
    }
}

fn status_word(status: RefundStatus) -> &'static str {
    match status {
        RefundStatus::Succeeded => "succeeded",
        RefundStatus::Failed => "failed",
        RefundStatus::Pending => "pending",
    }
}

/// What the provider's search shows for one refund.
enum Search {
    /// The refunds it holds for this refund (its reference, or its provider id), empty for
    /// none.
    Found(Vec<Refund>),
    /// It cannot tell which of its refunds is this one: Mercado Pago, whose refunds carry no
    /// pagos reference, with no provider id known or named.
    CannotTell,
    /// The look-up failed; only with an overrule (otherwise a 503, or a 409 for a
    /// `FALLIDO` its webhooks contradict).
    Unreachable(GatewayError),
}

/// What the provider shows for one refund: its search, and what its webhooks reported.
struct ProviderSays {
    search: Search,
    /// The refunds its webhooks reported succeeded or pending that its search does not
    /// show so far (`shown`).
    reported: Vec<Refund>,
}

/// Whether the search's `found` shows what a webhook `reported`: the same refund in the
/// same status, or settled when the webhook said pending. A webhook's success the search
/// shows otherwise stands: money went back, and a search lags behind the provider's events.
fn shown(found: &[Refund], reported: &Refund) -> bool {
    found.iter().any(|f| {
        f.id == reported.id
            && (f.status == reported.status || reported.status == RefundStatus::Pending)
    })
}

impl ProviderSays {
    /// Asks the provider about `r` as the reconciler does (`lookup_of`); with Mercado Pago
    /// and no provider id known, by the one on-call `named`, if any. Adds what its webhooks
    /// reported succeeded or pending that the search does not show. A look-up that fails
    /// is said (`Search::Unreachable`), with what the webhooks reported.
    async fn ask(
        state: &AppState,
        r: &refund::Model,
        named: Option<&str>,
    ) -> Result<ProviderSays, ApiError> {
        let mut lookup = lookup_of(r);
        let blind =
            lookup.gateway_ref.is_none() && !state.settings.gateway.refunds_carry_reference();
        if blind {
            lookup.gateway_ref = named.map(str::to_owned);
        }
        let search = match (&lookup.gateway_ref, blind) {
            (None, true) => Search::CannotTell,
            _ => match state.gateway.lookup_refunds(&lookup).await {
                Ok(found) => Search::Found(found),
                Err(err) => Search::Unreachable(err),
            },
        };
        let mut says = ProviderSays {
            search,
            reported: Vec::new(),
        };
        says.reported = reported_for_refund(&state.db, r.id)
            .await?
            .iter()
            .map(as_refund)
            .filter(|w| w.status != RefundStatus::Failed && !shown(says.found(), w))
            .collect();
        Ok(says)
    }

    /// The refunds its search found (none when it could not be asked or cannot tell).
    fn found(&self) -> &[Refund] {
        match &self.search {
            Search::Found(found) => found,
            Search::CannotTell | Search::Unreachable(_) => &[],
        }
    }

    /// Every refund it shows: its search's, then its webhooks'.
    fn refunds(&self) -> impl Iterator<Item = &Refund> {
        self.found().iter().chain(&self.reported)
    }

    /// Where `r` (one of `refunds`) comes from, in words: nothing for the search's. By
    /// identity: the search may show the same refund id in another status.
    fn source(&self, r: &Refund) -> &'static str {
        if self.reported.iter().any(|w| std::ptr::eq(w, r)) {
            " (reported by its webhook; its search does not show it so)"
        } else {
            ""
        }
    }

    /// Every refund, as a refusal lists them.
    fn seen(&self) -> Vec<ReembolsoVisto<'_>> {
        let search = self
            .found()
            .iter()
            .map(|r| ReembolsoVisto::of(r, "busqueda"));
        let webhooks = self
            .reported
            .iter()
            .map(|r| ReembolsoVisto::of(r, "webhook"));
        search.chain(webhooks).collect()
    }

    /// The refunds it shows, in words (empty for none).
    fn listed(&self) -> String {
        self.refunds()
            .map(|r| {
                format!(
                    "{} {} for {} {}{}",
                    r.id,
                    status_word(r.status),
                    r.amount,
                    r.currency,
                    self.source(r)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What it shows, in words, for a refusal's detail and an audit row.
    fn in_words(&self) -> String {
        let listed = self.listed();
        let search = match &self.search {
            Search::Found(_) if listed.is_empty() => return "no refund for this refund".into(),
            Search::Found(_) => return listed,
            Search::CannotTell => "nothing it can tell is this refund (Mercado Pago's refunds carry no pagos reference, and this refund's Mercado Pago id is not known)".to_owned(),
            Search::Unreachable(err) => format!("nothing: it could not be asked ({err})"),
        };
        if listed.is_empty() {
            search
        } else {
            format!("{listed}; its search {search}")
        }
    }

    /// The provider, as an overrule's audit row says it: `showed …`, `could not be asked`.
    fn which(&self) -> String {
        match &self.search {
            Search::Unreachable(err) if self.reported.is_empty() => {
                format!("could not be asked ({err})")
            }
            Search::Unreachable(err) => format!(
                "could not be asked ({err}), and whose webhooks reported {}",
                self.listed()
            ),
            _ => format!("showed {}", self.in_words()),
        }
    }

    /// A 409 `provider-disagrees`: `why`, then what the provider shows; nothing changed.
    fn disagrees(&self, why: &str) -> ApiError {
        provider_check::disagrees(why, &self.in_words(), "refund", "reembolsos", self.seen())
    }

    /// The answer to a resolution `event` not overruled while the provider could not be
    /// asked (`err`): a 503 that changes nothing, or, for a `FALLIDO` while its webhooks
    /// reported the refund succeeded or pending, the 409 the search would give.
    fn unreachable(&self, event: Event, err: &GatewayError) -> ApiError {
        match self.reported.first() {
            Some(r) if event == Event::ResolveFailed => self.disagrees(&format!(
                "The provider could not be asked, and its webhooks reported refund {} {} for {} {}: FALLIDO would free what is left to refund while the money may have gone back. Resolve once the provider answers, or overrule with contraProveedor.",
                r.id,
                status_word(r.status),
                r.amount,
                r.currency
            )),
            _ => provider_check::unreachable(
                "refund",
                err,
                "Try again; if it keeps failing, contraProveedor resolves it without the provider (say what its dashboard shows).",
            ),
        }
    }
}

/// Blind (`Asked::blind`), a `FALLIDO` naming a refund that gave no money back is checked
/// against that refund only, yet the one that gave this refund's money back may be beside
/// it in the charge's refund list: on-call, reading the panel, named another attempt's.
/// FALLIDO would free the amount, and refunded again the customer would get it twice. So
/// the whole list is read: a refund succeeded or pending for this refund's amount and
/// currency, other than the one named and held by no refund of the payment, refuses it
/// (the text why); `contraProveedor` overrules. The list that cannot be read: a 503.
async fn money_unheld_of_this_amount(
    state: &AppState,
    current: &refund::Model,
    asked: &Asked<'_>,
    siblings: &[refund::Model],
) -> Result<Option<String>, ApiError> {
    let Some(named) = asked.named else {
        return Ok(None);
    };
    if !asked.blind || asked.overruled || asked.event != Event::ResolveFailed {
        return Ok(None);
    }
    let listed = state
        .gateway
        .refunds_of_charge(&lookup_of(current))
        .await
        .map_err(|err| {
            provider_check::unreachable(
                "refund",
                &err,
                "Try again; if it keeps failing, contraProveedor resolves it without the provider (say what its dashboard shows).",
            )
        })?;
    let held = |id: &str| {
        siblings
            .iter()
            .any(|r| r.gateway_ref.as_deref() == Some(id))
    };
    Ok(listed
        .iter()
        .find(|r| {
            r.status != RefundStatus::Failed
                && r.id != named
                && r.amount == current.amount
                && r.currency.eq_ignore_ascii_case(&current.currency)
                && !held(&r.id)
        })
        .map(|r| {
            format!(
                "Mercado Pago's refunds carry no pagos reference, and beside refund {named} the payment's refund list shows refund {} {} for this refund's {} {}, which no pagos refund holds: it may be this refund's own. FALLIDO would free what is left to refund and tell the merchant reembolso.fallido; refunded again, the customer would get it twice. Resolve COMPLETADO naming {} if it is this refund's; if the panel shows it is not (whose it is, when it was made), overrule with contraProveedor saying so.",
                r.id,
                status_word(r.status),
                current.amount,
                current.currency,
                r.id
            )
        }))
}

/// The provider's refund id a resolution records (None: the refund's own stays), or the
/// refusal of what on-call asked because the provider contradicts it, unless on-call
/// overrules it. `siblings`: the payment's refunds (`current` among them): a provider
/// refund already recorded for another of them is never this one's, overruled or not.
fn checked_against(
    provider: &ProviderSays,
    current: &refund::Model,
    asked: &Asked<'_>,
    siblings: &[refund::Model],
) -> Result<Option<String>, ApiError> {
    let (named, overruled) = (asked.named, asked.overruled);
    if let Some(named) = named
        && let Some(other) = siblings
            .iter()
            .find(|r| r.id != current.id && r.gateway_ref.as_deref() == Some(named))
    {
        return Err(provider.disagrees(&format!(
            "gatewayRef {named} is the provider's refund of another refund of this payment ({}, {}): one provider refund is one pagos refund, and its money would count twice.",
            other.id, other.state
        )));
    }
    // Blind, a refund named may be the own of a sibling of the same charge and amount whose
    // answer has not come yet (sent, no provider id): its resend, with its own key, would
    // be answered with that very refund and settle the sibling with it too, two pagos
    // refunds counting one provider refund's money. It waits until the sibling settles or
    // is under review, where the check above sees its id. Overruled too.
    if let Some(named) = named
        && asked.blind
        && let Some(other) = siblings.iter().find(|r| {
            r.id != current.id
                && r.gateway_ref.is_none()
                && matches!(r.state, RefundState::EnProceso | RefundState::Enviado)
                && r.charge_ref == current.charge_ref
                && r.amount == current.amount
                && r.currency.eq_ignore_ascii_case(&current.currency)
        })
    {
        return Err(provider.disagrees(&format!(
            "Refund {} of this payment, for the same {} {}, was sent and its answer has not come ({}, no provider id yet): refund {named} may be its own, and its resend would be answered with it. Wait until the reconciler settles it or hands it to review (within the gateway's key window), then resolve this one.",
            other.id, other.amount, other.currency, other.state
        )));
    }
    if matches!(provider.search, Search::CannotTell) && !overruled {
        return Err(provider.disagrees(
            "Mercado Pago's refunds carry no pagos reference, and this refund's Mercado Pago id was never known (its answer was lost): pagos cannot tell whether Mercado Pago made it. Find it in Mercado Pago's panel (a refund of the payment for this amount, made when this refund was sent) and name it with gatewayRef: pagos asks Mercado Pago about it. If the panel shows none, resolve FALLIDO with contraProveedor saying so.",
        ));
    }
    let found: Vec<&Refund> = provider.refunds().collect();
    if asked.event == Event::ResolveFailed {
        if overruled {
            return Ok(named.map(str::to_owned));
        }
        if let Some(named) = named
            && !found.iter().any(|r| r.id == named)
        {
            return Err(provider.disagrees(&format!(
                "gatewayRef {named} is not a refund the provider holds for this refund (a typo, or another refund's?)."
            )));
        }
        if let Some(made) = found.iter().find(|r| r.status == RefundStatus::Succeeded) {
            return Err(provider.disagrees(&format!(
                "The provider shows money went back for this refund: refund {} succeeded for {} {}{}. FALLIDO would free what is left to refund and tell the merchant reembolso.fallido: refunded again, the customer would get it twice. Resolve COMPLETADO if it is for this refund's {} {}.",
                made.id,
                made.amount,
                made.currency,
                provider.source(made),
                current.amount,
                current.currency
            )));
        }
        if let Some(pending) = found.iter().find(|r| r.status == RefundStatus::Pending) {
            return Err(provider.disagrees(&format!(
                "Refund {} is still pending at the provider{}: it may still go through. Wait until the provider settles it, then resolve as it shows.",
                pending.id,
                provider.source(pending)
            )));
        }
        return Ok(named.map(str::to_owned));
    }
    let fits = |r: &&Refund| {
        r.status == RefundStatus::Succeeded
            && r.amount == current.amount
            && r.currency.eq_ignore_ascii_case(&current.currency)
    };
    let fitting: Vec<&str> = found
        .iter()
        .copied()
        .filter(fits)
        .map(|r| r.id.as_str())
        .collect();
    let own = current.gateway_ref.as_deref();
    match provider_check::choose(&fitting, named, own, overruled) {
        Choice::Record(id) => Ok(Some(id.to_owned())),
        Choice::KeepOwn => Ok(None),
        Choice::NamedUnfit(named) => {
            let why = match found.iter().find(|r| r.id == named) {
                Some(r) if r.status != RefundStatus::Succeeded => format!(
                    "Refund {named} is {} at the provider: no money went back by it.",
                    status_word(r.status)
                ),
                Some(r) => format!(
                    "Refund {named} is for {} {}, but this refund is for {} {}.",
                    r.amount, r.currency, current.amount, current.currency
                ),
                None => format!(
                    "gatewayRef {named} is not a refund the provider holds for this refund (a typo, or another refund's: its money would count twice)."
                ),
            };
            Err(provider.disagrees(&why))
        }
        // The provider could not be asked: on-call's word, with what it could name.
        Choice::NoneFits if overruled && matches!(provider.search, Search::Unreachable(_)) => {
            Ok(None)
        }
        // Overruled with the provider answering: the refund that gave the money back must
        // be named, so that no other refund of the payment can be resolved on it too.
        Choice::NoneFits if overruled => Err(provider_check::invalid(vec![field_error(
            "gatewayRef",
            "is required for COMPLETADO against what the provider shows: the provider's id of the refund that gave this money back (from its dashboard), so that no other refund of this payment can be settled on it too",
        )])),
        Choice::NoneFits => Err(provider.disagrees(&format!(
            "COMPLETADO needs a succeeded refund of this refund's {} {}, and the provider shows no succeeded refund of it: the merchant would be told money went back while none did. Wait while one is pending; resolve FALLIDO if none was made or it failed.",
            current.amount, current.currency
        ))),
        Choice::Several => Err(provider.disagrees(
            "The provider holds several succeeded refunds for this refund: say which one is its refund with gatewayRef (the others gave the money back again).",
        )),
    }
}
