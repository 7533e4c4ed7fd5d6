//! Indexes built and dropped without blocking writes: `CONCURRENTLY` on PostgreSQL, so
//! outside a transaction (a migration using these says `use_transaction` is
//! `Some(false)`), plainly on SQLite. Every statement can run again: a migration killed
//! halfway is finished by the next start.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

/// Builds the index `name` on `table` over `columns` (SQL, e.g. `"a", "b"`). On
/// PostgreSQL `CONCURRENTLY`: a build that was interrupted left an INVALID index, which
/// `IF NOT EXISTS` would take as done, so it is dropped and built again.
pub async fn create_index(
    manager: &SchemaManager<'_>,
    name: &str,
    table: &str,
    columns: &str,
) -> Result<(), DbErr> {
    let db = manager.get_connection();
    if manager.get_database_backend() == DbBackend::Postgres {
        drop_if_invalid(manager, name).await?;
        db.execute_unprepared(&format!(
            r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" ({columns})"#
        ))
        .await?;
    } else {
        db.execute_unprepared(&format!(
            r#"CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ({columns})"#
        ))
        .await?;
    }
    Ok(())
}

/// Drops the index `name` if it exists (`CONCURRENTLY` on PostgreSQL).
pub async fn drop_index(manager: &SchemaManager<'_>, name: &str) -> Result<(), DbErr> {
    let concurrently = if manager.get_database_backend() == DbBackend::Postgres {
        "CONCURRENTLY "
    } else {
        ""
    };
    manager
        .get_connection()
        .execute_unprepared(&format!(r#"DROP INDEX {concurrently}IF EXISTS "{name}""#))
        .await?;
    Ok(())
}

/// Drops the index `name` if an interrupted `CREATE INDEX CONCURRENTLY` left it INVALID
/// (PostgreSQL): `IF NOT EXISTS` would otherwise keep it, and it is never used.
pub async fn drop_if_invalid(manager: &SchemaManager<'_>, name: &str) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let invalid = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                r#"SELECT NOT "indisvalid" AS "invalid" FROM "pg_index" WHERE "indexrelid" = to_regclass('"{name}"')"#
            ),
        ))
        .await?
        .map(|row| row.try_get::<bool>("", "invalid"))
        .transpose()?
        .unwrap_or(false);
    if invalid {
        tracing::warn!(
            index = name,
            "an interrupted concurrent build left this index invalid: building it again"
        );
        db.execute_unprepared(&format!(r#"DROP INDEX CONCURRENTLY IF EXISTS "{name}""#))
            .await?;
    }
    Ok(())
}
