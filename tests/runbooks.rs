//! The runbooks quote what pagos writes and give on-call what pagos takes: the reasons
//! the reconciler sends a payment or a refund to review with, the errors of a gateway
//! that refuses or fails, the log lines of a refused webhook, the settings of a slow
//! gateway, the gauges while the database is away, the commands that write and the
//! check before `pagos reconcile --once`, the events a Stripe endpoint must be set up
//! with. On-call searches the logs for the quoted text: a quote pagos never writes finds
//! nothing.

use chrono::{TimeDelta, Utc};
use pagos::gateway::{
    Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError, Refund, RefundStatus,
};
use pagos::saga::reconcile::decide::{Decision, Facts, Horizons, Reconciled, decide};
use std::path::Path;
use std::time::Duration;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `text` with each `(from, to)` replaced in turn: the parts of a message that differ
/// from one payment to the next, written as a runbook quotes them.
fn templated(text: &str, parts: &[(&str, &str)]) -> String {
    parts
        .iter()
        .fold(text.to_owned(), |text, (from, to)| text.replace(from, to))
}

/// `text` with each line's leading white space and its line break dropped: a code span
/// or a sentence the runbook wraps reads as one line.
fn unwrapped(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// What the reconciler escalates with, for something in `state` registered `age` ago,
/// given `lookup` (None: not asked).
fn escalated<S: Reconciled>(
    state: S,
    age: TimeDelta,
    horizons: Horizons,
    lookup: Option<Result<Vec<S::Held>, GatewayError>>,
) -> String {
    escalated_named(state, age, horizons, lookup, None)
}

/// The same, for something the provider named `named` before.
fn escalated_named<S: Reconciled>(
    state: S,
    age: TimeDelta,
    horizons: Horizons,
    lookup: Option<Result<Vec<S::Held>, GatewayError>>,
    named: Option<&str>,
) -> String {
    let now = Utc::now();
    let facts = Facts {
        state,
        created_at: now - age,
        now,
        lookup: lookup.as_ref(),
        named,
    };
    match decide(&facts, &horizons) {
        Decision::Escalate(why) => why,
        Decision::Reschedule(why) => panic!("escalated, not rescheduled: {why}"),
        _ => panic!("escalated"),
    }
}

fn horizons(key_window: i64, give_up_after: i64) -> Horizons {
    Horizons {
        key_window: TimeDelta::hours(key_window),
        resend_margin: TimeDelta::minutes(5),
        give_up_after: TimeDelta::hours(give_up_after),
    }
}

fn charge(id: &str, status: ChargeStatus) -> Charge {
    Charge {
        id: id.into(),
        status,
        amount: 100,
        currency: "COP".into(),
        reference: uuid::Uuid::nil().to_string(),
        decline_code: None,
        charged_back: false,
    }
}

fn refund(id: &str, status: RefundStatus) -> Refund {
    Refund {
        id: id.into(),
        status,
        charge: "ch_1".into(),
        amount: 100,
        currency: "COP".into(),
        reference: uuid::Uuid::nil().to_string(),
        failure_code: None,
    }
}

/// The ages and horizons below, as the reasons write them (humantime).
const AGE: (&str, &str) = ("1day 6h", "…");
const DAY: (&str, &str) = ("1day", "…");
const HALF: (&str, &str) = ("12h", "…");

/// Every reason the reconciler writes when it sends `state`'s payment or refund to
/// review, as a runbook quotes it: ages, windows, ids and the last error as `…`.
fn reasons<S: Reconciled>(
    never_sent: S,
    sent: S,
    held: impl Fn(&str, bool) -> S::Held,
    id: &str,
) -> Vec<String> {
    let age = TimeDelta::hours(30);
    let ids = [
        (format!("{id}_a"), format!("{id}_…")),
        (format!("{id}_b"), format!("{id}_…")),
    ];
    let ids: Vec<(&str, &str)> = ids.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let mut all = vec![
        // Never sent, past the key window (and not past the give-up horizon).
        templated(
            &escalated(never_sent, age, horizons(24, 48), None),
            &[AGE, DAY],
        ),
        // Never sent, inside the key window, past the give-up horizon.
        templated(&escalated(never_sent, age, horizons(48, 24), None), &[AGE]),
        // Sent, the provider cannot be asked, past the give-up horizon.
        templated(
            &escalated(
                sent,
                age,
                horizons(48, 24),
                Some(Err(GatewayError::Unknown("the last error".into()))),
            ),
            &[AGE, ("outcome unknown: the last error", "…")],
        ),
        // Sent, nothing at the provider, past the give-up horizon.
        templated(
            &escalated(sent, age, horizons(48, 24), Some(Ok(vec![]))),
            &[AGE],
        ),
        // Sent, nothing at the provider, past the key window.
        templated(
            &escalated(
                sent,
                TimeDelta::hours(20),
                horizons(12, 24),
                Some(Ok(vec![])),
            ),
            &[HALF],
        ),
        // Several at the provider.
        templated(
            &escalated(
                sent,
                TimeDelta::hours(1),
                horizons(24, 24),
                Some(Ok(vec![held(ids[0].0, false), held(ids[1].0, false)])),
            ),
            &[ids[0], ids[1], (" 2 ", " N ")],
        ),
        // Named by the provider before, its search showing nothing, past the give-up
        // horizon.
        templated(
            &escalated_named(
                sent,
                age,
                horizons(48, 24),
                Some(Ok(vec![])),
                Some(ids[0].0),
            ),
            &[AGE, ids[0]],
        ),
        // Still pending, past the give-up horizon.
        templated(
            &escalated(
                sent,
                age,
                horizons(48, 24),
                Some(Ok(vec![held(ids[0].0, true)])),
            ),
            &[AGE, ids[0]],
        ),
    ];
    all.dedup();
    all
}

#[test]
fn revision_manual_quotes_every_reason_the_reconciler_sends_a_payment_there_with() {
    use pagos::saga::state::PaymentState;
    let runbook = unwrapped(&read("runbooks/revision-manual.md"));
    let held = |id: &str, pending: bool| {
        charge(
            id,
            if pending {
                ChargeStatus::Pending
            } else {
                ChargeStatus::Succeeded
            },
        )
    };
    for reason in reasons(PaymentState::EnProceso, PaymentState::Enviada, held, "ch") {
        assert!(
            runbook.contains(&format!("`{reason}`")),
            "runbooks/revision-manual.md quotes `{reason}`"
        );
    }
}

#[test]
fn refunds_quote_every_reason_the_reconciler_sends_a_refund_to_review_with() {
    use pagos::saga::refund::state::RefundState;
    let runbook = unwrapped(&read("runbooks/refunds.md"));
    let held = |id: &str, pending: bool| {
        refund(
            id,
            if pending {
                RefundStatus::Pending
            } else {
                RefundStatus::Succeeded
            },
        )
    };
    for reason in reasons(RefundState::EnProceso, RefundState::Enviado, held, "re") {
        assert!(
            runbook.contains(&format!("`{reason}`")),
            "runbooks/refunds.md quotes `{reason}`"
        );
    }
}

/// A gateway speaking the reference protocol that answers every request with `status`
/// and the body `{…}` (how the runbooks write the start of a provider's answer); its
/// base URL.
async fn answering(status: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The whole request: its head, then as many bytes as it says it carries.
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let body = "{…}";
                let answer = format!(
                    "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    reqwest::StatusCode::from_u16(status)
                        .ok()
                        .and_then(|s| s.canonical_reason())
                        .unwrap_or(""),
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn gateway(base: &str) -> pagos::gateway::http::HttpGateway {
    pagos::gateway::http::HttpGateway::new(base, "secret", Duration::from_secs(5)).expect("client")
}

fn charge_request() -> ChargeRequest {
    ChargeRequest {
        gateway_key: "pagos-key".into(),
        amount: 100,
        currency: "COP".into(),
        reference: uuid::Uuid::now_v7(),
        description: None,
        payment_method: None,
    }
}

/// The text an unknown outcome carries (what follows `outcome unknown: `).
fn unknown(err: GatewayError) -> String {
    match err {
        GatewayError::Unknown(why) => why,
        other => panic!("an unknown outcome, not {other:?}"),
    }
}

/// What the reconciler reschedules with when the look-up fails with `err` (its `why=`,
/// and the payment's `ultimoError`).
fn rescheduled(err: GatewayError) -> String {
    let lookup = Some(Err(err));
    let now = Utc::now();
    let facts = Facts {
        state: pagos::saga::state::PaymentState::Enviada,
        created_at: now - TimeDelta::minutes(20),
        now,
        lookup: lookup.as_ref(),
        named: None,
    };
    match decide(&facts, &horizons(24, 24)) {
        Decision::Reschedule(why) => why,
        other => panic!("rescheduled, not {other:?}"),
    }
}

#[tokio::test]
async fn the_gateway_runbooks_quote_the_errors_pagos_writes() {
    let stuck = unwrapped(&read("runbooks/payments-stuck-enviada.md"));
    let outage = unwrapped(&read("runbooks/gateway-outage.md"));
    let quoted = |runbook: &str, name: &str, text: &str| {
        assert!(
            runbook.contains(&format!("`{text}`")),
            "runbooks/{name} quotes `{text}`"
        );
    };

    // A look-up refused for our credentials, and one the gateway fails: the reconciler's
    // `why=`, which payments-stuck-enviada.md tells apart (credentials, not an outage).
    for status in [401, 503] {
        let base = answering(status).await;
        let err = gateway(&base)
            .lookup(uuid::Uuid::now_v7())
            .await
            .expect_err("the look-up fails");
        quoted(
            &stuck,
            "payments-stuck-enviada.md",
            &rescheduled(err.clone()),
        );
        quoted(&outage, "gateway-outage.md", &unknown(err));
    }

    // A charge: refused credentials and a failing gateway leave it unknown; another 4xx
    // to a first send is a refusal; the same to a resend proves nothing.
    for status in [401, 503] {
        let base = answering(status).await;
        let err = gateway(&base)
            .charge(&charge_request())
            .await
            .expect_err("the charge fails");
        quoted(&outage, "gateway-outage.md", &unknown(err));
    }
    let base = answering(404).await;
    let refused = gateway(&base)
        .charge(&charge_request())
        .await
        .expect_err("refused");
    assert!(matches!(refused, GatewayError::Rejected { .. }));
    quoted(&outage, "gateway-outage.md", &refused.to_string());
    let resent = pagos::gateway::retry::charge(
        &gateway(&base),
        &charge_request(),
        pagos::gateway::retry::RetryPolicy::new(0),
        true,
    )
    .await;
    match resent {
        pagos::gateway::retry::ChargeOutcome::Unknown(why) => {
            quoted(&outage, "gateway-outage.md", &why)
        }
        other => panic!("a refused resend is unknown, not {other:?}"),
    }
}

/// The code spans of a runbook's prose (its code blocks left out), each on one line.
fn spans(runbook: &str) -> Vec<String> {
    let prose: Vec<&str> = runbook
        .lines()
        .scan(false, |in_block, line| {
            let fence = line.trim_start().starts_with("```");
            if fence {
                *in_block = !*in_block;
            }
            Some((!fence && !*in_block).then_some(line))
        })
        .flatten()
        .collect();
    unwrapped(&prose.join("\n"))
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_webhook_runbook_quotes_the_log_lines_pagos_writes() {
    let runbook = read("runbooks/webhooks.md");
    let source = read("src/http/webhooks.rs");
    let mut quoted = 0;
    for span in spans(&runbook) {
        if span.starts_with("webhook ") {
            quoted += 1;
            assert!(
                source.contains(&format!("\"{span}\"")),
                "runbooks/webhooks.md quotes `{span}`, a line src/http/webhooks.rs does not write"
            );
        }
    }
    assert!(quoted >= 2, "the refusals' log lines are quoted");
}

/// Every command of the runbooks, their continued lines joined.
fn commands(runbook: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in runbook.lines() {
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(line);
            commands.push(std::mem::take(&mut current));
        }
    }
    commands
}

fn runbooks() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks");
    let mut all: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("runbooks/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).expect("readable"))
        })
        .collect();
    all.sort();
    assert!(all.len() >= 10);
    all
}

#[test]
fn every_curl_of_the_runbooks_reaches_pagos_or_the_gateway_through_their_settings() {
    for (name, text) in runbooks() {
        for command in commands(&text).iter().filter(|c| c.contains("curl ")) {
            assert!(
                !command.contains("http://") && !command.contains("https://"),
                "runbooks/{name}: a curl to a written-out address instead of $PAGOS_URL: {command}"
            );
        }
    }
}

#[test]
fn every_command_of_the_runbooks_that_writes_leaves_the_read_only_pgoptions() {
    // The commands that write (runbooks/README.md, conventions): under the runbooks'
    // read-only PGOPTIONS they fail.
    let writing = [
        "pagos merchants add ",
        "pagos merchants keys add ",
        "pagos merchants keys revoke ",
        "pagos operators add ",
        "pagos operators revoke ",
        "pagos reconcile --once ",
        "pagos migrate ",
    ];
    for (name, text) in runbooks() {
        // In code spans and code blocks, a command given with its arguments (a bare
        // `pagos operators add` names the command, it is not one to run).
        for command in spans(&text).into_iter().chain(commands(&text)) {
            for w in writing {
                if let Some(at) = command.find(w) {
                    assert!(
                        command[..at].ends_with("env -u PGOPTIONS "),
                        "runbooks/{name}: `{command}` writes: run it with `env -u PGOPTIONS`"
                    );
                }
            }
        }
    }
}

#[test]
fn every_row_of_the_slow_gateway_table_is_a_setting_pagos_starts_with_its_request_timeout_above_the_lease()
 {
    use clap::Parser;
    let runbook = read("runbooks/gateway-outage.md");
    let header = runbook
        .lines()
        .find(|l| l.starts_with("| `PAGOS_GATEWAY_TIMEOUT` | `PAGOS_GATEWAY_RETRIES` |"))
        .expect("the table of action B");
    let columns: Vec<&str> = header.split('|').map(str::trim).collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| c.contains(name))
            .unwrap_or_else(|| panic!("the table has a {name} column: {header}"))
    };
    let (timeout, retries, lease, request_timeout) = (
        column("PAGOS_GATEWAY_TIMEOUT"),
        column("PAGOS_GATEWAY_RETRIES"),
        column("PAGOS_LEASE"),
        column("PAGOS_REQUEST_TIMEOUT"),
    );
    let rows: Vec<Vec<String>> = runbook
        .lines()
        .skip_while(|l| *l != header)
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().split('`').nth(1).unwrap_or_default().to_owned())
                .collect()
        })
        .collect();
    assert!(rows.len() >= 4, "{rows:?}");
    for row in rows {
        let duration = |i: usize| {
            humantime::parse_duration(&row[i]).unwrap_or_else(|e| panic!("{row:?}: {e}"))
        };
        let cli = pagos::config::Cli::try_parse_from([
            "pagos",
            "serve",
            "--gateway-timeout",
            &row[timeout],
            "--gateway-retries",
            &row[retries],
            "--lease",
            &row[lease],
            "--request-timeout",
            &row[request_timeout],
        ])
        .expect("parsed");
        let pagos::config::Command::Serve(settings) = cli.command else {
            panic!("serve");
        };
        settings
            .validate()
            .unwrap_or_else(|e| panic!("{row:?}: pagos refuses it: {e}"));
        assert!(
            duration(request_timeout) > duration(lease),
            "{row:?}: the request timeout must stay above the lease, or slow payment requests are cut"
        );
    }
}

#[tokio::test]
async fn what_the_runbooks_say_of_the_gauges_while_the_database_cannot_be_read_is_what_pagos_exports()
 {
    use pagos::metrics::{Metrics, StateLabel};
    let metrics = Metrics::new();
    metrics
        .payments
        .get_or_create(&StateLabel { estado: "ENVIADA" })
        .set(3);
    metrics
        .refunds
        .get_or_create(&StateLabel { estado: "ENVIADO" })
        .set(1);
    metrics.webhook_endpoints_disabled.set(2);
    metrics.oldest_unsettled_age.set(120.0);
    // A database without pagos' tables: every read of the gauges fails.
    let db = sea_orm::Database::connect("sqlite::memory:")
        .await
        .expect("connected");
    pagos::metrics::refresh_gauges(&db, &metrics, Duration::from_secs(5)).await;
    let text = metrics.render();
    let has = |line: &str| text.lines().any(|l| l == line);
    assert!(has("pagos_database_up 0"), "{text}");
    assert!(
        has("pagos_oldest_unsettled_payment_age_seconds NaN"),
        "{text}"
    );
    assert!(
        has("pagos_oldest_undelivered_event_age_seconds NaN"),
        "{text}"
    );
    assert!(has("pagos_webhook_endpoints_disabled 2"), "{text}");
    assert!(
        !text.contains("pagos_payments{") && !text.contains("pagos_refunds{"),
        "{text}"
    );

    let restart = unwrapped(&read("runbooks/database-restart.md"));
    assert!(
        restart.contains("**`pagos_payments` and `pagos_refunds` disappear, `pagos_oldest_unsettled_payment_age_seconds` and `pagos_oldest_undelivered_event_age_seconds` read `NaN`**, and `pagos_webhook_endpoints_disabled` keeps its last value"),
        "runbooks/database-restart.md says what the gauges do"
    );
    let readme = unwrapped(&read("README.md"));
    assert!(
        readme.contains(
            "drops `pagos_payments` and `pagos_refunds` and sets the two age gauges to `NaN`"
        ),
        "the README's Doors say what the gauges do"
    );
}

/// The check runbooks/reconciliation.md runs before `pagos reconcile --once`, in bash,
/// with `psql` answering `pinned` (the gateway the database records): what it prints.
fn precheck(pinned: &str, env: &[(&str, &str)]) -> String {
    let runbook = read("runbooks/reconciliation.md");
    let after = runbook
        .split_once("Before running it:")
        .expect("the check")
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a sh block")
        .0;
    let script = format!("psql() {{ echo '{pinned}'; }}\n{block}");
    let mut command = std::process::Command::new("bash");
    command.arg("-c").arg(script);
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("PAGOS_")) {
        command.env_remove(name);
    }
    command.env("PAGOS_DATABASE_URL", "postgres://pagos@db.internal/pagos");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("bash runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_check_before_a_reconcile_from_the_command_line_passes_every_real_gateway_and_stops_the_sandbox()
 {
    for (pinned, env) in [
        ("stripe", vec![("PAGOS_GATEWAY", "stripe")]),
        ("mercadopago", vec![("PAGOS_GATEWAY", "mercadopago")]),
        (
            "http",
            vec![
                ("PAGOS_GATEWAY", "http"),
                ("PAGOS_GATEWAY_URL", "https://gateway.example"),
            ],
        ),
    ] {
        let said = precheck(pinned, &env);
        assert!(!said.contains("STOP"), "{pinned}: {said}");
    }
    for (pinned, env) in [
        ("stripe", vec![]),
        ("stripe", vec![("PAGOS_GATEWAY", "sandbox")]),
        ("stripe", vec![("PAGOS_GATEWAY", "mercadopago")]),
        ("http", vec![("PAGOS_GATEWAY", "http")]),
    ] {
        let said = precheck(pinned, &env);
        assert!(said.contains("STOP"), "{pinned} {env:?}: {said}");
    }
    let rules = unwrapped(&read("runbooks/README.md"));
    assert!(
        !rules.contains("without `PAGOS_GATEWAY=http`"),
        "golden rule 6 lets Stripe and Mercado Pago deployments run"
    );
}

/// The Stripe set-up subscribes the endpoint to every event pagos applies, payments' and
/// refunds', at the API version pagos pins: a refund that fails after Stripe answered it
/// `succeeded` is known only from its event, and an endpoint set up as the page says
/// must receive it. The API's own description of the endpoint names them too.
#[test]
fn the_stripe_set_up_subscribes_the_endpoint_to_every_event_pagos_applies() {
    let page = unwrapped(&read("docs/gateways/stripe.md"));
    let set_up = page
        .split("In the Stripe Dashboard, add the endpoint")
        .nth(1)
        .and_then(|rest| rest.split("## ").next())
        .expect("docs/gateways/stripe.md says how to add the endpoint");
    let (_, openapi) = pagos::http::api();
    let openapi = serde_json::to_value(&openapi).expect("OpenAPI as JSON");
    let described = openapi["paths"]["/v1/webhooks/stripe"]["post"]["requestBody"]["description"]
        .as_str()
        .expect("the Stripe endpoint's body is described")
        .to_owned();
    for kind in pagos::webhooks::stripe::ACTED_ON
        .iter()
        .chain(pagos::gateway::stripe::REFUND_EVENTS.iter())
    {
        assert!(
            set_up.contains(&format!("`{kind}`")),
            "the Stripe set-up does not subscribe to {kind}"
        );
        let short = kind.strip_prefix("payment_intent").unwrap_or(kind);
        assert!(
            described.contains(&format!("`{kind}`")) || described.contains(&format!("`{short}`")),
            "the OpenAPI description of /v1/webhooks/stripe does not name {kind}: {described}"
        );
    }
    let version = pagos::gateway::stripe::API_VERSION;
    assert!(
        set_up.contains(&format!("API version `{version}`")),
        "the endpoint's API version is not the one pagos pins ({version})"
    );
    assert!(described.contains(version), "{described}");
}
