//! Merchants: scoping (a key or a payment id of another merchant is never shared or
//! shown), several API keys per merchant, revocation and expiry seen by a running server,
//! the key cache, the limit on failed authentications, unique names and their migration.
//! Keys are added and revoked with the real `pagos` binary on the app's database, as an
//! operator would, while the app serves.

use crate::helpers::{
    ADMIN_TOKEN, API_KEY, Backend, Charge, OTHER_API_KEY, Spawn, TestApp, TestDatabase, json,
    payment_body, send,
};
use crate::on_both_databases;
use crate::process::BIN;
use pagos::entities::merchant;
use pagos::merchants::key::hash_api_key;
use pagos::merchants::store::{self, Credential};
use sea_orm::{ActiveValue::Set, EntityTrait, QueryOrder};
use serde_json::Value;
use std::time::{Duration, Instant};

on_both_databases!(
    two_merchants_with_one_key_make_two_payments_with_two_gateway_keys,
    a_merchant_cannot_read_another_merchants_payment,
);

async fn two_merchants_with_one_key_make_two_payments_with_two_gateway_keys(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    let a = app.pay_as(API_KEY, "shared-key", &payment_body()).await;
    let b = app
        .pay_as(OTHER_API_KEY, "shared-key", &payment_body())
        .await;
    assert_eq!(a.status(), 201);
    assert_eq!(b.status(), 201);
    assert!(b.headers().get("idempotent-replayed").is_none());
    let (a, b) = (json(a).await, json(b).await);
    assert_ne!(a["id"], b["id"]);

    let seen = app.charges_seen().await;
    assert_eq!(seen.len(), 2);
    assert_ne!(
        seen[0].headers["idempotency-key"],
        seen[1].headers["idempotency-key"]
    );
    assert_eq!(app.count_rows().await, (2, 2));
}

async fn a_merchant_cannot_read_another_merchants_payment(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let created = json(app.pay_as(API_KEY, "k-a", &payment_body()).await).await;
    let path = format!("/v1/pagos/{}", created["id"].as_str().expect("id"));

    let as_owner = app.get_as(API_KEY, &path).await;
    assert_eq!(as_owner.status(), 200);
    let as_other = app.get_as(OTHER_API_KEY, &path).await;
    assert_eq!(as_other.status(), 404);
    assert_eq!(
        as_other.headers()["content-type"],
        "application/problem+json"
    );
    let not_a_uuid = app.get_as(API_KEY, "/v1/pagos/nope").await;
    assert_eq!(not_a_uuid.status(), 404);
}

on_both_databases!(
    two_keys_of_one_merchant_both_work_and_see_the_same_payments,
    a_key_revoked_from_the_command_line_is_refused_by_a_running_server_within_5_seconds,
    a_key_revoked_while_a_look_up_writes_its_last_use_is_refused_within_5_seconds,
    a_key_past_its_expiry_is_refused_with_401,
    unknown_and_revoked_keys_sent_again_and_again_are_looked_up_once,
    an_address_past_the_failure_limit_gets_429_before_any_look_up_and_others_do_not,
    failed_admin_tokens_count_toward_the_same_limit,
    an_address_over_the_limit_gets_no_guess_checked_until_its_minute_is_over,
    merchant_names_are_unique_in_the_database,
    a_merchant_created_by_an_older_binary_during_a_deploy_can_authenticate,
    the_names_migration_renames_duplicates_in_creation_order_and_old_keys_keep_working,
);

/// `pagos ARGS --database-url <the app's database>`, the way an operator runs it.
async fn pagos_on(database_url: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .args(["--database-url", database_url])
        .env_remove("PAGOS_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("pagos runs")
}

async fn pagos(app: &TestApp, args: &[&str]) -> std::process::Output {
    let output = pagos_on(app.database_url(), args).await;
    assert!(
        output.status.success(),
        "pagos {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A new key of merchant `name` from `pagos merchants keys add`, with `extra` flags.
async fn new_key(app: &TestApp, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["merchants", "keys", "add", name];
    args.extend_from_slice(extra);
    let output = pagos(app, &args).await;
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

async fn keys_of(app: &TestApp, name: &str) -> Vec<Value> {
    let output = pagos(app, &["merchants", "keys", "list", name, "--json"]).await;
    let keys: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    keys.as_array().expect("an array").clone()
}

/// The listed key that is `key`: the longest prefix it starts with (`sk_tes`, the prefix of
/// `sk_test_acme`, is also the start of every generated `sk_test_…` key).
fn key_with_prefix<'a>(keys: &'a [Value], key: &str) -> &'a Value {
    keys.iter()
        .filter(|k| key.starts_with(k["prefix"].as_str().unwrap_or("-")))
        .max_by_key(|k| k["prefix"].as_str().map_or(0, str::len))
        .expect("the key is listed")
}

/// An authenticated request that changes nothing: 404 for a merchant (no such payment),
/// 401 when the key does not authenticate.
async fn probe(app: &TestApp, http: &reqwest::Client, api_key: &str) -> reqwest::Response {
    http.get(app.url(&format!("/v1/pagos/{}", uuid::Uuid::nil())))
        .bearer_auth(api_key)
        .send()
        .await
        .expect("sent")
}

async fn detail(answer: reqwest::Response) -> String {
    json(answer).await["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn two_keys_of_one_merchant_both_work_and_see_the_same_payments(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let second = new_key(&app, "acme", &[]).await;

    let made = app.pay_as(API_KEY, "two-keys", &payment_body()).await;
    assert_eq!(made.status(), 201);
    let made = json(made).await;
    let path = format!("/v1/pagos/{}", made["id"].as_str().expect("id"));
    let seen = app.get_as(&second, &path).await;
    assert_eq!(
        seen.status(),
        200,
        "the second key reads the first key's payment"
    );
    assert_eq!(json(seen).await["id"], made["id"]);
    // One merchant, one key space: the same Idempotency-Key through the other key replays.
    let again = app.pay_as(&second, "two-keys", &payment_body()).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(again).await["id"], made["id"]);
    assert_eq!(app.charges_seen().await.len(), 1);

    let keys = keys_of(&app, "acme").await;
    assert_eq!(keys.len(), 2);
    for key in [API_KEY, second.as_str()] {
        let listed = key_with_prefix(&keys, key);
        assert_eq!(listed["state"], "active");
        assert!(
            listed["lastUsedAt"].is_string(),
            "a key that authenticated has a last use: {listed}"
        );
    }
}

async fn a_key_revoked_from_the_command_line_is_refused_by_a_running_server_within_5_seconds(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let key = new_key(&app, "acme", &[]).await;
    // The server has seen the key, so it is in its cache when the revocation happens.
    assert_eq!(probe(&app, &app.http, &key).await.status(), 404);
    let prefix = key_with_prefix(&keys_of(&app, "acme").await, &key)["prefix"]
        .as_str()
        .expect("prefix")
        .to_owned();
    assert!(prefix.len() < key.len() / 2 + 1 && key.starts_with(&prefix));

    pagos(&app, &["merchants", "keys", "revoke", "acme", &prefix]).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let sent = Instant::now();
        let answer = probe(&app, &app.http, &key).await;
        if answer.status() == 401 {
            break answer;
        }
        assert_eq!(answer.status(), 404);
        assert!(
            sent < deadline,
            "a revoked key was still accepted 5 s after the revocation"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(detail(refused).await.contains("revoked"));
    assert_eq!(
        probe(&app, &app.http, API_KEY).await.status(),
        404,
        "the merchant's other key still works"
    );
    assert_eq!(
        key_with_prefix(&keys_of(&app, "acme").await, &key)["state"],
        "revoked"
    );
}

/// The look-up of a key writes its last use; a write held up (a lock, a busy pool; here a
/// pause of 8 s before it) while the key is revoked: every request for the key that
/// arrived meanwhile from another address waited for that one look-up and took its answer
/// as it ended, the key accepted 8 s after its revocation. The look-up answers what its read saw, the write
/// goes on by itself.
async fn a_key_revoked_while_a_look_up_writes_its_last_use_is_refused_within_5_seconds(
    backend: Backend,
) {
    use crate::process::{Serve, World, serving};
    let world = World::new(backend, crate::helpers::FakeGateway::charging("succeeded")).await;
    let uri = world.gateway.uri();
    let args = serving(&world.database.url, &uri, &[]);
    let server = Serve::start(&args, &[("PAGOS_PAUSE_AT", "key_used:8000")]).await;
    let added = pagos_on(&world.database.url, &["merchants", "keys", "add", "acme"]).await;
    let key = String::from_utf8_lossy(&added.stdout).trim().to_owned();
    // From two addresses: the look-ups of one address's unknown keys take turns.
    let probe = |key: String, from: [u8; 4]| {
        let url = format!("{}/v1/pagos/{}", server.url, uuid::Uuid::nil());
        async move {
            reqwest::Client::builder()
                .local_address(std::net::IpAddr::from(from))
                .build()
                .expect("client")
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .expect("sent")
                .status()
        }
    };
    // Its first use: the look-up's write of its last use is held up 8 s.
    let first = tokio::spawn(probe(key.clone(), [127, 0, 0, 1]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revoke = pagos_on(
        &world.database.url,
        &["merchants", "keys", "revoke", "acme", &key[..16]],
    )
    .await;
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let revoked = Instant::now();
    tokio::time::sleep_until((revoked + Duration::from_millis(5_200)).into()).await;
    assert_eq!(
        probe(key, [127, 0, 0, 2]).await,
        401,
        "a revoked key accepted more than 5 s after its revocation: {}",
        server.logs()
    );
    assert_eq!(
        first.await.expect("answered"),
        404,
        "accepted before its revocation"
    );
}

async fn a_key_past_its_expiry_is_refused_with_401(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let key = new_key(&app, "acme", &["--expira", "1s"]).await;
    let listed = key_with_prefix(&keys_of(&app, "acme").await, &key).clone();
    let expires_at: chrono::DateTime<chrono::Utc> = listed["expiresAt"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .expect("an expiry");
    let left = (expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(100)).await;

    let refused = probe(&app, &app.http, &key).await;
    assert_eq!(refused.status(), 401);
    assert!(detail(refused).await.contains("expired"));
    assert_eq!(
        key_with_prefix(&keys_of(&app, "acme").await, &key)["state"],
        "expired"
    );
    let merchants: Value =
        serde_json::from_slice(&pagos(&app, &["merchants", "list", "--json"]).await.stdout)
            .expect("JSON");
    let acme = merchants
        .as_array()
        .and_then(|all| all.iter().find(|m| m["name"] == "acme"))
        .expect("acme is listed");
    assert_eq!(acme["activeKeys"], 1, "only the key that has not expired");
}

async fn unknown_and_revoked_keys_sent_again_and_again_are_looked_up_once(backend: Backend) {
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "1000"]).await;
    let revoked = new_key(&app, "acme", &[]).await;
    let prefix: String = revoked.chars().take(16).collect();
    pagos(&app, &["merchants", "keys", "revoke", "acme", &prefix]).await;
    let unknown = "sk_live_NotAKeyOfAnyMerchantAtAll0000";
    assert_eq!(probe(&app, &app.http, unknown).await.status(), 401);
    assert_eq!(probe(&app, &app.http, &revoked).await.status(), 401);

    // From here on, a look-up in the database fails and answers 503.
    app.db.clone().close().await.expect("database closed");
    for _ in 0..25 {
        let answer = probe(&app, &app.http, unknown).await;
        assert_eq!(answer.status(), 401, "answered without the database");
        assert_eq!(detail(answer).await, "Unknown API key.");
        let answer = probe(&app, &app.http, &revoked).await;
        assert_eq!(answer.status(), 401, "answered without the database");
        assert!(detail(answer).await.contains("revoked"));
    }
}

/// A client whose requests come from `127.0.0.2`: another address on this machine.
fn client_at_another_address() -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// A look-up of a key held up past the cache's time to live (its write of the key's last
/// use waits on a lock) while the key is revoked: the answer it brings back is trusted for
/// `KEY_CACHE_TTL` from when it began, so the key is refused at once after the revocation,
/// not for 4 s more from when the look-up ended. (PostgreSQL: the revocation holds the
/// row's lock until it commits, and the look-up's write waits for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_revoked_while_a_look_up_of_it_waits_is_refused_right_after_the_revocation() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = Spawn::new(backend).start().await;
    let key = new_key(&app, "acme", &[]).await;
    // The revocation, as `merchants keys revoke` writes it, not committed yet.
    let revoking = app.db.begin().await.expect("begin");
    revoking
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            r#"UPDATE "api_keys" SET "revoked_at" = now() WHERE "key_hash" = $1"#,
            [hash_api_key(&key).into()],
        ))
        .await
        .expect("revoked, uncommitted");
    // Reads the key before the revocation commits, then waits to record its use.
    let waiting = {
        let request = app
            .http
            .get(app.url(&format!("/v1/pagos/{}", uuid::Uuid::nil())))
            .bearer_auth(&key);
        tokio::spawn(async move { request.send().await.expect("sent").status().as_u16() })
    };
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    revoking.commit().await.expect("revoked");
    assert_eq!(
        waiting.await.expect("answered"),
        404,
        "read before the revocation: the key still worked"
    );
    let after = probe(&app, &app.http, &key).await;
    assert_eq!(
        after.status(),
        401,
        "the key answered as the waiting look-up found it, after its revocation"
    );
    assert!(detail(after).await.contains("revoked"));
}

/// Forty wrong keys from one address in flight at once (their look-ups held by a lock on
/// the keys' table, so none is answered before the others arrive), then a valid key: with
/// a limit of 5 failures a minute the address is blocked by the time the valid key's turn
/// comes, and it gets 429 as any request of a blocked address does. Counted only once
/// known, the failures of a burst were all checked first, the address was blocked only
/// afterwards, and a key sent meanwhile was checked too: as many guesses per allowance as
/// the server takes requests at once. (PostgreSQL: SQLite's readers do not wait for a
/// lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_guesses_in_flight_at_once_gets_no_more_checks_than_the_limit() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "5"]).await;
    let held = app.db.begin().await.expect("begin");
    held.execute_unprepared("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let ask = |key: String| {
        let request = app
            .http
            .get(app.url(&format!("/v1/pagos/{}", uuid::Uuid::nil())))
            .bearer_auth(key);
        tokio::spawn(async move { request.send().await.expect("sent").status().as_u16() })
    };
    let guesses: Vec<_> = (0..40).map(|i| ask(format!("sk_live_guess_{i}"))).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let valid = ask(API_KEY.to_owned());
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.commit().await.expect("unlock");

    let mut answers = Vec::new();
    for guess in guesses {
        answers.push(guess.await.expect("answered"));
    }
    let checked = answers.iter().filter(|s| **s == 401).count();
    assert_eq!(
        checked + answers.iter().filter(|s| **s == 429).count(),
        40,
        "{answers:?}"
    );
    assert!(checked <= 5, "{checked} guesses answered 401: {answers:?}");
    assert_eq!(
        valid.await.expect("answered"),
        429,
        "a key sent after 40 failures from its address is not checked"
    );
}

async fn an_address_past_the_failure_limit_gets_429_before_any_look_up_and_others_do_not(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "5"]).await;
    for i in 0..5 {
        let answer = probe(&app, &app.http, &format!("sk_live_wrong_{i}")).await;
        assert_eq!(answer.status(), 401, "failure {i} is within the limit");
    }
    let refused = probe(&app, &app.http, "sk_live_wrong_5").await;
    assert_eq!(refused.status(), 429);
    let wait = crate::helpers::retry_after_secs(&refused);
    assert!(
        (55..=60).contains(&wait),
        "refused until its whole allowance is back, a minute: {wait}"
    );
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        json(refused).await["type"],
        "/problems/too-many-failed-authentications"
    );
    // Until then the address is refused whatever it sends.
    assert_eq!(probe(&app, &app.http, API_KEY).await.status(), 429);
    assert_eq!(
        app.admin_get("/admin/pagos?estado=ENVIADA").await.status(),
        429
    );

    let other = client_at_another_address();
    assert_eq!(probe(&app, &other, API_KEY).await.status(), 404);
    assert_eq!(probe(&app, &other, "sk_live_wrong_x").await.status(), 401);

    // Refused before any look-up: with the database gone, a key never seen is still a 429.
    app.db.clone().close().await.expect("database closed");
    assert_eq!(
        probe(&app, &app.http, "sk_live_never_seen").await.status(),
        429
    );
}

async fn failed_admin_tokens_count_toward_the_same_limit(backend: Backend) {
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "3"]).await;
    let admin_as = |http: &reqwest::Client, token: &str| {
        http.get(app.url("/admin/pagos?estado=ENVIADA&limite=1"))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..3 {
        let answer = admin_as(&app.http, "not-the-token").await.expect("sent");
        assert_eq!(answer.status(), 401);
    }
    let refused = admin_as(&app.http, "not-the-token").await.expect("sent");
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let other = client_at_another_address();
    let answer = admin_as(&other, ADMIN_TOKEN).await.expect("sent");
    assert_eq!(answer.status(), 200, "another address is not affected");
}

async fn merchant_names_are_unique_in_the_database(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let taken = pagos::app::add_merchant(&app.db, "  acme ", None).await;
    assert!(taken.is_err(), "a name already taken is refused");
    // A write that skips the checks meets the unique index.
    let forced = merchant::Entity::insert(merchant::ActiveModel {
        id: Set(uuid::Uuid::now_v7()),
        name: Set("acme".to_owned()),
        api_key_hash: Set(hash_api_key("sk_another_acme")),
        created_at: Set(pagos::db::now()),
    })
    .exec_without_returning(&app.db)
    .await;
    assert!(forced.is_err(), "the database refuses a second \"acme\"");
    assert!(
        pagos::app::add_merchant(&app.db, "   ", None)
            .await
            .is_err()
    );
    assert!(
        pagos::app::add_merchant(&app.db, &"x".repeat(65), None)
            .await
            .is_err()
    );
    assert_eq!(
        merchant::Entity::find()
            .all(&app.db)
            .await
            .expect("read")
            .len(),
        2
    );
}

async fn a_merchant_created_by_an_older_binary_during_a_deploy_can_authenticate(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    // What `merchants add` of a binary that predates `api_keys` writes: the merchant alone.
    let legacy_key = "sk_live_MadeByAnOlderBinaryDuringADeploy0";
    merchant::Entity::insert(merchant::ActiveModel {
        id: Set(uuid::Uuid::now_v7()),
        name: Set("legacy".to_owned()),
        api_key_hash: Set(hash_api_key(legacy_key)),
        created_at: Set(pagos::db::now()),
    })
    .exec_without_returning(&app.db)
    .await
    .expect("inserted");
    assert_eq!(probe(&app, &app.http, legacy_key).await.status(), 404);
    let keys = keys_of(&app, "legacy").await;
    assert_eq!(keys.len(), 1);
    let prefix = keys[0]["prefix"].as_str().expect("prefix").to_owned();
    assert_eq!(
        prefix,
        format!("sha256:{}", &hash_api_key(legacy_key)[..12])
    );

    // Revoked, it no longer works for binaries that read `merchants.api_key_hash` either.
    pagos(&app, &["merchants", "keys", "revoke", "legacy", &prefix]).await;
    let row = merchant::Entity::find()
        .all(&app.db)
        .await
        .expect("read")
        .into_iter()
        .find(|m| m.name == "legacy")
        .expect("legacy");
    assert_ne!(row.api_key_hash, hash_api_key(legacy_key));
}

async fn the_names_migration_renames_duplicates_in_creation_order_and_old_keys_keep_working(
    backend: Backend,
) {
    use migration::{Migrator, MigratorTrait};
    let database = TestDatabase::create(&backend).await;
    let db = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("open");
    let before_keys = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261203_000007_api_keys")
        .expect("the api_keys migration");
    Migrator::up(&db, Some(u32::try_from(before_keys).expect("count")))
        .await
        .expect("the schema before api keys and unique names");
    // Merchants as `merchants add` made them before names were unique.
    let seeded = ["demo", "demo", "demo-2", "demo", " acme ", "   "];
    let start = pagos::db::now() - chrono::TimeDelta::hours(1);
    let mut ids = Vec::new();
    for (i, name) in seeded.iter().enumerate() {
        let id = uuid::Uuid::now_v7();
        merchant::Entity::insert(merchant::ActiveModel {
            id: Set(id),
            name: Set((*name).to_owned()),
            api_key_hash: Set(hash_api_key(&format!("sk_old_{i}"))),
            created_at: Set(start + chrono::TimeDelta::seconds(i64::try_from(i).expect("i"))),
        })
        .exec_without_returning(&db)
        .await
        .expect("seeded");
        ids.push(id);
    }
    db.close().await.expect("closed");

    let migrated = tokio::process::Command::new(BIN)
        .args(["migrate", "--database-url", &database.url])
        .env("RUST_LOG", "info")
        .output()
        .await
        .expect("pagos migrate runs");
    let log = String::from_utf8_lossy(&migrated.stderr);
    assert!(migrated.status.success(), "{log}");
    assert!(log.contains("renamed 4 merchant(s)"), "{log}");
    assert!(log.contains(r#""demo" -> "demo-3""#), "{log}");

    let db = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("open");
    let names: Vec<String> = merchant::Entity::find()
        .order_by_asc(merchant::Column::CreatedAt)
        .all(&db)
        .await
        .expect("read")
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(
        names,
        ["demo", "demo-3", "demo-2", "demo-4", "acme", "merchant"]
    );
    let connection = pagos::app::open_and_migrate(&pagos::config::DatabaseArgs {
        url: database.url.clone(),
        pool_size: 2,
    })
    .await
    .expect("open");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            store::lookup(&connection, &hash_api_key(&format!("sk_old_{i}")))
                .await
                .expect("look-up"),
            Credential::Known {
                merchant: *id,
                expires_at: None
            },
            "the key of merchant {i} still authenticates it"
        );
    }
}

/// An address over the limit is refused until its whole allowance is back: at 30 a
/// minute, the 31st failure is a 429, and so is a guess two seconds on. Before, the block
/// ended at the next single allowance (one every two seconds here): the guess two seconds
/// on was checked, and a client guessing steadily got about twice the limit's guesses
/// checked in its first minute.
async fn an_address_over_the_limit_gets_no_guess_checked_until_its_minute_is_over(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "30"]).await;
    // Guesses until the first 429: the 30 of the limit are checked, and one more for each
    // allowance given back (one every two seconds) while they were sent, on a slow machine.
    let started = std::time::Instant::now();
    let mut checked = 0;
    loop {
        let answer = probe(&app, &app.http, &format!("sk_live_guess_{checked}")).await;
        if answer.status() == 429 {
            break;
        }
        assert_eq!(
            answer.status(),
            401,
            "failure {checked} is within the limit"
        );
        checked += 1;
        assert!(checked <= 60, "60 guesses checked: no limit");
    }
    let given_back = started.elapsed().as_secs() / 2 + 1;
    assert!(
        (30..=30 + given_back).contains(&checked),
        "{checked} guesses checked, at 30 a minute ({given_back} allowances back meanwhile)"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = probe(&app, &app.http, "sk_live_guess_later").await;
    assert_eq!(
        later.status(),
        429,
        "a guess two seconds after the block is not checked"
    );
}

on_both_databases!(
    every_401_of_the_merchant_and_admin_apis_carries_a_bearer_challenge,
    a_request_with_two_authorization_headers_is_refused_before_any_key_is_checked,
);

/// The `WWW-Authenticate` challenge of a 401 (RFC 9110 §15.5.2: every 401 carries one).
fn challenge_of(answer: &reqwest::Response, what: &str) -> String {
    assert_eq!(answer.status(), 401, "{what}");
    answer
        .headers()
        .get("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: a 401 without WWW-Authenticate"))
        .to_str()
        .expect("text")
        .to_owned()
}

/// Every 401 of the merchant API and of the admin API says how to authenticate: a
/// `Bearer` challenge of its realm, with `error="invalid_token"` (RFC 6750) when a
/// token was sent but refused, and none when no token was sent. Before, no 401 carried
/// `WWW-Authenticate`.
async fn every_401_of_the_merchant_and_admin_apis_carries_a_bearer_challenge(backend: Backend) {
    let app = crate::helpers::started(backend, &[]).await;
    let payment = format!("/v1/pagos/{}", uuid::Uuid::nil());

    let none = app.get(&payment).await;
    assert_eq!(
        challenge_of(&none, "no key"),
        r#"Bearer realm="pagos""#,
        "no key sent: no error code"
    );
    let unsent = send(
        app.http
            .post(app.url("/v1/pagos"))
            .header("Idempotency-Key", "k-no-key")
            .json(&payment_body()),
    )
    .await;
    assert_eq!(
        challenge_of(&unsent, "a payment without key"),
        r#"Bearer realm="pagos""#
    );
    let unknown = probe(&app, &app.http, "sk_live_never_issued").await;
    assert_eq!(
        challenge_of(&unknown, "an unknown key"),
        r#"Bearer realm="pagos", error="invalid_token""#
    );
    let revoked = new_key(&app, "acme", &[]).await;
    let prefix = key_with_prefix(&keys_of(&app, "acme").await, &revoked)["prefix"]
        .as_str()
        .expect("prefix")
        .to_owned();
    pagos(&app, &["merchants", "keys", "revoke", "acme", &prefix]).await;
    let refused = probe(&app, &app.http, &revoked).await;
    assert_eq!(
        challenge_of(&refused, "a revoked key"),
        r#"Bearer realm="pagos", error="invalid_token""#
    );
    assert_eq!(
        detail(refused).await,
        "This API key was revoked. Use another key of this merchant."
    );

    let admin = app.get("/admin/pagos?estado=ENVIADA").await;
    assert_eq!(
        challenge_of(&admin, "no admin token"),
        r#"Bearer realm="pagos-admin""#
    );
    for path in ["/admin/pagos?estado=ENVIADA", "/admin/cargos-huerfanos"] {
        let wrong = app.get_as("not-the-token", path).await;
        assert_eq!(
            challenge_of(&wrong, path),
            r#"Bearer realm="pagos-admin", error="invalid_token""#
        );
        assert_eq!(wrong.headers()["content-type"], "application/problem+json");
    }
}

/// A request with two `Authorization` headers is refused whichever comes first and
/// whether or not they are equal, before any key is checked, and counts as a failed
/// authentication. Before, the first won: a valid key followed by a bogus one made a
/// payment (201).
async fn a_request_with_two_authorization_headers_is_refused_before_any_key_is_checked(
    backend: Backend,
) {
    let app = Spawn::new(backend)
        .flags(&["--auth-failures-per-minute", "4"])
        .start()
        .await;
    app.answer_charges(Charge::succeeded()).await;
    let valid = format!("Bearer {API_KEY}");
    let pay_with = |first: &str, second: &str, key: &str| {
        app.http
            .post(app.url("/v1/pagos"))
            .header("Authorization", first)
            .header("Authorization", second)
            .header("Idempotency-Key", key)
            .json(&payment_body())
            .send()
    };
    for (i, (first, second)) in [
        (valid.as_str(), "Bearer sk_live_bogus"),
        ("Bearer sk_live_bogus", valid.as_str()),
        (valid.as_str(), valid.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = pay_with(first, second, &format!("k-two-{i}"))
            .await
            .expect("sent");
        assert_eq!(
            challenge_of(&answer, &format!("{first} then {second}")),
            r#"Bearer realm="pagos", error="invalid_request""#
        );
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
        let body = json(answer).await;
        assert_eq!(body["type"], "/problems/unauthorized");
        assert_eq!(
            body["detail"],
            "This request has more than one `Authorization` header. Send exactly one: \
             `Authorization: Bearer <token>`."
        );
    }
    assert_eq!(app.count_rows().await, (0, 0), "nothing stored");
    assert!(app.charges_seen().await.is_empty(), "nothing charged");

    let admin = send(
        app.http
            .get(app.url("/admin/pagos?estado=ENVIADA"))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
    )
    .await;
    assert_eq!(
        challenge_of(&admin, "two admin tokens"),
        r#"Bearer realm="pagos-admin", error="invalid_request""#
    );

    // Four failures so far, the limit: the next from this address is one too many, and
    // the address is refused whatever it sends.
    let refused = pay_with(&valid, "Bearer sk_live_bogus", "k-two-3")
        .await
        .expect("sent");
    assert_eq!(refused.status(), 429, "counted as failed authentications");
    assert_eq!(probe(&app, &app.http, API_KEY).await.status(), 429);
    // One header, from another address: the key works.
    let other = client_at_another_address();
    assert_eq!(probe(&app, &other, API_KEY).await.status(), 404);
}
