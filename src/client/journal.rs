//! The journal: pending payment intents in a small local SQLite file, so that a client
//! that dies and starts again pays them with the same key.
//!
//! It must never let an intent go before the server gave a terminal answer about it (or
//! provably never saw it), and never hold an API key: only its SHA-256, to tell at resume
//! time which intents a key may resume. Writes are durable before they return
//! (`synchronous=FULL`): an intent is on disk before its first request leaves.

use super::intent::{Intent, IntentKey, PaymentRequest};
use sea_orm::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ConnectionTrait, DatabaseConnection, DbBackend,
    EntityTrait, QueryOrder, SqlxSqliteConnector, Statement,
};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;
use url::Url;
use uuid::Uuid;

mod entry {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "pending_intents")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub idempotency_key: String,
        pub base_url: String,
        pub api_key_sha256: String,
        /// The body, as the contract's JSON.
        pub body: String,
        /// Requests that left for `POST /v1/pagos` (counted before each one is sent).
        pub attempts: i32,
        /// Set once the server answered with the payment: from then on it is only read.
        pub payment_id: Option<String>,
        /// Why this intent must not be sent again without a human (a reused key).
        pub blocked: Option<String>,
        pub last_error: Option<String>,
        pub created_at: ChronoDateTimeUtc,
        pub updated_at: ChronoDateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS pending_intents (
    idempotency_key TEXT NOT NULL PRIMARY KEY,
    base_url TEXT NOT NULL,
    api_key_sha256 TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    payment_id TEXT,
    blocked TEXT,
    last_error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open the journal {path}: {source}")]
    Open {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("journal: {0}")]
    Db(#[from] sea_orm::DbErr),
    #[error("journal entry {key} is unreadable: {why}")]
    Corrupt { key: String, why: String },
    #[error(
        "the journal already holds key {0} for another payment; an intent's key must be its own"
    )]
    KeyTaken(IntentKey),
}

/// An intent kept in the journal, with what is known about it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIntent {
    pub intent: Intent,
    /// The server it is paid at.
    pub base_url: Url,
    /// SHA-256 (hex) of the API key it was made with.
    pub api_key_sha256: String,
    /// Requests sent for it so far, across processes.
    pub attempts: u32,
    /// The payment, once the server named it.
    pub payment_id: Option<Uuid>,
    /// Set when it must not be retried without a human (its key was used for another
    /// request).
    pub blocked: Option<String>,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl PendingIntent {
    /// Was it made with this API key?
    pub fn made_with(&self, api_key: &str) -> bool {
        self.api_key_sha256 == api_key_sha256(api_key)
    }
}

/// SHA-256 of an API key, hex: how the journal names a merchant without holding its key.
pub fn api_key_sha256(api_key: &str) -> String {
    hex::encode(Sha256::digest(api_key.as_bytes()))
}

/// A journal file of pending intents. Cheap to clone; safe to share between tasks and
/// between processes (SQLite in WAL mode, with a busy timeout).
#[derive(Clone, Debug)]
pub struct Journal {
    db: DatabaseConnection,
    path: PathBuf,
}

fn now() -> chrono::DateTime<chrono::Utc> {
    crate::db::now()
}

impl Journal {
    /// Where the journal lives unless told otherwise: `pagos/journal.db` in the user's
    /// data directory (`$XDG_DATA_HOME` or `~/.local/share` on Linux,
    /// `~/Library/Application Support` on macOS, `%APPDATA%` on Windows).
    pub fn default_path() -> Option<PathBuf> {
        dirs::data_dir().map(|dir| dir.join("pagos").join("journal.db"))
    }

    /// Opens (creating if needed) the journal at `path`, and its parent directories.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Journal, JournalError> {
        let path = path.into();
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| JournalError::Open {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| fail(e.into()))?;
        }
        create_private(&path).map_err(|e| fail(e.into()))?;
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed intent survives a power cut, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| fail(e.into()))?;
        let db = SqlxSqliteConnector::from_sqlx_sqlite_pool(pool);
        db.execute_unprepared(CREATE_TABLE)
            .await
            .map_err(|e| fail(e.into()))?;
        Ok(Journal { db, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the intent down before anything is sent. Recording it again is a no-op that
    /// answers what is kept; another request under the same key is refused.
    pub async fn record(
        &self,
        intent: &Intent,
        base_url: &Url,
        api_key: &str,
    ) -> Result<PendingIntent, JournalError> {
        let body = intent.request().to_json().to_string();
        if let Some(kept) = self.get(intent.key()).await? {
            if kept.intent != *intent {
                return Err(JournalError::KeyTaken(intent.key().clone()));
            }
            return Ok(kept);
        }
        let at = now();
        let model = entry::ActiveModel {
            idempotency_key: Set(intent.key().to_string()),
            base_url: Set(base_url.to_string()),
            api_key_sha256: Set(api_key_sha256(api_key)),
            body: Set(body),
            attempts: Set(0),
            payment_id: Set(None),
            blocked: Set(None),
            last_error: Set(None),
            created_at: Set(at),
            updated_at: Set(at),
        };
        match entry::Entity::insert(model).exec(&self.db).await {
            Ok(_) => {}
            // Another task or process recorded it first: read what it wrote.
            Err(err) if self.get(intent.key()).await?.is_none() => return Err(err.into()),
            Err(_) => {}
        }
        match self.get(intent.key()).await? {
            Some(kept) if kept.intent == *intent => Ok(kept),
            _ => Err(JournalError::KeyTaken(intent.key().clone())),
        }
    }

    /// One intent, if kept.
    pub async fn get(&self, key: &IntentKey) -> Result<Option<PendingIntent>, JournalError> {
        entry::Entity::find_by_id(key.to_string())
            .one(&self.db)
            .await?
            .map(pending)
            .transpose()
    }

    /// Every kept intent, oldest first.
    pub async fn pending(&self) -> Result<Vec<PendingIntent>, JournalError> {
        entry::Entity::find()
            .order_by_asc(entry::Column::CreatedAt)
            .all(&self.db)
            .await?
            .into_iter()
            .map(pending)
            .collect()
    }

    /// Counts a request about to be sent; answers how many were sent before it. One
    /// statement, so two processes resuming the same intent never both see "none before".
    pub async fn count_attempt(&self, key: &IntentKey) -> Result<u32, JournalError> {
        let counted = self
            .db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Sqlite,
                "UPDATE pending_intents SET attempts = attempts + 1, updated_at = ? \
                 WHERE idempotency_key = ? RETURNING attempts",
                [now().into(), key.to_string().into()],
            ))
            .await?;
        let Some(row) = counted else {
            return Err(JournalError::Corrupt {
                key: key.to_string(),
                why: "it left the journal while being paid".into(),
            });
        };
        let after: i32 = row.try_get("", "attempts")?;
        Ok(u32::try_from(after.saturating_sub(1)).unwrap_or(0))
    }

    /// The server named the payment: from now on it is looked up, not posted.
    pub async fn payment_known(&self, key: &IntentKey, id: Uuid) -> Result<(), JournalError> {
        let kept = self.require(key).await?;
        self.update(kept, |m| m.payment_id = Set(Some(id.to_string())))
            .await
    }

    /// Notes why the last try did not settle the intent.
    pub async fn note(&self, key: &IntentKey, error: &str) -> Result<(), JournalError> {
        let kept = self.require(key).await?;
        self.update(kept, |m| m.last_error = Set(Some(error.to_owned())))
            .await
    }

    /// Keeps the intent but out of automatic retries, until a human forgets it.
    pub async fn block(&self, key: &IntentKey, why: &str) -> Result<(), JournalError> {
        let kept = self.require(key).await?;
        self.update(kept, |m| {
            m.blocked = Set(Some(why.to_owned()));
            m.last_error = Set(Some(why.to_owned()));
        })
        .await
    }

    /// Lets the intent go. Answers whether it was kept.
    pub async fn remove(&self, key: &IntentKey) -> Result<bool, JournalError> {
        let result = entry::Entity::delete_by_id(key.to_string())
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected > 0)
    }

    async fn require(&self, key: &IntentKey) -> Result<entry::Model, JournalError> {
        entry::Entity::find_by_id(key.to_string())
            .one(&self.db)
            .await?
            .ok_or_else(|| JournalError::Corrupt {
                key: key.to_string(),
                why: "it left the journal while being paid".into(),
            })
    }

    async fn update(
        &self,
        kept: entry::Model,
        change: impl FnOnce(&mut entry::ActiveModel),
    ) -> Result<(), JournalError> {
        let mut model: entry::ActiveModel = kept.into();
        change(&mut model);
        model.updated_at = Set(now());
        model.update(&self.db).await?;
        Ok(())
    }
}

fn pending(model: entry::Model) -> Result<PendingIntent, JournalError> {
    let corrupt = |why: String| JournalError::Corrupt {
        key: model.idempotency_key.clone(),
        why,
    };
    let key = IntentKey::parse(&model.idempotency_key).map_err(|e| corrupt(e.to_string()))?;
    let body: serde_json::Value =
        serde_json::from_str(&model.body).map_err(|e| corrupt(e.to_string()))?;
    let request = PaymentRequest::from_json(&body).map_err(|e| corrupt(e.to_string()))?;
    let base_url = Url::parse(&model.base_url).map_err(|e| corrupt(e.to_string()))?;
    let payment_id = model
        .payment_id
        .as_deref()
        .map(Uuid::parse_str)
        .transpose()
        .map_err(|e| corrupt(e.to_string()))?;
    Ok(PendingIntent {
        intent: Intent::with_key(key, request),
        base_url,
        api_key_sha256: model.api_key_sha256,
        attempts: u32::try_from(model.attempts).unwrap_or(0),
        payment_id,
        blocked: model.blocked,
        last_error: model.last_error,
        created_at: model.created_at,
        updated_at: model.updated_at,
    })
}

/// Creates the file readable by its owner only: it names payments and merchants.
fn create_private(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent() -> Intent {
        Intent::new(PaymentRequest::new("42", 250_000, "COP").expect("valid"))
    }

    fn url() -> Url {
        Url::parse("http://127.0.0.1:8080/").expect("url")
    }

    async fn journal(dir: &tempfile::TempDir) -> Journal {
        Journal::open(dir.path().join("nested").join("journal.db"))
            .await
            .expect("journal")
    }

    #[tokio::test]
    async fn a_recorded_intent_is_there_after_the_journal_is_opened_again() {
        let dir = tempfile::tempdir().expect("dir");
        let intent = intent();
        {
            let journal = journal(&dir).await;
            journal
                .record(&intent, &url(), "sk_test_acme")
                .await
                .expect("recorded");
            assert_eq!(journal.count_attempt(intent.key()).await.expect("ok"), 0);
            assert_eq!(journal.count_attempt(intent.key()).await.expect("ok"), 1);
        }
        let reopened = journal(&dir).await;
        let kept = reopened.pending().await.expect("pending");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].intent, intent);
        assert_eq!(kept[0].attempts, 2);
        assert_eq!(kept[0].base_url, url());
        assert!(kept[0].made_with("sk_test_acme"));
        assert!(!kept[0].made_with("sk_test_globex"));
    }

    #[tokio::test]
    async fn recording_twice_keeps_one_entry_and_another_body_under_the_key_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let intent = intent();
        journal.record(&intent, &url(), "k").await.expect("first");
        journal.record(&intent, &url(), "k").await.expect("again");
        assert_eq!(journal.pending().await.expect("pending").len(), 1);
        let other = Intent::with_key(
            intent.key().clone(),
            PaymentRequest::new("42", 1, "COP").expect("valid"),
        );
        assert!(matches!(
            journal.record(&other, &url(), "k").await,
            Err(JournalError::KeyTaken(_))
        ));
    }

    #[tokio::test]
    async fn the_api_key_is_never_written_in_clear() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let secret = "sk_live_do_not_store_me_4711";
        journal.record(&intent(), &url(), secret).await.expect("ok");
        drop(journal);
        for name in ["journal.db", "journal.db-wal"] {
            let path = dir.path().join("nested").join(name);
            if let Ok(bytes) = std::fs::read(&path) {
                let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
                assert!(!found, "{name} holds the API key");
            }
        }
    }

    #[tokio::test]
    async fn a_removed_intent_is_gone_and_the_payment_id_and_block_are_kept_until_then() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let intent = intent();
        journal.record(&intent, &url(), "k").await.expect("ok");
        let id = Uuid::new_v4();
        journal.payment_known(intent.key(), id).await.expect("ok");
        journal.block(intent.key(), "key reused").await.expect("ok");
        let kept = journal.get(intent.key()).await.expect("ok").expect("kept");
        assert_eq!(kept.payment_id, Some(id));
        assert_eq!(kept.blocked.as_deref(), Some("key reused"));
        assert!(journal.remove(intent.key()).await.expect("ok"));
        assert!(!journal.remove(intent.key()).await.expect("ok"));
        assert!(journal.pending().await.expect("ok").is_empty());
    }

    #[tokio::test]
    async fn concurrent_requests_of_one_intent_are_counted_once_each() {
        let dir = tempfile::tempdir().expect("dir");
        let first = journal(&dir).await;
        let second = journal(&dir).await;
        let intent = intent();
        first.record(&intent, &url(), "k").await.expect("ok");
        let counts = (0..10).map(|i| {
            let journal = if i % 2 == 0 { &first } else { &second };
            journal.count_attempt(intent.key())
        });
        let mut before: Vec<u32> = futures::future::try_join_all(counts).await.expect("ok");
        before.sort_unstable();
        assert_eq!(before, (0..10).collect::<Vec<u32>>());
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_journal_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let mode = std::fs::metadata(journal.path())
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
