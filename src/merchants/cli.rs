//! `pagos merchants …`: what the operator types and reads. Tables for people, `--json` for
//! scripts; a generated key on stdout once, everything else on stderr. A name or prefix
//! that names nothing, or a name already taken, is one line and exit code 2.

use super::key::{ApiKey, KeyKind, SHORT_BELOW_CHARS, WEAK_BELOW_BITS};
use super::name::MerchantName;
use super::store::{self, AddError, KeyState, Revocation};
use crate::config::{
    DatabaseArgs, KeyAddArgs, KeyListArgs, KeyRevokeArgs, KeysCommand, MerchantAddArgs,
    MerchantListArgs, MerchantsCommand, print_stdout, refuse, table, when,
};
use crate::entities::{api_key, merchant};
use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use std::process::ExitCode;

pub async fn run(command: MerchantsCommand) -> anyhow::Result<ExitCode> {
    match command {
        MerchantsCommand::Add(args) => add_merchant(args).await,
        MerchantsCommand::List(args) => list_merchants(args).await,
        MerchantsCommand::Keys { action } => match action {
            KeysCommand::Add(args) => add_key(args).await,
            KeysCommand::List(args) => list_keys(args).await,
            KeysCommand::Revoke(args) => revoke_key(args).await,
        },
    }
}

async fn add_merchant(args: MerchantAddArgs) -> anyhow::Result<ExitCode> {
    // The key is checked before the database is opened: a bad one changes nothing.
    let chosen = match args.api_key.as_ref().map(ApiKey::chosen).transpose() {
        Ok(chosen) => chosen,
        Err(err) => {
            return Ok(refuse(format_args!(
                "invalid setting PAGOS_MERCHANT_API_KEY (--api-key): {err}"
            )));
        }
    };
    let db = open(&args.database).await?;
    let kind = store::key_kind(&db, args.key_kind.gateway.as_str()).await?;
    if kind == KeyKind::Live && chosen.as_ref().is_some_and(ApiKey::is_demo) {
        return Ok(refuse(
            "invalid setting PAGOS_MERCHANT_API_KEY (--api-key): that is the README's public demo key, for the sandbox only; this database charges a real gateway (omit --api-key for a generated one)",
        ));
    }
    let key = match &chosen {
        Some(key) => key.clone(),
        None => ApiKey::generate(kind),
    };
    match store::add_merchant(&db, &args.name, &key).await {
        Ok(id) => {
            if chosen.is_some() {
                warn_if_weak(&key);
            }
            eprintln!(
                "pagos: merchant {:?} created with id {id}; its API key (prefix {}, shown once):",
                args.name.as_str(),
                key.prefix()
            );
            print_stdout(key.expose());
            Ok(ExitCode::SUCCESS)
        }
        Err(err @ AddError::NameTaken(_)) => Ok(refuse(err)),
        Err(err @ AddError::KeyTaken) => {
            eprintln!("pagos: {err}");
            Ok(ExitCode::FAILURE)
        }
        Err(AddError::Db(err)) => Err(err.into()),
    }
}

fn warn_if_weak(key: &ApiKey) {
    let strength = key.strength();
    if strength.is_weak() {
        eprintln!(
            "pagos: warning: this API key is weak ({} characters, about {:.0} bits; expected at \
             least {SHORT_BELOW_CHARS} characters and {WEAK_BELOW_BITS:.0} bits): whoever guesses \
             it pays as this merchant. Omit --api-key for a generated one.",
            strength.chars, strength.bits
        );
    }
}

/// The merchant named `name`, or the line that says there is none.
async fn merchant_named(
    db: &DatabaseConnection,
    name: &MerchantName,
) -> anyhow::Result<Result<merchant::Model, ExitCode>> {
    Ok(match store::find_merchant(db, name).await? {
        Some(merchant) => Ok(merchant),
        None => Err(refuse(format_args!(
            "no merchant is named {:?} (pagos merchants list shows them)",
            name.as_str()
        ))),
    })
}

/// Opened without migrating: only `serve` and `migrate` migrate (`db::open`).
async fn open(database: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    crate::db::open(database).await
}

/// As `open`, for a command that only reads: a read-only SQLite URL will do.
async fn open_to_read(database: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    crate::db::open_to_read(database).await
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MerchantJson {
    name: String,
    id: uuid::Uuid,
    created_at: DateTime<Utc>,
    active_keys: u64,
}

async fn list_merchants(args: MerchantListArgs) -> anyhow::Result<ExitCode> {
    let db = open_to_read(&args.database).await?;
    let merchants = store::list_merchants(&db).await?;
    if args.json {
        let rows: Vec<MerchantJson> = merchants
            .into_iter()
            .map(|m| MerchantJson {
                name: m.name,
                id: m.id,
                created_at: m.created_at,
                active_keys: m.active_keys,
            })
            .collect();
        print_stdout(&serde_json::to_string(&rows)?);
    } else {
        let rows = merchants.iter().map(|m| {
            vec![
                m.name.clone(),
                m.id.to_string(),
                when(m.created_at),
                m.active_keys.to_string(),
            ]
        });
        print_stdout(&table(["NAME", "ID", "CREATED", "ACTIVE KEYS"], rows));
    }
    Ok(ExitCode::SUCCESS)
}

async fn add_key(args: KeyAddArgs) -> anyhow::Result<ExitCode> {
    let db = open(&args.database).await?;
    let merchant = match merchant_named(&db, &args.name).await? {
        Ok(merchant) => merchant,
        Err(code) => return Ok(code),
    };
    let expires_at = match args.expira {
        None => None,
        Some(duration) => match chrono::TimeDelta::from_std(duration)
            .ok()
            .and_then(|d| crate::db::now().checked_add_signed(d))
        {
            Some(at) => Some(at),
            None => {
                return Ok(refuse(
                    "invalid setting PAGOS_EXPIRA (--expira): too far in the future",
                ));
            }
        },
    };
    let kind: KeyKind = store::key_kind(&db, args.key_kind.gateway.as_str()).await?;
    let key = ApiKey::generate(kind);
    match store::add_key(&db, &merchant, &key, expires_at).await {
        Ok(row) => {
            eprintln!(
                "pagos: new API key {} for merchant {:?}, {}; the key (shown once):",
                row.prefix,
                merchant.name,
                match row.expires_at {
                    Some(at) => format!("expires {}", when(at)),
                    None => "works until revoked".to_owned(),
                }
            );
            print_stdout(key.expose());
            Ok(ExitCode::SUCCESS)
        }
        Err(AddError::Db(err)) => Err(err.into()),
        // A collision of 190 random bits (or of a 47-bit prefix within one merchant).
        Err(err) => Err(anyhow::anyhow!("{err}; run the command again")),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyJson {
    prefix: String,
    state: &'static str,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
}

impl KeyJson {
    fn of(key: api_key::Model, now: DateTime<Utc>) -> KeyJson {
        KeyJson {
            state: KeyState::of(&key, now).as_str(),
            prefix: key.prefix,
            created_at: key.created_at,
            last_used_at: key.last_used_at,
            expires_at: key.expires_at,
            revoked_at: key.revoked_at,
        }
    }
}

async fn list_keys(args: KeyListArgs) -> anyhow::Result<ExitCode> {
    let db = open_to_read(&args.database).await?;
    let merchant = match merchant_named(&db, &args.name).await? {
        Ok(merchant) => merchant,
        Err(code) => return Ok(code),
    };
    let now = crate::db::now();
    let keys: Vec<KeyJson> = store::list_keys(&db, &merchant)
        .await?
        .into_iter()
        .map(|key| KeyJson::of(key, now))
        .collect();
    if args.json {
        print_stdout(&serde_json::to_string(&keys)?);
    } else {
        let never = || "never".to_owned();
        let rows = keys.iter().map(|k| {
            vec![
                k.prefix.clone(),
                when(k.created_at),
                k.last_used_at.map_or_else(never, when),
                k.expires_at.map_or_else(never, when),
                match k.revoked_at {
                    Some(at) => format!("revoked {}", when(at)),
                    None => k.state.to_owned(),
                },
            ]
        });
        print_stdout(&table(
            ["PREFIX", "CREATED", "LAST USED", "EXPIRES", "STATE"],
            rows,
        ));
    }
    Ok(ExitCode::SUCCESS)
}

async fn revoke_key(args: KeyRevokeArgs) -> anyhow::Result<ExitCode> {
    let db = open(&args.database).await?;
    let merchant = match merchant_named(&db, &args.name).await? {
        Ok(merchant) => merchant,
        Err(code) => return Ok(code),
    };
    match store::revoke_key(&db, &merchant, args.prefix.trim()).await? {
        Revocation::NoSuchKey => Ok(refuse(format_args!(
            "merchant {:?} has no key with prefix {:?} (pagos merchants keys list {:?} shows them)",
            merchant.name,
            args.prefix.trim(),
            merchant.name
        ))),
        Revocation::AlreadyRevoked(key) => {
            eprintln!(
                "pagos: key {} of merchant {:?} was already revoked ({}); nothing changed",
                key.prefix,
                merchant.name,
                key.revoked_at.map_or_else(String::new, when)
            );
            Ok(ExitCode::SUCCESS)
        }
        Revocation::Revoked(key) => {
            eprintln!(
                "pagos: revoked key {} of merchant {:?}: every pagos process refuses it within 5 seconds",
                key.prefix, merchant.name
            );
            if store::active_keys(&db, merchant.id).await? == 0 {
                eprintln!(
                    "pagos: warning: merchant {:?} has no working key left: its requests get 401 \
                     until it has one (pagos merchants keys add {:?})",
                    merchant.name, merchant.name
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_columns_whatever_the_script_of_the_names() {
        let text = table(
            ["NAME", "KEYS"],
            [
                vec!["Panadería Ñandú".to_owned(), "1".to_owned()],
                vec!["acme".to_owned(), "12".to_owned()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let column = |line: &str, word: &str| line.find(word).map(|b| line[..b].chars().count());
        assert_eq!(column(lines[0], "KEYS"), column(lines[1], "1"), "{text}");
        assert_eq!(column(lines[0], "KEYS"), column(lines[2], "12"), "{text}");
        assert!(lines[0].starts_with("NAME"), "{text}");
    }
}
