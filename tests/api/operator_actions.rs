//! On-call's actions leave a row naming who asked and what came of it, read back at
//! `GET /admin/acciones` (contract section 8): those that move nothing by their own hand —
//! "reconcile now" of a payment or a refund, a pass run by hand — and those that move money
//! or settle a state — a payment or a refund resolved by hand, a refund on-call asked. A
//! refusal leaves a row saying refused and why; a lector's refused ask leaves none, and an
//! ask that cannot be recorded is not done.

use crate::helpers::{ADMIN_TOKEN, Backend, FakeGateway, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use crate::operators::{operator, operator_in};
use pagos::operators::Role;
use sea_orm::EntityTrait;
use serde_json::{Value, json};

on_both_databases!(
    each_reconcile_now_and_each_pass_leaves_a_row_naming_the_operator_and_its_outcome,
    a_bad_query_of_the_actions_is_a_422_naming_the_parameter_and_changes_nothing,
    an_action_whose_audit_row_cannot_be_written_is_refused_and_nothing_is_done,
    a_pass_run_by_pagos_reconcile_once_leaves_a_row_naming_its_operator_and_its_report,
    pagos_reconcile_once_whose_audit_row_cannot_be_written_is_refused_and_does_nothing,
    pagos_reconcile_once_names_only_an_operator_who_may_run_a_pass,
    a_payment_resolved_by_hand_leaves_a_row_with_what_came_of_it_and_a_refusal_says_refused,
    a_refund_resolved_by_hand_leaves_a_row_on_the_refund_and_a_refusal_says_refused,
    an_on_call_refund_leaves_a_row_and_its_replay_says_nothing_new_was_refunded,
    resolutions_and_refunds_whose_audit_row_cannot_be_written_are_refused_and_nothing_is_done,
    an_action_a_newer_pagos_recorded_is_listed_by_its_name,
    the_admin_list_of_payments_takes_its_parameters_in_the_query_and_refuses_unknown_ones,
    on_calls_view_of_a_payment_shows_what_was_refunded_as_the_merchants_does,
    on_calls_list_of_payments_goes_on_page_by_page_with_its_cursor,
);

/// On-call's actions, newest first, as `token` reads them with `query`.
pub async fn actions_as(app: &TestApp, token: &str, query: &str) -> Vec<Value> {
    let answer = app.get_as(token, &format!("/admin/acciones{query}")).await;
    assert_eq!(answer.status(), 200, "{query}");
    json(answer).await["acciones"]
        .as_array()
        .cloned()
        .expect("acciones")
}

/// A payment whose charge is pending at `fake` (answered 202), then succeeded there: the
/// next look-up settles it. Its id.
pub async fn settled_at_the_provider(app: &TestApp, fake: &FakeGateway, key: &str) -> String {
    fake.set_new_status("pending");
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    fake.settle_all("succeeded");
    id
}

/// `row` is a finished action of `operador`'s: `accion` on `objetivo`, its `detalle`
/// saying `outcome`.
fn assert_row(row: &Value, operador: &str, accion: &str, objetivo: Option<&str>, outcome: &str) {
    assert_eq!(row["operador"], operador, "{row}");
    assert_eq!(row["accion"], accion, "{row}");
    assert_eq!(
        row["objetivo"],
        objetivo.map_or(Value::Null, Value::from),
        "{row}"
    );
    assert!(
        crate::helpers::text_has(row, "detalle", outcome),
        "{outcome} in {row}"
    );
    assert!(row["en"].is_string(), "{row}");
    assert!(row["terminadaEn"].is_string(), "finished: {row}");
}

async fn each_reconcile_now_and_each_pass_leaves_a_row_naming_the_operator_and_its_outcome(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    let ana = operator(&app, "ana", Role::Operador).await;
    let luis = operator(&app, "luis", Role::Lector).await;
    let payment = settled_at_the_provider(&app, &fake, "k-act-1").await;

    // A lector is refused before anything is written.
    for body in [json!({"pagoId": payment}), json!({})] {
        let answer = app.post_as(&luis, "/admin/reconciliaciones", &body).await;
        assert_eq!(answer.status(), 403, "{body}");
    }
    assert!(actions_as(&app, &luis, "").await.is_empty(), "no row");
    assert_eq!(app.payment(&payment).await.state, "ENVIADA");

    let answer = app
        .post_as(&eva, "/admin/reconciliaciones", &json!({"pagoId": payment}))
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["completados"], 1);

    refunds.refunding("pending");
    let answer = crate::refunds::refund(&app, &payment, "r-act-1", &json!({"monto": 1000})).await;
    assert_eq!(answer.status(), 202);
    let refund = json(answer).await["id"].as_str().expect("id").to_owned();
    refunds.settle_all("succeeded");
    let answer = app
        .post_as(
            &eva,
            "/admin/reconciliaciones",
            &json!({"reembolsoId": refund}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["reembolsos"]["completados"], 1);

    let answer = app
        .post_as(&ana, "/admin/reconciliaciones", &json!({}))
        .await;
    assert_eq!(answer.status(), 200);

    // A lector reads them: newest first, each naming who asked and what came of it.
    let all = actions_as(&app, &luis, "").await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert_row(
        &all[0],
        "ana",
        "reconcile_pass",
        None,
        "pagos: examinados 0",
    );
    assert_row(
        &all[1],
        "eva",
        "reconcile_refund",
        Some(&refund),
        "reembolsos: examinados 1, completados 1",
    );
    assert_row(
        &all[2],
        "eva",
        "reconcile_payment",
        Some(&payment),
        "pagos: examinados 1, completados 1",
    );

    // Filtered by who, by what, both; and cut at `limite`.
    let by_eva: Vec<Value> = actions_as(&app, ADMIN_TOKEN, "?operador=eva").await;
    let what: Vec<&str> = by_eva.iter().filter_map(|r| r["accion"].as_str()).collect();
    assert_eq!(what, ["reconcile_refund", "reconcile_payment"]);
    // Names are one operator's whatever their case (before: `EVA` found nothing, which
    // reads as "she did nothing").
    let by_eva_in_capitals = actions_as(&app, ADMIN_TOKEN, "?operador=EVA").await;
    assert_eq!(by_eva_in_capitals, by_eva);
    let on_payment = actions_as(&app, ADMIN_TOKEN, &format!("?objetivo={payment}")).await;
    assert_eq!(on_payment.len(), 1, "{on_payment:?}");
    assert_eq!(on_payment[0]["accion"], "reconcile_payment");
    let none = actions_as(
        &app,
        ADMIN_TOKEN,
        &format!("?operador=ana&objetivo={refund}"),
    )
    .await;
    assert!(none.is_empty(), "{none:?}");
    let newest = actions_as(&app, ADMIN_TOKEN, "?limite=1").await;
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0]["operador"], "ana");
}

async fn a_bad_query_of_the_actions_is_a_422_naming_the_parameter_and_changes_nothing(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let answer = app.admin_post("/admin/reconciliaciones", &json!({})).await;
    assert_eq!(answer.status(), 200);
    let before = actions_as(&app, ADMIN_TOKEN, "").await;
    assert_eq!(before.len(), 1);
    assert_eq!(before[0]["operador"], "admin", "the break-glass token");
    assert_eq!(
        actions_as(&app, ADMIN_TOKEN, "?operador=ADMIN").await,
        before,
        "the break-glass token's name, whatever its case"
    );

    for (query, campo) in [
        ("?limite=0", "limite"),
        ("?limite=501", "limite"),
        ("?limite=muchos", "limite"),
        ("?limite=5&limite=6", "limite"),
        ("?objetivo=not-a-uuid", "objetivo"),
        ("?operador=", "operador"),
        ("?operator=eva", "operator"),
    ] {
        let answer = app.admin_get(&format!("/admin/acciones{query}")).await;
        let problem = crate::helpers::problem(answer, 422, query).await;
        assert_eq!(problem["errores"][0]["campo"], campo, "{query}: {problem}");
    }
    let answer = app.get("/admin/acciones").await;
    assert_eq!(answer.status(), 401, "no token");
    assert_eq!(
        actions_as(&app, ADMIN_TOKEN, "").await,
        before,
        "nothing changed"
    );

    let operation = &app.openapi().await["paths"]["/admin/acciones"]["get"];
    crate::helpers::assert_responses(operation, &["200", "401", "422"], "GET /admin/acciones");
}

async fn an_action_whose_audit_row_cannot_be_written_is_refused_and_nothing_is_done(
    backend: Backend,
) {
    use sea_orm::ConnectionTrait;
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    let payment = settled_at_the_provider(&app, &fake, "k-act-unrecorded").await;
    let lookups = fake.lookups_made();
    app.db
        .execute_unprepared("DROP TABLE IF EXISTS operator_actions")
        .await
        .expect("dropped");

    for body in [json!({"pagoId": payment}), json!({})] {
        let answer = app.post_as(&eva, "/admin/reconciliaciones", &body).await;
        let problem = crate::helpers::problem(answer, 503, &body.to_string()).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", "nothing was done"),
            "{problem}"
        );
    }
    assert_eq!(fake.lookups_made(), lookups, "the provider was not asked");
    assert_eq!(app.payment(&payment).await.state, "ENVIADA", "not settled");
}

/// A world whose database holds `n` payments left ENVIADA and due, each charged at the
/// gateway: the next pass settles them.
async fn charged_and_due(backend: Backend, n: usize) -> crate::process::World {
    use pagos::entities::payment;
    use sea_orm::EntityTrait;
    let world = crate::process::World::new(backend, FakeGateway::charging("succeeded")).await;
    let merchant = crate::helpers::acme(&world.db).await;
    let at = pagos::db::now() - chrono::TimeDelta::minutes(5);
    for i in 0..n {
        let row = crate::helpers::left_payment(
            merchant,
            &format!("k-cli-{i}"),
            payment::PaymentState::Enviada,
            1,
            format!("pagos-cli-{i}"),
            at,
        );
        world.fake.preload(&row.id.to_string(), "succeeded");
        payment::Entity::insert(payment::ActiveModel::from(row))
            .exec_without_returning(&world.db)
            .await
            .expect("seed");
    }
    world
}

/// `pagos reconcile --once` with the world's settings, `args` and `env`; how it ended.
async fn reconcile_by_hand(
    world: &crate::process::World,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut all = world.crash_args();
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    crate::process::reconcile_once_output(&all, env).await
}

/// `pagos reconcile --once` refused: exit `code`, no report on stdout (no pass ran), and
/// one `pagos: ` line on stderr, which it returns.
fn refused_in_one_line(output: &std::process::Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(output.stdout.is_empty(), "no report: no pass ran");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pagos: "))
        .collect();
    assert_eq!(said.len(), 1, "one line: {stderr}");
    said[0].to_owned()
}

/// `pagos reconcile --once` is one of on-call's actions too: its pass leaves a
/// `reconcile_pass` row naming who ran it (`--operador`, or `cli:` and the login name)
/// and its report's counts, read at `GET /admin/acciones` like a pass asked of the API.
async fn a_pass_run_by_pagos_reconcile_once_leaves_a_row_naming_its_operator_and_its_report(
    backend: Backend,
) {
    let world = charged_and_due(backend, 2).await;
    for name in ["ana", "luis"] {
        operator_in(&world.db, name, Role::Operador).await;
    }
    let output = reconcile_by_hand(&world, &["--operador", "ana"], &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("the report is JSON");
    assert_eq!(report["completados"], 2, "{report}");

    // Unnamed, it is the login's; PAGOS_OPERATOR names it too.
    let output = reconcile_by_hand(&world, &[], &[("USER", "maria"), ("LOGNAME", "maria")]).await;
    assert!(output.status.success());
    let output = reconcile_by_hand(&world, &[], &[("PAGOS_OPERATOR", "luis")]).await;
    assert!(output.status.success());

    let serve = world.serve(&[("PAGOS_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
    let answer = reqwest::Client::new()
        .get(format!("{}/admin/acciones", serve.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 200);
    let all = json(answer).await["acciones"]
        .as_array()
        .cloned()
        .expect("acciones");
    assert_eq!(all.len(), 3, "{all:?}");
    assert_row(
        &all[0],
        "luis",
        "reconcile_pass",
        None,
        "pagos: examinados 0",
    );
    assert_row(
        &all[1],
        "cli:maria",
        "reconcile_pass",
        None,
        "pagos: examinados 0",
    );
    assert_row(
        &all[2],
        "ana",
        "reconcile_pass",
        None,
        "pagos: examinados 2, completados 2",
    );
    assert!(
        crate::helpers::text_has(&all[2], "detalle", "pagos reconcile --once"),
        "{}",
        all[2]
    );

    // A name pagos writes itself, or the break-glass token's, is a bad setting.
    for name in ["reconciler", "admin"] {
        let output = reconcile_by_hand(&world, &["--operador", name], &[]).await;
        assert_eq!(output.status.code(), Some(2), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("PAGOS_OPERATOR"), "{stderr}");
        assert!(output.stdout.is_empty());
    }

    // On a database no process has pinned yet, a refused operator pins nothing: before,
    // the gateway of the shell's settings was recorded first, and the next start with the
    // intended one refused as "another gateway".
    use sea_orm::{ColumnTrait, ConnectionTrait, PaginatorTrait, QueryFilter};
    world
        .db
        .execute_unprepared("DELETE FROM instance_facts WHERE name LIKE 'gateway%'")
        .await
        .expect("unpinned");
    let output = reconcile_by_hand(&world, &["--operador", "nobody"], &[]).await;
    assert_eq!(output.status.code(), Some(2));
    let pinned = pagos::entities::instance_fact::Entity::find()
        .filter(pagos::entities::instance_fact::Column::Name.like("gateway%"))
        .count(&world.db)
        .await
        .expect("count");
    assert_eq!(pinned, 0, "nothing pinned");
}

/// Like the admin API's: a pass whose audit row cannot be written is not run. One line
/// says so, exit 1, no report, and the provider is not asked.
async fn pagos_reconcile_once_whose_audit_row_cannot_be_written_is_refused_and_does_nothing(
    backend: Backend,
) {
    use sea_orm::ConnectionTrait;
    let world = charged_and_due(backend, 2).await;
    operator_in(&world.db, "ana", Role::Operador).await;
    world
        .db
        .execute_unprepared("DROP TABLE IF EXISTS operator_actions")
        .await
        .expect("dropped");

    let mut before = pagos::entities::payment::Entity::find()
        .all(&world.db)
        .await
        .expect("query");
    before.sort_by_key(|p| p.id);

    let output = reconcile_by_hand(&world, &["--operador", "ana"], &[]).await;
    let said = refused_in_one_line(&output, 1);
    assert!(said.contains("nothing was done"), "{said}");
    assert_eq!(world.fake.lookups_made(), 0, "the provider was not asked");
    let mut after = pagos::entities::payment::Entity::find()
        .all(&world.db)
        .await
        .expect("query");
    after.sort_by_key(|p| p.id);
    assert_eq!(after, before, "not settled, not even claimed");
}

/// `--operador` names an operator of the operators table who may act, as an operator's
/// token would have to: a typo, a revoked operator or a `lector` is a bad setting (one
/// line naming PAGOS_OPERATOR, exit 2), and nothing is run or recorded. The name is
/// recorded as the operator's, whatever case it was given in.
async fn pagos_reconcile_once_names_only_an_operator_who_may_run_a_pass(backend: Backend) {
    let world = charged_and_due(backend, 2).await;
    operator_in(&world.db, "ana", Role::Operador).await;
    operator_in(&world.db, "luis", Role::Lector).await;
    operator_in(&world.db, "bea", Role::Operador).await;
    pagos::operators::store::revoke(
        &world.db,
        &pagos::operators::OperatorName::parse("bea").expect("name"),
    )
    .await
    .expect("revoked");

    for (name, says) in [
        ("anna", "no operator named \"anna\""),
        ("bea", "no operator named \"bea\", or revoked"),
        ("luis", "luis is a lector"),
    ] {
        let output = reconcile_by_hand(&world, &["--operador", name], &[]).await;
        let said = refused_in_one_line(&output, 2);
        assert!(said.contains("PAGOS_OPERATOR"), "{name}: {said}");
        assert!(said.contains(says), "{name}: {said}");
    }
    assert_eq!(world.fake.lookups_made(), 0, "the provider was not asked");
    let rows = pagos::entities::operator_action::Entity::find()
        .all(&world.db)
        .await
        .expect("query");
    assert!(rows.is_empty(), "nothing recorded: {rows:?}");

    let output = reconcile_by_hand(&world, &["--operador", "ANA"], &[]).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = pagos::entities::operator_action::Entity::find()
        .all(&world.db)
        .await
        .expect("query");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].operator, "ana", "recorded as the operator is named");
}

/// eva's actions on `objetivo`, newest first.
async fn evas_on(app: &TestApp, objetivo: &str) -> Vec<Value> {
    actions_as(
        app,
        ADMIN_TOKEN,
        &format!("?operador=eva&objetivo={objetivo}"),
    )
    .await
}

/// A payment's resolution is one of on-call's actions: each ask leaves a `resolve_payment`
/// row on the payment, naming who asked what; one taken says the state it left (and the
/// refunds `reembolsar` asked), one refused says refused and why.
async fn a_payment_resolved_by_hand_leaves_a_row_with_what_came_of_it_and_a_refusal_says_refused(
    backend: Backend,
) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    let (payment, fake) = crate::operators::payment_under_review(&app, "k-act-res-1").await;

    // Refused: the provider shows the charge still pending; then a bad estado.
    let body = json!({"estado": "FALLIDA", "motivo": "no money in the dashboard"});
    let answer = app.resolve_as(&eva, &payment, &body).await;
    crate::helpers::problem(answer, 409, "pending at the provider").await;
    let answer = app
        .resolve_as(&eva, &payment, &json!({"estado": "PAGADA", "motivo": "x"}))
        .await;
    crate::helpers::problem(answer, 422, "bad estado").await;
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");

    fake.settle(&payment, "succeeded");
    let body = json!({"estado": "COMPLETADA", "motivo": "visto en el panel, ticket 12"});
    let done = app.resolved_as(&eva, &payment, &body).await;
    assert_eq!(done["pago"]["estado"], "COMPLETADA");

    let rows = evas_on(&app, &payment).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_row(
        &rows[0],
        "eva",
        "resolve_payment",
        Some(&payment),
        "resolve the payment COMPLETADA: visto en el panel, ticket 12 — resolved COMPLETADA",
    );
    assert_row(
        &rows[1],
        "eva",
        "resolve_payment",
        Some(&payment),
        "resolve the payment PAGADA: x — refused (422 validation-failed): estado must be",
    );
    assert_row(
        &rows[2],
        "eva",
        "resolve_payment",
        Some(&payment),
        "resolve the payment FALLIDA: no money in the dashboard — refused (409 provider-disagrees): ",
    );
    // The transition keeps its reason as it was.
    let trail = done["transiciones"].as_array().expect("trail");
    let last = trail.last().expect("a row");
    assert_eq!(last["operador"], "eva", "{last}");
    assert!(
        crate::helpers::text_has(
            last,
            "motivo",
            "resolved by eva (on-call): visto en el panel"
        ),
        "{last}"
    );

    // FALLIDA with reembolsar: the row names the compensation refund it asked.
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    let other = crate::operators::under_review(&app, &fake, "k-act-res-2").await;
    fake.settle(&other, "succeeded");
    let body = json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 13"});
    let done = app.resolved_as(&eva, &other, &body).await;
    assert_eq!(done["pago"]["estado"], "FALLIDA", "{done}");
    let refund = done["reembolsos"][0]["id"].as_str().expect("a refund");
    assert_eq!(refunds.made().len(), 1);
    let rows = evas_on(&app, &other).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_row(
        &rows[0],
        "eva",
        "resolve_payment",
        Some(&other),
        &format!(
            "resolve the payment FALLIDA and refund what the provider charged: ticket 13 — resolved FALLIDA; refunds asked: {refund}"
        ),
    );
    // The moves of the refund it started are eva's in the payment's trail and on the
    // console's page, never only the break-glass actor `admin`.
    let after: Vec<&Value> = done["transiciones"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|t| t["desde"] == "FALLIDA")
        .collect();
    assert!(!after.is_empty(), "{done}");
    for row in after {
        assert_eq!(row["operador"], "eva", "{row}");
    }
    let session = crate::console::log_in(&app, &eva).await;
    let page = app
        .http
        .get(app.url(&format!("/consola/pagos/{other}")))
        .header("cookie", format!("pagos_consola={session}"))
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("page");
    assert!(page.contains("eva (admin)"), "{page}");
    assert!(
        !page.contains(r#"<strong class="actor">admin</strong>"#),
        "no move on the page is the break-glass actor's alone: {page}"
    );
}

/// A refund's resolution leaves a `resolve_refund` row on the refund: refused while the
/// provider contradicts it, then taken.
async fn a_refund_resolved_by_hand_leaves_a_row_on_the_refund_and_a_refusal_says_refused(
    backend: Backend,
) {
    let (app, fake) =
        crate::refunds::app_with(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    let payment = crate::refunds::paid(&app, "pay-act-1").await;
    let refund =
        crate::refund_resolution::pending_under_review(&app, &fake, &payment, "ref-act-1", 50000)
            .await;
    let path = format!("/admin/reembolsos/{refund}/resolucion");

    let answer = app
        .post_as(
            &eva,
            &path,
            &json!({"estado": "COMPLETADO", "motivo": "en el panel"}),
        )
        .await;
    crate::helpers::problem(answer, 409, "still pending at the provider").await;
    fake.settle_all("succeeded");
    let answer = app
        .post_as(
            &eva,
            &path,
            &json!({"estado": "COMPLETADO", "motivo": "en el panel, ya"}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["reembolso"]["estado"], "COMPLETADO");

    let rows = evas_on(&app, &refund).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_row(
        &rows[0],
        "eva",
        "resolve_refund",
        Some(&refund),
        "resolve the refund COMPLETADO: en el panel, ya — resolved COMPLETADO",
    );
    assert_row(
        &rows[1],
        "eva",
        "resolve_refund",
        Some(&refund),
        "resolve the refund COMPLETADO: en el panel — refused (409 provider-disagrees): ",
    );
    assert!(evas_on(&app, &payment).await.is_empty(), "on the refund");
}

/// On-call's refund of a payment leaves a `refund_payment` row on the payment: the refund
/// made and its state. Sent again with the same key it is one refund: the replay's row
/// says nothing new was refunded. One over what is left says refused.
async fn an_on_call_refund_leaves_a_row_and_its_replay_says_nothing_new_was_refunded(
    backend: Backend,
) {
    let (app, fake) = crate::refunds::app_with(backend, &[]).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    let payment = crate::refunds::paid(&app, "pay-act-2").await;
    let path = format!("/admin/pagos/{payment}/reembolsos");
    let body = json!({"monto": 5000, "motivo": "cliente llamó"});

    let answer = app.post_keyed(&eva, &path, "oncall-act-1", &body).await;
    assert_eq!(answer.status(), 201);
    let refund = json(answer).await["id"].as_str().expect("id").to_owned();
    let again = app.post_keyed(&eva, &path, "oncall-act-1", &body).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(again).await["id"], refund.as_str());
    assert_eq!(fake.made().len(), 1, "one refund at the provider");
    let over = json!({"monto": 9_000_000, "motivo": "todo"});
    let answer = app.post_keyed(&eva, &path, "oncall-act-2", &over).await;
    crate::helpers::problem(answer, 422, "over what is left").await;

    let rows = evas_on(&app, &payment).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_row(
        &rows[0],
        "eva",
        "refund_payment",
        Some(&payment),
        "refund 9000000 COP: todo — refused (422 refund-exceeds-remaining): At most 245000",
    );
    assert_row(
        &rows[1],
        "eva",
        "refund_payment",
        Some(&payment),
        &format!(
            "refund 5000 COP: cliente llamó — nothing new was refunded: the same Idempotency-Key as refund {refund} (5000 COP), which is COMPLETADO"
        ),
    );
    assert_row(
        &rows[2],
        "eva",
        "refund_payment",
        Some(&payment),
        &format!("refund 5000 COP: cliente llamó — refund {refund} of 5000 COP: COMPLETADO"),
    );
}

/// A resolution of a payment or of a refund, or an on-call refund, whose audit row cannot
/// be written is refused (503, Retry-After) and nothing is done: nothing resolved, no
/// refund made at the provider.
async fn resolutions_and_refunds_whose_audit_row_cannot_be_written_are_refused_and_nothing_is_done(
    backend: Backend,
) {
    use pagos::saga::refund::store;
    use sea_orm::ConnectionTrait;
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let eva = operator(&app, "eva", Role::Operador).await;
    // A payment under review whose charge succeeded at the provider; a paid one with a
    // refund under review that the provider now shows succeeded.
    let (under_review, fake) = crate::operators::payment_under_review(&app, "k-act-nr-1").await;
    fake.settle(&under_review, "succeeded");
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    fake.set_new_status("succeeded");
    let paid = crate::refunds::paid(&app, "k-act-nr-2").await;
    let refund =
        crate::refund_resolution::pending_under_review(&app, &refunds, &paid, "ref-act-nr", 50000)
            .await;
    refunds.settle_all("succeeded");
    let uuid = |id: &str| uuid::Uuid::parse_str(id).expect("uuid");
    let refund_trail = store::trail(&app.db, uuid(&refund)).await.expect("trail");
    let payment_trail = json(app.admin_get(&format!("/admin/pagos/{under_review}")).await).await;
    let (made, lookups) = (refunds.made().len(), fake.lookups_made());
    app.db
        .execute_unprepared("DROP TABLE IF EXISTS operator_actions")
        .await
        .expect("dropped");

    let asks = [
        (
            format!("/admin/pagos/{under_review}/resolucion"),
            json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 14"}),
        ),
        (
            format!("/admin/reembolsos/{refund}/resolucion"),
            json!({"estado": "COMPLETADO", "motivo": "en el panel"}),
        ),
    ];
    for (path, body) in &asks {
        let answer = app.post_as(&eva, path, body).await;
        assert!(answer.headers().get("retry-after").is_some(), "{path}");
        let problem = crate::helpers::problem(answer, 503, path).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", "nothing was done"),
            "{problem}"
        );
    }
    let path = format!("/admin/pagos/{paid}/reembolsos");
    let body = json!({"monto": 5000, "motivo": "cliente llamó"});
    let answer = app.post_keyed(&eva, &path, "oncall-act-nr", &body).await;
    assert!(answer.headers().get("retry-after").is_some());
    let problem = crate::helpers::problem(answer, 503, &path).await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "nothing was done"),
        "{problem}"
    );

    assert_eq!(refunds.made().len(), made, "no refund made at the provider");
    assert_eq!(fake.lookups_made(), lookups, "the provider was not asked");
    let after = json(app.admin_get(&format!("/admin/pagos/{under_review}")).await).await;
    assert_eq!(after["pago"]["estado"], "REVISION_MANUAL");
    assert_eq!(after, payment_trail, "the payment and its trail unchanged");
    assert_eq!(
        store::trail(&app.db, uuid(&refund)).await.expect("trail"),
        refund_trail,
        "the refund unresolved"
    );
    let of_paid = store::of_payment(&app.db, uuid(&paid)).await.expect("read");
    assert_eq!(of_paid.len(), 1, "no refund registered: {of_paid:?}");
    assert_eq!(
        of_paid[0].state.as_str(),
        "REVISION_MANUAL",
        "{:?}",
        of_paid[0]
    );

    let doc = app.openapi().await;
    for (path, what) in [
        ("/admin/pagos/{id}/resolucion", "payment resolution"),
        ("/admin/reembolsos/{id}/resolucion", "refund resolution"),
        ("/admin/pagos/{id}/reembolsos", "on-call refund"),
    ] {
        let operation = &doc["paths"][path]["post"];
        crate::helpers::assert_responses(operation, &["503"], what);
        assert!(
            crate::helpers::text_has(
                &operation["responses"]["503"],
                "description",
                "Who asked could not be recorded"
            ),
            "{what}: {}",
            operation["responses"]["503"]
        );
    }
}

/// A row of an action this process does not know (a newer pagos recorded it: a rolling
/// deploy that adds one) is listed by its name: it does not make the list fail.
async fn an_action_a_newer_pagos_recorded_is_listed_by_its_name(backend: Backend) {
    use pagos::entities::operator_action::{Column, Entity};
    use sea_orm::sea_query::Expr;
    let app = Spawn::new(backend).start().await;
    let pass = app.admin_post("/admin/reconciliaciones", &json!({})).await;
    assert_eq!(pass.status(), 200);
    Entity::update_many()
        .col_expr(Column::Action, Expr::value("a_newer_action"))
        .exec(&app.db)
        .await
        .expect("renamed");

    let rows = actions_as(&app, ADMIN_TOKEN, "").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["accion"], "a_newer_action", "{rows:?}");
    assert_eq!(rows[0]["operador"], "admin", "{rows:?}");
}

/// `GET /admin/pagos` documents `estado` and `limite` as what they are, query parameters
/// (`estado` required, `limite` not; before, both path parameters, required), and reads
/// its query as the merchant's list reads its own: a parameter it does not know, given
/// twice or missing is a 422 naming it (before: `?estado=COMPLETADA&foo=1` was a 200).
async fn the_admin_list_of_payments_takes_its_parameters_in_the_query_and_refuses_unknown_ones(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let operation = &app.openapi().await["paths"]["/admin/pagos"]["get"];
    let parameters = operation["parameters"].as_array().expect("parameters");
    let names: Vec<&str> = parameters
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["estado", "limite", "cursor"], "{operation}");
    for parameter in parameters {
        assert_eq!(parameter["in"], "query", "{parameter}");
    }
    assert_eq!(parameters[0]["required"], true, "estado: {}", parameters[0]);
    assert_ne!(parameters[1]["required"], true, "limite: {}", parameters[1]);

    for (query, campo) in [
        ("?estado=COMPLETADA&foo=1", "foo"),
        ("?limite=5", "estado"),
        ("?estado=PAGADA", "estado"),
        ("?estado=COMPLETADA&limite=0", "limite"),
        ("?estado=COMPLETADA&limite=1001", "limite"),
        ("?estado=COMPLETADA&estado=FALLIDA", "estado"),
        ("?estado=COMPLETADA&cursor=abc", "cursor"),
        (
            "?estado=COMPLETADA&cursor=0195f1a2-0000-7000-8000-000000000000",
            "cursor",
        ),
    ] {
        let answer = app.admin_get(&format!("/admin/pagos{query}")).await;
        let problem = crate::helpers::problem(answer, 422, query).await;
        assert_eq!(problem["type"], "/problems/validation-failed", "{query}");
        assert_eq!(problem["errores"][0]["campo"], campo, "{query}: {problem}");
    }
    let listed = app
        .admin_get("/admin/pagos?estado=COMPLETADA&limite=1000")
        .await;
    assert_eq!(listed.status(), 200);
}

/// On-call's view of a payment (its detail, the list by state, a resolution's answer)
/// shows `montoReembolsado` as the merchant's `GET /v1/pagos/{id}` does: the sum of its
/// refunds `COMPLETADO` (a refund that failed not counted). Before, it was left out.
async fn on_calls_view_of_a_payment_shows_what_was_refunded_as_the_merchants_does(
    backend: Backend,
) {
    use crate::refunds::{app_with, paid, refund};
    let (app, fake) = app_with(backend.clone(), &[]).await;
    let payment = paid(&app, "k-view-1").await;
    let untouched = paid(&app, "k-view-2").await;
    for (key, monto) in [("r-1", 1000), ("r-2", 500)] {
        let answer = refund(&app, &payment, key, &json!({ "monto": monto })).await;
        assert_eq!(answer.status(), 201, "{key}");
    }
    fake.refunding("failed");
    let failed = refund(&app, &payment, "r-3", &json!({ "monto": 2000 })).await;
    assert_eq!(failed.status(), 422, "refused by the gateway");

    let merchants = json(
        app.get_as(crate::helpers::API_KEY, &format!("/v1/pagos/{payment}"))
            .await,
    )
    .await;
    assert_eq!(merchants["montoReembolsado"], 1500, "{merchants}");
    let detail = json(app.admin_get(&format!("/admin/pagos/{payment}")).await).await;
    assert_eq!(detail["pago"]["montoReembolsado"], 1500, "{detail}");
    let listed = json(app.admin_get("/admin/pagos?estado=COMPLETADA").await).await;
    let refunded: Vec<(&str, &Value)> = listed["pagos"]
        .as_array()
        .expect("pagos")
        .iter()
        .map(|p| (p["id"].as_str().unwrap_or_default(), &p["montoReembolsado"]))
        .collect();
    assert_eq!(
        refunded,
        [
            (payment.as_str(), &json!(1500)),
            (untouched.as_str(), &json!(0))
        ],
        "{listed}"
    );

    // A resolution's answer is the same view.
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let (under_review, fake) = crate::operators::payment_under_review(&app, "k-view-3").await;
    fake.settle(&under_review, "succeeded");
    let body = json!({"estado": "COMPLETADA", "motivo": "visto en el panel"});
    let done = app.resolved_as(ADMIN_TOKEN, &under_review, &body).await;
    assert_eq!(done["pago"]["montoReembolsado"], 0, "{done}");
}

/// After an outage on-call may have more payments under review than a page holds (1000 at
/// most): `siguiente` is the next page's `cursor`, every payment of the state is on exactly
/// one page, oldest first, and the last page says there is no next one. Before, the list
/// stopped at the first 1000 with no way to the rest. A payment that left the state
/// since its page was read still leads on to the next.
async fn on_calls_list_of_payments_goes_on_page_by_page_with_its_cursor(backend: Backend) {
    use crate::refunds::{app_with, paid};
    let (app, _fake) = app_with(backend, &[]).await;
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(paid(&app, &format!("k-page-{i}")).await);
        // Created in distinct milliseconds: the order is theirs, not the ids' tie-break.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let page = |query: String| {
        let app = &app;
        async move {
            let answer = app.admin_get(&format!("/admin/pagos{query}")).await;
            assert_eq!(answer.status(), 200, "{query}");
            let body = json(answer).await;
            let ids: Vec<String> = body["pagos"]
                .as_array()
                .expect("pagos")
                .iter()
                .map(|p| p["id"].as_str().expect("id").to_owned())
                .collect();
            (ids, body["siguiente"].as_str().map(str::to_owned))
        }
    };
    let mut listed = Vec::new();
    let mut query = "?estado=COMPLETADA&limite=2".to_owned();
    let mut pages = 0;
    loop {
        let (ids, next) = page(query.clone()).await;
        pages += 1;
        listed.extend(ids);
        match next {
            Some(cursor) => query = format!("?estado=COMPLETADA&limite=2&cursor={cursor}"),
            None => break,
        }
        assert!(pages < 10, "the pages end");
    }
    assert_eq!(pages, 3, "2 + 2 + 1");
    assert_eq!(listed, made, "each payment once, oldest first");

    // The first page's last payment has left COMPLETADA since (moved to review in the
    // database here): its cursor still leads on to the rest.
    let (first, next) = page("?estado=COMPLETADA&limite=2".to_owned()).await;
    assert_eq!(first, made[..2]);
    let moved = uuid::Uuid::parse_str(&made[1]).expect("id");
    let mut row: pagos::entities::payment::ActiveModel =
        pagos::entities::payment::Entity::find_by_id(moved)
            .one(&app.db)
            .await
            .expect("read")
            .expect("payment")
            .into();
    row.state = sea_orm::ActiveValue::Set(pagos::saga::state::PaymentState::RevisionManual);
    sea_orm::ActiveModelTrait::update(row, &app.db)
        .await
        .expect("moved");
    let next = next.expect("a next page");
    let (rest, _) = page(format!("?estado=COMPLETADA&limite=10&cursor={next}")).await;
    assert_eq!(rest, made[2..], "the next page goes on after it");
}
