//! The operators' console under `/consola/`: HTML pages rendered on the server (maud),
//! every asset embedded, one tiny script (times in the browser's zone) and no other.
//!
//! A login with an operator's token (or the break-glass admin token) opens a session
//! (`session.rs`); every page needs one and redirects to the login page without it. Every
//! form that changes something carries the session's CSRF token and is refused without
//! it. Actions go through the admin API's own functions (`admin::resolve_by_hand`,
//! `admin::reconcile_now`, `admin::reconcile_refund_now`,
//! `refund_resolution::resolve_by_hand`, `actions::audited`), so the console can do
//! nothing the API cannot, leaves the same audit rows, and a `lector` nothing but read.

mod refunds;
pub mod session;
pub mod view;
mod webhooks;

use super::AppState;
use super::admin::{self, Transicion};
use super::auth::{self, Admin};
use super::extract::PathId;
use super::problem::{ApiError, ProblemType};
use crate::entities::payment::PaymentState;
use crate::entities::webhook_delivery::DeliveryState;
use crate::entities::{merchant, payment, payment_transition as transitions, webhook_charge};
use crate::operators;
use crate::operators::actions::{self, Action};
use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, middleware};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use sea_orm::sea_query::Condition;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Deserialize;
use serde::de::DeserializeOwned;
pub use session::Sessions;
use session::{LOGIN_COOKIE, SESSION_COOKIE, SESSION_LIFETIME, Session};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;
use view::{Who, age, money, notice, page, state_badge, time};

/// Rows on one page of a list.
const PAGE_SIZE: u64 = 50;
/// Passes run by hand the reconciliation page lists.
const PASSES_SHOWN: u64 = 20;
/// "Reconcile now" asks of a payment its timeline shows (the latest).
const TIMELINE_ASKS: u64 = 200;
/// How long the detail page waits for the provider's answer.
const PROVIDER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/consola", get(|| async { Redirect::to("/consola/") }))
        .route("/consola/", get(queue))
        .route("/consola/login", get(login_form).post(login))
        .route("/consola/logout", post(logout))
        .route("/consola/pagos", get(search))
        .route("/consola/pagos/{id}", get(payment_page))
        .route("/consola/pagos/{id}/reconciliar", post(reconcile_payment))
        .route("/consola/pagos/{id}/resolver", post(resolve_payment))
        .route("/consola/pagos/{id}/reembolsar", post(refund_payment))
        .route(
            "/consola/reembolsos/{id}/reconciliar",
            post(refunds::reconcile),
        )
        .route("/consola/reembolsos/{id}/resolver", post(refunds::resolve))
        .route(
            "/consola/reconciliaciones",
            get(reconciliation_page).post(run_reconciliation),
        )
        .route("/consola/webhooks", get(webhooks::list))
        .route(
            "/consola/webhooks/{id}/reactivar",
            post(webhooks::reactivate),
        )
        .route("/consola/static/consola.css", get(css))
        .route("/consola/static/hora.js", get(script))
        .layer(middleware::map_response(secure_headers))
}

/// No framing, no outside resources, no caching of pages that show payments.
async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("x-content-type-options", "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", view::CSS)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", view::SCRIPT)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

fn to_login() -> Response {
    Redirect::to("/consola/login").into_response()
}

/// A request with a live console session.
pub struct Console {
    session: Session,
}

impl Console {
    fn who(&self) -> Who<'_> {
        Who {
            name: &self.session.name,
            role: self.session.role.as_str(),
            csrf: &self.session.csrf,
        }
    }

    /// The caller as the admin API knows callers.
    fn admin(&self) -> Admin {
        Admin {
            name: self.session.name.clone(),
            role: self.session.role,
            operator: self.session.operator,
        }
    }

    fn may_act(&self) -> bool {
        self.session.role.may_act()
    }

    /// The form of an action that writes (`csrf` reads its token): refused (the page to
    /// answer) without this session's CSRF token, or for a lector, who may only read.
    fn acting_form<F>(
        &self,
        form: Result<Form<F>, FormRejection>,
        csrf: fn(&F) -> Option<&str>,
    ) -> Result<F, Box<Response>> {
        let form = form.ok().map(|Form(f)| f);
        if let Some(refusal) = self.csrf_refusal(form.as_ref().and_then(csrf)) {
            return Err(Box::new(refusal));
        }
        if !self.may_act() {
            return Err(Box::new(refused(Some(self), LECTOR_REFUSED)));
        }
        // A form that did not parse has no token: refused above already.
        form.ok_or_else(|| Box::new(refused(Some(self), view::CSRF_REFUSED)))
    }

    /// `acting_form` for an action on the payment `id` (the path's), and the payment's id:
    /// refused as `acting_form` refuses, then 404 for an id that names no payment.
    fn acting_on_payment<F>(
        &self,
        form: Result<Form<F>, FormRejection>,
        csrf: fn(&F) -> Option<&str>,
        id: &str,
    ) -> Result<(F, Uuid), Box<Response>> {
        let form = self.acting_form(form, csrf)?;
        let uuid = parse_id(id).ok_or_else(|| Box::new(not_found(self)))?;
        Ok((form, uuid))
    }

    /// The refusal of a form without this session's CSRF token; `None` when it has it.
    fn csrf_refusal(&self, given: Option<&str>) -> Option<Response> {
        if self.session.csrf_matches(given) {
            None
        } else {
            tracing::warn!(operator = %self.session.name, "console form refused: no valid CSRF token");
            Some(refused(Some(self), view::CSRF_REFUSED))
        }
    }
}

impl FromRequestParts<AppState> for Console {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(value) = session::cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(to_login());
        };
        let Some(mut session) = state.console.find(value).await else {
            return Err(to_login());
        };
        match session.operator {
            Some(id) => match operators::store::active_by_id(&state.db, id).await {
                Ok(Some(operator)) => {
                    if operator.role != session.role {
                        session.role = operator.role;
                        state.console.update(value, session.clone()).await;
                    }
                }
                Ok(None) => {
                    state.console.close(value).await;
                    return Err(to_login());
                }
                Err(err) => return Err(ApiError::from(err).into_response()),
            },
            None if state.settings.admin_token.is_none() => {
                state.console.close(value).await;
                return Err(to_login());
            }
            None => {}
        }
        Ok(Console { session })
    }
}

/// The client address failed logins are counted by.
struct Client(Option<IpAddr>);

/// The query as `T`, or `T::default()` when it does not read as one (a parameter given
/// twice): a hand-edited URL gets the page without its parameters, as it gets the first
/// page for a page number that is not one, never axum's plain-text 400.
struct Lenient<T>(T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequestParts<S> for Lenient<T> {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let query = Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(query)| query)
            .unwrap_or_default();
        Ok(Lenient(query))
    }
}

impl FromRequestParts<AppState> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Client(auth::client_of(parts)))
    }
}

/// A 403 page.
fn refused(console: Option<&Console>, text: &str) -> Response {
    let who = console.map(Console::who);
    let body = html! {
        h1 { "Refused" }
        (notice("error", text))
        p { a href="/consola/" { "Back to the attention queue" } }
    };
    (StatusCode::FORBIDDEN, page("Refused", who.as_ref(), body)).into_response()
}

const LECTOR_REFUSED: &str = "Your role is lector: it may only read. Ask an operador to do this.";

/// What went wrong, in words for the page, and the status to answer with.
fn explain(err: ApiError) -> (StatusCode, String) {
    match err {
        ApiError::Problem(problem) => (
            problem
                .status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::UNPROCESSABLE_ENTITY),
            problem
                .detail
                .clone()
                .unwrap_or_else(|| problem.title.clone()),
        ),
        ApiError::Internal(err) => {
            tracing::error!(error = format!("{err:#}"), "console request failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "The database or the gateway did not answer. What was asked may have been done, in part or whole: look where things stand (follow a link of the page rather than reload it, which would send the same form again) before asking again.".to_owned(),
            )
        }
    }
}

fn error_page(console: &Console, err: ApiError) -> Response {
    let (status, text) = explain(err);
    let body = html! { h1 { "Something went wrong" } (notice("error", &text)) };
    (status, page("Error", Some(&console.who()), body)).into_response()
}

// ---------------------------------------------------------------- login and logout

#[derive(Default, Deserialize)]
struct LoginQuery {
    salida: Option<String>,
}

fn login_page(status: StatusCode, message: Option<(&str, &str)>, headers: &HeaderMap) -> Response {
    let nonce = session::random_value();
    let body = html! {
        section.card {
            h1 { "On-call console" }
            @if let Some((kind, text)) = message { (notice(kind, text)) }
            form.stack method="post" action="/consola/login" {
                input type="hidden" name="login" value=(nonce);
                label for="token" { "Your operator token" }
                input type="password" id="token" name="token" autocomplete="current-password" required placeholder="op_…";
                button type="submit" { "Log in" }
            }
            p.muted { "Ask for a token with " code { "pagos operators add NAME" } ". Sessions last 12 hours." }
        }
    };
    let cookie = session::set_cookie(LOGIN_COOKIE, &nonce, Duration::from_secs(3600), headers);
    (
        status,
        [(header::SET_COOKIE, cookie)],
        page("Log in", None, body),
    )
        .into_response()
}

async fn login_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Lenient(query): Lenient<LoginQuery>,
) -> Response {
    if let Some(value) = session::cookie(&headers, SESSION_COOKIE)
        && state.console.find(value).await.is_some()
    {
        return Redirect::to("/consola/").into_response();
    }
    let message = query.salida.map(|_| ("info", "You are logged out."));
    login_page(StatusCode::OK, message, &headers)
}

#[derive(Deserialize)]
struct LoginForm {
    token: Option<String>,
    login: Option<String>,
}

async fn login(
    State(state): State<AppState>,
    Client(client): Client,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return refused(None, view::CSRF_REFUSED);
    };
    // The form must come from a login page this browser loaded (double submit).
    let expected = session::cookie(&headers, LOGIN_COOKIE);
    let same = match (expected, form.login.as_deref()) {
        (Some(a), Some(b)) => bool::from(subtle::ConstantTimeEq::ct_eq(a.as_bytes(), b.as_bytes())),
        _ => false,
    };
    if !same {
        return refused(None, view::CSRF_REFUSED);
    }
    // In the address's turn: a burst of guesses is checked one at a time, each after the
    // failure before it was counted.
    let _turn = match state.auth.turn(client).await {
        Ok(turn) => turn,
        Err(err) => {
            let (status, text) = explain(err);
            return login_page(status, Some(("error", &text)), &headers);
        }
    };
    let token = form.token.unwrap_or_default();
    let token = token.trim();
    let who = match auth::who_is(&state, token).await {
        Ok(who) => who,
        Err(err) => {
            let (status, text) = explain(err);
            return login_page(status, Some(("error", &text)), &headers);
        }
    };
    let Some(who) = who else {
        let err = state.auth.count_failure(client).await;
        let (status, _) = explain(err);
        let text = if status == StatusCode::TOO_MANY_REQUESTS {
            "Too many failed logins from this address. Wait a minute and try again."
        } else {
            "Unknown or revoked token."
        };
        return login_page(status, Some(("error", text)), &headers);
    };
    // The operator's id as the one look-up that proved the token read it: a second
    // look-up could find the operator revoked in between, and the session would then
    // open as break-glass, which revocation does not end.
    tracing::info!(operator = %who.name, role = %who.role, "console login");
    let value = state.console.open(who.operator, who.name, who.role).await;
    let mut response = Redirect::to("/consola/").into_response();
    let jar = response.headers_mut();
    for cookie in [
        session::set_cookie(SESSION_COOKIE, &value, SESSION_LIFETIME, &headers),
        session::clear_cookie(LOGIN_COOKIE),
    ] {
        if let Ok(cookie) = HeaderValue::from_str(&cookie) {
            jar.append(header::SET_COOKIE, cookie);
        }
    }
    response
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

fn csrf_of(form: &Result<Form<CsrfForm>, FormRejection>) -> Option<&str> {
    form.as_ref().ok().and_then(|Form(f)| f.csrf.as_deref())
}

async fn logout(
    State(state): State<AppState>,
    console: Console,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if let Some(refusal) = console.csrf_refusal(csrf_of(&form)) {
        return refusal;
    }
    if let Some(value) = session::cookie(&headers, SESSION_COOKIE) {
        state.console.close(value).await;
    }
    tracing::info!(operator = %console.session.name, "console logout");
    (
        [(header::SET_COOKIE, session::clear_cookie(SESSION_COOKIE))],
        Redirect::to("/consola/login?salida=1"),
    )
        .into_response()
}

// ---------------------------------------------------------------- lists

#[derive(Default, Deserialize)]
struct PageQuery {
    pagina: Option<String>,
}

/// The page asked for: 1 unless a positive number says otherwise (a hand-edited URL
/// gets the first page, not an error).
fn page_number(pagina: Option<&str>) -> u64 {
    pagina
        .and_then(|p| p.trim().parse::<u64>().ok())
        .filter(|p| (1..=1_000_000).contains(p))
        .unwrap_or(1)
}

/// One page of a list of payments, with what its table shows of them.
struct PaymentPage {
    rows: Vec<payment::Model>,
    /// There are payments after this page.
    has_next: bool,
    names: HashMap<Uuid, String>,
    last: HashMap<Uuid, LastWords>,
}

impl PaymentPage {
    /// Page `page_no` (from 1, `PAGE_SIZE` a page) of the payments `query` selects, in
    /// its order.
    async fn read(
        state: &AppState,
        query: sea_orm::Select<payment::Entity>,
        page_no: u64,
    ) -> Result<PaymentPage, ApiError> {
        let mut rows = query
            .offset((page_no - 1) * PAGE_SIZE)
            .limit(PAGE_SIZE + 1)
            .all(&state.db)
            .await?;
        let has_next = rows.len() as u64 > PAGE_SIZE;
        rows.truncate(PAGE_SIZE as usize);
        let names = merchant_names(state, &rows).await?;
        let last = last_words(state, &rows).await?;
        Ok(PaymentPage {
            rows,
            has_next,
            names,
            last,
        })
    }
}

/// Merchant names by id, for the rows shown.
async fn merchant_names(
    state: &AppState,
    rows: &[payment::Model],
) -> Result<HashMap<Uuid, String>, ApiError> {
    let ids: Vec<Uuid> = rows.iter().map(|p| p.merchant_id).collect();
    Ok(merchant::Entity::find()
        .filter(merchant::Column::Id.is_in(ids))
        .all(&state.db)
        .await?
        .into_iter()
        .map(|m| (m.id, m.name))
        .collect())
}

/// What the "Last error" column says of a payment.
struct LastWords {
    text: String,
    /// When, for the last error of a look-up or a send (the audit reason's time is not
    /// shown: it is what last happened, not an error).
    at: Option<DateTime<Utc>>,
}

/// Of each payment shown, the last error of a look-up or a send at the provider, with
/// when; for one without, the latest audit row's reason: what last happened to it.
async fn last_words(
    state: &AppState,
    rows: &[payment::Model],
) -> Result<HashMap<Uuid, LastWords>, ApiError> {
    let mut last = HashMap::new();
    let mut without = Vec::new();
    for p in rows {
        match &p.last_error {
            Some(error) => {
                let words = LastWords {
                    text: error.clone(),
                    at: p.last_error_at,
                };
                last.insert(p.id, words);
            }
            None => without.push(p.id),
        }
    }
    for t in transitions::Entity::find()
        .filter(transitions::Column::PaymentId.is_in(without))
        .order_by_asc(transitions::Column::CreatedAt)
        .order_by_asc(transitions::Column::Id)
        .all(&state.db)
        .await?
    {
        let words = LastWords {
            text: t.reason,
            at: None,
        };
        last.insert(t.payment_id, words);
    }
    Ok(last)
}

/// A "Last error" cell's words: `text` and how long ago it was (`at`), or `—`.
fn last_error_cell(text: Option<&str>, at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Markup {
    html! {
        @match text {
            Some(text) => {
                (text)
                @if let Some(at) = at { " " span.muted { "(" (age(now - at)) " ago)" } }
            }
            None => span.muted { "—" },
        }
    }
}

/// The payments of a list, as a table that becomes cards on a phone.
fn payment_table(
    rows: &[payment::Model],
    names: &HashMap<Uuid, String>,
    last: &HashMap<Uuid, LastWords>,
    now: DateTime<Utc>,
) -> Markup {
    html! {
        div.table-wrap {
            table.cards {
                thead { tr {
                    th { "State" } th { "Age" } th { "Amount" } th { "Merchant / crédito" }
                    th { "Attempts" } th { "Next attempt" } th { "Last error" } th { "Payment" }
                } }
                tbody {
                    @for p in rows {
                        tr data-id=(p.id) {
                            td data-label="State" { (state_badge(p.state)) }
                            td data-label="Age" { (age(now - p.created_at)) }
                            td.num data-label="Amount" { (money(p.amount, &p.currency)) }
                            td data-label="Merchant" {
                                (names.get(&p.merchant_id).map_or("?", String::as_str))
                                " · " span.mono { (p.credit_id) }
                            }
                            td.num data-label="Attempts" { (p.attempts) }
                            td data-label="Next attempt" {
                                @if matches!(p.state, PaymentState::EnProceso | PaymentState::Enviada) {
                                    (view::relative(p.next_attempt_at, now))
                                } @else { span.muted { "—" } }
                            }
                            td data-label="Last error" {
                                @if let Some(code) = &p.decline_code { code { (code) } " " }
                                @if let Some(words) = last.get(&p.id) {
                                    (last_error_cell(Some(&words.text), words.at, now))
                                }
                            }
                            td data-label="Payment" {
                                a.mono href={ "/consola/pagos/" (p.id) } { (p.id.to_string()[..8]) "…" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `/consola/`: what needs on-call — payments under review, and payments in flight
/// longer than `PAGOS_STALE_AFTER` — oldest first.
async fn queue(
    State(state): State<AppState>,
    console: Console,
    Lenient(query): Lenient<PageQuery>,
) -> Response {
    match queue_page(&state, &console, page_number(query.pagina.as_deref())).await {
        Ok(markup) => markup.into_response(),
        Err(err) => error_page(&console, err),
    }
}

async fn queue_page(state: &AppState, console: &Console, page_no: u64) -> Result<Markup, ApiError> {
    let now = crate::db::now();
    let stale_before = now - crate::saga::store::chrono_after(state.settings.stale_after);
    let needs_attention = Condition::any()
        .add(payment::Column::State.eq(PaymentState::RevisionManual.as_str()))
        .add(
            Condition::all()
                .add(payment::Column::State.is_in([
                    PaymentState::EnProceso.as_str(),
                    PaymentState::Enviada.as_str(),
                ]))
                .add(payment::Column::CreatedAt.lt(stale_before)),
        );
    let oldest_first = payment::Entity::find()
        .filter(needs_attention)
        .order_by_asc(payment::Column::CreatedAt)
        .order_by_asc(payment::Column::Id);
    let PaymentPage {
        rows,
        has_next,
        names,
        last,
    } = PaymentPage::read(state, oldest_first, page_no).await?;
    let stale = humantime::format_duration(state.settings.stale_after);
    // Refunds that need on-call the same way: in review, or in flight too long.
    use crate::entities::refund;
    use pagos_types::RefundState;
    let refunds = refund::Entity::find()
        .filter(
            Condition::any()
                .add(refund::Column::State.eq(RefundState::RevisionManual.as_str()))
                .add(
                    Condition::all()
                        .add(refund::Column::State.is_in([
                            RefundState::EnProceso.as_str(),
                            RefundState::Enviado.as_str(),
                        ]))
                        .add(refund::Column::CreatedAt.lt(stale_before)),
                ),
        )
        .order_by_asc(refund::Column::CreatedAt)
        .order_by_asc(refund::Column::Id)
        .limit(PAGE_SIZE)
        .all(&state.db)
        .await?;
    let body = html! {
        h1 { "Needs attention" }
        p.muted {
            "Payments in manual review, and payments still in flight after " (stale)
            " (PAGOS_STALE_AFTER). Oldest first."
        }
        @if rows.is_empty() && page_no == 1 && refunds.is_empty() {
            (notice("ok", "Nothing needs you right now."))
        } @else if rows.is_empty() && page_no == 1 {
            p.muted { "No payment needs you right now." }
        } @else {
            (payment_table(&rows, &names, &last, now))
            (view::pager("/consola/", page_no, has_next, view::Order::OldestFirst))
        }
        @if page_no == 1 && !refunds.is_empty() {
            h2 { "Refunds" }
            p.muted { "Refunds in manual review, and refunds still in flight after " (stale) ". Oldest first; the oldest " (PAGE_SIZE) " at most." }
            div.table-wrap {
                table.cards #refund-queue {
                    thead { tr { th { "Age" } th { "State" } th { "Amount" } th { "Attempts" } th { "Last error" } th { "Payment" } } }
                    tbody {
                        @for r in &refunds {
                            tr {
                                td data-label="Age" { (age(now - r.created_at)) }
                                td data-label="State" { (view::refund_badge(r.state)) }
                                td data-label="Amount" { (money(r.amount, &r.currency)) }
                                td data-label="Attempts" { (r.attempts) }
                                td data-label="Last error" {
                                    (last_error_cell(r.last_error.as_deref().or(r.failure_code.as_deref()), r.last_error_at, now))
                                }
                                td data-label="Payment" {
                                    a.mono href={ "/consola/pagos/" (r.payment_id) "#refund-" (r.id) } { (r.payment_id.to_string()[..8]) "…" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page("Needs attention", Some(&console.who()), body))
}

#[derive(Default, Deserialize)]
struct SearchQuery {
    estado: Option<String>,
    q: Option<String>,
    pagina: Option<String>,
}

const STATES: [PaymentState; 5] = [
    PaymentState::RevisionManual,
    PaymentState::Enviada,
    PaymentState::EnProceso,
    PaymentState::Completada,
    PaymentState::Fallida,
];

/// `/consola/pagos?estado=&q=`: q is a payment id, a `creditoId` or (part of) a merchant's
/// name. Newest first.
async fn search(
    State(state): State<AppState>,
    console: Console,
    Lenient(query): Lenient<SearchQuery>,
) -> Response {
    match search_page(&state, &console, query).await {
        Ok(markup) => markup.into_response(),
        Err(err) => error_page(&console, err),
    }
}

async fn search_page(
    state: &AppState,
    console: &Console,
    query: SearchQuery,
) -> Result<Markup, ApiError> {
    let now = crate::db::now();
    let page_no = page_number(query.pagina.as_deref());
    let estado = query
        .estado
        .as_deref()
        .filter(|e| !e.is_empty())
        .and_then(|e| e.parse::<PaymentState>().ok());
    let q = query.q.as_deref().map(str::trim).unwrap_or("").to_owned();
    let mut filter = Condition::all();
    if let Some(estado) = estado {
        filter = filter.add(payment::Column::State.eq(estado.as_str()));
    }
    if q.chars().any(char::is_control) {
        // No payment id, credit id or merchant name holds one: nothing matches (and the
        // text is not sent: PostgreSQL refuses a NUL in text, shown as an outage).
        filter = filter.add(payment::Column::Id.is_null());
    } else if !q.is_empty() {
        let mut any = Condition::any().add(payment::Column::CreditId.eq(q.as_str()));
        if let Ok(id) = Uuid::parse_str(&q) {
            any = any.add(payment::Column::Id.eq(id));
        }
        let merchants: Vec<Uuid> = merchant::Entity::find()
            .filter(merchant::Column::Name.contains(q.as_str()))
            .all(&state.db)
            .await?
            .into_iter()
            .map(|m| m.id)
            .collect();
        if !merchants.is_empty() {
            any = any.add(payment::Column::MerchantId.is_in(merchants));
        }
        filter = filter.add(any);
    }
    let newest_first = payment::Entity::find()
        .filter(filter)
        .order_by_desc(payment::Column::CreatedAt)
        .order_by_desc(payment::Column::Id);
    let PaymentPage {
        rows,
        has_next,
        names,
        last,
    } = PaymentPage::read(state, newest_first, page_no).await?;
    let base = format!(
        "/consola/pagos?estado={}&q={}",
        estado.map_or("", |e| e.as_str()),
        url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
    );
    let body = html! {
        h1 { "Payments" }
        form.search method="get" action="/consola/pagos" {
            input type="search" name="q" value=(q) placeholder="Payment id, creditoId or merchant" aria-label="Search";
            select name="estado" aria-label="State" {
                option value="" { "Any state" }
                @for s in STATES {
                    option value=(s.as_str()) selected[estado == Some(s)] { (view::state_words(s).0) }
                }
            }
            button type="submit" { "Search" }
        }
        @if rows.is_empty() {
            (notice("info", "No payment matches."))
        } @else {
            (payment_table(&rows, &names, &last, now))
            (view::pager(&base, page_no, has_next, view::Order::NewestFirst))
        }
    };
    Ok(page("Payments", Some(&console.who()), body))
}

// ---------------------------------------------------------------- one payment

#[derive(Default, Deserialize)]
struct DetailQuery {
    hecho: Option<String>,
}

fn parse_id(id: &str) -> Option<Uuid> {
    Uuid::parse_str(id).ok()
}

/// What the payment's page says when an action sends the browser back to it
/// (`?hecho=`): the word, the notice's kind, its text.
const DONE: &[(&str, &str, &str)] = &[
    (
        "resuelto",
        "ok",
        "Resolved. The audit trail records your name and reason.",
    ),
    (
        "resuelto-en-revision",
        "warn",
        "Your resolution is recorded, but the payment is REVISION_MANUAL again: a refund it sent did not go through at the provider. It still needs you: see Refunds and the audit trail below.",
    ),
    (
        "reconciliado",
        "ok",
        "Reconciled now: see the state and the audit trail below.",
    ),
    (
        "reconciliacion-fallida",
        "error",
        "Not reconciled: pagos could not finish working on it (the logs say why). Read its state and audit trail below before asking again; the reconciler's next pass takes it up too.",
    ),
    (
        "reembolsado",
        "ok",
        "Refunded: the provider returned the money. The refund below names you.",
    ),
    (
        "reembolso-enviado",
        "info",
        "Refund sent; the provider has not confirmed it yet. The reconciler settles it: see Refunds below.",
    ),
    (
        "reembolso-en-revision",
        "error",
        "Refund sent, and under review: the provider's answer did not match it. Nothing settles it by itself: read its card under Refunds below and resolve it (runbooks/refunds.md).",
    ),
    (
        "omitido",
        "info",
        "Not reconciled: someone else holds it right now, or it is not the reconciler's to touch (final or under review).",
    ),
    (
        "reembolso-resuelto",
        "ok",
        "Refund resolved. Its audit trail records your name and reason: see Refunds and the audit trail below.",
    ),
    (
        "reembolso-reconciliado",
        "ok",
        "Refund reconciled now: see its state under Refunds, and what came of it in the audit trail below.",
    ),
    (
        "reembolso-omitido",
        "info",
        "The refund was not reconciled: someone else holds it right now, or it is not the reconciler's to touch (final or under review).",
    ),
];

async fn payment_page(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    Lenient(query): Lenient<DetailQuery>,
) -> Response {
    let done = query
        .hecho
        .as_deref()
        .and_then(|hecho| DONE.iter().find(|(said, _, _)| *said == hecho))
        .map(|&(_, kind, text)| (kind, text));
    detail_response(&state, &console, &id, StatusCode::OK, done).await
}

async fn detail_response(
    state: &AppState,
    console: &Console,
    id: &str,
    status: StatusCode,
    message: Option<(&str, &str)>,
) -> Response {
    detail_response_keeping(state, console, id, status, message, None).await
}

/// A refund form as it was sent, kept when the refund it asked may have been registered:
/// the same key asks the very same refund again, where a new one would ask another.
struct KeptRefund {
    clave: String,
    monto: Option<i64>,
    motivo: String,
}

/// The same, its refund form keeping `kept` (the key, amount and reason just sent).
async fn detail_response_keeping(
    state: &AppState,
    console: &Console,
    id: &str,
    status: StatusCode,
    message: Option<(&str, &str)>,
    kept: Option<&KeptRefund>,
) -> Response {
    let Some(id) = parse_id(id) else {
        return not_found(console);
    };
    match detail_page(state, console, id, message, kept).await {
        Ok(Some(markup)) => (status, markup).into_response(),
        Ok(None) => not_found(console),
        Err(err) => error_page(console, err),
    }
}

/// The payment's page with what went wrong (`explain`) above it.
async fn detail_error(state: &AppState, console: &Console, id: &str, err: ApiError) -> Response {
    let (status, text) = explain(err);
    detail_response(state, console, id, status, Some(("error", &text))).await
}

fn not_found(console: &Console) -> Response {
    nothing_such(console, "payment")
}

/// 404: no such `what` (a payment, a refund), with the way back to the search.
fn nothing_such(console: &Console, what: &str) -> Response {
    let body =
        html! { h1 { "No such " (what) } p { a href="/consola/pagos" { "Search payments" } } };
    (
        StatusCode::NOT_FOUND,
        page("Not found", Some(&console.who()), body),
    )
        .into_response()
}

/// What the provider says about the payment now, for on-call to resolve by.
async fn provider_says(state: &AppState, p: &payment::Model) -> Markup {
    let lookup = state.gateway.lookup(p.id);
    let asked = Asked {
        amount: p.amount,
        currency: &p.currency,
        whose: "payment's",
        none: "The provider has no charge with this payment's reference.",
    };
    provider_answer(lookup, asked, |c: &crate::gateway::Charge| Held {
        id: &c.id,
        status: format!("{:?}", c.status),
        amount: c.amount,
        currency: &c.currency,
        code: c.decline_code.as_deref().map(|code| ("decline code", code)),
    })
    .await
}

/// What a resolve form's look-up is for: a payment's or a refund's amount, and the words
/// for what the provider holds of it.
pub(super) struct Asked<'a> {
    pub amount: i64,
    pub currency: &'a str,
    /// "payment's", "refund's": whose amount one that does not fit is not.
    pub whose: &'a str,
    /// Said when the provider holds nothing for it.
    pub none: &'a str,
}

/// One thing the provider holds (a charge, a refund), as the page lists it.
pub(super) struct Held<'a> {
    pub id: &'a str,
    pub status: String,
    pub amount: i64,
    pub currency: &'a str,
    /// The decline or failure code, with its name.
    pub code: Option<(&'static str, &'a str)>,
}

/// What the provider answers `lookup` within `PROVIDER_LOOKUP_TIMEOUT`: a failure as a
/// notice, `asked.none` when it holds nothing, else each thing it holds (`held`), marked
/// when it is not for the amount asked about.
pub(super) async fn provider_answer<T, E: std::fmt::Display>(
    lookup: impl Future<Output = Result<Vec<T>, E>>,
    asked: Asked<'_>,
    held: impl Fn(&T) -> Held<'_>,
) -> Markup {
    let found = tokio::time::timeout(PROVIDER_LOOKUP_TIMEOUT, lookup).await;
    html! {
        @match found {
            Err(_) => (notice("error", &format!("The provider did not answer within {} s.", PROVIDER_LOOKUP_TIMEOUT.as_secs()))),
            Ok(Err(err)) => (notice("error", &format!("The provider's look-up failed: {err}"))),
            Ok(Ok(found)) if found.is_empty() => p.provider-none { (asked.none) },
            Ok(Ok(found)) => {
                ul.provider-held {
                    @for h in found.iter().map(&held) {
                        li {
                            code { (h.id) } " — " strong { (h.status.to_lowercase()) }
                            ", " (money(h.amount, h.currency))
                            @if h.amount != asked.amount || !h.currency.eq_ignore_ascii_case(asked.currency) {
                                " " span.badge.st-failed { "not this " (asked.whose) " amount" }
                            }
                            @if let Some((name, code)) = h.code { ", " (name) " " code { (code) } }
                        }
                    }
                }
            }
        }
    }
}

async fn detail_page(
    state: &AppState,
    console: &Console,
    id: Uuid,
    message: Option<(&str, &str)>,
    kept: Option<&KeptRefund>,
) -> Result<Option<Markup>, ApiError> {
    let Some(p) = crate::saga::store::find_payment(&state.db, id).await? else {
        return Ok(None);
    };
    let now = crate::db::now();
    let detail = admin::detail(state, &p).await?;
    let merchant_name = merchant::Entity::find_by_id(p.merchant_id)
        .one(&state.db)
        .await?
        .map_or_else(|| p.merchant_id.to_string(), |m| m.name);
    let reports = webhook_charge::Entity::find()
        .filter(webhook_charge::Column::PaymentId.eq(p.id))
        .order_by_asc(webhook_charge::Column::FirstSeenAt)
        .all(&state.db)
        .await?;
    let events = crate::entities::event::Entity::find()
        .filter(crate::entities::event::Column::SubjectId.eq(p.id))
        .order_by_asc(crate::entities::event::Column::Sequence)
        .all(&state.db)
        .await?;
    let deliveries = crate::entities::webhook_delivery::Entity::find()
        .filter(
            crate::entities::webhook_delivery::Column::EventId
                .is_in(events.iter().map(|e| e.id.clone())),
        )
        .all(&state.db)
        .await?;
    let refunds = crate::saga::refund::store::of_payment(&state.db, p.id).await?;
    let refund_reports = crate::webhooks::refunds::reported_for_payment(&state.db, p.id).await?;
    let refunded: i64 = refunds
        .iter()
        .filter(|r| r.state == pagos_types::RefundState::Completado)
        .map(|r| r.amount)
        .sum();
    let held: i64 = refunds
        .iter()
        .filter(|r| r.state != pagos_types::RefundState::Fallido)
        .map(|r| r.amount)
        .sum();
    let left = (p.amount - held).max(0);
    let refundable = p.state == PaymentState::Completada && left > 0;
    // One key per rendered form: the same form sent twice is one refund. A form sent
    // whose refund may have been registered is drawn again with its key.
    let refund_key = kept.map_or_else(
        || format!("consola-{}", Uuid::new_v4()),
        |k| k.clave.clone(),
    );
    let (kept_monto, kept_motivo) = kept.map_or((None, ""), |k| (k.monto, k.motivo.as_str()));
    let under_review = p.state == PaymentState::RevisionManual;
    let in_flight = matches!(p.state, PaymentState::EnProceso | PaymentState::Enviada);
    let provider = if under_review {
        Some(provider_says(state, &p).await)
    } else {
        None
    };
    let asks = actions::list(
        &state.db,
        &actions::Filter {
            target: Some(p.id),
            action: Some(Action::ReconcilePayment),
            ..actions::Filter::default()
        },
        TIMELINE_ASKS,
    )
    .await?;
    let refund_trails = refunds::Trails::read(state, &refunds).await?;
    let timeline = timeline(&detail.transiciones, &asks, &refund_trails);
    let refund_cards = refunds::cards(state, console, &refunds, &refund_trails, now).await;
    let csrf = &console.session.csrf;
    let body = html! {
        @if let Some((kind, text)) = message { (notice(kind, text)) }
        h1 { "Payment " span.mono { (p.id) } }
        section.card {
            p { (state_badge(p.state)) " " strong.amount { (money(p.amount, &p.currency)) } }
            dl.facts {
                dt { "Merchant" } dd { (merchant_name) }
                dt { "creditoId" } dd.mono { (p.credit_id) }
                @if let Some(d) = &p.description { dt { "Description" } dd { (d) } }
                dt { "Created" } dd { (time(p.created_at)) " (" (age(now - p.created_at)) " ago)" }
                dt { "Updated" } dd { (time(p.updated_at)) }
                dt { "State (API)" } dd.mono { (p.state.as_str()) }
            }
        }
        h2 { "Gateway" }
        section.card {
            dl.facts {
                dt { "Attempts" } dd { (p.attempts) }
                dt { "Next attempt" } dd {
                    @if in_flight { (time(p.next_attempt_at)) " (" (view::relative(p.next_attempt_at, now)) ")" }
                    @else { span.muted { "none: not in flight" } }
                }
                @if let Some(until) = p.claimed_until.filter(|u| *u > now) {
                    dt { "Held by a worker until" } dd { (time(until)) }
                }
                dt { "Gateway key" } dd.mono { (p.gateway_key) }
                dt { "Charge (gatewayRef)" } dd.mono { (p.gateway_ref.as_deref().unwrap_or("—")) }
                dt { "Decline code" } dd.mono { (p.decline_code.as_deref().unwrap_or("—")) }
                @if let Some(error) = &p.last_error {
                    dt { "Last error" } dd {
                        span.mono { (error) }
                        @if let Some(at) = p.last_error_at {
                            " (" (time(at)) ", " (age(now - at)) " ago)"
                        }
                    }
                }
            }
            @if !reports.is_empty() {
                h3 { "What the provider's webhooks reported" }
                ul {
                    @for r in &reports {
                        li {
                            code { (r.charge_id) } " (" (r.source) "): " strong { (r.status.as_str()) }
                            ", " (money(r.amount, &r.currency))
                            @if r.last_event_id == crate::webhooks::consumer::OVERRULED_AT_RESOLUTION {
                                ", recorded succeeded by on-call's FALLIDA resolution, which overruled the provider: settled outside pagos (no later event changes this)"
                            } @else if r.last_event_id == crate::webhooks::consumer::KNOWN_AT_RESOLUTION {
                                ", recorded succeeded by on-call's FALLIDA resolution, which weighed it (no later event changes this)"
                            } @else {
                                ", event " code { (r.last_event_id) }
                            }
                            " at " (time(r.updated_at))
                        }
                    }
                }
            }
        }
        h2 { "Actions" }
        @if !in_flight && !under_review && !refundable {
            p.muted {
                "None: the payment is final."
                @if refunds.iter().any(refunds::needs_on_call) {
                    " Its refunds that need you are under " a href="#refunds" { "Refunds" } "."
                }
            }
        }
        div.actions {
            @if in_flight {
                section.card {
                    h3 { "Reconcile now" }
                    p.muted { "Asks the provider about this payment now and settles it if the answer is final. Only when nobody holds it." }
                    @if console.may_act() {
                        form method="post" action={ "/consola/pagos/" (p.id) "/reconciliar" } {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" id="reconcile" { "Reconcile now" }
                        }
                    } @else {
                        p.muted.lector { (LECTOR_REFUSED) }
                    }
                }
            }
            @if under_review {
                section.card {
                    h3 { "Resolve by hand" }
                    h4 { "The provider says now" }
                    @if let Some(provider) = &provider { (provider) }
                    @if console.may_act() {
                        form.stack method="post" action={ "/consola/pagos/" (p.id) "/resolver" } {
                            input type="hidden" name="csrf" value=(csrf);
                            label for="estado" { "Outcome" }
                            select id="estado" name="estado" required {
                                option value="" { "Choose…" }
                                option value="COMPLETADA" { "Paid: the provider charged it" }
                                option value="FALLIDA" { "Failed: no money was taken" }
                                option value=(FAILED_REFUNDING) { "Failed — refund what the provider charged" }
                            }
                            p.muted {
                                "pagos asks the provider before it resolves: it refuses \"Paid\" without a succeeded charge, and \"no money was taken\" while a charge succeeded. While the provider cannot be asked (the look-up above failed), pagos takes your word, checked only against what the provider's webhooks reported: read its dashboard first; the audit trail records that it could not be asked. \"Refund what the provider charged\" settles it failed and refunds each succeeded charge through pagos (never also in the provider's dashboard), and waits until the provider answers."
                            }
                            label for="motivo" { "Reason (kept in the audit trail with your name)" }
                            textarea id="motivo" name="motivo" required maxlength="1000"
                                placeholder="What you saw and where: the provider's dashboard, the ticket…" {}
                            label for="gatewayRef" { "Provider's charge id (optional)" }
                            input type="text" id="gatewayRef" name="gatewayRef" maxlength="255";
                            button type="submit" id="resolve" { "Resolve" }
                        }
                    } @else {
                        p.muted.lector { (LECTOR_REFUSED) }
                    }
                }
            }
        }
        @if refundable {
            section.card {
                h3 { "Refund" }
                p.muted {
                    "Returns money of this payment through the provider. Left to refund: "
                    strong { (money(left, &p.currency)) } "."
                }
                @if console.may_act() {
                    form.stack method="post" action={ "/consola/pagos/" (p.id) "/reembolsar" } {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="clave" value=(refund_key);
                        label for="monto" { "Amount in minor units of " (p.currency) }
                        // A kept form's amount may stand already and count against what
                        // is left: no maximum, or the browser would refuse to send it again.
                        input type="number" id="monto" name="monto" min="1" max=[kept.is_none().then_some(left)] step="1" value=[kept_monto];
                        label.check {
                            input type="checkbox" id="todo" name="todo" value="si";
                            " Or everything left: " (money(left, &p.currency)) " (" (left) ")"
                        }
                        label for="motivoReembolso" { "Reason (kept with the refund and your name)" }
                        textarea id="motivoReembolso" name="motivo" required maxlength="255"
                            placeholder="The customer's request, the ticket…" { (kept_motivo) }
                        button type="submit" id="refund" { "Refund" }
                    }
                } @else {
                    p.muted.lector { (LECTOR_REFUSED) }
                }
            }
        }
        h2 { "Refunds" }
        @if refunds.is_empty() {
            p.muted { "None." }
        } @else {
            p { "Refunded: " strong { (money(refunded, &p.currency)) } " of " (money(p.amount, &p.currency)) "." }
            div.table-wrap {
                table.cards #refunds {
                    thead { tr { th { "Refund" } th { "State" } th { "Amount" } th { "Reason" } th { "Asked by" } th { "Created" } } }
                    tbody {
                        @for r in &refunds {
                            tr {
                                td.mono data-label="Refund" { (r.id) }
                                td data-label="State" { (refunds::state_cell(r, console.may_act())) }
                                td data-label="Amount" { (money(r.amount, &r.currency)) }
                                td data-label="Reason" { (r.reason.as_deref().unwrap_or("—")) }
                                td data-label="Asked by" { (r.requested_by.as_deref().unwrap_or("the merchant")) }
                                td data-label="Created" { (time(r.created_at)) " (" (age(now - r.created_at)) " ago)" }
                            }
                        }
                    }
                }
            }
            (refund_cards)
            @if !refund_reports.is_empty() {
                h3 { "What the provider's webhooks reported about them" }
                ul #refund-reports {
                    @for w in &refund_reports {
                        li {
                            code { (w.provider_refund_id) } " (" (w.source) "): " strong { (w.status.as_str()) }
                            ", " (money(w.amount, &w.currency))
                            @if let Some(code) = &w.failure_code { ", failure code " code { (code) } }
                            @if let Some(id) = w.refund_id { ", refund " span.mono { (id) } }
                            ", event " code { (w.last_event_id) } " at " (time(w.updated_at))
                        }
                    }
                }
            }
        }
        h2 { "Events to the merchant" }
        @if events.is_empty() {
            p.muted { "No event yet: one is written when the payment becomes final or goes to review." }
        } @else {
            div.table-wrap {
                table.cards #events {
                    thead { tr { th { "Event" } th { "Type" } th { "Written" } th { "Deliveries (endpoint: state, attempts)" } } }
                    tbody {
                        @for e in &events {
                            tr {
                                td.mono data-label="Event" { (e.id) }
                                td data-label="Type" { (e.event_type.as_str()) " #" (e.sequence) }
                                td data-label="Written" { (time(e.created_at)) }
                                td data-label="Deliveries" {
                                    @let mine: Vec<_> = deliveries.iter().filter(|d| d.event_id == e.id).collect();
                                    @if mine.is_empty() { span.muted { "no endpoint wants it" } }
                                    @for d in mine {
                                        div {
                                            span.mono { (d.endpoint_id.to_string()[..8]) "…" } ": " (d.state.as_str())
                                            ", " (d.attempts) " attempt(s)"
                                            @if let (Some(at), DeliveryState::Delivered) = (d.delivered_at, d.state) { ", delivered " (time(at)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Audit trail" }
        ol.timeline {
            @for entry in timeline { (entry) }
        }
    };
    Ok(Some(page("Payment", Some(&console.who()), body)))
}

/// The audit trail's moves and on-call's "reconcile now" asks of the payment, with
/// on-call's moves of its refunds and the "reconcile now" asked of them, oldest first: an
/// ask before the moves its work made (it is written before the work).
fn timeline(
    moves: &[Transicion],
    asks: &[actions::Row],
    refund_trails: &refunds::Trails,
) -> Vec<Markup> {
    let mut entries: Vec<(Option<DateTime<Utc>>, u8, Markup)> = moves
        .iter()
        .map(|t| {
            let at = DateTime::parse_from_rfc3339(&t.en)
                .ok()
                .map(|d| d.with_timezone(&Utc));
            (at, 1, timeline_entry(t))
        })
        .chain(asks.iter().map(|a| (Some(a.at), 0, asked_entry(a))))
        .chain(
            refund_trails
                .by_on_call()
                .map(|t| (Some(t.created_at), 1, refunds::move_entry(t))),
        )
        .chain(
            refund_trails
                .asks
                .iter()
                .map(|a| (Some(a.at), 0, refunds::ask_entry(a))),
        )
        .collect();
    entries.sort_by_key(|(at, rank, _)| (*at, *rank));
    entries.into_iter().map(|(_, _, entry)| entry).collect()
}

/// On-call's "reconcile now" in the timeline: who asked, when, what came of it.
fn asked_entry(a: &actions::Row) -> Markup {
    html! {
        li.asked {
            div.when { (time(a.at)) " · by " strong.actor { (a.operator) " (on-call)" } }
            div { "Reconcile now asked" }
            div.reason { (came_of(a)) }
        }
    }
}

/// What came of an action of on-call, or that it is not over.
fn came_of(a: &actions::Row) -> Markup {
    html! {
        @match actions::outcome_of(a) {
            Some(outcome) => (outcome),
            None => span.muted { "not over yet (or its process stopped before it ended)" },
        }
    }
}

fn timeline_entry(t: &Transicion) -> Markup {
    let state = |s: &str| {
        s.parse::<PaymentState>()
            .map_or_else(|_| html! { code { (s) } }, state_badge)
    };
    let at = DateTime::parse_from_rfc3339(&t.en).map(|d| d.with_timezone(&Utc));
    html! {
        li {
            div.when {
                @match at { Ok(at) => (time(at)), Err(_) => (t.en) }
                " · by " strong.actor { (t.operador.as_deref().map_or(t.quien.clone(), |o| format!("{o} ({})", t.quien))) }
            }
            div {
                @if let Some(from) = &t.desde { (state(from)) " → " }
                (state(&t.hacia))
            }
            div.reason { (t.motivo) }
        }
    }
}

async fn reconcile_payment(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let uuid = match console.acting_on_payment(form, |f| f.csrf.as_deref(), &id) {
        Ok((_, uuid)) => uuid,
        Err(refusal) => return *refusal,
    };
    match admin::reconcile_now(&state, &console.admin(), Some(uuid)).await {
        Ok(report) => {
            let done = if report.pagos.errores > 0 {
                "reconciliacion-fallida"
            } else if report.pagos.omitidos > 0 {
                "omitido"
            } else {
                "reconciliado"
            };
            Redirect::to(&format!("/consola/pagos/{uuid}?hecho={done}")).into_response()
        }
        Err(err) => detail_error(&state, &console, &id, err).await,
    }
}

/// The resolve form's third outcome: FALLIDA with `reembolsar`.
const FAILED_REFUNDING: &str = "FALLIDA_REEMBOLSAR";

#[derive(Deserialize)]
struct ResolveForm {
    csrf: Option<String>,
    estado: Option<String>,
    motivo: Option<String>,
    #[serde(rename = "gatewayRef")]
    gateway_ref: Option<String>,
}

async fn resolve_payment(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<ResolveForm>, FormRejection>,
) -> Response {
    let (form, uuid) = match console.acting_on_payment(form, |f| f.csrf.as_deref(), &id) {
        Ok(acting) => acting,
        Err(refusal) => return *refusal,
    };
    let gateway_ref = form.gateway_ref.filter(|r| !r.trim().is_empty());
    let (estado, reembolsar) = match form.estado.as_deref().unwrap_or("") {
        FAILED_REFUNDING => ("FALLIDA", true),
        estado => (estado, false),
    };
    let asked = admin::HandResolution {
        estado,
        motivo: form.motivo.as_deref().unwrap_or(""),
        gateway_ref,
        reembolsar,
        contra_proveedor: None,
    };
    match admin::resolve_by_hand(&state, &console.admin(), uuid, asked).await {
        // A refund the resolution sent may have failed at once, sending the payment back.
        Ok(p) if p.state == PaymentState::RevisionManual => Redirect::to(&format!(
            "/consola/pagos/{}?hecho=resuelto-en-revision",
            p.id
        ))
        .into_response(),
        Ok(p) => Redirect::to(&format!("/consola/pagos/{}?hecho=resuelto", p.id)).into_response(),
        Err(err) => detail_error(&state, &console, &id, err).await,
    }
}

#[derive(Deserialize)]
struct RefundForm {
    csrf: Option<String>,
    clave: Option<String>,
    monto: Option<String>,
    /// `si`: everything left, asked for in so many words (an empty amount is refused).
    todo: Option<String>,
    motivo: Option<String>,
}

/// What on-call reads when a refund it asked may stand though the page says it failed.
const REFUND_MAY_STAND: &str = "The refund may have been registered, and sent to the provider: look for it under Refunds below before anything else. This form keeps its key: sending it again asks the very same refund (never a second one) and shows what became of it.";

/// What a refund the console asked and that answered an error (`kind`, `status`) leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RefundLeft {
    /// A refusal before any write (over what is left, a payment not refundable, the
    /// provider's refusal of a refund then `FALLIDO`): nothing that holds money.
    Nothing,
    /// Its key still being sent (409), or a failure of the database or the provider after
    /// the refund may have been written (5xx): it may stand. The form is kept: sent again,
    /// the same key asks the very same refund.
    MayStand,
    /// The key already asked a refund with another amount or reason (422, a kept form
    /// changed): that one stands.
    StandsAlready,
}

fn refund_left(kind: Option<ProblemType>, status: StatusCode) -> RefundLeft {
    match kind {
        Some(ProblemType::KeyReused) => RefundLeft::StandsAlready,
        Some(ProblemType::RequestInFlight) => RefundLeft::MayStand,
        _ if status.is_server_error() => RefundLeft::MayStand,
        _ => RefundLeft::Nothing,
    }
}

/// What on-call reads when its form's key already asked another refund.
const REFUND_STANDS: &str = "A refund was already asked with this form's key, with another amount or reason: look at its state under Refunds below (unless it is FALLIDO, nothing went back through it, it counts against what is left and may have refunded). The form below is a new one: use it only for a refund beside that one.";

/// On-call refunds a payment: the admin API's refund, with the key the form was rendered
/// with, so a form sent twice (a double click, a reload) is one refund.
async fn refund_payment(
    State(state): State<AppState>,
    console: Console,
    PathId(id): PathId,
    form: Result<Form<RefundForm>, FormRejection>,
) -> Response {
    let (form, uuid) = match console.acting_on_payment(form, |f| f.csrf.as_deref(), &id) {
        Ok(acting) => acting,
        Err(refusal) => return *refusal,
    };
    let everything = form.todo.as_deref() == Some("si");
    // Everything left only when asked for in so many words: an amount left empty by
    // mistake (typed into another box, cleared) must not refund the whole payment.
    let monto = match (
        form.monto
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty()),
        everything,
    ) {
        (None, true) => Ok(None),
        (None, false) => Err(
            "Enter the amount to refund, or tick \"everything left\"; nothing was refunded."
                .to_owned(),
        ),
        (Some(_), true) => Err(
            "Both an amount and \"everything left\" were given: choose one; nothing was refunded."
                .to_owned(),
        ),
        (Some(text), false) => text.parse::<i64>().map(Some).map_err(|_| {
            format!(
                "The amount must be a whole number of minor units, not {text:?}; nothing was refunded."
            )
        }),
    };
    let monto = match monto {
        Ok(monto) => monto,
        Err(text) => {
            return detail_response(
                &state,
                &console,
                &id,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(("error", &text)),
            )
            .await;
        }
    };
    let answer = super::refunds::refund_by_hand(
        &state,
        &console.admin(),
        uuid,
        form.clave.as_deref().unwrap_or(""),
        monto,
        form.motivo.as_deref().unwrap_or(""),
    )
    .await;
    let kept = KeptRefund {
        clave: form.clave.clone().unwrap_or_default(),
        monto,
        motivo: form.motivo.clone().unwrap_or_default(),
    };
    let answer = match answer {
        Ok(answer) => answer,
        // Still running under this key, or failed after it may have been registered (a
        // database that went away after the send): the same form again, never a new key
        // (which would ask a second refund while the first stands).
        Err(ApiError::Internal(err)) => {
            tracing::error!(error = format!("{err:#}"), "console refund failed");
            let cause = "The database or the provider did not answer.";
            let status = StatusCode::SERVICE_UNAVAILABLE;
            return refund_error_page(&state, &console, &id, status, None, cause, &kept).await;
        }
        Err(ApiError::Problem(problem)) => {
            let status = problem
                .status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
            let cause = problem
                .detail
                .clone()
                .unwrap_or_else(|| problem.title.clone());
            return refund_error_page(&state, &console, &id, status, problem.kind(), &cause, &kept)
                .await;
        }
    };
    let status = answer.status();
    if status.is_success() {
        // A 202 is a refund in flight, or one its first send sent to review (the
        // provider answered another refund): the reconciler settles only the first.
        let under_review = status == StatusCode::ACCEPTED && {
            let body = axum::body::to_bytes(answer.into_body(), 64 * 1024)
                .await
                .unwrap_or_default();
            serde_json::from_slice::<serde_json::Value>(&body)
                .is_ok_and(|r| r["estado"] == "REVISION_MANUAL")
        };
        let done = if status == StatusCode::CREATED {
            "reembolsado"
        } else if under_review {
            "reembolso-en-revision"
        } else {
            "reembolso-enviado"
        };
        return Redirect::to(&format!("/consola/pagos/{uuid}?hecho={done}")).into_response();
    }
    // A refusal (the provider's, or over what is left) is a problem: show its words.
    let body = axum::body::to_bytes(answer.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let problem = serde_json::from_slice::<pagos_types::Problem>(&body).ok();
    let text = problem
        .as_ref()
        .and_then(|p| p.detail.clone())
        .unwrap_or_else(|| "The refund was refused.".to_owned());
    let kind = problem.as_ref().and_then(pagos_types::Problem::kind);
    refund_error_page(&state, &console, &id, status, kind, &text, &kept).await
}

/// The payment's page after a refund answered an error (`cause`): as `refund_left` says,
/// its form kept (`kept`) with what on-call reads before sending it again, a new form
/// saying the key's refund stands, or the refusal's words.
async fn refund_error_page(
    state: &AppState,
    console: &Console,
    id: &str,
    status: StatusCode,
    kind: Option<ProblemType>,
    cause: &str,
    kept: &KeptRefund,
) -> Response {
    let (text, kept) = match refund_left(kind, status) {
        RefundLeft::Nothing => (cause.to_owned(), None),
        RefundLeft::MayStand => (format!("{cause} {REFUND_MAY_STAND}"), Some(kept)),
        RefundLeft::StandsAlready => (REFUND_STANDS.to_owned(), None),
    };
    detail_response_keeping(state, console, id, status, Some(("error", &text)), kept).await
}

// ---------------------------------------------------------------- reconciliation

/// What each figure of a pass's report means.
const REPORT_WORDS: [(&str, &str); 8] = [
    ("examinados", "looked at"),
    ("completados", "settled as paid"),
    ("fallidos", "settled as failed"),
    (
        "reenviados",
        "sent again with the same key; answer not final yet",
    ),
    (
        "pendientes",
        "provider pending or not reachable: looked at again later",
    ),
    ("revisionManual", "moved to manual review: on-call decides"),
    (
        "errores",
        "could not be processed (database errors): retried on a later pass",
    ),
    (
        "omitidos",
        "held by someone else or not the reconciler's: left alone",
    ),
];

/// The passes run by hand, newest first, that the reconciliation page lists.
async fn passes_by_hand(state: &AppState) -> Result<Vec<actions::Row>, ApiError> {
    let passes = actions::Filter {
        action: Some(Action::ReconcilePass),
        ..actions::Filter::default()
    };
    Ok(actions::list(&state.db, &passes, PASSES_SHOWN).await?)
}

fn reconciliation_markup(
    console: &Console,
    report: Option<&crate::saga::reconcile::Report>,
    passes: &[actions::Row],
) -> Markup {
    let body = html! {
        h1 { "Reconciliation" }
        p.muted { "A pass asks the provider about every payment due for a look (in flight, its next attempt passed), and settles what the provider's answer settles. The background reconciler does the same every PAGOS_RECONCILE_EVERY." }
        @if console.may_act() {
            form method="post" action="/consola/reconciliaciones" {
                input type="hidden" name="csrf" value=(console.session.csrf);
                button type="submit" id="run-pass" { "Run a pass now" }
            }
        } @else {
            p.muted.lector { (LECTOR_REFUSED) }
        }
        @if let Some(report) = report {
            h2 { "Report of the pass just run" }
            @let figures = serde_json::to_value(report).unwrap_or_default();
            @let refunds = &figures["reembolsos"];
            div.table-wrap {
                table #report {
                    thead { tr { th { "Payments" } th { "Refunds" } th { "Field" } th { "Meaning" } } }
                    tbody {
                        @for (field, meaning) in REPORT_WORDS {
                            tr {
                                td.num { (figures.get(field).and_then(serde_json::Value::as_u64).unwrap_or(0)) }
                                td.num { (refunds.get(field).and_then(serde_json::Value::as_u64).unwrap_or(0)) }
                                td.mono { (field) }
                                td { (meaning) }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Passes run by hand" }
        @if passes.is_empty() {
            p.muted { "None yet." }
        } @else {
            p.muted { "The last " (PASSES_SHOWN) ", newest first." }
            div.table-wrap {
                table.cards #passes {
                    thead { tr { th { "When" } th { "Who" } th { "Outcome" } } }
                    tbody {
                        @for r in passes {
                            tr {
                                td data-label="When" { (time(r.at)) }
                                td data-label="Who" { (r.operator) }
                                td data-label="Outcome" { (came_of(r)) }
                            }
                        }
                    }
                }
            }
        }
    };
    page("Reconciliation", Some(&console.who()), body)
}

async fn reconciliation_page(State(state): State<AppState>, console: Console) -> Response {
    match passes_by_hand(&state).await {
        Ok(passes) => reconciliation_markup(&console, None, &passes).into_response(),
        Err(err) => error_page(&console, err),
    }
}

async fn run_reconciliation(
    State(state): State<AppState>,
    console: Console,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = console.acting_form(form, |f| f.csrf.as_deref()) {
        return *refusal;
    }
    let report = match admin::reconcile_now(&state, &console.admin(), None).await {
        Ok(report) => report,
        Err(err) => return error_page(&console, err),
    };
    match passes_by_hand(&state).await {
        Ok(passes) => reconciliation_markup(&console, Some(&report), &passes).into_response(),
        Err(err) => error_page(&console, err),
    }
}
