//! Building and running pagos: the composition root. It builds the handlers' state
//! (`http::Shared`) and each worker's dependencies from the settings, and has one function
//! per command. Nothing imports it but `main.rs`.
//!
//! Start-up is the only place allowed to stop the process on bad settings.

use crate::config::{GatewayKind, RanBy, SettingError, Settings};
use crate::db;
use crate::gateway::Gateway;
use crate::gateway::http::HttpGateway;
use crate::gateway::mercadopago::MercadoPagoGateway;
use crate::gateway::sandbox::{Outcomes, SandboxGateway};
use crate::gateway::stripe::StripeGateway;
use crate::http::auth::Authenticator;
use crate::http::{self, AppState, Shared};
use crate::idempotency::cache::ReplayCache;
use crate::metrics::{MeteredGateway, MeteredMercadoPago, MeteredStripe, Metrics};
use crate::reaper::{self, Reaper, Retentions};
use crate::reconciler;
// Webhooks to merchants: the delivery worker.
use crate::delivery::Deliverer;
use crate::dispatcher::{self, Dispatcher};
use crate::saga::SagaDeps;
use crate::saga::reconcile::{self, Limits, Reconciler};
use anyhow::Context;
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait};
use secrecy::ExposeSecret;
use std::sync::Arc;
use uuid::Uuid;

/// Opens the database and applies pending migrations (`db::open_and_migrate`).
pub use crate::db::{Migrated, open_and_migrate};

/// `pagos migrate`: opens the database and applies pending migrations; says what it did.
pub async fn migrate(database: &crate::db::DatabaseArgs) -> anyhow::Result<Migrated> {
    let db = crate::db::connect(database).await?;
    let migrated = crate::db::migrate(&db).await;
    db.close().await.ok();
    migrated
}

/// The gateway the settings name, its answers held to what pagos stores
/// (`gateway::storable`).
pub fn gateway_from(settings: &Settings) -> anyhow::Result<Arc<dyn Gateway>> {
    Ok(crate::gateway::storable::Storable::wrap(adapter_from(
        settings,
    )?))
}

fn adapter_from(settings: &Settings) -> anyhow::Result<Arc<dyn Gateway>> {
    Ok(match settings.gateway {
        GatewayKind::Sandbox => Arc::new(SandboxGateway::new(Outcomes::default())),
        GatewayKind::Http => {
            let url = settings
                .gateway_url
                .as_ref()
                .context("PAGOS_GATEWAY_URL is required")?;
            Arc::new(HttpGateway::new(
                url.as_str(),
                settings
                    .gateway_secret
                    .as_ref()
                    .map_or("", ExposeSecret::expose_secret),
                settings.gateway_timeout,
            )?)
        }
        GatewayKind::Stripe => Arc::new(stripe_from(settings)?),
        GatewayKind::MercadoPago => Arc::new(mercadopago_from(settings)?),
    })
}

/// Records which gateway this database's payments go through, on first use, and refuses
/// to run with another: a sandbox started by mistake on a production database would
/// "settle" every payment in flight without asking the real provider.
pub async fn pin_gateway(db: &DatabaseConnection, settings: &Settings) -> anyhow::Result<()> {
    use crate::entities::instance_fact as facts;
    let kind = gateway_name(settings);
    facts::Entity::insert(facts::ActiveModel {
        name: Set("gateway".to_owned()),
        value: Set(kind.clone()),
        recorded_at: Set(db::now()),
    })
    .on_conflict_do_nothing()
    .exec_without_returning(db)
    .await?;
    let pinned = facts::Entity::find_by_id("gateway".to_owned())
        .one(db)
        .await?
        .map(|fact| fact.value);
    refuse_another_gateway(pinned, &kind)?;
    let Some(account) = settings.gateway_account() else {
        return Ok(());
    };
    facts::Entity::insert(facts::ActiveModel {
        name: Set(account_fact(settings)),
        value: Set(account),
        recorded_at: Set(db::now()),
    })
    .on_conflict_do_nothing()
    .exec_without_returning(db)
    .await?;
    refuse_another_account(db, settings).await
}

/// The `instance_facts` row that records the account and mode of the gateway's secret
/// (`Settings::gateway_account`), where the secret says: one a gateway kind, so that a
/// database moved to another provider records that provider's account afresh.
fn account_fact(settings: &Settings) -> String {
    format!("gateway_account/{}", settings.gateway.as_str())
}

/// A secret of another account, or another mode, than the one this database's payments
/// went through: a payment left in flight would be looked up there, found nowhere and
/// sent again with the same key (a second charge, or a test-mode COMPLETADA for a live
/// payment). Rotating a key of the same account is not refused. Checked only where both
/// the recorded and the given secret say (a database first used by an older release, or
/// a secret of another form, records or is checked against nothing).
async fn refuse_another_account(
    db: &DatabaseConnection,
    settings: &Settings,
) -> anyhow::Result<()> {
    use crate::entities::instance_fact as facts;
    let Some(given) = settings.gateway_account() else {
        return Ok(());
    };
    let recorded = facts::Entity::find_by_id(account_fact(settings))
        .one(db)
        .await?
        .map(|fact| fact.value);
    match recorded {
        Some(recorded) if recorded != given => Err(crate::config::SettingError {
            env: "PAGOS_GATEWAY_SECRET",
            flag: "gateway-secret",
            message: format!(
                "names {kind} {given}; this database's payments went through {kind} {recorded}: a payment left in flight would be looked up where it was never made and sent again there; use that account's secret, or settle them first (runbooks/gateway-outage.md, \"Changing accounts\")",
                kind = settings.gateway.as_str()
            ),
        }
        .into()),
        _ => Ok(()),
    }
}

/// The same refusal before `serve` migrates: a process started with the wrong gateway
/// must not upgrade the schema the database's processes run on. A schema too old to say
/// (or a database never used) is checked again by `pin_gateway` once migrated; a pin
/// that cannot be read (a database that refuses the read) stops the start, migrating
/// nothing.
async fn refuse_another_gateway_before_migrating(
    db: &DatabaseConnection,
    settings: &Settings,
) -> anyhow::Result<()> {
    use crate::entities::instance_fact as facts;
    let pinned_table = crate::db::table_exists(db, "instance_facts").await?;
    let pinned = if pinned_table {
        facts::Entity::find_by_id("gateway".to_owned())
            .one(db)
            .await?
            .map(|fact| fact.value)
    } else {
        None
    };
    refuse_another_gateway(pinned, &gateway_name(settings))?;
    if pinned_table {
        refuse_another_account(db, settings).await?;
    }
    Ok(())
}

/// The sandbox on a database that holds live API keys (`sk_live_`, made by `pagos merchants
/// add` with a real gateway before any process pinned one): a `serve` started without
/// `PAGOS_GATEWAY` (a configuration that did not mount) would pin the database to the
/// sandbox and answer the live merchants' payments `COMPLETADA` with no money moved.
/// Refused before anything is migrated or pinned.
async fn refuse_the_sandbox_with_live_keys(
    db: &DatabaseConnection,
    settings: &Settings,
) -> anyhow::Result<()> {
    use crate::entities::api_key;
    use sea_orm::{ColumnTrait, QueryFilter, QuerySelect};
    if settings.gateway != GatewayKind::Sandbox || !crate::db::table_exists(db, "api_keys").await? {
        return Ok(());
    }
    // Compared here, not with LIKE (whose `_` matches any character). A key chosen by
    // hand keeps too short a prefix to tell (at most half of it): generated keys only.
    let live = api_key::Entity::find()
        .select_only()
        .column(api_key::Column::Prefix)
        .filter(api_key::Column::RevokedAt.is_null())
        .into_tuple::<String>()
        .all(db)
        .await?
        .iter()
        .filter(|prefix| prefix.starts_with(crate::merchants::key::KeyKind::Live.scheme()))
        .count();
    if live == 0 {
        return Ok(());
    }
    Err(SettingError {
        env: "PAGOS_GATEWAY",
        flag: "gateway",
        message: format!(
            "is sandbox (the default) but this database holds {live} live API key(s) (sk_live_…), made for a real gateway: the sandbox would answer their payments COMPLETADA and no money would move; set PAGOS_GATEWAY (and its URL and secret) to the gateway they were made for"
        ),
    }
    .into())
}

fn gateway_name(settings: &Settings) -> String {
    use clap::ValueEnum;
    settings
        .gateway
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

fn refuse_another_gateway(pinned: Option<String>, kind: &str) -> anyhow::Result<()> {
    match pinned {
        Some(pinned) if pinned != kind => Err(crate::config::SettingError {
            env: "PAGOS_GATEWAY",
            flag: "gateway",
            message: format!(
                "this database's payments go through the {pinned:?} gateway, not {kind:?}; \
                 settle or move them first (runbooks/gateway-outage.md, \"Changing gateways\")"
            ),
        }
        .into()),
        _ => Ok(()),
    }
}

/// The Mercado Pago adapter the settings describe (also, built once in `build`, what
/// notifications ask for a notified payment's state).
pub fn mercadopago_from(settings: &Settings) -> anyhow::Result<MercadoPagoGateway> {
    let (url, secret) = provider_settings(settings)?;
    Ok(
        MercadoPagoGateway::new(url, secret, settings.gateway_timeout)?
            .charging_in(settings.mercadopago_moneda.clone()),
    )
}

/// The Stripe adapter the settings describe (also, built once in `build`, what a dispute
/// event asks for its PaymentIntent).
pub fn stripe_from(settings: &Settings) -> anyhow::Result<StripeGateway> {
    let (url, secret) = provider_settings(settings)?;
    Ok(StripeGateway::new(url, secret, settings.gateway_timeout)?)
}

/// A provider's base URL (its production API unless PAGOS_GATEWAY_URL says otherwise)
/// and secret (required: `Settings::validate` refuses to start without it).
fn provider_settings(settings: &Settings) -> anyhow::Result<(&str, &str)> {
    let url = settings
        .gateway_url
        .as_ref()
        .context("PAGOS_GATEWAY_URL is required")?;
    let secret = settings
        .gateway_secret
        .as_ref()
        .map(ExposeSecret::expose_secret)
        .filter(|s| !s.is_empty())
        .with_context(|| {
            format!(
                "PAGOS_GATEWAY_SECRET is required when PAGOS_GATEWAY={}",
                settings.gateway.as_str()
            )
        })?;
    Ok((url.as_str(), secret))
}

/// Builds the application over an open database.
pub fn build(db: DatabaseConnection, settings: Settings, gateway: Arc<dyn Gateway>) -> AppState {
    let metrics = Arc::new(Metrics::refreshed_every(settings.metrics_refresh));
    let mercadopago = (settings.gateway == GatewayKind::MercadoPago)
        .then(|| match mercadopago_from(&settings) {
            Ok(adapter) => Some(MeteredMercadoPago::new(adapter, metrics.clone())),
            Err(err) => {
                // The same settings built the charging adapter: only a broken TLS setup
                // gets here. Notifications then answer 503 and the reconciler settles.
                tracing::error!(error = %err, "cannot build the Mercado Pago client for notifications");
                None
            }
        })
        .flatten();
    let stripe = (settings.gateway == GatewayKind::Stripe)
        .then(|| match stripe_from(&settings) {
            Ok(adapter) => Some(MeteredStripe::new(adapter, metrics.clone())),
            Err(err) => {
                // As Mercado Pago's: only a broken TLS setup gets here. Dispute events
                // then answer 503, and Stripe delivers them again.
                tracing::error!(error = %err, "cannot build the Stripe client for dispute events");
                None
            }
        })
        .flatten();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(settings.max_in_flight as usize));
    let unauthenticated = Arc::new(tokio::sync::Semaphore::new(
        (settings.max_in_flight as usize / 4).max(1),
    ));
    let gateway = MeteredGateway::wrap(gateway, metrics.clone());
    let saga = SagaDeps {
        db: db.clone(),
        gateway: gateway.clone(),
        policy: settings.retry_policy(),
        stale_after: settings.stale_after,
        send_hold: settings.send_hold(),
        send_lasts: settings.send_lasts(),
        key_window: settings.gateway_key_window,
    };
    let limits = Limits {
        key_window: settings.gateway_key_window,
        give_up_after: settings.give_up_after,
        gateway_timeout: settings.gateway_timeout,
        lease: settings.lease,
        concurrency: settings.reconcile_concurrency,
    };
    AppState(Arc::new(Shared {
        db,
        gateway,
        auth: Authenticator::new(settings.auth_failures_per_minute),
        reconciler: Reconciler::new(saga, metrics.clone(), limits),
        replay_cache: ReplayCache::refreshed_every(
            settings.replay_cache_mib.saturating_mul(1024 * 1024),
            settings.key_retention,
            settings.retention_refresh,
        ),
        settings,
        metrics,
        mercadopago,
        stripe,
        in_flight,
        unauthenticated,
        tasks: tokio_util::task::TaskTracker::new(),
        console: Default::default(),
        stopping: tokio::sync::watch::Sender::new(false),
        draining: tokio::sync::watch::Sender::new(false),
    }))
}

/// The key reaper of this state's database and settings.
fn reaper_of(state: &AppState) -> Reaper {
    Reaper {
        db: state.db.clone(),
        metrics: state.metrics.clone(),
        key_retention: state.settings.key_retention,
        message_retention: state.settings.message_retention,
        batch: state.settings.purge_batch,
        cache: state.replay_cache.clone(),
        clock: crate::reaper::SteadyClock::start(),
    }
}

/// What records this process's key retention and bounds its replay cache by the others'.
fn retentions_of(state: &AppState) -> Retentions {
    Retentions::new(
        state.db.clone(),
        state.replay_cache.clone(),
        state.settings.key_retention,
    )
}

/// The webhook delivery worker of this state's database and settings.
pub fn dispatcher_of(state: &AppState) -> Dispatcher {
    let webhooks = &state.settings.webhooks;
    Dispatcher {
        db: state.db.clone(),
        deliverer: Deliverer::new(webhooks),
        retries: webhooks.retries(),
        metrics: state.metrics.clone(),
        batch: 32,
        fan_out_batch: 500,
        claim_for: webhooks.timeout + dispatcher::CLAIM_MARGIN,
        idle: std::time::Duration::from_millis(250),
    }
}

/// `pagos serve` on an already bound listener, until `shutdown` resolves: the whole
/// surface on this one door (the caller bound no admin door).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_doors(listener, None, state, shutdown).await
}

/// `pagos serve` on its bound listeners until `shutdown` resolves: with an `admin` one,
/// `/admin/*`, `/consola/*` and `/metrics` are served there and not on `public`. Both get
/// the same header timeout, limits and shutdown. Keeps the gauges of `/metrics` fresh
/// meanwhile, and records this process's key retention, before it serves and then every
/// `idempotency::cache::REFRESH` (the replay cache answers only while it does).
///
/// Served with hyper's own HTTP/1 connection builder rather than `axum::serve`, which
/// has no header read timeout: a client that never finishes its request head would hold
/// a connection (and a file descriptor) forever.
pub async fn serve_doors(
    public: tokio::net::TcpListener,
    admin: Option<tokio::net::TcpListener>,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Dropped with this function: a refresh only reads, so stopping one halfway is fine.
    let _gauges = AbortOnDrop(tokio::spawn(crate::metrics::keep_gauges_fresh(
        state.db.clone(),
        state.metrics.clone(),
        state.settings.metrics_refresh,
    )));
    // Before the first request: the replay cache answers nothing until it has read the
    // other processes' retentions. Failing, it reads the database until a refresh works.
    let retentions = retentions_of(&state);
    retentions.refresh_or_say().await;
    let every = state.replay_cache.refresh_every();
    let _retentions = AbortOnDrop(tokio::spawn(retentions.run_periodically(every)));
    let mut connections = hyper::server::conn::http1::Builder::new();
    connections
        .timer(hyper_util::rt::TokioTimer::new())
        // Counted from the first byte awaited, and again while a keep-alive connection
        // waits for its next request.
        .header_read_timeout(state.settings.header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let tasks = state.tasks.clone();
    let grace = state.settings.shutdown_grace;
    let (public_router, admin_door) = match admin {
        Some(listener) => {
            let (public_router, admin_router) = http::doors(state);
            (public_router, Some((listener, admin_router)))
        }
        None => (http::router(state), None),
    };
    let admin_door = async {
        match admin_door {
            Some((listener, router)) => accept(listener, router, &connections, &graceful).await,
            None => std::future::pending().await,
        }
    };
    // Dropping the accept loops closes the listeners: no new connection once shutting down.
    tokio::select! {
        () = shutdown => {}
        () = accept(public, public_router, &connections, &graceful) => {}
        () = admin_door => {}
    }
    // Requests in flight and the sagas they started finish, up to PAGOS_SHUTDOWN_GRACE;
    // idle connections close now, half-sent heads at PAGOS_HEADER_TIMEOUT.
    drain(graceful, &tasks, grace).await;
    Ok(())
}

/// Waits for the connections `graceful` watches and the tasks `tasks` tracks, up to
/// `grace`. A saga still running then is dropped with the process: its payment stays
/// `EN_PROCESO` or `ENVIADA`, held until its lease ends, and the reconciler (of this
/// process when it starts again, or of another one) takes it from there, exactly as
/// after a crash. Returns how many were left.
pub async fn drain(
    graceful: hyper_util::server::graceful::GracefulShutdown,
    tasks: &tokio_util::task::TaskTracker,
    grace: std::time::Duration,
) -> usize {
    tasks.close();
    let at_signal = tasks.len();
    if at_signal > 0 {
        tracing::info!(sagas = at_signal, grace = %humantime::format_duration(grace), "waiting for the sagas in flight");
    }
    let both = async {
        // The requests first: one still registering its payment starts its saga after
        // the signal, and a closed tracker with nothing in it is done waiting at once. A
        // handler spawns its saga before its connection ends (a dropped handler spawns
        // nothing), so once every connection is done every saga is tracked.
        graceful.shutdown().await;
        let running = tasks.len();
        if running > 0 && at_signal == 0 {
            tracing::info!(sagas = running, grace = %humantime::format_duration(grace), "waiting for the sagas in flight");
        }
        tasks.wait().await;
    };
    if tokio::time::timeout(grace, both).await.is_ok() {
        return 0;
    }
    let left = tasks.len();
    if left > 0 {
        tracing::warn!(
            sagas = left,
            grace = %humantime::format_duration(grace),
            "PAGOS_SHUTDOWN_GRACE is over: {left} saga(s) still in flight are left to the reconciler"
        );
    } else {
        tracing::warn!(
            grace = %humantime::format_duration(grace),
            "PAGOS_SHUTDOWN_GRACE is over: closing the requests still in flight"
        );
    }
    left
}

/// Accepts connections on `listener` for ever, each served by `router` in a task of its
/// own and watched by `graceful`.
async fn accept(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    connections: &hyper::server::conn::http1::Builder,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
) {
    use tower::Layer;
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // Out of file descriptors and the like: wait for some to close rather
                // than spin on the error.
                tracing::error!(error = %err, "cannot accept connections");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        // What axum::serve would insert: handlers may extract the client's address.
        let service = axum::Extension(axum::extract::ConnectInfo(remote)).layer(router.clone());
        let connection = connections.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                // A half-sent head closed at the header timeout, a client gone: theirs.
                tracing::debug!(error = %err, %remote, "connection ended with an error");
            }
        });
    }
}

/// Errors of one connection that went away before it was accepted: nothing to do.
fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Aborts a background task when its owner ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The API key of the merchant `serve` creates on a fresh database in sandbox mode, so the
/// README's first curl works with no setup. Never created with a real gateway.
pub use crate::merchants::key::DEMO_API_KEY;

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let clock_off = std::sync::Arc::new(std::sync::OnceLock::new());
    let served = serve_until_stopped(settings, clock_off.clone()).await;
    // Stopped because its clock went wrong: one line, exit 1, as at start.
    match clock_off.get() {
        Some(why) => Err(anyhow::anyhow!("{why}")),
        None => served,
    }
}

async fn serve_until_stopped(
    settings: Settings,
    clock_off: std::sync::Arc<std::sync::OnceLock<String>>,
) -> anyhow::Result<()> {
    // Installed first, and watched from the start: a SIGTERM while the process waits for
    // the database, for another process's migrations or migrates itself stops it there
    // (a migration stopped halfway is rolled back, or rebuilt at the next start); once it
    // serves, it is a graceful stop.
    let mut signals = crate::signals::Signals::install();
    let (first, mut signalled_once) = tokio::sync::watch::channel(false);
    let first = std::sync::Arc::new(first);
    let (second, signalled_twice) = tokio::sync::watch::channel(false);
    let stop_for_the_clock = first.clone();
    tokio::spawn(async move {
        let _ = signals.next().await;
        let _ = first.send(true);
        // Only a human's Ctrl-C cuts the stop short: an orchestrator may send SIGTERM again
        // (a runtime restarted, a shorter grace asked) and means the drain it asked for.
        while signals.next().await == crate::signals::Stop::Terminate {
            tracing::info!(
                "SIGTERM again: still shutting down as the first signal asked; Ctrl-C stops at once"
            );
        }
        let _ = second.send(true);
    });
    let started = tokio::select! {
        started = start(&settings) => started?,
        _ = signalled_once.wait_for(|s| *s) => {
            tracing::info!("stopped before serving");
            return Ok(());
        }
    };
    let (db, gateway, listener, admin) = started;
    // A clock that goes wrong while serving stops the process as a SIGTERM would (it
    // finishes what it has in hand, claims nothing more), and it exits 1 naming the
    // clock: claims, send holds and a payment's age against the gateway's key window are
    // read on it, and the start-up check is not made again by itself.
    tokio::spawn({
        let (db, clock_off) = (db.clone(), clock_off.clone());
        async move {
            let why = crate::db::clock_goes_off(&db).await;
            tracing::error!(
                "{why}: stopping now, without PAGOS_DRAIN_DELAY: nothing more is claimed or sent on it, and what is in flight finishes"
            );
            let _ = clock_off.set(why);
            stop_for_the_clock.send_replace(true);
        }
    });
    let state = build(db, settings, gateway);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signalled = std::sync::Arc::new(std::sync::OnceLock::new());
    tokio::spawn(stop_when_signalled(
        state.clone(),
        signalled_once,
        signalled_twice,
        stop,
        signalled.clone(),
        clock_off,
    ));
    // On-call's passes (admin API, console) stop claiming with the workers.
    tokio::spawn({
        let (mut stopped, stopping) = (stopped.clone(), state.stopping.clone());
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
            stopping.send_replace(true);
        }
    });
    let retentions = retentions_of(&state);
    let every = state.settings.reconcile_every;
    let reconciling = tokio::spawn(reconciler::run_periodically(
        state.reconciler.clone(),
        every,
        stopped.clone(),
    ));
    let reaping = tokio::spawn(reaper::run_periodically(
        reaper_of(&state),
        reaper::period(every),
        stopped.clone(),
    ));
    let delivering = tokio::spawn(dispatcher::run_periodically(
        dispatcher_of(&state),
        stopped.clone(),
    ));
    let grace = state.settings.shutdown_grace;
    let until_signalled = {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let served = serve_doors(listener, admin, state, until_signalled).await;
    // What the workers have in hand finishes (each write atomic anyway), within the
    // grace counted from the end of PAGOS_DRAIN_DELAY; what is still running then is dropped with the
    // process, its claims running out as after a crash. (Served to the end without a
    // signal: the listener failed, and the workers are left with the process.)
    let Some(&at) = signalled.get() else {
        return served;
    };
    let workers = async {
        let _ = reconciling.await;
        let _ = reaping.await;
        let _ = delivering.await;
    };
    if tokio::time::timeout_at(at + grace, workers).await.is_err() {
        tracing::warn!(
            "background work still running at the end of PAGOS_SHUTDOWN_GRACE is left: its claims run out and another pass takes it, as after a crash"
        );
        // Its retention's row ages out (`idempotency::cache::LIVE`), as after a crash: the
        // reaper may still be deleting.
        return served;
    }
    // The reaper has stopped: the retention's row can go.
    retentions.forget().await;
    served
}

/// What `serve` does on Ctrl-C or SIGTERM. At the first signal `/readyz` answers 503 and
/// the process goes on serving for `PAGOS_DRAIN_DELAY`, so that a load balancer sends
/// new requests elsewhere before the listener closes; then `stop` tells the workers to
/// take no new work and the doors to drain, and `signalled` holds when (the grace counts
/// from there). A Ctrl-C after the first signal, at any time, ends the process at once with
/// exit code 130: what it leaves in flight is left to the reconciler, as after a crash.
/// Stopped for its clock (`clock_off`), it skips `PAGOS_DRAIN_DELAY`, or what is left of it.
async fn stop_when_signalled(
    state: AppState,
    mut first: tokio::sync::watch::Receiver<bool>,
    mut second: tokio::sync::watch::Receiver<bool>,
    stop: tokio::sync::watch::Sender<bool>,
    signalled: std::sync::Arc<std::sync::OnceLock<tokio::time::Instant>>,
    clock_off: std::sync::Arc<std::sync::OnceLock<String>>,
) {
    let _ = first.wait_for(|s| *s).await;
    state.draining.send_replace(true);
    // Stopped for its clock: not a moment more of serving and claiming on it.
    let delay = match clock_off.get() {
        Some(_) => std::time::Duration::ZERO,
        None => state.settings.drain_delay,
    };
    let stopped_at_once = async {
        let _ = second.wait_for(|s| *s).await;
        let left = state.tasks.len();
        tracing::warn!(
            tasks = left,
            "Ctrl-C after the first signal: stopping at once; {left} saga(s) or on-call pass(es) in flight, and what the workers had claimed, are left to the reconciler"
        );
        std::process::exit(130);
    };
    tokio::pin!(stopped_at_once);
    if !delay.is_zero() {
        tracing::info!(
            delay = %humantime::format_duration(delay),
            "shutting down: /readyz answers 503 and requests are still served for PAGOS_DRAIN_DELAY; Ctrl-C stops at once"
        );
        // The clock watch sends on `first` again when it stops the process: the rest of
        // the delay is not served on a clock gone wrong.
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            Ok(()) = first.changed() => {
                tracing::info!("the clock went wrong while draining: the rest of PAGOS_DRAIN_DELAY is skipped");
            }
            () = &mut stopped_at_once => {}
        }
    }
    tracing::info!("shutting down: finishing requests in flight");
    let _ = signalled.set(tokio::time::Instant::now());
    // The workers take no new work from now on, beside the requests' drain: a
    // reconciliation pass claims nothing more, the delivery worker starts no attempt, the
    // reaper ends its purge.
    let _ = stop.send(true);
    stopped_at_once.await;
}

/// What `serve` needs before it serves: the database migrated and pinned to this
/// gateway, the sandbox's demo merchant, the gateway, and the listeners bound.
async fn start(
    settings: &Settings,
) -> anyhow::Result<(
    DatabaseConnection,
    Arc<dyn Gateway>,
    tokio::net::TcpListener,
    Option<tokio::net::TcpListener>,
)> {
    if !crate::outbox::ON {
        tracing::warn!(
            "built with bench-without-outbox: no event is written, no merchant is told; a benchmark yardstick, never a deployment"
        );
    }
    if settings.admin_token_is_short() {
        tracing::warn!(
            "PAGOS_ADMIN_TOKEN is shorter than 16 characters: it opens every admin endpoint; make it a long random value (openssl rand -hex 32)"
        );
    }
    // What can be refused without the database is, before anything is written to it: an
    // address that cannot be had found after the migrations and the gateway's pin would
    // have upgraded the schema the running processes use, and pinned a database to
    // settings that then never served. Bound now, listened on once the database is ready:
    // until then a connection is refused, as before the process started, not left
    // waiting in a backlog a balancer would take for a process that is up.
    let main_address = Address::taken(settings.bind, "PAGOS_BIND", "bind")?;
    let admin_address = match settings.admin_bind {
        Some(admin_bind) => Some(Address::taken(
            admin_bind,
            "PAGOS_ADMIN_BIND",
            "admin-bind",
        )?),
        None => None,
    };
    let gateway = gateway_from(settings)?;
    let db = crate::db::connect(&settings.database).await?;
    crate::db::check_clock(&db).await?;
    refuse_another_gateway_before_migrating(&db, settings).await?;
    refuse_the_sandbox_with_live_keys(&db, settings).await?;
    crate::db::migrate(&db).await?;
    pin_gateway(&db, settings).await?;
    if settings.gateway == GatewayKind::Sandbox {
        ensure_demo_merchant(&db).await?;
    } else {
        revoke_demo_key(&db).await?;
    }
    // Mercado Pago's account currency, asked now rather than at the first payment; a
    // refusal (a token that may not read the account) is on-call's to see at start.
    tokio::spawn({
        let gateway = gateway.clone();
        async move {
            if let Err(err) = gateway.account_currency().await {
                tracing::error!(error = %err, "the gateway did not say which currency its account charges in: new payments are answered 503 until it does; set PAGOS_MERCADOPAGO_MONEDA to the account's currency to charge in it while Mercado Pago cannot say");
            }
        }
    });
    let listener = main_address.listened()?;
    let admin = admin_address.map(Address::listened).transpose()?;
    let addr = listener.local_addr()?;
    match &admin {
        Some(admin) => {
            let admin_addr = admin.local_addr()?;
            tracing::info!(%addr, %admin_addr, gateway = ?settings.gateway, "pagos listening; /admin, /consola and /metrics only on the admin address");
        }
        None => tracing::info!(%addr, gateway = ?settings.gateway, "pagos listening"),
    }
    Ok((db, gateway, listener, admin))
}

/// An address `serve` has bound and will listen on, with the setting that named it.
struct Address {
    socket: tokio::net::TcpSocket,
    at: std::net::SocketAddr,
    env: &'static str,
    flag: &'static str,
}

impl Address {
    /// `at` bound (as `TcpListener::bind` binds: the address reused after a restart), not
    /// listened on yet; refused as the setting `env` when it cannot be had.
    fn taken(
        at: std::net::SocketAddr,
        env: &'static str,
        flag: &'static str,
    ) -> Result<Address, SettingError> {
        let bound = (|| {
            let socket = if at.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            socket.bind(at)?;
            Ok::<_, std::io::Error>(socket)
        })();
        match bound {
            Ok(socket) => Ok(Address {
                socket,
                at,
                env,
                flag,
            }),
            Err(err) => Err(SettingError::cannot_listen(env, flag, at, &err)),
        }
    }

    /// Listening from now on.
    fn listened(self) -> Result<tokio::net::TcpListener, SettingError> {
        self.socket
            .listen(1024)
            .map_err(|err| SettingError::cannot_listen(self.env, self.flag, self.at, &err))
    }
}

/// The sandbox's merchant `demo` on a database that has no merchant yet. Two processes
/// starting at once on a fresh database both try: the name and the key are unique, so one
/// of them creates it and the other finds it there.
async fn ensure_demo_merchant(db: &DatabaseConnection) -> anyhow::Result<()> {
    use crate::merchants::{key::ApiKey, name::MerchantName, store};
    use sea_orm::PaginatorTrait;
    if crate::entities::merchant::Entity::find().count(db).await? > 0 {
        return Ok(());
    }
    let name = MerchantName::parse("demo")?;
    let key = ApiKey::chosen(&DEMO_API_KEY.into())?;
    match store::add_merchant(db, &name, &key).await {
        Ok(_) => {
            tracing::info!(
                key_prefix = %key.prefix(),
                "sandbox mode on a fresh database: created merchant \"demo\" with the README's demo API key (the sandbox never moves money)"
            );
            Ok(())
        }
        Err(store::AddError::NameTaken(_) | store::AddError::KeyTaken) => Ok(()),
        Err(store::AddError::Db(err)) => Err(err.into()),
    }
}

/// The demo key is public (the README prints it): on a database that runs with a real
/// gateway (a sandbox database moved to one, runbooks/gateway-outage.md) it would take
/// real payments for whoever reads the README. Revoked at start, said once.
async fn revoke_demo_key(db: &DatabaseConnection) -> anyhow::Result<()> {
    use crate::merchants::{key::ApiKey, store};
    let demo = ApiKey::chosen(&DEMO_API_KEY.into())?;
    if let Some((key, merchant)) = store::revoke_active_by_hash(db, &demo.hash()).await? {
        tracing::warn!(
            merchant = %merchant,
            key_prefix = %key.prefix,
            "revoked the README's public demo API key: this database runs with a real gateway, where anyone could pay with it"
        );
    }
    Ok(())
}

/// What the audit row of a pass run by `pagos reconcile --once` says was asked.
const PASS_BY_CLI: &str = "run a pass now (pagos reconcile --once)";

/// `pagos reconcile --once`: one pass, the report as JSON on stdout, recorded in the audit
/// trail of on-call's actions as `operator`'s (`reconcile_pass`), like a pass asked of the
/// admin API: the row is written before the pass (if it cannot be, nothing is done: one
/// line, exit 1, nothing on stdout) and completed with the report, or with the error that
/// cut the pass short and what it did until then.
/// It does not migrate (only `serve` and `migrate` do): a database that lacks migrations is
/// refused with one line.
pub async fn reconcile_once(
    settings: Settings,
    ran_by: RanBy,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::operators::actions::{self, Action};
    let gateway = gateway_from(&settings)?;
    let db = crate::db::open(&settings.database).await?;
    crate::db::check_clock(&db).await?;
    refuse_the_sandbox_with_live_keys(&db, &settings).await?;
    // Who runs it is checked before the gateway's pin is written: a mistyped operator
    // must not pin a first-used database to whatever PAGOS_GATEWAY the shell had.
    let operator = pass_operator(&db, ran_by).await?;
    let operator = operator.as_str();
    pin_gateway(&db, &settings).await?;
    let state = build(db, settings, gateway);
    let row = actions::begin(&state.db, operator, Action::ReconcilePass, None, PASS_BY_CLI)
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "the audit trail could not record who asked for this pass ({err}), so nothing was done; try again"
            )
        })?;
    // Cut short by the database, the pass still prints what it did (written, and done),
    // then fails with the error: on-call must know both.
    let (report, failed) = match reconcile::run_pass(&state.reconciler, None).await {
        Ok(report) => (report, None),
        Err(err) => (*err.report, Some(err.source)),
    };
    let outcome = match &failed {
        None => report.in_words(),
        Some(err) => actions::failed(format_args!(
            "reconciliation pass cut short: {err} (done until then: {})",
            report.in_words()
        )),
    };
    if let Err(err) = actions::finish(&state.db, row, PASS_BY_CLI, &outcome).await {
        tracing::error!(error = %err, action_id = %row, "the pass is over, but its audit row could not be completed");
    }
    crate::config::print_stdout(&serde_json::to_string(&report)?);
    match failed {
        None => Ok(std::process::ExitCode::SUCCESS),
        // The error's own words (its sources are in them already), on one line.
        Some(err) => Err(anyhow::anyhow!("reconciliation pass cut short: {err}")),
    }
}

/// The name a pass by hand is recorded under. One named with `--operador` must be an
/// operator who may run a pass, as the admin API would ask of their token: one that is
/// not (a typo, a revoked or a `lector` operator) is a bad setting, so that the audit
/// trail never names someone who is not, or may not act.
async fn pass_operator(db: &DatabaseConnection, ran_by: RanBy) -> anyhow::Result<String> {
    let name = match ran_by {
        RanBy::Login(login) => return Ok(login),
        RanBy::Operator(name) => name,
    };
    let refused = |message: String| SettingError {
        env: "PAGOS_OPERATOR",
        flag: "operador",
        message,
    };
    match crate::operators::store::active_by_name(db, &name).await? {
        None => Err(refused(format!(
            "no operator named {:?}, or revoked (`pagos operators list` shows them); unset, the pass is recorded under the login name",
            name.as_str()
        ))
        .into()),
        Some(found) if found.role != crate::operators::Role::Operador => Err(refused(format!(
            "{} is a {}: running a pass needs the role operador",
            found.name,
            found.role.as_str()
        ))
        .into()),
        // As stored: `Ana` given for `ana` is recorded as `ana`.
        Some(found) => Ok(found.name),
    }
}

/// Creates a merchant named `name` with `api_key` (generated when `None`, of the kind this
/// database's gateway calls for); returns its id and the key. `pagos merchants add` does the
/// same with its own messages (`merchants::cli`).
pub async fn add_merchant(
    db: &DatabaseConnection,
    name: &str,
    api_key: Option<String>,
) -> anyhow::Result<(Uuid, String)> {
    use crate::merchants::{key::ApiKey, name::MerchantName, store};
    let name = MerchantName::parse(name)?;
    let key = match api_key {
        Some(key) => ApiKey::chosen(&key.into())?,
        None => ApiKey::generate(store::key_kind(db, GatewayKind::Sandbox.as_str()).await?),
    };
    let id = store::add_merchant(db, &name, &key).await?;
    Ok((id, key.expose().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handlers_can_read_the_address_of_the_client() {
        use axum::extract::ConnectInfo;
        use std::net::SocketAddr;
        let router = axum::Router::new().route(
            "/who",
            axum::routing::get(|ConnectInfo(addr): ConnectInfo<SocketAddr>| async move {
                addr.to_string()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let connections = hyper::server::conn::http1::Builder::new();
        let served = accept(listener, router, &connections, &graceful);
        let asked = async {
            let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mine = client.local_addr().expect("local addr");
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                    .await
                    .expect("handshake");
            tokio::spawn(connection);
            let request = axum::http::Request::get("/who")
                .header("host", addr.to_string())
                .body(String::new())
                .expect("request");
            let answer = sender.send_request(request).await.expect("answered");
            assert_eq!(answer.status(), 200);
            let body = http_body_util::BodyExt::collect(answer.into_body())
                .await
                .expect("body")
                .to_bytes();
            (mine, String::from_utf8_lossy(&body).into_owned())
        };
        tokio::select! {
            () = served => panic!("the accept loop ended"),
            (mine, seen) = asked => assert_eq!(seen, mine.to_string()),
        }
    }
}
