//! Building and running pagos: the shared `App`, and one function per command.
//!
//! Start-up is the only place allowed to stop the process on bad settings.

use crate::config::{DatabaseArgs, GatewayKind, Settings};
use crate::db;
use crate::entities::merchant;
use crate::gateway::Gateway;
use crate::gateway::http::HttpGateway;
use crate::gateway::sandbox::{Outcomes, SandboxGateway};
use crate::http::auth::{MerchantCache, hash_api_key};
use crate::http::{self, AppState};
use crate::saga::SagaDeps;
use anyhow::Context;
use migration::{Migrator, MigratorTrait};
use rand::distr::{Alphanumeric, SampleString};
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait};
use std::sync::Arc;
use uuid::Uuid;

/// Everything a request handler or background task shares.
pub struct App {
    pub db: DatabaseConnection,
    pub gateway: Arc<dyn Gateway>,
    pub settings: Settings,
    pub merchants: MerchantCache,
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
                settings.gateway_secret.as_deref().unwrap_or(""),
                settings.gateway_timeout,
            )?)
        }
    })
}

/// Builds the application over an open database.
pub fn build(db: DatabaseConnection, settings: Settings, gateway: Arc<dyn Gateway>) -> AppState {
    AppState(Arc::new(App {
        db,
        gateway,
        settings,
        merchants: MerchantCache::default(),
    }))
}

/// `pagos serve` on an already bound listener, until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let router = http::router(state);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")
}

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let db = open_and_migrate(&settings.database).await?;
    let gateway = gateway_from(&settings)?;
    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .with_context(|| format!("cannot listen on {} (PAGOS_BIND)", settings.bind))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, gateway = ?settings.gateway, "pagos listening");
    let state = build(db, settings, gateway);
    serve_on(listener, state, shutdown_signal()).await
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

/// Creates a merchant; returns (id, API key).
pub async fn add_merchant(
    db: &DatabaseConnection,
    name: &str,
    api_key: Option<String>,
) -> anyhow::Result<(Uuid, String)> {
    let api_key = api_key
        .unwrap_or_else(|| format!("sk_{}", Alphanumeric.sample_string(&mut rand::rng(), 32)));
    let id = Uuid::now_v7();
    merchant::Entity::insert(merchant::ActiveModel {
        id: Set(id),
        name: Set(name.to_owned()),
        api_key_hash: Set(hash_api_key(&api_key)),
        created_at: Set(db::now()),
    })
    .exec_without_returning(db)
    .await
    .context("creating the merchant (is this API key already taken?)")?;
    Ok((id, api_key))
}

/// `pagos reconcile --once`. (Being written.)
pub async fn reconcile_once(_settings: Settings) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("pagos reconcile is not available in this build yet")
}
