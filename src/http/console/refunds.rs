//! On-call's actions on a payment's refunds, from the payment's page: **reconcile now** of
//! a refund in flight and **resolve** of a refund under review. Each goes through the admin
//! API's own function (`admin::reconcile_refund_now`, recorded with who asked;
//! `refund_resolution::resolve_by_hand`, which asks the provider first and refuses what it
//! contradicts), with the payment forms' CSRF token, roles and redirect after the POST.
//! The page shows a card for each refund that needs on-call, and its timeline on-call's
//! moves of the refunds and the "reconcile now" asked of them.

use super::view::{age, money, refund_badge, time};
use super::{
    Asked, Console, CsrfForm, Held, LECTOR_REFUSED, TIMELINE_ASKS, came_of, detail_error,
    error_page, nothing_such, parse_id, provider_answer,
};
use crate::entities::refund;
use crate::entities::refund_transition::{self as transitions, Actor};
use crate::http::AppState;
use crate::http::admin::{self, operator_in};
use crate::http::extract::PathId;
use crate::http::problem::ApiError;
use crate::http::refund_resolution::{self, ResolucionReembolso};
use crate::operators::actions::{self, Action};
use axum::Form;
use axum::extract::State;
use axum::extract::rejection::FormRejection;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use pagos_types::RefundState;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde::Deserialize;
use std::collections::HashMap;
use uuid::Uuid;

/// A refund in flight, which "reconcile now" asks the provider about.
fn in_flight(r: &refund::Model) -> bool {
    matches!(r.state, RefundState::EnProceso | RefundState::Enviado)
}

/// A refund on-call acts on from the page: in flight, or under review.
pub(super) fn needs_on_call(r: &refund::Model) -> bool {
    in_flight(r) || r.state == RefundState::RevisionManual
}

/// The id of a refund's card on the payment's page.
fn anchor(id: Uuid) -> String {
    format!("refund-{id}")
}

/// A refund's id as the page shortens it.
fn short(id: Uuid) -> String {
    format!("{}…", &id.to_string()[..8])
}

/// The state cell of a refund's row: its badge, and a link to its card when on-call may
/// act on it.
pub(super) fn state_cell(r: &refund::Model, may_act: bool) -> Markup {
    html! {
        (refund_badge(r.state))
        @if may_act && needs_on_call(r) {
            " " a.to-action href={ "#" (anchor(r.id)) } {
                @if in_flight(r) { "Reconcile now ↓" } @else { "Resolve ↓" }
            }
        }
    }
}

/// What the page reads of the payment's refunds besides their rows.
pub(super) struct Trails {
    /// Every move of the refunds, oldest first.
    moves: Vec<transitions::Model>,
    /// The "reconcile now" asked of them, newest first.
    pub(super) asks: Vec<actions::Row>,
}

impl Trails {
    pub(super) async fn read(
        state: &AppState,
        refunds: &[refund::Model],
    ) -> Result<Trails, ApiError> {
        let ids: Vec<Uuid> = refunds.iter().map(|r| r.id).collect();
        let moves = if ids.is_empty() {
            Vec::new()
        } else {
            transitions::Entity::find()
                .filter(transitions::Column::RefundId.is_in(ids.iter().copied()))
                .order_by_asc(transitions::Column::CreatedAt)
                .order_by_asc(transitions::Column::Id)
                .all(&state.db)
                .await?
        };
        let asks =
            actions::list_on(&state.db, Action::ReconcileRefund, &ids, TIMELINE_ASKS).await?;
        Ok(Trails { moves, asks })
    }

    /// On-call's moves of the refunds (resolutions, refunds started by a resolution), for
    /// the payment's timeline.
    pub(super) fn by_on_call(&self) -> impl Iterator<Item = &transitions::Model> {
        self.moves.iter().filter(|t| t.actor == Actor::Admin)
    }

    /// The reason of each refund's latest move: why it is where it is.
    fn last_reasons(&self) -> HashMap<Uuid, &str> {
        self.moves
            .iter()
            .map(|t| (t.refund_id, t.reason.as_str()))
            .collect()
    }
}

/// A move of one of the payment's refunds, in its timeline.
pub(super) fn move_entry(t: &transitions::Model) -> Markup {
    let who = match (t.actor == Actor::Admin)
        .then(|| operator_in(&t.reason))
        .flatten()
    {
        Some(operator) => format!("{operator} ({})", t.actor.as_str()),
        None => t.actor.as_str().to_owned(),
    };
    html! {
        li.refund {
            div.when { (time(t.created_at)) " · by " strong.actor { (who) } }
            div {
                "Refund " span.mono { (short(t.refund_id)) } ": "
                @if let Some(from) = t.from_state { (refund_badge(from)) " → " }
                (refund_badge(t.to_state))
            }
            div.reason { (t.reason) }
        }
    }
}

/// "Reconcile now" asked of one of the payment's refunds, in its timeline.
pub(super) fn ask_entry(a: &actions::Row) -> Markup {
    html! {
        li.asked {
            div.when { (time(a.at)) " · by " strong.actor { (a.operator) " (on-call)" } }
            div {
                "Reconcile now asked of refund "
                @if let Some(id) = a.target { span.mono { (short(id)) } }
            }
            div.reason { (came_of(a)) }
        }
    }
}

/// What the provider holds for a refund under review now, for on-call to resolve by.
async fn provider_says(state: &AppState, r: &refund::Model) -> Markup {
    let lookup = crate::saga::refund::reconcile::lookup_of(r);
    if lookup.gateway_ref.is_none() && !state.settings.gateway.refunds_carry_reference() {
        return html! {
            p.provider-none {
                "Mercado Pago's refunds carry no pagos reference, and this refund's Mercado Pago id is not known: find it in Mercado Pago's panel (a refund of the payment for this amount, made when this refund was sent) and give its id below."
            }
        };
    }
    let asked = Asked {
        amount: r.amount,
        currency: &r.currency,
        whose: "refund's",
        none: "The provider has no refund for this refund.",
    };
    provider_answer(
        state.gateway.lookup_refunds(&lookup),
        asked,
        |f: &crate::gateway::Refund| Held {
            id: &f.id,
            status: format!("{:?}", f.status),
            amount: f.amount,
            currency: &f.currency,
            code: f.failure_code.as_deref().map(|code| ("failure code", code)),
        },
    )
    .await
}

/// A card for each refund that needs on-call: reconcile now (in flight) or resolve (under
/// review, with what the provider holds for it now).
pub(super) async fn cards(
    state: &AppState,
    console: &Console,
    refunds: &[refund::Model],
    trails: &Trails,
    now: DateTime<Utc>,
) -> Markup {
    let acting: Vec<&refund::Model> = refunds.iter().filter(|r| needs_on_call(r)).collect();
    if acting.is_empty() {
        return html! {};
    }
    let under_review = acting
        .iter()
        .filter(|r| r.state == RefundState::RevisionManual);
    let said: HashMap<Uuid, Markup> = futures::future::join_all(
        under_review.map(|r| async move { (r.id, provider_says(state, r).await) }),
    )
    .await
    .into_iter()
    .collect();
    let why = trails.last_reasons();
    let csrf = &console.session.csrf;
    html! {
        h3 { "Refunds that need you" }
        div.actions.refund-actions {
            @for r in acting {
                section.card id=(anchor(r.id)) {
                    h4 { "Refund " span.mono { (short(r.id)) } " " (refund_badge(r.state)) }
                    dl.facts {
                        dt { "Amount" } dd { (money(r.amount, &r.currency)) }
                        dt { "Provider's refund id" } dd.mono { (r.gateway_ref.as_deref().unwrap_or("—")) }
                        @if let Some(reason) = why.get(&r.id) { dt { "Last move" } dd { (reason) } }
                        @if let Some(error) = &r.last_error {
                            dt { "Last error" } dd {
                                (error)
                                @if let Some(at) = r.last_error_at { " " span.muted { "(" (age(now - at)) " ago)" } }
                            }
                        }
                    }
                    @if in_flight(r) {
                        p.muted { "Reconcile now asks the provider about this refund and settles it if the answer is final. Only when nobody holds it." }
                        @if console.may_act() {
                            form method="post" action={ "/consola/reembolsos/" (r.id) "/reconciliar" } {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" id={ "reconcile-" (anchor(r.id)) } { "Reconcile now" }
                            }
                        } @else {
                            p.muted.lector { (LECTOR_REFUSED) }
                        }
                    } @else {
                        h4 { "The provider says now" }
                        @if let Some(said) = said.get(&r.id) { (said) }
                        @if console.may_act() {
                            (resolve_form(r, csrf))
                        } @else {
                            p.muted.lector { (LECTOR_REFUSED) }
                        }
                    }
                }
            }
        }
    }
}

/// The form that resolves refund `r`, under review; its fields' ids are the refund's own,
/// so that several refunds under review each have theirs.
fn resolve_form(r: &refund::Model, csrf: &str) -> Markup {
    let field = |name: &str| format!("{name}-{}", anchor(r.id));
    html! {
        form.stack method="post" action={ "/consola/reembolsos/" (r.id) "/resolver" } {
            input type="hidden" name="csrf" value=(csrf);
            label for=(field("estado")) { "Outcome" }
            select id=(field("estado")) name="estado" required {
                option value="" { "Choose…" }
                option value="COMPLETADO" { "Refunded: the money went back" }
                option value="FALLIDO" { "Failed: no money went back" }
            }
            p.muted {
                "pagos asks the provider before it resolves: it refuses \"the money went back\" without a succeeded refund of this amount, and \"no money went back\" while the provider shows the refund succeeded or still pending. \"No money went back\" frees the amount: if the customer must still get it, refund it again from this page (never also in the provider's dashboard)."
            }
            label for=(field("motivo")) { "Reason (kept in the refund's audit trail with your name)" }
            textarea id=(field("motivo")) name="motivo" required maxlength="1000"
                placeholder="What you saw and where: the provider's dashboard, the ticket…" {}
            label for=(field("gatewayRef")) { "Provider's refund id (optional)" }
            input type="text" id=(field("gatewayRef")) name="gatewayRef" maxlength="255";
            button type="submit" id=(field("resolve")) { "Resolve refund" }
        }
    }
}

fn not_found(console: &Console) -> Response {
    nothing_such(console, "refund")
}

/// The form of an action on the refund `id` (the path's), and the refund: refused as
/// `Console::acting_form` refuses, then 404 for an id that names no refund.
async fn acting_on_refund<F>(
    state: &AppState,
    console: &Console,
    form: Result<Form<F>, FormRejection>,
    csrf: fn(&F) -> Option<&str>,
    id: &str,
) -> Result<(F, refund::Model), Box<Response>> {
    let form = console.acting_form(form, csrf)?;
    let uuid = parse_id(id).ok_or_else(|| Box::new(not_found(console)))?;
    match crate::saga::refund::store::find(&state.db, uuid).await {
        Ok(Some(found)) => Ok((form, found)),
        Ok(None) => Err(Box::new(not_found(console))),
        Err(err) => Err(Box::new(error_page(console, err.into()))),
    }
}

/// The payment's page, told `done`.
fn back_to(r: &refund::Model, done: &str) -> Response {
    Redirect::to(&format!("/consola/pagos/{}?hecho={done}", r.payment_id)).into_response()
}

/// On-call reconciles a refund now: the admin API's, recorded with who asked.
pub(super) async fn reconcile(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let r = match acting_on_refund(&state, &console, form, |f| f.csrf.as_deref(), &id).await {
        Ok((_, r)) => r,
        Err(refusal) => return *refusal,
    };
    match admin::reconcile_refund_now(&state, &console.admin(), r.id).await {
        Ok(report) if report.reembolsos.errores > 0 => back_to(&r, "reconciliacion-fallida"),
        Ok(report) if report.reembolsos.omitidos > 0 => back_to(&r, "reembolso-omitido"),
        Ok(_) => back_to(&r, "reembolso-reconciliado"),
        Err(err) => detail_error(&state, &console, &r.payment_id.to_string(), err).await,
    }
}

#[derive(Deserialize)]
pub(super) struct ResolveRefundForm {
    csrf: Option<String>,
    estado: Option<String>,
    motivo: Option<String>,
    #[serde(rename = "gatewayRef")]
    gateway_ref: Option<String>,
}

/// On-call settles a refund under review: the admin API's resolution, which asks the
/// provider first; a refusal is shown on the payment's page and changes nothing.
pub(super) async fn resolve(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<ResolveRefundForm>, FormRejection>,
) -> Response {
    let (form, r) = match acting_on_refund(&state, &console, form, |f| f.csrf.as_deref(), &id).await
    {
        Ok(acting) => acting,
        Err(refusal) => return *refusal,
    };
    let request = ResolucionReembolso {
        estado: form.estado.unwrap_or_default(),
        motivo: form.motivo.unwrap_or_default(),
        gateway_ref: form.gateway_ref.filter(|g| !g.trim().is_empty()),
        contra_proveedor: None,
    };
    match refund_resolution::resolve_by_hand(&state, &console.admin(), r.id, request).await {
        Ok(_) => back_to(&r, "reembolso-resuelto"),
        Err(err) => detail_error(&state, &console, &r.payment_id.to_string(), err).await,
    }
}
