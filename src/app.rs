//! Building and running pagos: the shared `App`, and one function per command.
//!
//! Start-up is the only place allowed to stop the process on bad settings.

use crate::config::{DatabaseArgs, GatewayKind, Settings};
use crate::db;
use crate::gateway::Gateway;
use crate::gateway::http::HttpGateway;
use crate::gateway::mercadopago::MercadoPagoGateway;
use crate::gateway::sandbox::{Outcomes, SandboxGateway};
use crate::gateway::stripe::StripeGateway;
use crate::http::auth::Authenticator;
use crate::http::{self, AppState};
use crate::metrics::{MeteredGateway, Metrics};
use crate::reconciler;
use crate::saga::SagaDeps;
use anyhow::Context;
use migration::{Migrator, MigratorTrait};
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait};
use secrecy::ExposeSecret;
use std::sync::Arc;
use uuid::Uuid;

/// Everything a request handler or background task shares.
pub struct App {
    pub db: DatabaseConnection,
    /// The configured gateway, metered.
    pub gateway: Arc<dyn Gateway>,
    pub settings: Settings,
    /// The API-key cache and the limit on failed authentications.
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
}

impl App {
    pub fn saga_deps(&self) -> SagaDeps {
        SagaDeps {
            db: self.db.clone(),
            gateway: self.gateway.clone(),
            policy: self.settings.retry_policy(),
            stale_after: self.settings.stale_after,
        }
    }
}

/// Opens the database and applies pending migrations.
pub async fn open_and_migrate(args: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    let db = db::connect(args).await?;
    Migrator::up(&db, None)
        .await
        .context("applying migrations")?;
    Ok(db)
}

pub fn gateway_from(settings: &Settings) -> anyhow::Result<Arc<dyn Gateway>> {
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
        GatewayKind::Stripe => {
            let (url, secret) = provider_settings(settings)?;
            Arc::new(StripeGateway::new(url, secret, settings.gateway_timeout)?)
        }
        GatewayKind::MercadoPago => Arc::new(mercadopago_from(settings)?),
    })
}

/// Records which gateway this database's payments go through, on first use, and refuses
/// to run with another: a sandbox started by mistake on a production database would
/// "settle" every payment in flight without asking the real provider.
pub async fn pin_gateway(db: &DatabaseConnection, settings: &Settings) -> anyhow::Result<()> {
    use crate::entities::instance_fact as facts;
    use clap::ValueEnum;
    let kind = settings
        .gateway
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
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
        .map(|fact| fact.value)
        .unwrap_or_else(|| kind.clone());
    if pinned != kind {
        return Err(crate::config::SettingError {
            env: "PAGOS_GATEWAY",
            flag: "gateway",
            message: format!(
                "this database's payments go through the {pinned:?} gateway, not {kind:?}; \
                 settle or move them first (runbooks/gateway-outage.md, \"Changing gateways\")"
            ),
        }
        .into());
    }
    Ok(())
}

/// The Mercado Pago adapter the settings describe (also what the webhook consumer asks
/// for a notified payment's state).
pub fn mercadopago_from(settings: &Settings) -> anyhow::Result<MercadoPagoGateway> {
    let (url, secret) = provider_settings(settings)?;
    Ok(MercadoPagoGateway::new(
        url,
        secret,
        settings.gateway_timeout,
    )?)
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
    let metrics = Arc::new(Metrics::new());
    AppState(Arc::new(App {
        db,
        gateway: MeteredGateway::wrap(gateway, metrics.clone()),
        auth: Authenticator::new(settings.auth_failures_per_minute),
        settings,
        metrics,
    }))
}

/// `pagos serve` on an already bound listener, until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let router = http::router(state);
    // The peer's address (`ConnectInfo`) is what failed authentications are counted by.
    let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")
}

/// The API key of the merchant `serve` creates on a fresh database in sandbox mode, so the
/// README's first curl works with no setup. Never created with a real gateway.
pub const DEMO_API_KEY: &str = "sk_sandbox_demo";

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let db = open_and_migrate(&settings.database).await?;
    pin_gateway(&db, &settings).await?;
    if settings.gateway == GatewayKind::Sandbox {
        ensure_demo_merchant(&db).await?;
    }
    let gateway = gateway_from(&settings)?;
    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .with_context(|| format!("cannot listen on {} (PAGOS_BIND)", settings.bind))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, gateway = ?settings.gateway, "pagos listening");
    let state = build(db, settings, gateway);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let background = tokio::spawn(reconciler::run_periodically(state.0.clone(), stopped));
    let served = serve_on(listener, state, shutdown_signal()).await;
    let _ = stop.send(true);
    // A pass in progress finishes its payments; each of its writes is atomic anyway.
    let _ = background.await;
    served
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

/// `pagos reconcile --once`: one pass, the report as JSON on stdout.
pub async fn reconcile_once(settings: Settings) -> anyhow::Result<std::process::ExitCode> {
    let db = open_and_migrate(&settings.database).await?;
    pin_gateway(&db, &settings).await?;
    let gateway = gateway_from(&settings)?;
    let state = build(db, settings, gateway);
    let report = reconciler::run_pass(&state)
        .await
        .context("reconciliation pass")?;
    #[allow(clippy::print_stdout)]
    {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
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
        None => ApiKey::generate(store::key_kind(db, GatewayKind::Sandbox).await?),
    };
    let id = store::add_merchant(db, &name, &key).await?;
    Ok((id, key.expose().to_owned()))
}
