//! The console in a real browser: Debian's headless Chromium driven through chromedriver
//! (WebDriver, `fantoccini`) against a real `pagos serve` process, on SQLite and
//! PostgreSQL. Where no browser can be started the tests say so and pass, except with
//! `CI=true`, where that is a failure. The SQLite run saves the screenshots of
//! `docs/console/`.
//!
//! Locally: `apt-get install chromium chromium-driver`, then
//! `cargo test --test api console_browser`. `PAGOS_CHROMEDRIVER` and `PAGOS_CHROMIUM`
//! name other binaries.

use crate::helpers::{
    ADMIN_TOKEN, API_KEY, Backend, FakeGateway, TestDatabase, payment_body, send_json,
};
use crate::on_both_databases;
use crate::process::{Serve, free_port};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use wiremock::MockServer;

on_both_databases!(an_operator_resolves_a_payment_under_review_in_the_browser);

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Says why no browser test ran; a failure in CI.
fn no_browser(why: &str) {
    assert!(!in_ci(), "CI=true and no browser could be started: {why}");
    eprintln!(
        "skipped: no browser could be started ({why}); install chromium and chromium-driver to run the console's browser tests"
    );
}

/// chromedriver on a port of its own, killed when dropped.
struct Driver {
    _child: tokio::process::Child,
    url: String,
}

async fn start_driver() -> Result<Driver, String> {
    let binary =
        std::env::var("PAGOS_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let port = free_port();
    let child = tokio::process::Command::new(&binary)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{binary}: {e}"))?;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if let Ok(answer) = http.get(format!("{url}/status")).send().await
            && answer.status() == 200
        {
            return Ok(Driver { _child: child, url });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{binary} did not answer on {url}"))
}

/// A headless Chromium session; its profile lives in `profile`, removed when dropped.
async fn browser(driver: &Driver, profile: &tempfile::TempDir) -> Result<Client, String> {
    let chromium = std::env::var("PAGOS_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,1000", "--lang=en-US",
                     format!("--user-data-dir={}", profile.path().display())]
        }),
    );
    // As `pagos` itself does: two rustls crypto providers are enabled in the tree, so
    // one is chosen for the process (`Err`: one already was).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    ClientBuilder::rustls()
        .map_err(|e| e.to_string())?
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .map_err(|e| e.to_string())
}

/// What the test's `pagos serve` holds: two payments under review, one in flight, and a
/// paid one with a refund under review.
struct Scene {
    serve: Serve,
    _database: TestDatabase,
    _gateway: MockServer,
    /// The provider, for the walk-through to settle a charge as the page shows it.
    fake: FakeGateway,
    under_review: [String; 2],
    in_flight: String,
    /// The provider's refunds, for the walk-through to settle one as the page shows it.
    refunds: crate::refunds::FakeRefunds,
    /// The paid payment, and its refund under review.
    refunded: (String, String),
    ana: String,
    luis: String,
}

fn pagos_cli(args: &[&str]) -> String {
    crate::binary::printed(crate::binary::pagos(args, None), &format!("{args:?}"))
}

async fn scene(backend: &Backend) -> Scene {
    let database = TestDatabase::create(backend).await;
    let gateway = MockServer::start().await;
    let fake = FakeGateway::charging("pending");
    fake.mount(&gateway).await;
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(&gateway).await;
    let db = database.url.clone();
    pagos_cli(&["migrate", "--database-url", &db]);
    // The operators, as on-call adds them.
    let ana = pagos_cli(&["operators", "add", "ana", "--database-url", &db]);
    let luis = pagos_cli(&[
        "operators",
        "add",
        "luis",
        "--rol",
        "lector",
        "--database-url",
        &db,
    ]);
    pagos_cli(&[
        "merchants",
        "add",
        "acme",
        "--api-key",
        API_KEY,
        "--database-url",
        &db,
    ]);
    let uri = gateway.uri();
    let serve = Serve::start(
        &[
            "--database-url",
            &db,
            "--gateway",
            "http",
            "--gateway-url",
            &uri,
            "--gateway-secret",
            "gw_secret",
            "--gateway-timeout",
            "500ms",
            "--admin-token",
            ADMIN_TOKEN,
            "--give-up-after",
            "1s",
            "--stale-after",
            "1s",
            "--reconcile-every",
            "1h",
        ],
        &[],
    )
    .await;
    let http = reqwest::Client::new();
    let pay = |key: &'static str, body: Value| {
        let http = http.clone();
        let url = format!("{}/v1/pagos", serve.url);
        async move {
            let answer = http
                .post(url)
                .bearer_auth(API_KEY)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .expect("sent");
            let status = answer.status();
            let body: Value = answer.json().await.expect("json");
            (status, body["id"].as_str().expect("id").to_owned())
        }
    };
    let (status, first) = pay("k-browser-1", payment_body()).await;
    assert_eq!(status, 202);
    let (_, second) = pay(
        "k-browser-2",
        json!({"creditoId": "credito-77", "monto": 1999, "moneda": "USD"}),
    )
    .await;
    fake.fail_lookups(true);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for id in [&first, &second] {
        let report = send_json(
            http.post(format!("{}/admin/reconciliaciones", serve.url))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({ "pagoId": id })),
        )
        .await;
        assert_eq!(report["revisionManual"], 1, "{report}");
    }
    // The provider answers look-ups again: the detail page shows what it says.
    fake.fail_lookups(false);
    let (_, in_flight) = pay(
        "k-browser-3",
        json!({"creditoId": "credito-8", "monto": 1250000, "moneda": "COP"}),
    )
    .await;
    fake.set_new_status("succeeded");
    let (_, paid) = pay(
        "k-browser-4",
        json!({"creditoId": "credito-9", "monto": 990000, "moneda": "COP"}),
    )
    .await;
    // A refund the provider keeps pending past PAGOS_GIVE_UP_AFTER goes to review.
    refunds.refunding("pending");
    let refund = send_json(
        http.post(format!("{}/v1/pagos/{paid}/reembolsos", serve.url))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "k-browser-refund")
            .json(&json!({"monto": 40000, "motivo": "the customer returned one item"})),
    )
    .await;
    let refund = refund["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = send_json(
        http.post(format!("{}/admin/reconciliaciones", serve.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "reembolsoId": refund })),
    )
    .await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    Scene {
        serve,
        _database: database,
        _gateway: gateway,
        fake,
        under_review: [first, second],
        in_flight,
        refunds,
        refunded: (paid, refund),
        ana,
        luis,
    }
}

impl Scene {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.serve.url)
    }

    /// Refund `id`'s state, as its merchant reads it.
    async fn refund_state(&self, id: &str) -> String {
        let refund = send_json(
            reqwest::Client::new()
                .get(self.url(&format!("/v1/reembolsos/{id}")))
                .bearer_auth(API_KEY),
        )
        .await;
        refund["estado"].as_str().unwrap_or("").to_owned()
    }

    async fn state_of(&self, id: &str) -> String {
        let detail = send_json(
            reqwest::Client::new()
                .get(self.url(&format!("/admin/pagos/{id}")))
                .bearer_auth(ADMIN_TOKEN),
        )
        .await;
        detail["pago"]["estado"].as_str().unwrap_or("").to_owned()
    }
}

/// Saves a screenshot of what the browser shows to docs/console/NAME.png (SQLite run only).
async fn screenshot(browser: &Client, save: bool, name: &str) {
    if !save {
        return;
    }
    let png = browser.screenshot().await.expect("screenshot");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console");
    std::fs::create_dir_all(&dir).expect("docs/console");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("screenshot written");
}

async fn path_of(browser: &Client) -> String {
    let url = browser.current_url().await.expect("url");
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    }
}

/// Waits (a click's navigation may still be on its way) until the browser shows `expected`.
async fn wait_path(browser: &Client, expected: &str, why: &str) {
    for _ in 0..150 {
        if path_of(browser).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(path_of(browser).await, expected, "{why}");
}

/// Waits until the page's text holds every one of `needles`; the text.
async fn wait_text(browser: &Client, needles: &[&str]) -> String {
    let mut text = String::new();
    for _ in 0..150 {
        text = page_text(browser).await;
        if needles.iter().all(|n| text.contains(n)) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page never showed {needles:?}: {text}");
}

/// The element, once the page has it.
async fn wait_for(browser: &Client, css: &str) -> fantoccini::elements::Element {
    browser
        .wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

/// The text the page shows. Read by a script rather than through an element, which a
/// navigation still on its way can make stale; retried while a page is being replaced.
async fn page_text(browser: &Client) -> String {
    let mut last = String::new();
    for _ in 0..100 {
        match browser
            .execute(
                "return document.body ? document.body.innerText : null;",
                vec![],
            )
            .await
        {
            Ok(Value::String(text)) => return text,
            Ok(other) => last = other.to_string(),
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page's text could not be read: {last}");
}

/// Goes to `path` of the console's server.
async fn goto(browser: &Client, scene: &Scene, path: &str) {
    browser.goto(&scene.url(path)).await.expect("goto");
}

/// What a person does to an element of the page.
enum Act<'a> {
    Click,
    Type(&'a str),
    Choose(&'a str),
}

/// Does `action` to the element `css` (`what`, in the failure message).
async fn act(browser: &Client, css: &str, what: &str, action: Act<'_>) {
    let element = browser.find(Locator::Css(css)).await.expect(what);
    let done = match action {
        Act::Click => element.click().await.map(|_| ()),
        Act::Type(text) => element.send_keys(text).await,
        Act::Choose(value) => element.select_by_value(value).await,
    };
    done.unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Runs `script` in the page.
async fn run_script(browser: &Client, script: &str, args: Vec<Value>, what: &str) -> Value {
    browser.execute(script, args).await.expect(what)
}

/// The elements `css` the page has now.
async fn all(browser: &Client, css: &str, what: &str) -> Vec<fantoccini::elements::Element> {
    browser.find_all(Locator::Css(css)).await.expect(what)
}

async fn log_in(browser: &Client, scene: &Scene, token: &str, save: bool) {
    goto(browser, scene, "/consola/login").await;
    act(browser, "#token", "token field", Act::Type(token)).await;
    screenshot(browser, save, "login").await;
    act(
        browser,
        "form.stack button[type=submit]",
        "button",
        Act::Click,
    )
    .await;
    wait_path(browser, "/consola/", "logged in, on the queue").await;
}

async fn log_out(browser: &Client) {
    act(browser, "form.logout button", "logout button", Act::Click).await;
    wait_path(browser, "/consola/login?salida=1", "logged out").await;
}

async fn an_operator_resolves_a_payment_under_review_in_the_browser(backend: Backend) {
    let driver = match start_driver().await {
        Ok(driver) => driver,
        Err(why) => return no_browser(&why),
    };
    let profile = tempfile::tempdir().expect("a profile directory");
    let browser = match browser(&driver, &profile).await {
        Ok(browser) => browser,
        Err(why) => return no_browser(&why),
    };
    let save = matches!(backend, Backend::Sqlite);
    // In a task of its own, so that a failed assertion still closes the browser (a
    // session left open keeps Chromium running after chromedriver is gone).
    let walk = {
        let browser = browser.clone();
        tokio::spawn(async move {
            let scene = scene(&backend).await;
            tokio::time::timeout(
                Duration::from_secs(120),
                walk_through(&browser, &scene, save),
            )
            .await
        })
    };
    let result = walk.await;
    let _ = browser.close().await;
    match result {
        Ok(finished) => finished.expect("the walk through finished in time"),
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

async fn walk_through(browser: &Client, scene: &Scene, save: bool) {
    let [first, second] = &scene.under_review;

    // Logged out, every page leads to the login page.
    for path in [
        "/consola/".to_owned(),
        "/consola/pagos?q=acme".to_owned(),
        format!("/consola/pagos/{first}"),
        "/consola/reconciliaciones".to_owned(),
    ] {
        goto(browser, scene, &path).await;
        assert_eq!(path_of(browser).await, "/consola/login", "{path}");
    }

    // An operador logs in and sees what needs attention, oldest first.
    log_in(browser, scene, &scene.ana, save).await;
    let rows = all(browser, "tbody tr[data-id]", "rows").await;
    let mut ids = Vec::new();
    for row in &rows {
        ids.push(row.attr("data-id").await.expect("attr").unwrap_or_default());
    }
    assert_eq!(
        ids,
        [first.clone(), second.clone(), scene.in_flight.clone()],
        "under review and in flight, oldest first"
    );
    let text = page_text(browser).await;
    assert!(text.contains("Needs manual review"), "{text}");
    assert!(
        text.contains("2,500.00 COP") && text.contains("19.99 USD"),
        "{text}"
    );
    assert!(text.contains("ana"), "{text}");
    screenshot(browser, save, "queue").await;

    // Opens the first one.
    act(
        browser,
        &format!("tr[data-id=\"{first}\"] a"),
        "link",
        Act::Click,
    )
    .await;
    wait_path(
        browser,
        &format!("/consola/pagos/{first}"),
        "the payment's page",
    )
    .await;
    wait_text(browser, &["The provider says now", "pending"]).await;
    screenshot(browser, save, "payment").await;

    // A form without its CSRF token is refused, and nothing changes.
    run_script(
        browser,
        "document.querySelector('form[action$=\"/resolver\"] input[name=csrf]').remove();",
        vec![],
        "script",
    )
    .await;
    act(browser, "#estado", "estado", Act::Choose("COMPLETADA")).await;
    act(browser, "#motivo", "motivo", Act::Type("forged")).await;
    act(browser, "#resolve", "button", Act::Click).await;
    wait_text(browser, &["Refused", "CSRF"]).await;
    assert_eq!(scene.state_of(first).await, "REVISION_MANUAL");

    // The reason is required: the browser will not send the form without one.
    goto(browser, scene, &format!("/consola/pagos/{first}")).await;
    act(browser, "#estado", "estado", Act::Choose("FALLIDA")).await;
    act(browser, "#resolve", "button", Act::Click).await;
    assert_eq!(
        path_of(browser).await,
        format!("/consola/pagos/{first}"),
        "not sent without a reason"
    );
    assert_eq!(scene.state_of(first).await, "REVISION_MANUAL");

    // Resolved with a reason, once its charge failed at the provider (FALLIDA is refused
    // while a charge is still pending: it may yet take the money).
    scene.fake.settle(first, "declined");
    act(
        browser,
        "#motivo",
        "motivo",
        Act::Type("No charge in the provider's dashboard; ticket OPS-42"),
    )
    .await;
    act(browser, "#resolve", "button", Act::Click).await;
    wait_path(
        browser,
        &format!("/consola/pagos/{first}?hecho=resuelto"),
        "resolved",
    )
    .await;
    assert_eq!(scene.state_of(first).await, "FALLIDA");
    let timeline = browser
        .find(Locator::Css("ol.timeline li:last-child"))
        .await
        .expect("last audit row")
        .text()
        .await
        .expect("text");
    assert!(
        timeline.contains("ana (admin)"),
        "the audit trail names her: {timeline}"
    );
    assert!(timeline.contains("ticket OPS-42"), "{timeline}");
    assert!(timeline.contains("Failed, no money taken"), "{timeline}");
    run_script(
        browser,
        "document.querySelector('ol.timeline').scrollIntoView();",
        vec![],
        "scrolled",
    )
    .await;
    screenshot(browser, save, "resolved").await;

    // It left the queue.
    goto(browser, scene, "/consola/").await;
    assert!(
        all(browser, &format!("tr[data-id=\"{first}\"]"), "rows")
            .await
            .is_empty(),
        "resolved: not in the queue any more"
    );
    assert!(
        !all(browser, &format!("tr[data-id=\"{second}\"]"), "rows")
            .await
            .is_empty()
    );

    // A refund under review, resolved from its payment's page once the provider shows the
    // money went back: its state in the table leads to its card.
    let (paid, refund) = &scene.refunded;
    scene.refunds.settle_all("succeeded");
    goto(browser, scene, &format!("/consola/pagos/{paid}")).await;
    act(
        browser,
        &format!("#refunds a[href=\"#refund-{refund}\"]"),
        "the refund's link",
        Act::Click,
    )
    .await;
    let card = format!("#refund-{refund}");
    act(
        browser,
        &format!("{card} select[name=estado]"),
        "outcome",
        Act::Choose("COMPLETADO"),
    )
    .await;
    act(
        browser,
        &format!("{card} textarea[name=motivo]"),
        "reason",
        Act::Type("The provider's dashboard shows it succeeded; ticket OPS-43"),
    )
    .await;
    run_script(
        browser,
        "document.querySelector('#refunds').scrollIntoView();",
        vec![],
        "scrolled",
    )
    .await;
    screenshot(browser, save, "refund").await;
    act(
        browser,
        &format!("{card} button[type=submit]"),
        "button",
        Act::Click,
    )
    .await;
    wait_path(
        browser,
        &format!("/consola/pagos/{paid}?hecho=reembolso-resuelto"),
        "the refund resolved",
    )
    .await;
    wait_text(browser, &["Refund resolved", "ticket OPS-43"]).await;
    assert_eq!(scene.refund_state(refund).await, "COMPLETADO");

    // Search, and a reconciliation pass with its report.
    goto(browser, scene, "/consola/pagos?q=acme").await;
    let found = all(browser, "tbody tr[data-id]", "rows").await;
    assert_eq!(found.len(), 4, "every payment of acme");
    screenshot(browser, save, "search").await;
    goto(browser, scene, "/consola/reconciliaciones").await;
    act(browser, "#run-pass", "button", Act::Click).await;
    let report = wait_for(browser, "#report")
        .await
        .text()
        .await
        .expect("text");
    assert!(report.contains("examinados"), "{report}");
    screenshot(browser, save, "reconciliation").await;

    // On a phone.
    browser.set_window_size(390, 844).await.expect("resized");
    goto(browser, scene, "/consola/").await;
    let overflow = run_script(
        browser,
        "return document.documentElement.scrollWidth > window.innerWidth + 1;",
        vec![],
        "script",
    )
    .await;
    assert_eq!(
        overflow,
        Value::Bool(false),
        "no sideways scrolling on a phone"
    );
    screenshot(browser, save, "queue-phone").await;
    browser.set_window_size(1280, 1000).await.expect("resized");

    log_out(browser).await;
    goto(browser, scene, "/consola/").await;
    assert_eq!(path_of(browser).await, "/consola/login", "logged out");

    // A lector sees the payment but cannot resolve it, not even with a hand-made form.
    log_in(browser, scene, &scene.luis, false).await;
    goto(browser, scene, &format!("/consola/pagos/{second}")).await;
    assert!(
        all(browser, "#resolve", "buttons").await.is_empty(),
        "no resolve button for a lector"
    );
    assert!(page_text(browser).await.contains("lector"));
    run_script(
        browser,
        "const csrf = document.querySelector('form.logout input[name=csrf]').value;
             const form = document.createElement('form');
             form.method = 'post';
             form.action = arguments[0];
             for (const [k, v] of [['csrf', csrf], ['estado', 'COMPLETADA'], ['motivo', 'I think it went through']]) {
               const input = document.createElement('input');
               input.type = 'hidden'; input.name = k; input.value = v;
               form.appendChild(input);
             }
             document.body.appendChild(form);
             form.submit();",
        vec![json!(format!("/consola/pagos/{second}/resolver"))],
        "script",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = page_text(browser).await;
    assert!(
        text.contains("Refused") && text.contains("lector"),
        "{text}"
    );
    assert_eq!(scene.state_of(second).await, "REVISION_MANUAL");
    log_out(browser).await;
}
