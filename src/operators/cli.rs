//! `pagos operators …`: add an operator (its token on stdout, once), revoke one, list them
//! as a table. A name that names nothing, or one already taken, is one line and exit 2.

use super::store::{self, AddError, Revocation};
use super::{OperatorName, Token};
use crate::config::{
    OperatorAddArgs, OperatorListArgs, OperatorRevokeArgs, OperatorsCommand, print_stdout, refuse,
    table, when,
};
use crate::db::open;
use std::process::ExitCode;

pub async fn run(command: OperatorsCommand) -> anyhow::Result<ExitCode> {
    match command {
        OperatorsCommand::Add(args) => add(args).await,
        OperatorsCommand::Revoke(args) => revoke(args).await,
        OperatorsCommand::List(args) => list(args).await,
    }
}

fn parse_name(raw: &str) -> Result<OperatorName, ExitCode> {
    OperatorName::parse(raw).map_err(|err| refuse(format_args!("invalid operator name: {err}")))
}

async fn add(args: OperatorAddArgs) -> anyhow::Result<ExitCode> {
    let name = match OperatorName::parse_new(&args.name) {
        Ok(name) => name,
        Err(err) => return Ok(refuse(format_args!("invalid operator name: {err}"))),
    };
    let db = open(&args.database).await?;
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
    let db = open(&args.database).await?;
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
    let db = crate::db::open_to_read(&args.database).await?;
    let rows = store::list(&db).await?.into_iter().map(|row| {
        vec![
            row.name,
            row.role.to_string(),
            when(row.created_at),
            match row.revoked_at {
                Some(at) => format!("revoked {}", when(at)),
                None => "active".to_owned(),
            },
        ]
    });
    print_stdout(&table(["NAME", "ROLE", "CREATED", "STATE"], rows));
    Ok(ExitCode::SUCCESS)
}
