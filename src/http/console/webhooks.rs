//! `/consola/webhooks`: merchants' webhook endpoints that fail or are `DESACTIVADO`, with
//! their last attempts and their last reactivation by on-call, and reactivation with
//! redelivery (the merchant API's own `outbox::endpoints::reactivate`, recorded with who
//! asked: `actions::audited`).

use super::{Console, LECTOR_REFUSED, Lenient, error_page, refused};
use crate::entities::webhook_endpoint::EndpointState;
use crate::entities::{merchant, webhook_attempt as attempts, webhook_endpoint as endpoints};
use crate::http::AppState;
use crate::http::actions::{Asked, audited};
use crate::http::extract::PathId;
use crate::http::problem::ApiError;
use crate::operators::actions::{self, Action};
use axum::Form;
use axum::extract::State;
use axum::extract::rejection::FormRejection;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::TimeDelta;
use maud::{Markup, html};
use sea_orm::sea_query::Condition;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Deserialize;
use uuid::Uuid;

use super::view::{notice, page, time};

/// Attempts shown per endpoint.
const LAST_ATTEMPTS: u64 = 5;

#[derive(Default, Deserialize)]
pub(super) struct WebhooksQuery {
    hecho: Option<String>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    console: Console,
    Lenient(query): Lenient<WebhooksQuery>,
) -> Response {
    let done = query
        .hecho
        .as_deref()
        .filter(|h| *h == "reactivado")
        .map(|_| ("ok", "Reactivated: its pending events are due now, and those asked for are delivered again."));
    match list_page(&state, &console, done).await {
        Ok(markup) => markup.into_response(),
        Err(err) => error_page(&console, err),
    }
}

async fn list_page(
    state: &AppState,
    console: &Console,
    done: Option<(&str, &str)>,
) -> Result<Markup, ApiError> {
    let troubled = endpoints::Entity::find()
        .filter(
            Condition::any()
                .add(endpoints::Column::State.eq(EndpointState::Desactivado))
                .add(endpoints::Column::FailingSince.is_not_null()),
        )
        .order_by_asc(endpoints::Column::UpdatedAt)
        .limit(200)
        .all(&state.db)
        .await?;
    let names: std::collections::HashMap<Uuid, String> = merchant::Entity::find()
        .filter(merchant::Column::Id.is_in(troubled.iter().map(|e| e.merchant_id)))
        .all(&state.db)
        .await?
        .into_iter()
        .map(|m| (m.id, m.name))
        .collect();
    let ids: Vec<Uuid> = troubled.iter().map(|e| e.id).collect();
    let reactivated = actions::last_on_each(&state.db, Action::ReactivateEndpoint, &ids).await?;
    let mut cards = Vec::new();
    for endpoint in &troubled {
        let last = attempts::Entity::find()
            .filter(attempts::Column::EndpointId.eq(endpoint.id))
            .order_by_desc(attempts::Column::AttemptedAt)
            .limit(LAST_ATTEMPTS)
            .all(&state.db)
            .await?;
        cards.push(card(
            console,
            endpoint,
            names.get(&endpoint.merchant_id),
            &last,
            reactivated.get(&endpoint.id),
        ));
    }
    let body = html! {
        @if let Some((kind, text)) = done { (notice(kind, text)) }
        h1 { "Webhooks to merchants" }
        p.muted { "Endpoints whose deliveries fail, or that are DESACTIVADO (answered 410, or failed for PAGOS_WEBHOOKS_DISABLE_AFTER). A DESACTIVADO endpoint gets nothing until it is reactivated." }
        @if cards.is_empty() {
            (notice("ok", "Every endpoint is delivering."))
        }
        @for c in cards { (c) }
    };
    Ok(page("Webhooks", Some(&console.who()), body))
}

fn card(
    console: &Console,
    endpoint: &endpoints::Model,
    merchant: Option<&String>,
    last: &[attempts::Model],
    reactivated: Option<&actions::Row>,
) -> Markup {
    let down = endpoint.state == EndpointState::Desactivado;
    html! {
        section.card data-endpoint=(endpoint.id) {
            p {
                @if down { span.badge.st-failed { "DESACTIVADO" } } @else { span.badge.st-sent { "Failing" } }
                " " strong { (merchant.map_or("?", String::as_str)) } " · " span.mono { (endpoint.url) }
            }
            dl.facts {
                @if let Some(since) = endpoint.failing_since { dt { "Failing since" } dd { (time(since)) } }
                @if let Some(reason) = &endpoint.disabled_reason { dt { "Why disabled" } dd { (reason) } }
                dt { "Endpoint" } dd.mono { (endpoint.id) }
                @if let Some(r) = reactivated {
                    dt { "Last reactivated" } dd.reactivated { (time(r.at)) " by " strong { (r.operator) } }
                }
            }
            @if !last.is_empty() {
                div.table-wrap {
                    table.cards {
                        thead { tr { th { "When" } th { "Event" } th { "Answer" } th { "Latency" } th { "Outcome" } } }
                        tbody {
                            @for a in last {
                                tr {
                                    td data-label="When" { (time(a.attempted_at)) }
                                    td.mono data-label="Event" { (a.event_id) }
                                    td data-label="Answer" {
                                        @match a.status { Some(s) => { "HTTP " (s) }, None => span.muted { "no answer" } }
                                        @if let Some(e) = &a.error { " — " (e) }
                                    }
                                    td.num data-label="Latency" { (a.latency_ms) " ms" }
                                    td data-label="Outcome" { (a.outcome) }
                                }
                            }
                        }
                    }
                }
            }
            @if console.may_act() {
                form.stack method="post" action={ "/consola/webhooks/" (endpoint.id) "/reactivar" } {
                    input type="hidden" name="csrf" value=(console.session.csrf);
                    label for={ "redeliver-" (endpoint.id) } { "Deliver again" }
                    select id={ "redeliver-" (endpoint.id) } name="reenviar" {
                        option value="" { "Nothing more: only what is still pending" }
                        @if endpoint.failing_since.is_some() {
                            option value="fallo" { "Every event since it started failing" }
                        }
                        option value="24h" { "Every event of the last 24 hours" }
                    }
                    button type="submit" { "Reactivate" }
                }
            } @else {
                p.muted.lector { (LECTOR_REFUSED) }
            }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct ReactivateForm {
    csrf: Option<String>,
    reenviar: Option<String>,
}

pub(super) async fn reactivate(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<ReactivateForm>, FormRejection>,
) -> Response {
    let form = match console.acting_form(form, |f| f.csrf.as_deref()) {
        Ok(form) => form,
        Err(refusal) => return *refusal,
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return refused(Some(&console), "No such endpoint.");
    };
    let found = match endpoints::Entity::find_by_id(id).one(&state.db).await {
        Ok(Some(found)) => found,
        Ok(None) => return refused(Some(&console), "No such endpoint."),
        Err(err) => return error_page(&console, err.into()),
    };
    let (since, what) = match form.reenviar.as_deref() {
        Some("fallo") => match crate::outbox::endpoints::failures_began(&state.db, &found).await {
            Ok(since) => (since, "since it started failing"),
            Err(err) => return error_page(&console, err.into()),
        },
        Some("24h") => (
            Some(crate::db::now() - TimeDelta::hours(24)),
            "of the last 24 hours",
        ),
        _ => (None, ""),
    };
    let asked = Asked {
        action: Action::ReactivateEndpoint,
        target: Some(id),
        what: match since {
            Some(at) => format!(
                "reactivate, delivering again every event {what} (since {})",
                at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ),
            None => "reactivate, delivering what is pending".to_owned(),
        },
    };
    let (db, merchant) = (state.db.clone(), found.merchant_id);
    let work = async move { crate::outbox::endpoints::reactivate(&db, merchant, id, since).await };
    let done = |e: &Option<endpoints::Model>| match e {
        Some(_) => "done: ACTIVO".to_owned(),
        None => "no such endpoint any more: nothing done".to_owned(),
    };
    match audited(&state, &console.admin(), asked, work, done).await {
        Ok(Some(_)) => {
            tracing::info!(operator = %console.session.name, endpoint = %id, redeliver_since = ?since, "webhook endpoint reactivated from the console");
            Redirect::to("/consola/webhooks?hecho=reactivado").into_response()
        }
        // Deleted by its merchant since the page was read: nothing was reactivated.
        Ok(None) => refused(
            Some(&console),
            "No such endpoint any more: its merchant deleted it. Nothing was done.",
        ),
        Err(err) => error_page(&console, err),
    }
}
