//! `pagos refund`: one refund with the retrying client. The refund intent's key is kept in
//! the journal until a terminal answer, and running the same command again while it is
//! kept sends the same key: a refund asked twice is made once. One kept for the same
//! refund under another URL or API key is not sent from here, and no new one is made
//! beside it without `--new`.
//!
//! Stdout carries the result only (the refund as JSON); progress and errors go to stderr.
//! It must never print or store the API key.

use super::cli::bad_setting;
use super::{
    Beside, Client, Journal, Kept, PayError, PayPolicy, PendingRefund, RefundIntent, RefundOutcome,
    RefundRequest,
};
use secrecy::{ExposeSecret, SecretString};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use uuid::Uuid;

#[derive(Debug, clap::Args)]
#[command(
    about = "Refund part or all of a payment with the retrying client (one key per refund, kept in a journal)",
    after_help = "Exit codes: 0 refunded, 3 refused by the gateway, 4 still pending at the deadline, 1 anything else, 2 a bad flag or a journal that cannot be opened.\n\
                  The same command run again while its refund is kept in the journal sends the same Idempotency-Key; \
                  one kept under another --url or API key is not sent from here (exit 1), and --new makes a new refund."
)]
pub struct RefundArgs {
    /// Base URL of the pagos server
    #[arg(long, env = "PAGOS_URL", value_name = "URL", value_parser = url)]
    pub url: url::Url,
    /// The merchant's API key (the journal keeps only its SHA-256)
    #[arg(long, env = "PAGOS_API_KEY", hide_env_values = true, value_name = "KEY",
          value_parser = secret)]
    pub api_key: SecretString,
    /// The payment to refund (its id)
    #[arg(long, env = "PAGOS_PAGO", value_name = "ID")]
    pub pago: Uuid,
    /// Amount to refund in minor units (default: everything not yet refunded)
    #[arg(long, env = "PAGOS_MONTO", value_name = "N")]
    pub monto: Option<i64>,
    /// Why (at most 255 characters)
    #[arg(long, env = "PAGOS_MOTIVO", value_name = "TEXT")]
    pub motivo: Option<String>,
    /// Make a new refund with a new Idempotency-Key even when the journal keeps an
    /// intent for this same refund (which may have been made: without --new, one made
    /// here is asked again with its key, and one made at another URL or with another API
    /// key stops the command)
    #[arg(long, env = "PAGOS_NEW")]
    pub new: bool,
    /// The journal of pending intents (default: pagos/journal.db in the user's data
    /// directory)
    #[arg(long, env = "PAGOS_JOURNAL", value_name = "PATH")]
    pub journal: Option<PathBuf>,
    /// How long the refund may take in all, retries and waits included
    #[arg(long, env = "PAGOS_DEADLINE", default_value = "2m", value_parser = super::cli::positive_duration,
          value_name = "DURATION")]
    pub deadline: Duration,
    /// Tries of a request whose outcome stays unknown, the first one included (a 409
    /// saying the first request is still in flight does not count)
    #[arg(long, env = "PAGOS_MAX_ATTEMPTS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000), value_name = "N")]
    pub max_attempts: u32,
}

/// The intent that makes this refund: the one the journal keeps for this same refund
/// (`--pago`, `--monto`, `--motivo`) at this server with this API key, asked again with its
/// key (running `pagos refund` again after a deadline, a kill or a crash must not refund
/// twice); a new one when none is kept, or with `--new`. None (exit 1, nothing sent) when
/// one is kept only under another URL or API key: it may have made the refund, and it is
/// not this command's to send.
async fn same_refund(
    client: &Client,
    journal: &Journal,
    api_key: &str,
    request: RefundRequest,
    new: bool,
) -> anyhow::Result<Option<RefundIntent>> {
    if new {
        let kept = journal.find_refunds(&request).await?;
        if !kept.is_empty() {
            eprintln!(
                "pagos: --new: a new refund with a new Idempotency-Key; the {} kept intent(s) for this same refund stay in the journal",
                kept.len()
            );
        }
        return Ok(Some(RefundIntent::new(request)));
    }
    // Found, or a new intent written down, at once: the same command run twice together
    // refunds under one key.
    let fresh = RefundIntent::new(request);
    let kept = match journal
        .kept_refunds_or_record(&fresh, client.base_url(), api_key, Beside::Nothing)
        .await?
    {
        Kept::Recorded => return Ok(Some(fresh)),
        Kept::Found(kept) => kept,
    };
    let here = kept
        .iter()
        .find(|k| k.base_url == *client.base_url() && k.made_with(api_key));
    if let Some(pending) = here {
        eprintln!(
            "pagos: this refund is kept in the journal, made {} with {} request(s) sent; asking again with its Idempotency-Key {}",
            made(pending),
            pending.attempts,
            pending.intent.key()
        );
        return Ok(Some(pending.intent.clone()));
    }
    let Some(pending) = kept.first() else {
        return Ok(Some(fresh));
    };
    let whose = if pending.made_with(api_key) {
        "this API key"
    } else {
        "another API key"
    };
    eprintln!(
        "pagos: the journal keeps an intent for this same refund, {}, made {} at {} with {whose}; it may have made the refund, so nothing was sent and no second refund was made: run the same command with --url {} and the API key it was made with to ask it again with its key, or --new to make a new refund",
        pending.intent.key(),
        made(pending),
        pending.base_url,
        pending.base_url,
    );
    Ok(None)
}

fn made(pending: &PendingRefund) -> String {
    pending
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn secret(s: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(s))
}

fn url(s: &str) -> Result<url::Url, String> {
    super::base_url(s).map_err(|e| e.to_string())
}

pub async fn run(args: RefundArgs) -> anyhow::Result<ExitCode> {
    let Some(path) = args.journal.clone().or_else(Journal::default_path) else {
        return Ok(bad_setting(
            "PAGOS_JOURNAL",
            "journal",
            "this user has no data directory; give the journal's path",
        ));
    };
    let request = match RefundRequest::new(args.pago, args.monto, args.motivo.as_deref()) {
        Ok(request) => request,
        Err(errors) => {
            let first = errors.first().map(|e| e.campo.as_str()).unwrap_or("monto");
            let (env, flag) = if first == "motivo" {
                ("PAGOS_MOTIVO", "motivo")
            } else {
                ("PAGOS_MONTO", "monto")
            };
            let why: Vec<String> = errors.into_iter().map(|e| e.detalle).collect();
            return Ok(bad_setting(env, flag, why.join("; ")));
        }
    };
    let api_key = args.api_key.expose_secret().to_owned();
    let client = match Client::new(args.url.as_str(), &api_key) {
        Ok(client) => client,
        Err(err) => return Ok(bad_setting("PAGOS_API_KEY", "api-key", err)),
    };
    let journal = match super::cli::open_journal(&path).await {
        Ok(journal) => journal,
        Err(exit) => return Ok(exit),
    };
    let client = client.with_journal(journal.clone()).with_policy(PayPolicy {
        deadline: args.deadline,
        max_attempts: args.max_attempts,
        ..PayPolicy::default()
    });
    let intent = match same_refund(&client, &journal, &api_key, request, args.new).await? {
        Some(intent) => intent,
        None => return Ok(ExitCode::from(1)),
    };
    eprintln!(
        "pagos: refunding payment {} with Idempotency-Key {}",
        args.pago,
        intent.key()
    );
    let (code, printed) = match client.refund(&intent).await {
        Ok(RefundOutcome::Refunded(refund)) => (0, Some(refund)),
        Ok(RefundOutcome::Refused { refund, problem }) => {
            eprintln!("pagos: refused: {}", problem.headline());
            (3, Some(refund))
        }
        Ok(RefundOutcome::Pending(refund)) => {
            eprintln!(
                "pagos: refund {} still {} at the deadline; run the same command later to learn the outcome",
                refund.id, refund.state
            );
            (4, Some(refund))
        }
        Err(err @ PayError::GaveUp { .. }) => {
            eprintln!("pagos: {err}; run the same command again: it sends the same key");
            (1, None)
        }
        Err(err) => {
            eprintln!("pagos: {err}");
            (1, None)
        }
    };
    if let Some(refund) = printed {
        // A closed stdout (`| head`) must not turn a refund into a panic.
        let _ = writeln!(
            std::io::stdout().lock(),
            "{}",
            serde_json::to_string(&refund)?
        );
    }
    Ok(ExitCode::from(code))
}
