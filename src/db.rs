//! Opening the database and starting write transactions the same way everywhere.
//!
//! SQLite runs in WAL mode with a busy timeout, and every write transaction is
//! `BEGIN IMMEDIATE`: a deferred transaction that reads and then writes can fail at once
//! with "database is locked" (busy timeouts do not apply to lock upgrades).

use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use std::time::Duration;

use crate::config::DatabaseArgs;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("invalid setting PAGOS_DATABASE_URL (--database-url): {0}")]
    BadUrl(String),
    #[error("cannot open the database: {0}")]
    Unreachable(DbErr),
}

pub async fn connect(args: &DatabaseArgs) -> Result<DatabaseConnection, OpenError> {
    let url = args.url.as_str();
    let is_sqlite = url.starts_with("sqlite:");
    if !is_sqlite && !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Err(OpenError::BadUrl(
            "expected sqlite://FILE?mode=rwc or postgres://USER@HOST/DB".into(),
        ));
    }
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(args.pool_size)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings a pooled connection on every checkout unless told otherwise: one more
        // round trip in the path of every query (4 of the 22 a created payment cost,
        // 1 of a replay's 3; benches/run.sh counts them). Ping only connections idle long
        // enough to have been dropped by a firewall or a proxy. A busy connection the
        // server dropped (a restart) fails its one query and is discarded when sqlx pings
        // it on its way back to the pool; the request answers 503 and its retry, with the
        // same key, goes through.
        .test_before_acquire_if_idle_for(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|opts| {
            opts.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true)
        });
    Database::connect(options)
        .await
        .map_err(OpenError::Unreachable)
}

/// Begins a transaction that will write: `BEGIN IMMEDIATE` on SQLite, plain `BEGIN`
/// (read committed) on PostgreSQL.
pub async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let options = TransactionOptions {
        sqlite_transaction_mode: (db.get_database_backend() == DbBackend::Sqlite)
            .then_some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    db.begin_with_options(options).await
}

/// Now, truncated to milliseconds: what is written is exactly what is read back and shown
/// (SQLite and PostgreSQL keep different sub-second precision).
pub fn now() -> chrono::DateTime<chrono::Utc> {
    use chrono::DurationRound;
    let now = chrono::Utc::now();
    now.duration_trunc(chrono::TimeDelta::milliseconds(1))
        .unwrap_or(now)
}
