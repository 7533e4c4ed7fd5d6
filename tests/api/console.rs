//! The console over plain HTTP (no browser): every page needs a session, a login opens
//! one with the right cookie, forms without the session's CSRF token are refused. The
//! browser tests (`console_browser.rs`) drive the same pages as a person would.

use crate::helpers::{ADMIN_TOKEN, Backend, Spawn, TestApp, send};
use crate::on_both_databases;
use crate::operators::{operator, payment_under_review};
use pagos::operators::Role;
use reqwest::redirect::Policy;
use std::time::Duration;

on_both_databases!(
    logged_out_every_console_page_redirects_to_login,
    a_login_opens_a_strict_http_only_session_and_a_bad_token_does_not,
    a_console_form_without_its_csrf_token_is_refused_and_changes_nothing,
    an_operador_refunds_from_the_console_once_however_often_the_form_is_sent,
    a_refund_form_answered_with_an_error_while_its_refund_may_stand_keeps_its_key,
    a_hand_edited_console_url_gets_a_page_never_plain_text,
    a_resolution_from_the_console_leaves_its_row_at_admin_acciones_and_the_timeline_shows_it_once,
);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .expect("client")
}

/// The value of `name` among the answer's `Set-Cookie` headers.
fn set_cookie(answer: &reqwest::Response, name: &str) -> Option<String> {
    answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

fn value_of(set_cookie: &str) -> String {
    set_cookie
        .split(';')
        .next()
        .and_then(|kv| kv.split_once('='))
        .map(|(_, v)| v.to_owned())
        .unwrap_or_default()
}

/// `GET path` without following redirects, with `cookie` (a `Cookie` header) if given.
pub(crate) async fn get_page(app: &TestApp, cookie: Option<&str>, path: &str) -> reqwest::Response {
    let request = client().get(app.url(path));
    send(match cookie {
        Some(cookie) => request.header("cookie", cookie),
        None => request,
    })
    .await
}

/// `POST path` with `fields` as a form, as `get_page` sends.
async fn post_page(
    app: &TestApp,
    cookie: Option<&str>,
    path: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let request = client().post(app.url(path)).form(fields);
    send(match cookie {
        Some(cookie) => request.header("cookie", cookie),
        None => request,
    })
    .await
}

/// The `Cookie` header of the console session `session`.
pub(crate) fn session_cookie(session: &str) -> String {
    format!("pagos_consola={session}")
}

/// The login page's nonce, from its cookie.
async fn login_nonce(app: &TestApp) -> String {
    let form = get_page(app, None, "/consola/login").await;
    assert_eq!(form.status(), 200);
    value_of(&set_cookie(&form, "pagos_consola_login").expect("login cookie"))
}

/// The login form sent with `token`, by the browser that got `nonce`.
async fn submit_login(app: &TestApp, nonce: &str, token: &str) -> reqwest::Response {
    let cookie = format!("pagos_consola_login={nonce}");
    post_page(
        app,
        Some(&cookie),
        "/consola/login",
        &[("token", token), ("login", nonce)],
    )
    .await
}

/// Logs in with `token`; the session cookie's value.
pub async fn log_in(app: &TestApp, token: &str) -> String {
    let nonce = login_nonce(app).await;
    let answer = submit_login(app, &nonce, token).await;
    assert_eq!(answer.status(), 303, "logged in");
    assert_eq!(answer.headers()["location"], "/consola/");
    value_of(&set_cookie(&answer, "pagos_consola").expect("session cookie"))
}

fn csrf_in(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..].split('"').next().expect("value").to_owned()
}

async fn logged_out_every_console_page_redirects_to_login(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let id = uuid::Uuid::new_v4();
    for path in [
        "/consola/".to_owned(),
        "/consola/pagos".to_owned(),
        "/consola/pagos?estado=REVISION_MANUAL&q=acme".to_owned(),
        format!("/consola/pagos/{id}"),
        "/consola/reconciliaciones".to_owned(),
    ] {
        let answer = get_page(&app, None, &path).await;
        assert_eq!(answer.status(), 303, "{path}");
        assert_eq!(answer.headers()["location"], "/consola/login", "{path}");
        // A made-up session is no session.
        let answer = get_page(&app, Some("pagos_consola=made-up"), &path).await;
        assert_eq!(answer.headers()["location"], "/consola/login", "{path}");
    }
    for path in [
        format!("/consola/pagos/{id}/resolver"),
        format!("/consola/pagos/{id}/reconciliar"),
        "/consola/reconciliaciones".to_owned(),
        "/consola/logout".to_owned(),
    ] {
        let answer = post_page(&app, None, &path, &[("csrf", "x")]).await;
        assert_eq!(answer.status(), 303, "{path}");
        assert_eq!(answer.headers()["location"], "/consola/login", "{path}");
    }
    // The login page itself and its stylesheet need no session, and are embedded.
    let css = get_page(&app, None, "/consola/static/consola.css").await;
    assert_eq!(css.status(), 200);
    let login = get_page(&app, None, "/consola/login").await;
    assert_eq!(login.status(), 200);
    let csp = login.headers()["content-security-policy"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let html = login.text().await.expect("html");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no outside asset: {html}"
    );
}

async fn a_login_opens_a_strict_http_only_session_and_a_bad_token_does_not(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let nonce = login_nonce(&app).await;
    let bad = submit_login(&app, &nonce, "op_wrong").await;
    assert_eq!(bad.status(), 401);
    assert!(set_cookie(&bad, "pagos_consola").is_none());
    // A login form posted from elsewhere (no nonce cookie) is refused, even with a good token.
    let forged = post_page(
        &app,
        None,
        "/consola/login",
        &[("token", ADMIN_TOKEN), ("login", "guess")],
    )
    .await;
    assert_eq!(forged.status(), 403);

    let ana = operator(&app, "ana", Role::Operador).await;
    let nonce = login_nonce(&app).await;
    let good = submit_login(&app, &nonce, &ana).await;
    assert_eq!(good.status(), 303);
    let cookie = set_cookie(&good, "pagos_consola").expect("session cookie");
    crate::helpers::assert_contains_all(
        &cookie,
        &[
            "HttpOnly",
            "SameSite=Strict",
            "Max-Age=43200",
            "Path=/consola",
        ],
    );
    let session = value_of(&cookie);
    let queue = get_page(&app, Some(&session_cookie(&session)), "/consola/").await;
    assert_eq!(queue.status(), 200);
    assert!(queue.text().await.expect("html").contains("ana"));

    // Revoking the operator ends the session at once.
    pagos::operators::store::revoke(
        &app.db,
        &pagos::operators::OperatorName::parse("ana").expect("name"),
    )
    .await
    .expect("revoked");
    let after = get_page(&app, Some(&session_cookie(&session)), "/consola/").await;
    assert_eq!(after.status(), 303);
}

async fn a_console_form_without_its_csrf_token_is_refused_and_changes_nothing(backend: Backend) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let (id, gateway) = payment_under_review(&app, "k-console-csrf").await;
    // Its charge failed at the provider: FALLIDA is what it shows.
    gateway.settle(&id, "declined");
    let bea = operator(&app, "bea", Role::Operador).await;
    let session = log_in(&app, &bea).await;
    let page = get_page(
        &app,
        Some(&session_cookie(&session)),
        &format!("/consola/pagos/{id}"),
    )
    .await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("Needs manual review"), "the state in words");
    assert!(
        html.contains("pago.revision_manual"),
        "the event the merchant is told: {html}"
    );
    let csrf = csrf_in(&html);
    let resolver = format!("/consola/pagos/{id}/resolver");

    for fields in [
        vec![("estado", "FALLIDA"), ("motivo", "no charge")],
        vec![
            ("estado", "FALLIDA"),
            ("motivo", "no charge"),
            ("csrf", "forged"),
        ],
    ] {
        let answer = post_form(&app, &session, &resolver, &fields).await;
        assert_eq!(answer.status(), 403, "{fields:?}");
        assert!(answer.text().await.expect("html").contains("CSRF"));
    }
    assert_eq!(
        app.payment(&id).await.state,
        "REVISION_MANUAL",
        "nothing changed"
    );

    // A reason is required; with one, it is resolved.
    for (motivo, status, state) in [
        ("  ", 422, "REVISION_MANUAL"),
        ("no charge at the provider", 303, "FALLIDA"),
    ] {
        let fields = [("estado", "FALLIDA"), ("motivo", motivo), ("csrf", &csrf)];
        let answer = post_form(&app, &session, &resolver, &fields).await;
        assert_eq!(answer.status(), status, "motivo {motivo:?}");
        assert_eq!(app.payment(&id).await.state, state, "motivo {motivo:?}");
    }
}

on_both_databases!(the_attention_queue_is_oldest_first_50_a_page_and_leaves_settled_payments_out);

async fn the_attention_queue_is_oldest_first_50_a_page_and_leaves_settled_payments_out(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--stale-after", "1s"]).await;
    let fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let mut ids = Vec::new();
    for n in 0..51 {
        let answer = app
            .pay(&format!("k-queue-{n:02}"), &crate::helpers::payment_body())
            .await;
        assert_eq!(answer.status(), 202);
        ids.push(
            crate::helpers::json(answer).await["id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }
    fake.set_new_status("succeeded");
    let paid = app
        .pay("k-queue-paid", &crate::helpers::payment_body())
        .await;
    assert_eq!(paid.status(), 201);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;

    let session = log_in(&app, ADMIN_TOKEN).await;
    let rows_of = |html: &str| -> Vec<String> {
        html.split("data-id=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect()
    };
    let first = html_of(&app, &session, "/consola/").await;
    assert_eq!(rows_of(&first), ids[..50], "oldest first, 50 a page");
    assert!(first.contains("pagina=2"), "a link to the next page");
    assert!(
        first.contains("Sent, outcome not known yet"),
        "the state in words"
    );
    let second = html_of(&app, &session, "/consola/?pagina=2").await;
    assert_eq!(
        rows_of(&second),
        ids[50..],
        "the 51st on page 2; the paid one nowhere"
    );
    let odd = get_page(
        &app,
        Some(&session_cookie(&session)),
        "/consola/?pagina=abc",
    )
    .await;
    assert_eq!(
        odd.status(),
        200,
        "a hand-edited page number gets the first page"
    );
}

on_both_databases!(
    an_operador_reconciles_from_the_console_recorded_by_name_and_a_lector_is_refused_unrecorded
);

/// The HTML of `path` as `session` sees it.
async fn html_of(app: &TestApp, session: &str, path: &str) -> String {
    get_page(app, Some(&session_cookie(session)), path)
        .await
        .text()
        .await
        .expect("html")
}

async fn page_with_csrf(app: &TestApp, session: &str, path: &str) -> (String, String) {
    let html = html_of(app, session, path).await;
    let csrf = csrf_in(&html);
    (html, csrf)
}

async fn post_form(
    app: &TestApp,
    session: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    post_page(app, Some(&session_cookie(session)), path, fields).await
}

/// `fields` posted to `path` as `session`: answered 303 (done, see the page); where it
/// sends the browser.
async fn see_other(app: &TestApp, session: &str, path: &str, fields: &[(&str, &str)]) -> String {
    let answer = post_form(app, session, path, fields).await;
    assert_eq!(answer.status(), 303, "{path}");
    answer.headers()["location"]
        .to_str()
        .expect("a location")
        .to_owned()
}

/// "Run a pass now" from the reconciliation page, as `session` with its CSRF token: the
/// page with the pass's report.
async fn pass_run_by_hand(app: &TestApp, session: &str, csrf: &str) -> String {
    let path = "/consola/reconciliaciones";
    let answer = post_form(app, session, path, &[("csrf", csrf)]).await;
    assert_eq!(answer.status(), 200, "the pass's report");
    answer.text().await.expect("html")
}

/// "Reconcile now" and "Run a pass now" from the console: refused to a lector, who leaves
/// no row; an operador's each leave a row naming them, read at `/admin/acciones`, and the
/// payment's timeline shows the ask (who, when, what came of it) among its moves, the
/// reconciliation page the passes run by hand.
async fn an_operador_reconciles_from_the_console_recorded_by_name_and_a_lector_is_refused_unrecorded(
    backend: Backend,
) {
    use crate::operator_actions::actions_as;
    let app = Spawn::new(backend).start().await;
    let fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let id = crate::operator_actions::settled_at_the_provider(&app, &fake, "k-console-rec").await;

    let luis = operator(&app, "luis", Role::Lector).await;
    let reader = log_in(&app, &luis).await;
    let (html, csrf) = page_with_csrf(&app, &reader, &format!("/consola/pagos/{id}")).await;
    assert!(!html.contains("id=\"reconcile\""), "no action for a lector");
    for path in [
        format!("/consola/pagos/{id}/reconciliar"),
        "/consola/reconciliaciones".to_owned(),
    ] {
        let answer = post_form(&app, &reader, &path, &[("csrf", csrf.as_str())]).await;
        assert_eq!(answer.status(), 403, "{path}");
        assert!(answer.text().await.expect("html").contains("lector"));
    }
    assert_eq!(
        app.payment(&id).await.state,
        "ENVIADA",
        "the lector changed nothing"
    );
    assert!(actions_as(&app, ADMIN_TOKEN, "").await.is_empty(), "no row");

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (html, csrf) = page_with_csrf(&app, &session, &format!("/consola/pagos/{id}")).await;
    assert!(html.contains("id=\"reconcile\""));
    let sent_to = see_other(
        &app,
        &session,
        &format!("/consola/pagos/{id}/reconciliar"),
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(sent_to, format!("/consola/pagos/{id}?hecho=reconciliado"));
    assert_eq!(
        app.payment(&id).await.state,
        "COMPLETADA",
        "settled by the provider's answer"
    );
    let html = html_of(&app, &session, &format!("/consola/pagos/{id}")).await;
    let timeline = &html[html.find("Audit trail").expect("the timeline")..];
    crate::helpers::assert_contains_all(
        timeline,
        &[
            "eva (on-call)",
            "Reconcile now asked",
            "pagos: examinados 1, completados 1",
        ],
    );
    // Among the moves: after the payment was sent, before the move its work made.
    let asked = timeline.find("Reconcile now asked").expect("the ask");
    let sent = timeline
        .find("by <strong class=\"actor\">request")
        .expect("the send");
    let settled = timeline
        .find("by <strong class=\"actor\">reconciler")
        .expect("the settlement");
    assert!(sent < asked && asked < settled, "{timeline}");

    let report = pass_run_by_hand(&app, &session, &csrf).await;
    assert!(
        report.contains("id=\"report\"") && report.contains("examinados"),
        "{report}"
    );
    let rows = actions_as(&app, ADMIN_TOKEN, "?operador=eva").await;
    let what: Vec<&str> = rows.iter().filter_map(|r| r["accion"].as_str()).collect();
    assert_eq!(what, ["reconcile_pass", "reconcile_payment"], "{rows:?}");
    assert_eq!(rows[1]["objetivo"], id.as_str());
    // Anyone of on-call reads who ran the passes.
    let html = html_of(&app, &reader, "/consola/reconciliaciones").await;
    let passes = &html[html.find("id=\"passes\"").expect("the passes run by hand")..];
    crate::helpers::assert_contains_all(passes, &[">eva<", "pagos: examinados 0"]);
}

on_both_databases!(
    a_disabled_webhook_endpoint_is_listed_and_an_operador_reactivates_it_recorded_by_name
);

/// An endpoint of acme's at `hooks.acme.example`, `DESACTIVADO` as the delivery worker
/// leaves it after an answer 410.
async fn disabled_endpoint(app: &TestApp) -> pagos::entities::webhook_endpoint::Model {
    let acme = pagos::merchants::store::find_merchant(
        &app.db,
        &pagos::merchants::name::MerchantName::parse("acme").expect("name"),
    )
    .await
    .expect("db")
    .expect("acme");
    let endpoint = pagos::outbox::endpoints::create(
        &app.db,
        pagos::outbox::endpoints::NewEndpoint {
            merchant: acme.id,
            url: "https://hooks.acme.example/pagos",
            types: None,
            secret: "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXR0ZXN0c2VjcmV0",
        },
    )
    .await
    .expect("endpoint")
    .expect("room for it");
    disable(app, &endpoint).await
}

/// `endpoint`, `DESACTIVADO` after an answer 410.
async fn disable(
    app: &TestApp,
    endpoint: &pagos::entities::webhook_endpoint::Model,
) -> pagos::entities::webhook_endpoint::Model {
    use pagos::entities::webhook_endpoint::EndpointState;
    use sea_orm::{ActiveModelTrait, ActiveValue::Set, IntoActiveModel};
    let mut down = endpoint.clone().into_active_model();
    down.state = Set(EndpointState::Desactivado);
    down.disabled_reason = Set(Some("answered 410 Gone".into()));
    down.update(&app.db).await.expect("disabled")
}

/// A reactivation from the console: refused to a lector, who leaves no row; an operador's
/// leaves a row naming them, what they asked to deliver again and what came of it, and
/// when the endpoint is listed again its card says who reactivated it last.
async fn a_disabled_webhook_endpoint_is_listed_and_an_operador_reactivates_it_recorded_by_name(
    backend: Backend,
) {
    use crate::operator_actions::actions_as;
    use pagos::entities::webhook_endpoint::{self as endpoints, EndpointState};
    use sea_orm::EntityTrait;
    let app = Spawn::new(backend).start().await;
    let endpoint = disabled_endpoint(&app).await;
    let on_it = format!("?objetivo={}", endpoint.id);

    let luis = operator(&app, "luis", Role::Lector).await;
    let reader = log_in(&app, &luis).await;
    let (html, csrf) = page_with_csrf(&app, &reader, "/consola/webhooks").await;
    assert!(
        html.contains("hooks.acme.example") && html.contains("DESACTIVADO"),
        "{html}"
    );
    assert!(html.contains("answered 410 Gone"));
    assert!(!html.contains("Last reactivated"), "never reactivated");
    let path = format!("/consola/webhooks/{}/reactivar", endpoint.id);
    let answer = post_form(&app, &reader, &path, &[("csrf", csrf.as_str())]).await;
    assert_eq!(answer.status(), 403, "a lector cannot reactivate");
    assert!(
        actions_as(&app, ADMIN_TOKEN, &on_it).await.is_empty(),
        "no row"
    );

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (_, csrf) = page_with_csrf(&app, &session, "/consola/webhooks").await;
    let answer = post_form(&app, &session, &path, &[("reenviar", "24h")]).await;
    assert_eq!(answer.status(), 403, "no CSRF token, no change");
    let still = endpoints::Entity::find_by_id(endpoint.id)
        .one(&app.db)
        .await
        .expect("db")
        .expect("endpoint");
    assert_eq!(still.state, EndpointState::Desactivado);

    let answer = post_form(
        &app,
        &session,
        &path,
        &[("csrf", csrf.as_str()), ("reenviar", "24h")],
    )
    .await;
    assert_eq!(answer.status(), 303);
    let now = endpoints::Entity::find_by_id(endpoint.id)
        .one(&app.db)
        .await
        .expect("db")
        .expect("endpoint");
    assert_eq!(now.state, EndpointState::Activo, "reactivated");
    let (html, _) = page_with_csrf(&app, &session, "/consola/webhooks").await;
    assert!(!html.contains("hooks.acme.example"), "no longer listed");
    let rows = actions_as(&app, &luis, &on_it).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["operador"], "eva");
    assert_eq!(rows[0]["accion"], "reactivate_endpoint");
    assert!(rows[0]["terminadaEn"].is_string(), "{rows:?}");
    for said in ["of the last 24 hours", "done: ACTIVO"] {
        assert!(
            crate::helpers::text_has(&rows[0], "detalle", said),
            "{said}: {rows:?}"
        );
    }

    // It fails again: its card names who reactivated it last.
    disable(&app, &endpoint).await;
    let html = html_of(&app, &reader, "/consola/webhooks").await;
    let card = &html[html
        .find("Last reactivated")
        .expect("the last reactivation")..];
    assert!(card.contains("by <strong>eva</strong>"), "{card}");
}

fn hidden_in(html: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&needle)
        .unwrap_or_else(|| panic!("a {name} field"))
        + needle.len();
    html[at..].split('"').next().expect("value").to_owned()
}

/// A refund from the payment's page: refused to a lector and without the CSRF token; an
/// operador's form sent twice (a double click) is one refund at the gateway, listed on the
/// page with who asked; a refund that needs on-call shows in the attention queue.
async fn an_operador_refunds_from_the_console_once_however_often_the_form_is_sent(
    backend: Backend,
) {
    use sea_orm::ConnectionTrait;
    let (app, fake) = crate::refunds::app_with(backend, &[]).await;
    let id = crate::refunds::paid(&app, "k-console-refund").await;
    let path = format!("/consola/pagos/{id}/reembolsar");

    let luis = operator(&app, "luis", Role::Lector).await;
    let reader = log_in(&app, &luis).await;
    let (html, csrf) = page_with_csrf(&app, &reader, &format!("/consola/pagos/{id}")).await;
    assert!(
        !html.contains("id=\"refund\""),
        "no refund form for a lector"
    );
    let fields = [
        ("csrf", csrf.as_str()),
        ("clave", "consola-lector"),
        ("motivo", "I should not"),
    ];
    let answer = post_form(&app, &reader, &path, &fields).await;
    assert_eq!(answer.status(), 403);

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (html, csrf) = page_with_csrf(&app, &session, &format!("/consola/pagos/{id}")).await;
    assert!(html.contains("id=\"refund\""));
    assert!(
        html.contains("2,500.00 COP"),
        "what is left, in major units"
    );
    let clave = hidden_in(&html, "clave");
    let no_csrf = [
        ("clave", clave.as_str()),
        ("monto", "1000"),
        ("motivo", "customer asked"),
    ];
    let answer = post_form(&app, &session, &path, &no_csrf).await;
    assert_eq!(answer.status(), 403, "no CSRF token, no refund");
    assert!(fake.made().is_empty());

    let form = [
        ("csrf", csrf.as_str()),
        ("clave", clave.as_str()),
        ("monto", "1000"),
        ("motivo", "customer asked"),
    ];
    for _ in 0..2 {
        let answer = post_form(&app, &session, &path, &form).await;
        assert_eq!(answer.status(), 303);
        assert_eq!(
            answer.headers()["location"],
            format!("/consola/pagos/{id}?hecho=reembolsado").as_str()
        );
    }
    assert_eq!(fake.made().len(), 1, "the same form twice is one refund");
    let (html, _) = page_with_csrf(
        &app,
        &session,
        &format!("/consola/pagos/{id}?hecho=reembolsado"),
    )
    .await;
    assert!(html.contains("id=\"refunds\""), "{html}");
    assert!(
        html.contains("Refunded: <strong>10.00 COP</strong>"),
        "{html}"
    );
    assert!(html.contains(">eva<"), "the refund names who asked: {html}");
    assert!(
        html.contains(">eva (admin)<") && !html.contains(">admin<"),
        "the refund's move in the timeline names her, not the break-glass token: {html}"
    );

    // Over what is left: refused with the reason, nothing sent.
    let (html, csrf) = page_with_csrf(&app, &session, &format!("/consola/pagos/{id}")).await;
    let over = [
        ("csrf", csrf.as_str()),
        ("clave", hidden_in(&html, "clave").as_str()),
        ("monto", "250000"),
        ("motivo", "too much"),
    ]
    .map(|(k, v)| (k, v.to_owned()));
    let over: Vec<(&str, &str)> = over.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = post_form(&app, &session, &path, &over).await;
    assert_eq!(answer.status(), 422);
    assert_eq!(fake.made().len(), 1);

    // An amount left empty refunds nothing: everything left is asked for in so many
    // words, and not with an amount beside it.
    let (html, csrf) = page_with_csrf(&app, &session, &format!("/consola/pagos/{id}")).await;
    let clave = hidden_in(&html, "clave");
    for (monto, todo) in [("", None), ("1000", Some("si"))] {
        let mut asked = vec![
            ("csrf", csrf.as_str()),
            ("clave", clave.as_str()),
            ("monto", monto),
            ("motivo", "the customer asked"),
        ];
        asked.extend(todo.map(|t| ("todo", t)));
        let answer = post_form(&app, &session, &path, &asked).await;
        assert_eq!(answer.status(), 422, "{monto:?} {todo:?}");
        let text = answer.text().await.expect("page");
        assert!(text.contains("nothing was refunded"), "{text}");
    }
    assert_eq!(fake.made().len(), 1);
    let everything = [
        ("csrf", csrf.as_str()),
        ("clave", clave.as_str()),
        ("monto", ""),
        ("todo", "si"),
        ("motivo", "the customer asked"),
    ];
    let answer = post_form(&app, &session, &path, &everything).await;
    assert_eq!(answer.status(), 303);
    assert_eq!(fake.made().len(), 2);
    assert_eq!(fake.made()[1]["amount"], 249_000, "everything left");

    // A refund under review is in the attention queue, linked to its payment.
    app.db
        .execute_unprepared("UPDATE refunds SET state = 'REVISION_MANUAL'")
        .await
        .expect("update");
    let (html, _) = page_with_csrf(&app, &session, "/consola/").await;
    assert!(html.contains("id=\"refund-queue\""), "{html}");
    assert!(html.contains(&format!("/consola/pagos/{id}")), "{html}");
}

async fn a_hand_edited_console_url_gets_a_page_never_plain_text(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let session = session_cookie(&log_in(&app, ADMIN_TOKEN).await);
    let id = uuid::Uuid::new_v4();
    // A parameter given twice reads as no parameters; an id that is not UTF-8 once
    // percent-decoded is an id the console does not know.
    for (cookie, path, status) in [
        (
            Some(&session),
            "/consola/?pagina=2&pagina=3".to_owned(),
            200,
        ),
        (
            Some(&session),
            "/consola/pagos?estado=ENVIADA&estado=FALLIDA&q=x".to_owned(),
            200,
        ),
        (
            Some(&session),
            "/consola/webhooks?hecho=a&hecho=b".to_owned(),
            200,
        ),
        (
            Some(&session),
            format!("/consola/pagos/{id}?hecho=a&hecho=b"),
            404,
        ),
        (Some(&session), "/consola/pagos/%FF".to_owned(), 404),
        // A NUL searched for: no payment holds one (PostgreSQL refused it: a 503 page
        // saying the database did not answer).
        (Some(&session), "/consola/pagos?q=%00".to_owned(), 200),
        (None, "/consola/login?salida=1&salida=2".to_owned(), 200),
    ] {
        let answer = get_page(&app, cookie.map(String::as_str), &path).await;
        assert_eq!(answer.status(), status, "{path}");
        let content_type = answer.headers()["content-type"].to_str().expect("text");
        assert!(
            content_type.starts_with("text/html"),
            "{path}: {content_type}"
        );
    }
}

on_both_databases!(
    reactivating_with_every_event_since_it_started_failing_resends_the_event_that_started_it
);

/// "Every event since it started failing" resends the event whose failed attempt started
/// the failures: it was written before that attempt (the endpoint's `failing_since`), and
/// is `ABANDONADA` once its schedule ran out.
async fn reactivating_with_every_event_since_it_started_failing_resends_the_event_that_started_it(
    backend: Backend,
) {
    use crate::receiver::Answer;
    use pagos::entities::webhook_delivery::{self as deliveries, DeliveryState};
    use sea_orm::EntityTrait;
    let (app, _fake, receiver, made) = crate::webhooks_out::delivering_to_a_receiver(
        backend,
        &[
            "--webhooks-timeout",
            "1s",
            "--webhooks-schedule",
            "0s,1s",
            "--webhooks-disable-after",
            "500ms",
        ],
    )
    .await;
    receiver.answer_next([
        Answer::Status(500, "down".into()),
        Answer::Status(500, "down".into()),
    ]);
    let endpoint = made["id"].as_str().expect("id").to_owned();
    let answer = app.pay("k-fallo", &crate::helpers::payment_body()).await;
    assert_eq!(answer.status(), 201);
    let paid = crate::helpers::json(answer).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let event = crate::outbox::events_of(&app, &paid).await[0].id.clone();
    crate::webhooks_out::eventually(
        std::time::Duration::from_secs(15),
        "the first event given up",
        async || {
            deliveries::Entity::find()
                .all(&app.db)
                .await
                .expect("deliveries")
                .iter()
                .any(|d| d.event_id == event && d.state == DeliveryState::GivenUp)
        },
    )
    .await;
    assert_eq!(receiver.deliveries().len(), 2, "its two attempts failed");

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (html, csrf) = page_with_csrf(&app, &session, "/consola/webhooks").await;
    assert!(html.contains("value=\"fallo\""), "{html}");
    let answer = post_form(
        &app,
        &session,
        &format!("/consola/webhooks/{endpoint}/reactivar"),
        &[("csrf", csrf.as_str()), ("reenviar", "fallo")],
    )
    .await;
    assert_eq!(answer.status(), 303);
    crate::webhooks_out::eventually(
        std::time::Duration::from_secs(10),
        "the first event delivered",
        async || {
            receiver
                .deliveries()
                .iter()
                .any(|d| d.header("webhook-id") == event && d.answer == Answer::Ok)
        },
    )
    .await;
}

on_both_databases!(
    the_console_resolves_failed_refunding_what_the_provider_charged_and_shows_a_refusal_as_a_page
);

/// The provider charged a payment under review. The console offers the runbooks' three
/// outcomes; "failed, no money taken" is refused (the provider shows money taken), on a
/// page that says why and what to do; "failed, refund what the provider charged" settles
/// it FALLIDA and refunds the charge.
async fn the_console_resolves_failed_refunding_what_the_provider_charged_and_shows_a_refusal_as_a_page(
    backend: Backend,
) {
    let (app, refunds, id, charge) = charged_under_review(backend, "k-console-refund", None).await;
    let (session, page, html, csrf) = bea_on_its_page(&app, &id).await;
    crate::helpers::assert_contains_all(
        &html,
        &[
            "value=\"COMPLETADA\"",
            "value=\"FALLIDA\"",
            "value=\"FALLIDA_REEMBOLSAR\"",
            "Failed — refund what the provider charged",
        ],
    );
    let resolver = format!("/consola/pagos/{id}/resolver");

    let refused = resolve_as(
        &app,
        &session,
        &resolver,
        "FALLIDA",
        "no money was taken",
        &csrf,
    )
    .await;
    assert_eq!(refused.status(), 409);
    let content_type = refused.headers()["content-type"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(content_type.starts_with("text/html"), "{content_type}");
    let html = refused.text().await.expect("html");
    crate::helpers::assert_contains_all(
        &html,
        &[&charge, "succeeded", "reembolsar", "Resolve by hand"],
    );
    assert!(!html.contains("\"type\":"), "a page, not JSON: {html}");
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    assert!(refunds.made().is_empty(), "nothing refunded");

    let motivo = "ticket 5: charged after all, the order is cancelled";
    let answer = resolve_as(
        &app,
        &session,
        &resolver,
        "FALLIDA_REEMBOLSAR",
        motivo,
        &csrf,
    )
    .await;
    assert_eq!(answer.status(), 303);
    assert_eq!(
        answer.headers()["location"],
        format!("{page}?hecho=resuelto").as_str()
    );
    assert_eq!(app.payment(&id).await.state, "FALLIDA");
    let made = refunds.made();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["charge"], charge.as_str());
    assert_eq!(made[0]["amount"], 250000);
    let html = html_of(&app, &session, &page).await;
    assert!(html.contains("ticket 5"), "{html}");
}

/// A payment (`key`) under review whose charge the provider shows succeeded, refunds
/// answered `refunding` (else succeeded): the app, the refunds' fake, the payment and its
/// charge. The compensation refund is sent before the answer: a machine under load must
/// not time it out (it would be left to the reconciler).
async fn charged_under_review(
    backend: Backend,
    key: &str,
    refunding: Option<&'static str>,
) -> (TestApp, crate::refunds::FakeRefunds, String, String) {
    let args = [
        "--give-up-after",
        "1s",
        "--stale-after",
        "1s",
        "--gateway-timeout",
        "5s",
    ];
    let app = crate::helpers::started(backend, &args).await;
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    if let Some(status) = refunding {
        refunds.refunding(status);
    }
    let (id, fake) = payment_under_review(&app, key).await;
    fake.settle(&id, "succeeded");
    let charge = fake.charge_ids(&id).remove(0);
    (app, refunds, id, charge)
}

/// bea, an operador, logged in on payment `id`'s page: her session, the page, its HTML and
/// CSRF token.
async fn bea_on_its_page(app: &TestApp, id: &str) -> (String, String, String, String) {
    let bea = operator(app, "bea", Role::Operador).await;
    let session = log_in(app, &bea).await;
    let page = format!("/consola/pagos/{id}");
    let (html, csrf) = page_with_csrf(app, &session, &page).await;
    (session, page, html, csrf)
}

/// The console's resolve form of a payment (`resolver`, its action) sent with `estado` and
/// `motivo` in `session`, whose page gave `csrf`.
async fn resolve_as(
    app: &TestApp,
    session: &str,
    resolver: &str,
    estado: &str,
    motivo: &str,
    csrf: &str,
) -> reqwest::Response {
    let fields = [("estado", estado), ("motivo", motivo), ("csrf", csrf)];
    post_form(app, session, resolver, &fields).await
}

on_both_databases!(a_resolution_whose_refund_fails_at_once_is_not_shown_as_resolved);

/// "Failed — refund what the provider charged", and the provider fails the refund at once:
/// the payment is back in REVISION_MANUAL. Before, the console showed the green
/// "Resolved" all the same, and on-call closed a ticket whose customer's charge still
/// waited for them.
async fn a_resolution_whose_refund_fails_at_once_is_not_shown_as_resolved(backend: Backend) {
    let (app, refunds, id, _) =
        charged_under_review(backend, "k-console-refund-fails", Some("failed")).await;
    let (session, page, _, csrf) = bea_on_its_page(&app, &id).await;

    let resolver = format!("{page}/resolver");
    let motivo = "ticket 6: the order is cancelled";
    let answer = resolve_as(
        &app,
        &session,
        &resolver,
        "FALLIDA_REEMBOLSAR",
        motivo,
        &csrf,
    )
    .await;

    assert_eq!(answer.status(), 303);
    let to = answer.headers()["location"]
        .to_str()
        .expect("text")
        .to_owned();
    assert_eq!(to, format!("{page}?hecho=resuelto-en-revision"));
    assert_eq!(refunds.made().len(), 1, "the refund was sent");
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    let html = html_of(&app, &session, &to).await;
    assert!(html.contains("REVISION_MANUAL again"), "{html}");
    assert!(!html.contains("Resolved. The audit trail"), "{html}");
}

on_both_databases!(the_console_reports_what_a_pass_did_with_refunds_beside_payments);

/// A pass that settles only a refund: the console's report shows it, in a column of its
/// own beside the payments' (which were all zero, and were all it showed).
async fn the_console_reports_what_a_pass_did_with_refunds_beside_payments(backend: Backend) {
    let (app, fake) = crate::refunds::app_with(backend, &["--stale-after", "200ms"]).await;
    let payment = crate::refunds::paid(&app, "pay-1").await;
    fake.refunding("pending");
    let answer =
        crate::refunds::refund(&app, &payment, "ref-1", &serde_json::json!({"monto": 5000})).await;
    assert_eq!(answer.status(), 202);
    fake.settle_all("succeeded");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (_, csrf) = page_with_csrf(&app, &session, "/consola/reconciliaciones").await;
    let report = pass_run_by_hand(&app, &session, &csrf).await;
    assert!(report.contains("<th>Refunds</th>"), "{report}");
    assert!(
        report.contains(
            r#"<td class="num">0</td><td class="num">1</td><td class="mono">completados</td>"#
        ),
        "no payment and one refund settled: {report}"
    );
}

on_both_databases!(
    a_payment_whose_look_ups_fail_shows_the_gateways_error_in_the_queue_and_its_detail_until_it_settles,
    a_look_up_the_provider_answers_pending_clears_the_error_of_the_failed_one_before,
    a_payment_sent_to_review_because_the_provider_cannot_be_asked_shows_the_look_ups_error,
);

/// A payment the gateway left pending; its id, and how on-call's detail reads it now.
async fn pending_with_detail(
    app: &TestApp,
    key: &str,
) -> (String, impl AsyncFn() -> serde_json::Value) {
    let answer = app.pay(key, &crate::helpers::payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = crate::helpers::json(answer).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let path = format!("/admin/pagos/{id}");
    let detail =
        async move || crate::helpers::json(app.admin_get(&path).await).await["pago"].clone();
    (id, detail)
}

/// The last error is why a payment waits now: once the provider answers a look-up (the
/// charge is still pending), the error of the look-up that failed before is no longer
/// shown, in on-call's detail nor in the row.
async fn a_look_up_the_provider_answers_pending_clears_the_error_of_the_failed_one_before(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let (id, detail) = pending_with_detail(&app, "k-pending-again").await;

    fake.fail_lookups(true);
    let report = app.reconcile(&id).await;
    assert_eq!(report["pendientes"], 1, "{report}");
    let pago = detail().await;
    assert!(
        pago["ultimoError"]["mensaje"]
            .as_str()
            .is_some_and(|m| m.contains("provider lookup failed")),
        "{pago}"
    );

    fake.fail_lookups(false);
    let report = app.reconcile(&id).await;
    assert_eq!(report["pendientes"], 1, "still pending: {report}");
    app.waits_on_the_provider(&id).await;
}

/// A payment the reconciler sends to REVISION_MANUAL because its give-up horizon passed
/// and the provider cannot be asked pages on-call: its detail shows the look-up's error,
/// as for one that keeps waiting.
async fn a_payment_sent_to_review_because_the_provider_cannot_be_asked_shows_the_look_ups_error(
    backend: Backend,
) {
    use pagos::entities::payment;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr};
    let app = Spawn::new(backend).start().await;
    let fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let (id, detail) = pending_with_detail(&app, "k-paged").await;
    assert!(detail().await.get("ultimoError").is_none(), "no error yet");
    // Registered past the give-up horizon (PAGOS_GIVE_UP_AFTER, 24h).
    payment::Entity::update_many()
        .col_expr(
            payment::Column::CreatedAt,
            Expr::value(pagos::db::now() - chrono::TimeDelta::days(2)),
        )
        .filter(payment::Column::Id.eq(uuid::Uuid::parse_str(&id).expect("uuid")))
        .exec(&app.db)
        .await
        .expect("backdated");

    fake.fail_lookups(true);
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    let pago = detail().await;
    assert_eq!(pago["estado"], "REVISION_MANUAL");
    let said = pago["ultimoError"]["mensaje"].as_str().unwrap_or_default();
    assert!(
        said.contains("provider lookup failed") && said.contains("503"),
        "{pago}"
    );
    assert!(pago["ultimoError"]["en"].is_string(), "{pago}");
}

/// The last error of a payment whose look-ups fail (the gateway answers 503) is what the
/// console's queue shows in its "Last error" column, with how long ago, and what on-call's
/// detail says (`ultimoError`): why it keeps waiting, which was only in the logs. Once the
/// payment settles, it is gone.
async fn a_payment_whose_look_ups_fail_shows_the_gateways_error_in_the_queue_and_its_detail_until_it_settles(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--stale-after", "1s"]).await;
    let fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let answer = app.pay("k-failing", &crate::helpers::payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = crate::helpers::json(answer).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let detail =
        async || crate::helpers::json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert!(
        detail().await["pago"].get("ultimoError").is_none(),
        "pending is no error"
    );

    fake.fail_lookups(true);
    let report = app.reconcile(&id).await;
    assert_eq!(report["pendientes"], 1, "{report}");
    let pago = detail().await["pago"].clone();
    let error = &pago["ultimoError"];
    let said = error["mensaje"].as_str().expect("mensaje");
    assert!(
        said.contains("provider lookup failed") && said.contains("503"),
        "{pago}"
    );
    let at = error["en"].as_str().expect("en");
    let at = chrono::DateTime::parse_from_rfc3339(at).expect("RFC 3339");
    assert!(
        (pagos::db::now() - at.to_utc()).num_seconds() < 10,
        "when: {at}"
    );

    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let session = log_in(&app, ADMIN_TOKEN).await;
    let queue = html_of(&app, &session, "/consola/").await;
    let row = queue
        .split(&format!("data-id=\"{id}\""))
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("the payment is in the queue: {queue}"));
    let cell = row
        .split("data-label=\"Last error\"")
        .nth(1)
        .and_then(|rest| rest.split("</td>").next())
        .expect("a Last error cell");
    let escaped = said
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(cell.contains(&escaped), "the error, whole: {cell}");
    assert!(cell.contains(" ago)"), "with its age: {cell}");

    fake.fail_lookups(false);
    fake.settle_all("succeeded");
    let report = app.reconcile(&id).await;
    assert_eq!(report["completados"], 1, "{report}");
    let pago = detail().await["pago"].clone();
    assert_eq!(pago["estado"], "COMPLETADA");
    assert!(pago.get("ultimoError").is_none(), "settled: {pago}");
    let row = app.payment(&id).await;
    assert_eq!((row.last_error, row.last_error_at), (None, None));

    let doc = app.openapi().await;
    let schemas = &doc["components"]["schemas"];
    // The merchant's `Pago`, and what on-call reads besides.
    let parts = schemas["PagoAdmin"]["allOf"].as_array().expect("allOf");
    assert!(
        parts
            .iter()
            .any(|part| part["properties"]["ultimoError"].is_object()),
        "the detail's schema: {parts:?}"
    );
    for field in ["mensaje", "en"] {
        assert!(
            schemas["UltimoError"]["properties"][field].is_object(),
            "{field}"
        );
    }
}

on_both_databases!(
    an_operador_resolves_refunds_under_review_from_the_payments_page_named_in_their_audit,
    a_refund_resolution_the_provider_contradicts_is_refused_on_the_page_and_changes_nothing,
    an_operador_reconciles_a_refund_now_from_the_payments_page_recorded_by_name,
    a_lector_or_a_form_without_its_csrf_token_cannot_act_on_a_refund,
);

/// pagos giving up on a refund after 1 s, the reference gateway keeping refunds, and a
/// COMPLETADA payment of 250000 COP: the app, the gateway's refunds and the payment.
/// A refund form sent while the refund it asked is still being sent (a double click, a
/// reload; the same holds when the database fails after the send) is answered with an
/// error. Before, the page was drawn again with a new key and said nothing had changed:
/// sending it again asked a second refund while the first stood (the customer refunded
/// twice). Now the form keeps its key, amount and reason, and says the refund may stand:
/// sent again, it is the same refund.
async fn a_refund_form_answered_with_an_error_while_its_refund_may_stand_keeps_its_key(
    backend: Backend,
) {
    let (app, fake) = crate::refunds::app_with(backend, &[]).await;
    let id = crate::refunds::paid(&app, "k-console-slow-refund").await;
    let path = format!("/consola/pagos/{id}/reembolsar");
    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    let (html, csrf) = page_with_csrf(&app, &session, &format!("/consola/pagos/{id}")).await;
    let clave = hidden_in(&html, "clave");
    let form = [
        ("csrf", csrf.as_str()),
        ("clave", clave.as_str()),
        ("monto", "1000"),
        ("motivo", "customer asked"),
    ];
    fake.delay(Duration::from_secs(2));

    let first = post_form(&app, &session, &path, &form);
    let second = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer = post_form(&app, &session, &path, &form).await;
        let status = answer.status();
        (status, answer.text().await.expect("html"))
    };
    let (first, (status, html)) = tokio::join!(first, second);

    assert_eq!(first.status(), 303, "the first one refunded");
    assert_eq!(status, 409, "{html}");
    assert!(html.contains("may have been registered"), "{html}");
    assert_eq!(
        hidden_in(&html, "clave"),
        clave,
        "the form keeps its key: sent again, it is the same refund"
    );
    assert!(html.contains("value=\"1000\""), "and its amount: {html}");
    let monto = html
        .split("<input")
        .find(|tag| tag.contains("name=\"monto\""))
        .expect("the amount field");
    assert!(
        !monto.contains("max=\""),
        "no maximum the kept amount (counted as left already) would exceed: {monto}"
    );
    let kept = [
        ("csrf", csrf.as_str()),
        ("clave", clave.as_str()),
        ("monto", "1000"),
        ("motivo", "customer asked"),
    ];
    let again = post_form(&app, &session, &path, &kept).await;
    assert_eq!(again.status(), 303, "the same refund's answer");
    assert_eq!(fake.made().len(), 1, "one refund at the provider");

    // The kept form sent with another amount: its key's refund stands, and the page says
    // so above a new form (not the same edited form, which every send would refuse).
    let edited = [
        ("csrf", csrf.as_str()),
        ("clave", clave.as_str()),
        ("monto", "2000"),
        ("motivo", "customer asked"),
    ];
    let answer = post_form(&app, &session, &path, &edited).await;
    assert_eq!(answer.status(), 422);
    let html = answer.text().await.expect("html");
    assert!(
        html.contains("already asked with this form's key"),
        "{html}"
    );
    assert_ne!(hidden_in(&html, "clave"), clave, "a new form");
    assert_eq!(fake.made().len(), 1);
}

async fn with_paid(backend: Backend) -> (TestApp, crate::refunds::FakeRefunds, String) {
    let (app, fake) =
        crate::refunds::app_with(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let payment = crate::refunds::paid(&app, "k-console-refunds").await;
    (app, fake, payment)
}

/// A refund of 5000 of `payment` that the provider holds pending: `ENVIADO`. Its id.
async fn refund_pending(
    app: &TestApp,
    fake: &crate::refunds::FakeRefunds,
    payment: &str,
    key: &str,
) -> String {
    fake.refunding("pending");
    let answer =
        crate::refunds::refund(app, payment, key, &serde_json::json!({ "monto": 5000 })).await;
    assert_eq!(answer.status(), 202);
    crate::helpers::json(answer).await["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

/// A refund of 5000 of `payment` still pending at the provider past PAGOS_GIVE_UP_AFTER:
/// reconciled, it went to `REVISION_MANUAL`. Its id.
async fn refund_under_review(
    app: &TestApp,
    fake: &crate::refunds::FakeRefunds,
    payment: &str,
    key: &str,
) -> String {
    let id = refund_pending(app, fake, payment, key).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let answer = app
        .admin_post(
            "/admin/reconciliaciones",
            &serde_json::json!({ "reembolsoId": id }),
        )
        .await;
    assert_eq!(answer.status(), 200);
    let report = crate::helpers::json(answer).await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    id
}

/// Refund `id` resolved `estado` with `motivo` (and `gateway_ref`) through its card's form,
/// as eva's session with its CSRF token: answered 303, the refund is `estado` and the last
/// row of its trail names eva and the reason. Where the answer sends the browser.
async fn resolved_by_eva(
    (app, session, csrf): (&TestApp, &str, &str),
    id: &str,
    estado: &str,
    motivo: &str,
    gateway_ref: &str,
) -> String {
    let sent_to = see_other(
        app,
        session,
        &format!("/consola/reembolsos/{id}/resolver"),
        &[
            ("csrf", csrf),
            ("estado", estado),
            ("motivo", motivo),
            ("gatewayRef", gateway_ref),
        ],
    )
    .await;
    let (state, trail) = refund_now(app, id).await;
    assert_eq!(state, estado);
    let last = trail.last().expect("a row");
    assert!(
        last.contains("resolved by eva (on-call)") && last.contains(motivo),
        "{last}"
    );
    sent_to
}

/// eva, an operador, logged in and on payment `payment`'s page: her session, the page's
/// path, its HTML and its CSRF token.
async fn eva_on_the_payment(app: &TestApp, payment: &str) -> (String, String, String, String) {
    let eva = operator(app, "eva", Role::Operador).await;
    let session = log_in(app, &eva).await;
    let page = format!("/consola/pagos/{payment}");
    let (html, csrf) = page_with_csrf(app, &session, &page).await;
    (session, page, html, csrf)
}

/// Refund `id`'s state, and the reasons of its audit trail, oldest first.
async fn refund_now(app: &TestApp, id: &str) -> (String, Vec<String>) {
    let id = uuid::Uuid::parse_str(id).expect("uuid");
    let found = pagos::saga::refund::store::find(&app.db, id)
        .await
        .expect("db")
        .expect("the refund");
    let trail = pagos::saga::refund::store::trail(&app.db, id)
        .await
        .expect("trail")
        .into_iter()
        .map(|t| t.reason)
        .collect();
    (found.state.as_str().to_owned(), trail)
}

/// Refunds under review resolved from their payment's page, one COMPLETADO once the
/// provider shows it succeeded, one FALLIDO once it shows it failed: each through the
/// form on the refund's card (linked from its state in the table), each audit row naming
/// the operador, and the payment's timeline showing her moves.
async fn an_operador_resolves_refunds_under_review_from_the_payments_page_named_in_their_audit(
    backend: Backend,
) {
    let (app, fake, payment) = with_paid(backend).await;
    let first = refund_under_review(&app, &fake, &payment, "ref-console-1").await;
    let (session, page, html, csrf) = eva_on_the_payment(&app, &payment).await;
    crate::helpers::assert_contains_all(
        &html,
        &[
            &format!("href=\"#refund-{first}\""),
            &format!("id=\"refund-{first}\""),
            &format!("action=\"/consola/reembolsos/{first}/resolver\""),
            "value=\"COMPLETADO\"",
            "Refunded: the money went back",
            "value=\"FALLIDO\"",
            "Failed: no money went back",
            "The provider says now",
            "re_fake_1</code> — <strong>pending",
        ],
    );
    assert!(
        !html.contains("contraProveedor"),
        "the page overrules no provider, as the payment's form does not"
    );

    // The provider settled it: the money went back.
    fake.settle_all("succeeded");
    let sent_to = resolved_by_eva(
        (&app, &session, &csrf),
        &first,
        "COMPLETADO",
        "ticket 77: re_fake_1 succeeded in the dashboard",
        "",
    )
    .await;
    assert_eq!(
        sent_to,
        format!("/consola/pagos/{payment}?hecho=reembolso-resuelto")
    );
    let html = html_of(&app, &session, &format!("{page}?hecho=reembolso-resuelto")).await;
    assert!(html.contains("Refund resolved"), "{html}");
    assert!(
        !html.contains(&format!("id=\"refund-{first}\"")),
        "settled: no card any more"
    );
    let timeline = &html[html.find("Audit trail").expect("the timeline")..];
    crate::helpers::assert_contains_all(
        timeline,
        &[
            "eva (admin)",
            "ticket 77",
            "Needs manual review",
            "Refunded",
        ],
    );

    // A second one, which the provider failed: no money went back.
    let second = refund_under_review(&app, &fake, &payment, "ref-console-2").await;
    let (_, csrf) = page_with_csrf(&app, &session, &page).await;
    fake.settle_all("failed");
    resolved_by_eva(
        (&app, &session, &csrf),
        &second,
        "FALLIDO",
        "ticket 78: re_fake_2 failed at the provider",
        "re_fake_2",
    )
    .await;
    let html = html_of(&app, &session, &page).await;
    let timeline = &html[html.find("Audit trail").expect("the timeline")..];
    crate::helpers::assert_contains_all(timeline, &["ticket 78", "Refused, nothing returned"]);
}

/// A resolution the provider contradicts (COMPLETADO while it shows the refund pending,
/// FALLIDO while it shows it pending), one it cannot be asked about, and one without a
/// reason: each refused on the payment's page, which says why, and nothing changes.
async fn a_refund_resolution_the_provider_contradicts_is_refused_on_the_page_and_changes_nothing(
    backend: Backend,
) {
    let (app, fake, payment) = with_paid(backend).await;
    let id = refund_under_review(&app, &fake, &payment, "ref-console-1").await;
    let before = refund_now(&app, &id).await;
    let (session, _, _, csrf) = eva_on_the_payment(&app, &payment).await;
    let resolver = format!("/consola/reembolsos/{id}/resolver");

    for (estado, fail_lookups, status, says) in [
        (
            "COMPLETADO",
            false,
            409,
            "the provider shows no succeeded refund",
        ),
        ("FALLIDO", false, 409, "is still pending at the provider"),
        ("FALLIDO", true, 503, "could not be asked"),
    ] {
        fake.fail_lookups(fail_lookups);
        let answer = post_form(
            &app,
            &session,
            &resolver,
            &[
                ("csrf", csrf.as_str()),
                ("estado", estado),
                ("motivo", "I think it is settled"),
            ],
        )
        .await;
        assert_eq!(answer.status(), status, "{estado}");
        let content_type = answer.headers()["content-type"]
            .to_str()
            .expect("text")
            .to_owned();
        assert!(content_type.starts_with("text/html"), "{content_type}");
        let html = answer.text().await.expect("html");
        assert!(html.contains(says), "{estado}: {html}");
        assert!(html.contains("re_fake_1") || fail_lookups, "{html}");
        assert!(
            html.contains("Nothing was changed") || fail_lookups,
            "{html}"
        );
        assert!(
            html.contains("Refunds that need you"),
            "the payment's page, its refund still there: {html}"
        );
        assert!(!html.contains("\"type\":"), "a page, not JSON: {html}");
        assert_eq!(refund_now(&app, &id).await, before, "{estado}");
    }
    fake.fail_lookups(false);

    let answer = post_form(
        &app,
        &session,
        &resolver,
        &[
            ("csrf", csrf.as_str()),
            ("estado", "FALLIDO"),
            ("motivo", "   "),
        ],
    )
    .await;
    assert_eq!(answer.status(), 422, "a reason is required");
    assert!(
        answer
            .text()
            .await
            .expect("html")
            .contains("motivo is required")
    );
    assert_eq!(refund_now(&app, &id).await, before);
}

/// "Reconcile now" of a refund in flight, from its payment's page: the provider's answer
/// settles it, the ask is recorded naming the operador (`/admin/acciones`), and the
/// payment's timeline shows it with what came of it.
async fn an_operador_reconciles_a_refund_now_from_the_payments_page_recorded_by_name(
    backend: Backend,
) {
    use crate::operator_actions::actions_as;
    let (app, fake, payment) = with_paid(backend).await;
    let id = refund_pending(&app, &fake, &payment, "ref-console-1").await;
    assert_eq!(refund_now(&app, &id).await.0, "ENVIADO");
    let (session, page, html, csrf) = eva_on_the_payment(&app, &payment).await;
    crate::helpers::assert_contains_all(
        &html,
        &[
            &format!("href=\"#refund-{id}\""),
            &format!("action=\"/consola/reembolsos/{id}/reconciliar\""),
        ],
    );

    fake.settle_all("succeeded");
    let sent_to = see_other(
        &app,
        &session,
        &format!("/consola/reembolsos/{id}/reconciliar"),
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        sent_to,
        format!("/consola/pagos/{payment}?hecho=reembolso-reconciliado")
    );
    assert_eq!(
        refund_now(&app, &id).await.0,
        "COMPLETADO",
        "settled by the provider's answer"
    );
    let rows = actions_as(&app, ADMIN_TOKEN, "?operador=eva").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["accion"], "reconcile_refund");
    assert_eq!(rows[0]["objetivo"], id.as_str());
    assert!(rows[0]["terminadaEn"].is_string(), "{rows:?}");
    assert!(
        crate::helpers::text_has(
            &rows[0],
            "detalle",
            "reembolsos: examinados 1, completados 1"
        ),
        "{rows:?}"
    );
    let html = html_of(
        &app,
        &session,
        &format!("{page}?hecho=reembolso-reconciliado"),
    )
    .await;
    assert!(html.contains("Refund reconciled now"), "{html}");
    let timeline = &html[html.find("Audit trail").expect("the timeline")..];
    crate::helpers::assert_contains_all(
        timeline,
        &[
            "eva (on-call)",
            "Reconcile now asked of refund",
            &id[..8],
            "reembolsos: examinados 1, completados 1",
        ],
    );
}

/// A lector sees the refunds that need on-call but no form, and one posted anyway is
/// refused; an operador's form without the session's CSRF token is refused too. None of
/// them changes a refund or leaves a row.
async fn a_lector_or_a_form_without_its_csrf_token_cannot_act_on_a_refund(backend: Backend) {
    use crate::operator_actions::actions_as;
    let (app, fake, payment) = with_paid(backend).await;
    let review = refund_under_review(&app, &fake, &payment, "ref-console-1").await;
    let flight = refund_pending(&app, &fake, &payment, "ref-console-2").await;
    // Each action would settle its refund now.
    fake.settle_all("succeeded");
    let before = [
        refund_now(&app, &review).await,
        refund_now(&app, &flight).await,
    ];
    let page = format!("/consola/pagos/{payment}");
    let resolver = format!("/consola/reembolsos/{review}/resolver");
    let reconciler = format!("/consola/reembolsos/{flight}/reconciliar");

    let luis = operator(&app, "luis", Role::Lector).await;
    let reader = log_in(&app, &luis).await;
    let (html, csrf) = page_with_csrf(&app, &reader, &page).await;
    assert!(html.contains(&format!("id=\"refund-{review}\"")), "{html}");
    assert!(
        !html.contains("action=\"/consola/reembolsos/"),
        "no refund form for a lector: {html}"
    );
    assert!(html.contains("Your role is lector"), "{html}");
    for (path, fields) in [
        (
            &resolver,
            vec![
                ("csrf", csrf.as_str()),
                ("estado", "COMPLETADO"),
                ("motivo", "I should not"),
            ],
        ),
        (&reconciler, vec![("csrf", csrf.as_str())]),
    ] {
        let answer = post_form(&app, &reader, path, &fields).await;
        assert_eq!(answer.status(), 403, "{path}");
        assert!(answer.text().await.expect("html").contains("lector"));
    }

    let eva = operator(&app, "eva", Role::Operador).await;
    let session = log_in(&app, &eva).await;
    for (path, fields) in [
        (
            &resolver,
            vec![("estado", "COMPLETADO"), ("motivo", "ticket 9")],
        ),
        (
            &resolver,
            vec![
                ("csrf", "forged"),
                ("estado", "COMPLETADO"),
                ("motivo", "ticket 9"),
            ],
        ),
        (&reconciler, vec![]),
        (&reconciler, vec![("csrf", "forged")]),
    ] {
        let answer = post_form(&app, &session, path, &fields).await;
        assert_eq!(answer.status(), 403, "{path} {fields:?}");
        assert!(answer.text().await.expect("html").contains("CSRF"));
    }
    assert_eq!(
        [
            refund_now(&app, &review).await,
            refund_now(&app, &flight).await,
        ],
        before,
        "nothing changed"
    );
    for who in ["luis", "eva"] {
        assert!(
            actions_as(&app, ADMIN_TOKEN, &format!("?operador={who}"))
                .await
                .is_empty(),
            "no row of {who}'s"
        );
    }

    // An id that names no refund is a page that says so.
    let (_, csrf) = page_with_csrf(&app, &session, &page).await;
    let none = uuid::Uuid::new_v4();
    let answer = post_form(
        &app,
        &session,
        &format!("/consola/reembolsos/{none}/reconciliar"),
        &[("csrf", csrf.as_str())],
    )
    .await;
    assert_eq!(answer.status(), 404);
    assert!(
        answer
            .text()
            .await
            .expect("html")
            .contains("No such refund")
    );
}

/// The console's resolution is the admin API's: it leaves the `resolve_payment` row naming
/// who asked, read at `/admin/acciones`. The payment's timeline shows the resolution once,
/// as its move (who, the reason), never the row beside it.
async fn a_resolution_from_the_console_leaves_its_row_at_admin_acciones_and_the_timeline_shows_it_once(
    backend: Backend,
) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let (id, gateway) = payment_under_review(&app, "k-console-audit").await;
    gateway.settle(&id, "declined");
    let bea = operator(&app, "bea", Role::Operador).await;
    let session = log_in(&app, &bea).await;
    let path = format!("/consola/pagos/{id}");
    let page = get_page(&app, Some(&session_cookie(&session)), &path).await;
    let csrf = csrf_in(&page.text().await.expect("html"));

    let fields = [
        ("estado", "FALLIDA"),
        ("motivo", "declinado en el panel"),
        ("csrf", &csrf),
    ];
    let to = see_other(&app, &session, &format!("{path}/resolver"), &fields).await;
    assert_eq!(to, format!("{path}?hecho=resuelto"));
    assert_eq!(app.payment(&id).await.state, "FALLIDA");

    let rows =
        crate::operator_actions::actions_as(&app, ADMIN_TOKEN, &format!("?objetivo={id}")).await;
    let resolutions: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["accion"] == "resolve_payment")
        .collect();
    assert_eq!(resolutions.len(), 1, "{rows:?}");
    let row = resolutions[0];
    assert_eq!(row["operador"], "bea", "{row}");
    assert!(
        crate::helpers::text_has(
            row,
            "detalle",
            "resolve the payment FALLIDA: declinado en el panel — resolved FALLIDA"
        ),
        "{row}"
    );
    assert!(row["terminadaEn"].is_string(), "{row}");

    let page = get_page(&app, Some(&session_cookie(&session)), &path).await;
    let html = page.text().await.expect("html");
    assert_eq!(
        html.matches("declinado en el panel").count(),
        1,
        "the resolution once in the timeline: {html}"
    );
    assert!(!html.contains("resolve the payment"), "{html}");
}
