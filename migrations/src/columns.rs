//! Columns added to a table that exists, and dropped again: one `ALTER TABLE` per column,
//! since SQLite alters a table one column at a time.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

/// Adds `columns` to `table`, in order, each unless the table has it already: a migration
/// whose record was deleted (README's rollback to a release built before
/// `m20261208_000018`) runs again on a schema that has its columns. PostgreSQL says
/// `ADD COLUMN IF NOT EXISTS`; SQLite has no such clause, so its table's columns are read
/// first (`pragma_table_info`, in the migration's transaction).
pub async fn add(
    manager: &SchemaManager<'_>,
    table: &'static str,
    columns: Vec<ColumnDef>,
) -> Result<(), DbErr> {
    for column in columns {
        if manager.get_database_backend() == DbBackend::Sqlite
            && has(manager, table, &column.get_column_name()).await?
        {
            continue;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(table)
                    .add_column_if_not_exists(column)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// Whether SQLite's `table` has the column `name`.
async fn has(manager: &SchemaManager<'_>, table: &str, name: &str) -> Result<bool, DbErr> {
    Ok(manager
        .get_connection()
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            r#"SELECT 1 AS "found" FROM pragma_table_info(?) WHERE "name" = ?"#,
            [table.into(), name.into()],
        ))
        .await?
        .is_some())
}

/// Drops `columns` from `table`, in order.
pub async fn drop(
    manager: &SchemaManager<'_>,
    table: &'static str,
    columns: &[&'static str],
) -> Result<(), DbErr> {
    for column in columns {
        manager
            .alter_table(Table::alter().table(table).drop_column(*column).to_owned())
            .await?;
    }
    Ok(())
}
