//! Columns added to a table that exists, and dropped again: one `ALTER TABLE` per column,
//! since SQLite alters a table one column at a time.

use sea_orm_migration::prelude::*;

/// Adds `columns` to `table`, in order.
pub async fn add(
    manager: &SchemaManager<'_>,
    table: &'static str,
    columns: Vec<ColumnDef>,
) -> Result<(), DbErr> {
    for column in columns {
        manager
            .alter_table(Table::alter().table(table).add_column(column).to_owned())
            .await?;
    }
    Ok(())
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
