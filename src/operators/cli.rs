//! `pagos operators …`: add an operator (its token on stdout, once), revoke one, list them
//! as a table. A name that names nothing, or one already taken, is one line and exit 2.

use super::store::{self, AddError, Revocation};
use super::{OperatorName, Token};
use crate::config::{OperatorAddArgs, OperatorListArgs, OperatorRevokeArgs, OperatorsCommand};
use crate::db::open_and_migrate;
use chrono::{DateTime, Utc};
use comfy_table::{Table, presets::NOTHING};
use std::process::ExitCode;

pub async fn run(command: OperatorsCommand) -> anyhow::Result<ExitCode> {
    match command {
        OperatorsCommand::Add(args) => add(args).await,
        OperatorsCommand::Revoke(args) => revoke(args).await,
        OperatorsCommand::List(args) => list(args).await,
    }
}

fn refuse(line: impl std::fmt::Display) -> ExitCode {
    eprintln!("pagos: {line}");
    ExitCode::from(2)
}

#[allow(clippy::print_stdout)]
fn print_stdout(text: &str) {
    println!("{text}");
}

fn parse_name(raw: &str) -> Result<OperatorName, ExitCode> {
    OperatorName::parse(raw).map_err(|err| refuse(format_args!("invalid operator name: {err}")))
}

async fn add(args: OperatorAddArgs) -> anyhow::Result<ExitCode> {
    let name = match parse_name(&args.name) {
        Ok(name) => name,
        Err(code) => return Ok(code),
    };
    let db = open_and_migrate(&args.database).await?;
    let token = Token::generate();
    match store::add(&db, &name, args.rol, &token).await {
        Ok(row) => {
            eprintln!(
                "pagos: operator {:?} created, role {}; their token (shown once, only its hash is stored):",
                row.name, row.role
            );
            print_stdout(token.expose());
            Ok(ExitCode::SUCCESS)
        }
        Err(err @ AddError::NameTaken(_)) => Ok(refuse(err)),
        Err(AddError::Db(err)) => Err(err.into()),
    }
}

async fn revoke(args: OperatorRevokeArgs) -> anyhow::Result<ExitCode> {
    let name = match parse_name(&args.name) {
        Ok(name) => name,
        Err(code) => return Ok(code),
    };
    let db = open_and_migrate(&args.database).await?;
    match store::revoke(&db, &name).await? {
        Revocation::NoSuchOperator => Ok(refuse(format_args!(
            "no operator is named {:?} (pagos operators list shows them)",
            name.as_str()
        ))),
        Revocation::AlreadyRevoked(row) => {
            eprintln!(
                "pagos: operator {:?} was already revoked ({}); nothing changed",
                row.name,
                row.revoked_at.map_or_else(String::new, when)
            );
            Ok(ExitCode::SUCCESS)
        }
        Revocation::Revoked(row) => {
            eprintln!(
                "pagos: revoked operator {:?}: their token and console sessions are refused from now on",
                row.name
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn list(args: OperatorListArgs) -> anyhow::Result<ExitCode> {
    let db = open_and_migrate(&args.database).await?;
    let mut table = Table::new();
    table
        .load_style(NOTHING)
        .set_header(vec!["NAME", "ROLE", "CREATED", "STATE"]);
    for row in store::list(&db).await? {
        table.add_row(vec![
            row.name,
            row.role.to_string(),
            when(row.created_at),
            match row.revoked_at {
                Some(at) => format!("revoked {}", when(at)),
                None => "active".to_owned(),
            },
        ]);
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i < 3 { 2 } else { 0 }));
    }
    print_stdout(&table.trim_fmt());
    Ok(ExitCode::SUCCESS)
}

/// To the minute, in UTC.
fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}
