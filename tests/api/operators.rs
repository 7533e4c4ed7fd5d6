//! Operators: their own tokens on the admin API beside the break-glass admin token, a
//! `lector` who may only read, the audit trail that names who resolved; and
//! `pagos operators …` as an operator meets it.

use crate::helpers::{ADMIN_TOKEN, Backend, FakeGateway, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use pagos::operators::{OperatorName, Role, Token, store};
use serde_json::json;
use std::time::Duration;

on_both_databases!(
    an_operator_token_reads_and_resolves_and_the_audit_trail_names_the_operator,
    a_lector_reads_but_gets_403_on_every_write_and_nothing_changes,
    a_revoked_or_unknown_operator_token_gets_401,
    a_resolution_writes_the_charge_it_names_and_an_audit_reason_naming_the_operator,
);

/// A payment the reconciler gave up on, its look-ups failing until then:
/// `REVISION_MANUAL`, its one charge still pending at `fake` (mounted on `app`), which
/// answers look-ups again. Needs `--give-up-after 1s` (and `--stale-after 1s`, which it may
/// not be shorter than).
pub async fn under_review(app: &TestApp, fake: &FakeGateway, key: &str) -> String {
    fake.set_new_status("pending");
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    fake.fail_lookups(true);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    fake.fail_lookups(false);
    id
}

/// A gateway that remembers its charges, mounted on `app`, and a payment under review
/// there (`under_review`): its id and the gateway. One per app: a second gateway mounted
/// on the same app is never asked.
pub async fn payment_under_review(app: &TestApp, key: &str) -> (String, FakeGateway) {
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    (under_review(app, &fake, key).await, fake)
}

/// An app that gives a payment up after 1 s, with operator `name` (`role`) and payment
/// `key` under review (`payment_under_review`): the app, the operator's token, the
/// payment's id and its gateway.
async fn reviewing(
    backend: Backend,
    name: &str,
    role: Role,
    key: &str,
) -> (TestApp, String, String, FakeGateway) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let token = operator(&app, name, role).await;
    let (id, fake) = payment_under_review(&app, key).await;
    (app, token, id, fake)
}

/// Adds an operator as `pagos operators add` does; their token.
pub async fn operator(app: &TestApp, name: &str, role: Role) -> String {
    operator_in(&app.db, name, role).await
}

/// As `operator`, in the database `db`.
pub async fn operator_in(db: &sea_orm::DatabaseConnection, name: &str, role: Role) -> String {
    let token = Token::generate();
    store::add(db, &OperatorName::parse(name).expect("name"), role, &token)
        .await
        .expect("operator added");
    token.expose().to_owned()
}

async fn an_operator_token_reads_and_resolves_and_the_audit_trail_names_the_operator(
    backend: Backend,
) {
    let (app, ana, id, fake) = reviewing(backend, "ana", Role::Operador, "k-op-1").await;
    // Its charge failed at the provider: no money taken.
    fake.settle(&id, "declined");

    let listed = app
        .get_as(&ana, "/admin/pagos?estado=REVISION_MANUAL")
        .await;
    assert_eq!(listed.status(), 200);
    assert_eq!(json(listed).await["pagos"][0]["id"], id.as_str());

    let detail = app
        .resolved_as(
            &ana,
            &id,
            &json!({"estado": "FALLIDA", "motivo": "no charge in the provider dashboard"}),
        )
        .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    let last = crate::helpers::last_transition(&detail);
    assert_eq!(last["quien"], "admin", "{last}");
    assert_eq!(last["operador"], "ana", "{last}");
    assert!(
        last["motivo"]
            .as_str()
            .is_some_and(|m| m.contains("ana") && m.contains("no charge in the provider")),
        "{last}"
    );
    // Read back later, the trail still names her.
    let again = json(app.get_as(&ana, &format!("/admin/pagos/{id}")).await).await;
    let last = crate::helpers::last_transition(&again);
    assert_eq!(last["operador"], "ana");

    // The break-glass token still works, and is recorded as `admin`.
    let other = under_review(&app, &fake, "k-op-2").await;
    fake.settle(&other, "succeeded");
    let detail = app
        .resolved_as(
            ADMIN_TOKEN,
            &other,
            &json!({"estado": "COMPLETADA", "motivo": "seen succeeded"}),
        )
        .await;
    let last = crate::helpers::last_transition(&detail);
    assert_eq!(last["operador"], "admin", "{last}");
}

/// What runbooks/revision-manual.md tells on-call to expect of a resolution.
async fn a_resolution_writes_the_charge_it_names_and_an_audit_reason_naming_the_operator(
    backend: Backend,
) {
    let (app, ana, id, fake) = reviewing(backend, "ana", Role::Operador, "k-op-ref").await;
    // The payment's own charge was declined; another charge for it succeeded.
    fake.settle(&id, "declined");
    let found = fake.preload_for(&id, "succeeded", 250_000);

    let detail = app
        .resolved_as(
            &ana,
            &id,
            &json!({"estado": "COMPLETADA", "motivo": format!("  INC-7: {found} succeeded  "), "gatewayRef": format!(" {found} ")}),
        )
        .await;
    assert_eq!(detail["pago"]["gatewayRef"], found.as_str(), "{detail}");
    let last = crate::helpers::last_transition(&detail);
    assert_eq!(last["desde"], "REVISION_MANUAL", "{last}");
    assert_eq!(last["quien"], "admin", "{last}");
    assert_eq!(last["operador"], "ana", "{last}");
    assert_eq!(
        last["motivo"],
        format!("resolved by ana (on-call): INC-7: {found} succeeded"),
        "{last}"
    );
    // The merchant's retry replays the settled payment, with the charge on-call named.
    let replay = app.pay("k-op-ref", &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await["gatewayRef"], found.as_str());
}

async fn a_lector_reads_but_gets_403_on_every_write_and_nothing_changes(backend: Backend) {
    let (app, luis, id, _gateway) = reviewing(backend, "luis", Role::Lector, "k-op-3").await;

    let read = app.get_as(&luis, &format!("/admin/pagos/{id}")).await;
    assert_eq!(read.status(), 200, "a lector reads");

    for (path, body) in [
        (
            format!("/admin/pagos/{id}/resolucion"),
            json!({"estado": "COMPLETADA", "motivo": "I think it went through"}),
        ),
        ("/admin/reconciliaciones".to_owned(), json!({})),
        ("/admin/reconciliaciones".to_owned(), json!({"pagoId": id})),
        (
            format!("/admin/pagos/{id}/resolucion"),
            json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "refund what it charged"}),
        ),
        (
            format!("/admin/pagos/{id}/reembolsos"),
            json!({"monto": 1, "motivo": "goodwill"}),
        ),
        (
            format!("/admin/reembolsos/{}/resolucion", uuid::Uuid::nil()),
            json!({"estado": "COMPLETADO", "motivo": "seen in the dashboard"}),
        ),
        (
            "/admin/reconciliaciones".to_owned(),
            json!({"reembolsoId": uuid::Uuid::nil()}),
        ),
    ] {
        let answer = app.post_as(&luis, &path, &body).await;
        assert_eq!(answer.status(), 403, "{path}");
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{path}"
        );
        let problem = json(answer).await;
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("/forbidden")),
            "{problem}"
        );
        assert!(
            crate::helpers::text_has(&problem, "detail", "lector"),
            "{problem}"
        );
    }
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "REVISION_MANUAL", "the 403s changed nothing");
}

async fn a_revoked_or_unknown_operator_token_gets_401(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let eva = operator(&app, "eva", Role::Operador).await;
    assert_eq!(
        app.get_as(&eva, "/admin/pagos?estado=ENVIADA")
            .await
            .status(),
        200
    );

    match store::revoke(&app.db, &OperatorName::parse("eva").expect("name"))
        .await
        .expect("revoked")
    {
        store::Revocation::Revoked(_) => {}
        _ => panic!("eva was active"),
    }
    let answer = app.get_as(&eva, "/admin/pagos?estado=ENVIADA").await;
    assert_eq!(answer.status(), 401, "a revoked token is refused at once");
    assert_eq!(answer.headers()["content-type"], "application/problem+json");

    let made_up = app
        .get_as(
            "op_notarealtoken0000000000000000000",
            "/admin/pagos?estado=ENVIADA",
        )
        .await;
    assert_eq!(made_up.status(), 401);
    let admin = app.get_as(ADMIN_TOKEN, "/admin/pagos?estado=ENVIADA").await;
    assert_eq!(admin.status(), 200, "the break-glass token stays");
}

fn pagos(args: &[&str]) -> std::process::Output {
    std::process::Command::new(crate::process::BIN)
        .args(args)
        .env_remove("PAGOS_DATABASE_URL")
        .output()
        .expect("pagos runs")
}

#[test]
fn operators_add_prints_a_token_once_list_is_a_table_and_revoke_keeps_the_row() {
    let dir = tempfile::tempdir().expect("dir");
    let db = crate::cli::sqlite_in(&dir, "ops.db");
    let added = pagos(&[
        "operators",
        "add",
        "ana",
        "--rol",
        "lector",
        "--database-url",
        &db,
    ]);
    assert!(added.status.success(), "{added:?}");
    let token = String::from_utf8_lossy(&added.stdout).trim().to_owned();
    assert!(token.starts_with("op_") && token.len() >= 35, "{token}");
    let stderr = String::from_utf8_lossy(&added.stderr);
    assert!(
        !stderr.contains(&token),
        "the token only on stdout: {stderr}"
    );
    assert!(stderr.contains("lector"), "{stderr}");

    let default = pagos(&["operators", "add", "bea", "--database-url", &db]);
    assert!(default.status.success());

    let again = pagos(&["operators", "add", "ana", "--database-url", &db]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let bad_role = pagos(&[
        "operators",
        "add",
        "cai",
        "--rol",
        "jefe",
        "--database-url",
        &db,
    ]);
    assert_eq!(bad_role.status.code(), Some(2));
    let reserved = pagos(&["operators", "add", "admin", "--database-url", &db]);
    assert_eq!(reserved.status.code(), Some(2));

    // Named as on-call remembers it, whatever its case: names are unique without case,
    // and a compromised operator's token must not stay live for a capital letter.
    let revoked = pagos(&["operators", "revoke", "ANA", "--database-url", &db]);
    assert!(revoked.status.success(), "{revoked:?}");
    let nobody = pagos(&["operators", "revoke", "zoe", "--database-url", &db]);
    assert_eq!(nobody.status.code(), Some(2));

    let listed = pagos(&["operators", "list", "--database-url", &db]);
    assert!(listed.status.success());
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("ROLE"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("ana") && lines[1].contains("lector") && lines[1].contains("revoked"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("bea") && lines[2].contains("operador") && lines[2].contains("active"),
        "{table}"
    );
    assert!(!table.contains(&token), "never the token: {table}");

    // Only the hash is stored.
    // The database file and its write-ahead log, wherever SQLite left the rows.
    let mut file = std::fs::read(dir.path().join("ops.db")).expect("db file");
    file.extend(std::fs::read(dir.path().join("ops.db-wal")).unwrap_or_default());
    let text = String::from_utf8_lossy(&file);
    assert!(!text.contains(&token));
    assert!(text.contains(&pagos::operators::hash_token(&token)));
}

/// The names pagos writes itself in audit rows and in a refund's "asked by" are not
/// operators' (an operator called `merchant` would pass for the merchant), and a name is
/// taken whatever its case (`Ana` beside `ana` reads as the same person).
#[test]
fn operators_add_refuses_the_names_pagos_writes_itself_and_a_name_taken_in_another_case() {
    let dir = tempfile::tempdir().expect("dir");
    let db = crate::cli::sqlite_in(&dir, "names.db");
    let add = |name: &str| pagos(&["operators", "add", name, "--database-url", &db]);
    let ana = add("ana");
    assert!(ana.status.success(), "{ana:?}");
    for name in [
        "merchant",
        "Merchant",
        "pagos",
        "reconciler",
        "webhook",
        "request",
        "admin",
        "ADMIN",
    ] {
        let refused = add(name);
        assert_eq!(refused.status.code(), Some(2), "{name}: {refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("reserved"), "{name}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    for name in ["Ana", "ANA"] {
        let refused = add(name);
        assert_eq!(refused.status.code(), Some(2), "{name}: {refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("already exists"), "{name}: {stderr}");
        assert!(stderr.contains("\"ana\""), "names the one taken: {stderr}");
    }
    let listed = pagos(&["operators", "list", "--database-url", &db]);
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(table.lines().count(), 2, "ana alone: {table}");
    // Names that only look alike are other people.
    assert!(add("ana.p").status.success());
}
