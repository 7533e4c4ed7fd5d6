//! Merchant names become unique, trimmed, non-blank and at most 64 printable characters,
//! so that a command naming a merchant (`pagos merchants keys add NAME`) names one.
//!
//! Names made before this rule are put right in creation order (oldest first, then by id,
//! so the outcome is the same on every run): the oldest holder of a name keeps it, the
//! next ones become `name-2`, `name-3`, … (skipping names already taken); a name that is
//! blank once trimmed becomes `merchant`. Every rename is logged, then the unique index
//! is added. The rule here is the one `pagos` parses names with (`merchants::name`).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;
use sea_orm_migration::sea_orm::prelude::Uuid;
use std::collections::HashSet;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "merchants_name_key";
const MAX_CHARS: usize = 64;
const BLANK: &str = "merchant";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let rows = db
            .query_all(
                &Query::select()
                    .columns(["id", "name"])
                    .from("merchants")
                    .order_by("created_at", Order::Asc)
                    .order_by("id", Order::Asc)
                    .to_owned(),
            )
            .await?;
        let mut merchants = Vec::with_capacity(rows.len());
        for row in rows {
            let id: Uuid = row.try_get("", "id")?;
            let name: String = row.try_get("", "name")?;
            merchants.push((id, name));
        }
        let names: Vec<&str> = merchants.iter().map(|(_, name)| name.as_str()).collect();
        let renames = plan(&names);
        let mut said = Vec::with_capacity(renames.len());
        for (index, new_name) in &renames {
            let (id, old_name) = &merchants[*index];
            manager
                .exec_stmt(
                    Query::update()
                        .table("merchants")
                        .value("name", new_name.as_str())
                        .and_where(Expr::col("id").eq(*id))
                        .to_owned(),
                )
                .await?;
            said.push(format!("{old_name:?} -> {new_name:?} (id {id})"));
        }
        if !said.is_empty() {
            tracing::warn!(
                "merchant names made unique and well-formed: renamed {} merchant(s): {}",
                said.len(),
                said.join(", ")
            );
        }
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("merchants")
                    .col("name")
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // The renames stay: the old names were ambiguous, and nothing needs them back.
        manager
            .drop_index(
                Index::drop()
                    .name(INDEX)
                    .table("merchants")
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

/// Characters a name may hold: none that a terminal would not show, such as controls,
/// zero-width characters or bidirectional overrides (a name that reads as another).
fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(c,
            '\u{00AD}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}')
}

/// `raw` as the rule allows it: whitespace controls become spaces, other unprintable
/// characters go, then trimmed and cut to 64 characters; `merchant` when nothing is left.
fn well_formed(raw: &str) -> String {
    let shown: String = raw
        .chars()
        .filter_map(|c| {
            if c.is_whitespace() && c.is_control() {
                Some(' ')
            } else {
                printable(c).then_some(c)
            }
        })
        .collect();
    let cut: String = shown.trim().chars().take(MAX_CHARS).collect();
    match cut.trim_end() {
        "" => BLANK.to_owned(),
        name => name.to_owned(),
    }
}

/// `base` with `-n`, cut so that the whole stays within 64 characters.
fn numbered(base: &str, n: usize) -> String {
    let suffix = format!("-{n}");
    let room = MAX_CHARS - suffix.chars().count();
    let cut: String = base.chars().take(room).collect();
    format!("{}{suffix}", cut.trim_end())
}

/// The renames that make `names` (in creation order) well-formed and unique: (index, new
/// name) for each name that changes.
fn plan(names: &[&str]) -> Vec<(usize, String)> {
    let wanted: Vec<String> = names.iter().map(|name| well_formed(name)).collect();
    let mut taken: HashSet<String> = HashSet::with_capacity(wanted.len());
    let keeps: Vec<bool> = wanted.iter().map(|w| taken.insert(w.clone())).collect();
    let mut renames = Vec::new();
    for (index, (want, keep)) in wanted.iter().zip(keeps).enumerate() {
        let name = if keep {
            want.clone()
        } else {
            let mut n = 2;
            while taken.contains(&numbered(want, n)) {
                n += 1;
            }
            let name = numbered(want, n);
            taken.insert(name.clone());
            name
        };
        if name != names[index] {
            renames.push((index, name));
        }
    }
    renames
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn the_oldest_holder_keeps_a_name_and_the_next_ones_are_numbered() {
        assert_eq!(
            plan(&["demo", "acme", "demo", "demo"]),
            vec![(2, "demo-2".to_owned()), (3, "demo-3".to_owned())]
        );
    }

    #[test]
    fn a_number_already_taken_by_another_merchant_is_skipped() {
        assert_eq!(
            plan(&["demo", "demo", "demo-2"]),
            vec![(1, "demo-3".to_owned())]
        );
    }

    #[test]
    fn blank_padded_and_unprintable_names_are_put_right() {
        assert_eq!(
            plan(&["", "   ", " acme ", "a\tb\u{200B}c"]),
            vec![
                (0, "merchant".to_owned()),
                (1, "merchant-2".to_owned()),
                (2, "acme".to_owned()),
                (3, "a bc".to_owned()),
            ]
        );
    }

    #[test]
    fn long_names_are_cut_to_64_characters_numbers_included() {
        let long = "ñ".repeat(70);
        let renames = plan(&[&long, &long]);
        assert_eq!(renames[0].1, "ñ".repeat(64));
        assert_eq!(renames[1].1, format!("{}-2", "ñ".repeat(62)));
    }

    #[test]
    fn well_formed_unique_names_are_left_alone() {
        assert!(plan(&["acme", "globex", "Acme"]).is_empty());
    }
}
