//! `pagos pay`: the retrying client's command line.
//!
//! Stdout carries the result only (an aligned table, or JSON with `--json`); progress and
//! errors go to stderr. It must never print or store the API key, and never make a second
//! intent for a payment it already holds: the same payment asked again while the journal
//! keeps it pending resumes that intent with its key (as `--resume` does); only `--new`
//! makes a second one.

use super::{
    Beside, Client, Intent, IntentKey, Journal, JournalError, Kept, Outcome, PayError, PayPolicy,
    PaymentRequest, PaymentState, PendingIntent,
};
use pagos_types::{Currency, FieldError, PaymentMethod, Problem};
use secrecy::{ExposeSecret, SecretString};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit codes of `pagos pay` (the contract's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    Paid,
    Declined,
    Pending,
    Failed,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Paid => 0,
            Exit::Declined => 3,
            Exit::Pending => 4,
            Exit::Failed => 1,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

#[derive(Debug, clap::Args)]
#[command(
    about = "Make one payment with the retrying client (one key per intent, kept in a journal)",
    after_help = "Exit codes: 0 paid, 3 declined, 4 still pending at the deadline, 1 anything else, 2 a bad flag or a journal that cannot be opened.\n\
                  The journal keeps each intent and its Idempotency-Key from before the first request \
                  until a terminal answer; `pagos pay --resume` retries what it holds, with the same keys."
)]
pub struct PayArgs {
    /// Base URL of the pagos server
    #[arg(long, env = "PAGOS_URL", value_name = "URL", value_parser = url,
          required_unless_present_any = ["resume", "forget"])]
    pub url: Option<url::Url>,
    /// The merchant's API key (the journal keeps only its SHA-256)
    #[arg(
        long,
        env = "PAGOS_API_KEY",
        hide_env_values = true,
        value_name = "KEY",
        value_parser = secret,
        required_unless_present = "forget"
    )]
    pub api_key: Option<SecretString>,
    /// The credit this payment pays (creditoId)
    #[arg(long, env = "PAGOS_CREDITO", value_name = "ID", value_parser = credit_id,
          required_unless_present_any = ["resume", "forget"])]
    pub credito: Option<String>,
    /// Amount in minor units of the currency (250000 COP is 2500.00 COP)
    #[arg(long, env = "PAGOS_MONTO", value_name = "N", value_parser = amount,
          required_unless_present_any = ["resume", "forget"])]
    pub monto: Option<i64>,
    /// ISO 4217 currency code (COP, USD, EUR, MXN, BRL, …)
    #[arg(long, env = "PAGOS_MONEDA", value_name = "CUR", value_parser = currency,
          required_unless_present_any = ["resume", "forget"])]
    pub moneda: Option<String>,
    /// Optional description of the payment (at most 255 characters)
    #[arg(long, env = "PAGOS_DESCRIPCION", value_name = "TEXT", value_parser = description)]
    pub descripcion: Option<String>,
    /// How the payer pays (medioPago), as the contract's JSON; required when the server
    /// charges through Stripe ('{"id":"pm_…","cliente":"cus_…"}', or just the pm_… id) or
    /// Mercado Pago ('{"id":"visa","token":"…","cuotas":1,"email":"payer@example.com"}')
    #[arg(long, env = "PAGOS_MEDIO_PAGO", hide_env_values = true, value_name = "JSON",
          value_parser = payment_method)]
    pub medio_pago: Option<PaymentMethod>,
    /// Retry every intent still in the journal, each with its own key and server
    /// (the API key must be the one it was made with)
    #[arg(long, env = "PAGOS_RESUME")]
    pub resume: bool,
    /// Make a new payment with a new Idempotency-Key even when the journal holds a
    /// pending intent for this same payment (which may have paid: without --new, that
    /// intent is resumed with its key)
    #[arg(long, env = "PAGOS_NEW", conflicts_with_all = ["resume", "forget"])]
    pub new: bool,
    /// Remove one intent from the journal after checking its payment by hand; it is
    /// never retried again
    #[arg(long, env = "PAGOS_FORGET", value_name = "KEY")]
    pub forget: Option<String>,
    /// The journal of pending intents (default: pagos/journal.db in the user's data
    /// directory)
    #[arg(long, env = "PAGOS_JOURNAL", value_name = "PATH")]
    pub journal: Option<PathBuf>,
    /// Print the payment as JSON (one line per payment) instead of a table
    #[arg(long, env = "PAGOS_JSON")]
    pub json: bool,
    /// How long one payment may take in all, retries and waits included
    #[arg(long, env = "PAGOS_DEADLINE", default_value = "2m", value_parser = positive_duration,
          value_name = "DURATION")]
    pub deadline: Duration,
    /// Tries of a request whose outcome stays unknown, the first one included (a 409
    /// saying the first request is still in flight does not count)
    #[arg(long, env = "PAGOS_MAX_ATTEMPTS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000), value_name = "N")]
    pub max_attempts: u32,
    /// Longest wait for one answer
    #[arg(long, env = "PAGOS_REQUEST_TIMEOUT", default_value = "15s", value_parser = positive_duration,
          value_name = "DURATION")]
    pub request_timeout: Duration,
    /// Base of the exponential backoff (retry n waits a random time up to base × 2ⁿ)
    #[arg(long, env = "PAGOS_RETRY_MIN_DELAY", default_value = "250ms", value_parser = positive_duration,
          value_name = "DURATION")]
    pub retry_min_delay: Duration,
    /// Cap of one backoff wait (a longer Retry-After from the server still wins)
    #[arg(long, env = "PAGOS_RETRY_MAX_DELAY", default_value = "10s", value_parser = positive_duration,
          value_name = "DURATION")]
    pub retry_max_delay: Duration,
    /// How long the server keeps Idempotency-Keys (its PAGOS_KEY_RETENTION): an intent
    /// first sent 99 % of this ago or longer is not sent again without a human; --deadline
    /// must be shorter than that
    #[arg(long, env = "PAGOS_KEY_RETENTION", default_value = "24h", value_parser = positive_duration,
          value_name = "DURATION")]
    pub key_retention: Duration,
}

/// A setting that holds a secret: redacted in `Debug`, wiped from memory when dropped.
fn secret(s: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(s))
}

/// The longest duration any setting of `pagos pay` or `pagos refund` takes: far beyond a
/// sane deadline, timeout, delay or key retention, and far below what a clock can add.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A duration setting: positive, and at most [`MAX_DURATION`].
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) if d > MAX_DURATION => Err("must be at most 365 days".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{e}; expected a duration such as 250ms, 30s or 2m")),
    }
}

fn url(s: &str) -> Result<url::Url, String> {
    super::base_url(s).map_err(|e| e.to_string())
}

/// Checks one field with the server's own rules, on an otherwise valid body.
fn field(name: &str, value: serde_json::Value) -> Result<(), String> {
    let mut body = serde_json::json!({"creditoId": "1", "monto": 1, "moneda": "COP"});
    body[name] = value;
    match PaymentRequest::from_json(&body) {
        Ok(_) => Ok(()),
        Err(invalid) => Err(invalid
            .0
            .into_iter()
            .map(|e| e.detalle)
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

fn credit_id(s: &str) -> Result<String, String> {
    field("creditoId", s.into()).map(|()| s.to_owned())
}

fn amount(s: &str) -> Result<i64, String> {
    let n: i64 = s
        .parse()
        .map_err(|_| "expected a whole number of minor units, such as 250000".to_owned())?;
    field("monto", n.into()).map(|()| n)
}

fn currency(s: &str) -> Result<String, String> {
    let code = s.to_ascii_uppercase();
    field("moneda", code.as_str().into()).map(|()| code)
}

fn description(s: &str) -> Result<String, String> {
    field("descripcion", s.into()).map(|()| s.to_owned())
}

/// `medioPago` as JSON (`{"id":…}` or `"pm_…"`); text that is not JSON is taken as the id,
/// which the contract reads the same (`pm_…` for `"pm_…"`).
fn payment_method(s: &str) -> Result<PaymentMethod, String> {
    let value = serde_json::from_str(s).unwrap_or_else(|_| serde_json::Value::from(s));
    PaymentMethod::from_json(&value).map_err(|errors| {
        errors
            .into_iter()
            .map(|e| format!("{} {}", e.campo, e.detalle))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// A setting that parsed but cannot be used: one line naming it, exit 2.
pub(crate) fn bad_setting(env: &str, flag: &str, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("pagos: invalid setting {env} (--{flag}): {message}");
    ExitCode::from(2)
}

/// The journal at `path`; one that cannot be opened is a bad setting (exit 2).
pub(crate) async fn open_journal(path: &std::path::Path) -> Result<Journal, ExitCode> {
    Journal::open(path)
        .await
        .map_err(|err| bad_setting("PAGOS_JOURNAL", "journal", err))
}

impl PayArgs {
    fn policy(&self) -> PayPolicy {
        PayPolicy {
            max_attempts: self.max_attempts,
            deadline: self.deadline,
            request_timeout: self.request_timeout,
            min_delay: self.retry_min_delay,
            max_delay: self.retry_max_delay,
            seed: None,
        }
    }
}

pub async fn run(args: PayArgs) -> anyhow::Result<ExitCode> {
    let Some(path) = args.journal.clone().or_else(Journal::default_path) else {
        return Ok(bad_setting(
            "PAGOS_JOURNAL",
            "journal",
            "this user has no data directory; give the journal's path",
        ));
    };
    if args.retry_min_delay > args.retry_max_delay {
        return Ok(bad_setting(
            "PAGOS_RETRY_MIN_DELAY",
            "retry-min-delay",
            "must not exceed PAGOS_RETRY_MAX_DELAY (--retry-max-delay)",
        ));
    }
    if let Some(key) = &args.forget {
        let Ok(key) = IntentKey::parse(key) else {
            return Ok(bad_setting(
                "PAGOS_FORGET",
                "forget",
                "not an Idempotency-Key",
            ));
        };
        let journal = match open_journal(&path).await {
            Ok(journal) => journal,
            Err(exit) => return Ok(exit),
        };
        return forget(&journal, &key).await;
    }
    // A try cannot start once the key may be gone (`PayError::Expired`): a deadline that
    // long only promises retries that never come.
    if args.deadline >= args.key_retention - args.key_retention / 100 {
        return Ok(bad_setting(
            "PAGOS_DEADLINE",
            "deadline",
            format!(
                "must be shorter than 99% of PAGOS_KEY_RETENTION (--key-retention, {}): no request is sent once the server may have let its Idempotency-Key go",
                humantime::format_duration(args.key_retention)
            ),
        ));
    }
    let api_key = args
        .api_key
        .as_ref()
        .map(ExposeSecret::expose_secret)
        .unwrap_or_default()
        .to_owned();
    if let Err(err) = Client::new("http://localhost", &api_key) {
        return Ok(bad_setting("PAGOS_API_KEY", "api-key", err));
    }
    let journal = match open_journal(&path).await {
        Ok(journal) => journal,
        Err(exit) => return Ok(exit),
    };
    if args.resume {
        if args.credito.is_some()
            || args.monto.is_some()
            || args.moneda.is_some()
            || args.medio_pago.is_some()
        {
            eprintln!(
                "pagos: --resume retries the journal's intents; --credito, --monto, --moneda and --medio-pago are ignored"
            );
        }
        return Ok(resume(&args, &journal, &api_key).await?.into());
    }
    let (Some(url), Some(credito), Some(monto), Some(moneda)) =
        (&args.url, &args.credito, args.monto, &args.moneda)
    else {
        return Ok(bad_setting(
            "PAGOS_URL",
            "url",
            "--url, --credito, --monto and --moneda are required to pay",
        ));
    };
    let request = PaymentRequest::new(credito.as_str(), monto, moneda)
        .and_then(|r| match &args.descripcion {
            Some(d) => r.with_description(d.as_str()),
            None => Ok(r),
        })
        .and_then(|r| match &args.medio_pago {
            Some(method) => r.with_payment_method(method.clone()),
            None => Ok(r),
        });
    let request = match request {
        Ok(request) => request,
        Err(err) => return Ok(bad_setting("PAGOS_MONTO", "monto", err)),
    };
    let client = client(&args, url.as_str(), &api_key, &journal)?;
    let intent = match same_payment(&client, &journal, &api_key, request, args.new).await? {
        Ok(intent) => intent,
        Err(exit) => return Ok(exit.into()),
    };
    eprintln!(
        "pagos: paying {} for credit {} with Idempotency-Key {} (journal {})",
        money(monto, intent.request().currency()),
        credito,
        intent.key(),
        journal.path().display()
    );
    let result = client.pay(&intent).await;
    Ok(report(&journal, &intent, result, args.json).await.into())
}

/// The intent that pays `request`: the one the journal keeps pending for this same
/// payment, at this server with this API key, resumed with its key (running `pagos pay`
/// again after a deadline, a kill or a crash must not pay twice); a new one when there is
/// none, or with `--new`. A pending one made elsewhere or with another API key is not
/// sent from here, and no new one is made beside it without `--new`.
async fn same_payment(
    client: &Client,
    journal: &Journal,
    api_key: &str,
    request: PaymentRequest,
    new: bool,
) -> anyhow::Result<Result<Intent, Exit>> {
    if new {
        let kept = journal.find(&request).await?;
        if !kept.is_empty() {
            eprintln!(
                "pagos: --new: a new payment with a new Idempotency-Key; the {} pending intent(s) for this same payment stay in the journal (`pagos pay --resume` retries them)",
                kept.len()
            );
        }
        return Ok(Ok(Intent::new(request)));
    }
    // Found, or a new intent written down, at once: the same command run twice together
    // pays under one key.
    let fresh = Intent::new(request);
    let kept = match journal
        .kept_or_record(&fresh, client.base_url(), api_key, Beside::Nothing)
        .await?
    {
        Kept::Recorded => return Ok(Ok(fresh)),
        Kept::Found(kept) => kept,
    };
    let here = kept
        .iter()
        .find(|k| k.base_url == *client.base_url() && k.made_with(api_key));
    if let Some(pending) = here {
        eprintln!(
            "pagos: the journal holds a pending intent for this same payment, made {} with {} request(s) sent; it may have paid, so it is resumed with its Idempotency-Key {} instead of making a second payment (--new makes a new one)",
            made(pending),
            pending.attempts,
            pending.intent.key(),
        );
        return Ok(Ok(pending.intent.clone()));
    }
    let Some(pending) = kept.first() else {
        return Ok(Ok(fresh));
    };
    let whose = if pending.made_with(api_key) {
        "this API key"
    } else {
        "another API key"
    };
    eprintln!(
        "pagos: the journal holds a pending intent for this same payment, {}, made {} at {} with {whose}; it may have paid, so nothing was sent and no second payment was made: `pagos pay --resume` (with the API key it was made with) retries it at its server, and --new makes a new payment",
        pending.intent.key(),
        made(pending),
        pending.base_url,
    );
    Ok(Err(Exit::Failed))
}

fn made(pending: &PendingIntent) -> String {
    pending
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn client(args: &PayArgs, url: &str, api_key: &str, journal: &Journal) -> anyhow::Result<Client> {
    Ok(Client::new(url, api_key)?
        .with_policy(args.policy())
        .with_key_retention(args.key_retention)
        .with_journal(journal.clone())
        .on_retry(|notice| eprintln!("pagos: {notice}")))
}

async fn resume(args: &PayArgs, journal: &Journal, api_key: &str) -> anyhow::Result<Exit> {
    let pending = journal.pending().await?;
    if pending.is_empty() {
        eprintln!("pagos: no pending intents in {}", journal.path().display());
        return Ok(Exit::Paid);
    }
    let mut worst = Exit::Paid;
    let mut other_key = Vec::new();
    for kept in pending {
        if !kept.made_with(api_key) {
            other_key.push(kept);
            continue;
        }
        let request = kept.intent.request();
        eprintln!(
            "pagos: resuming intent {} at {}: {} for credit {}, made {}, {} request(s) sent before",
            kept.intent.key(),
            kept.base_url,
            money(request.amount(), request.currency()),
            request.credit_id(),
            made(&kept),
            kept.attempts,
        );
        let client = client(args, kept.base_url.as_str(), api_key, journal)?;
        let result = client.pay(&kept.intent).await;
        worst = worst.max(report(journal, &kept.intent, result, args.json).await);
    }
    // Not resumed is not paid: the journal tells keys apart by their SHA-256, and only the
    // server knows whether two keys are one merchant's, so these wait for the key they
    // were made with (or a human), and the exit says something is left.
    if !other_key.is_empty() {
        eprintln!(
            "pagos: {} intent(s) made with another API key were not resumed and stay in the journal (this key cannot tell whether they are its merchant's): resume them with the key they were made with; after a key rotation, see \"Rotating the API key\" in docs/client.md",
            other_key.len()
        );
        for kept in &other_key {
            let request = kept.intent.request();
            let payment = kept
                .payment_id
                .map_or(String::new(), |id| format!(", payment {id}"));
            eprintln!(
                "pagos:   not resumed: {} at {}: {} for credit {}, made {}{payment}",
                kept.intent.key(),
                kept.base_url,
                money(request.amount(), request.currency()),
                request.credit_id(),
                made(kept),
            );
        }
        worst = worst.max(Exit::Failed);
    }
    Ok(worst)
}

async fn forget(journal: &Journal, key: &IntentKey) -> anyhow::Result<ExitCode> {
    let kept = match journal.get(key).await {
        Ok(Some(kept)) => kept,
        Ok(None) => {
            eprintln!("pagos: no intent {key} in {}", journal.path().display());
            return Ok(Exit::Failed.into());
        }
        // A row this client cannot read (written by another version, or damaged) is
        // still let go when asked by its key: it would block every command that reads
        // the journal.
        Err(JournalError::Corrupt { why, .. }) => {
            journal.remove(key).await?;
            eprintln!(
                "pagos: forgot intent {key}, which this client could not read ({why}); it will not be retried"
            );
            return Ok(Exit::Paid.into());
        }
        Err(e) => return Err(e.into()),
    };
    journal.remove(key).await?;
    let request = kept.intent.request();
    let payment = kept
        .payment_id
        .map_or("no payment id known".to_owned(), |id| {
            format!("payment {id}")
        });
    eprintln!(
        "pagos: forgot intent {key} ({} for credit {}, {payment}); it will not be retried",
        money(request.amount(), request.currency()),
        request.credit_id(),
    );
    Ok(Exit::Paid.into())
}

/// Prints what became of an intent and answers its exit code.
async fn report(
    journal: &Journal,
    intent: &Intent,
    result: Result<Outcome, PayError>,
    json: bool,
) -> Exit {
    let key = intent.key();
    match result {
        Ok(outcome) => {
            let exit = match &outcome {
                Outcome::Paid(_) => Exit::Paid,
                Outcome::Declined { problem, .. } => {
                    let why = problem
                        .as_ref()
                        .map(|p| p.detail.clone().unwrap_or_else(|| p.title.clone()))
                        .unwrap_or_else(|| "the payment is FALLIDA".into());
                    eprintln!("pagos: declined: {why}");
                    Exit::Declined
                }
                Outcome::Pending(p) if p.state == PaymentState::RevisionManual => {
                    eprintln!(
                        "pagos: payment {} is REVISION_MANUAL: the server could not settle it and waits for its on-call engineers, who decide whether it was paid; `pagos pay --resume` learns their answer once they have given it",
                        p.id
                    );
                    Exit::Pending
                }
                Outcome::Pending(p) => {
                    eprintln!(
                        "pagos: payment {} is still {} at the deadline; the server settles it, and `pagos pay --resume` learns how",
                        p.id, p.state
                    );
                    Exit::Pending
                }
            };
            print(&render(key, &outcome, json));
            exit
        }
        Err(err) => {
            eprintln!("pagos: {err}");
            for field in err.problem().map(field_errors).unwrap_or_default() {
                eprintln!("pagos:   {}: {}", field.campo, field.detalle);
            }
            let kept = matches!(journal.get(key).await, Ok(Some(_)));
            match &err {
                PayError::KeyReused { .. }
                | PayError::Blocked { .. }
                | PayError::Expired { .. }
                | PayError::Lost { .. }
                    if kept =>
                {
                    eprintln!(
                        "pagos: intent {key} stays in the journal and is not retried; once you know what it paid, `pagos pay --forget {key}`"
                    );
                }
                // The request may have reached pagos (a proxy that answers its own
                // timeout with a redirect); `--resume` sends to the URL the intent was
                // made at, which redirects until someone fixes it.
                PayError::Redirected { .. } if kept => eprintln!(
                    "pagos: intent {key} stays in the journal: the request may have reached pagos; `pagos pay --resume` retries it with the same key once its URL reaches pagos again; or look the payment up (`GET /v1/pagos?creditoId=`) and, once you know it was not made, `pagos pay --forget {key}` and pay at the URL pagos answers at"
                ),
                _ if kept => eprintln!(
                    "pagos: intent {key} stays in the journal; `pagos pay --resume` retries it with the same key"
                ),
                _ => {}
            }
            // A payment the server holds whose state could not be read is pending as far
            // as anyone knows, as one read pending is: never "failed".
            if matches!(err, PayError::Unread { .. }) {
                Exit::Pending
            } else {
                Exit::Failed
            }
        }
    }
}

/// The offending fields a validation refusal lists under `errores`.
fn field_errors(problem: &Problem) -> Vec<FieldError> {
    problem
        .extensions
        .get("errores")
        .cloned()
        .and_then(|errores| serde_json::from_value(errores).ok())
        .unwrap_or_default()
}

fn print(text: &str) {
    // A closed stdout (`| head`) must not turn a payment into a panic.
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// The payment as an aligned table, or as the contract's JSON on one line.
pub fn render(key: &IntentKey, outcome: &Outcome, json: bool) -> String {
    let p = outcome.payment();
    if json {
        return serde_json::to_string(p).unwrap_or_default();
    }
    let amount = match Currency::parse(&p.currency) {
        Some(currency) => format!("{} ({})", p.amount, money(p.amount, currency)),
        None => format!("{} {}", p.amount, p.currency),
    };
    let mut rows = vec![
        ("idempotencyKey", key.to_string()),
        ("id", p.id.to_string()),
        ("estado", p.state.to_string()),
        ("creditoId", p.credit_id.clone()),
        ("monto", amount),
    ];
    if let Some(d) = &p.description {
        rows.push(("descripcion", d.clone()));
    }
    if let Some(method) = &p.payment_method {
        rows.push(("medioPago", method.id.clone()));
    }
    rows.push(("gatewayRef", p.gateway_ref.clone().unwrap_or_default()));
    if let Outcome::Declined {
        problem: Some(problem),
        ..
    } = outcome
        && let Some(code) = problem
            .extensions
            .get("declineCode")
            .and_then(|c| c.as_str())
    {
        rows.push(("declineCode", code.to_owned()));
    }
    rows.push(("creadoEn", p.created_at.clone()));
    rows.push(("actualizadoEn", p.updated_at.clone()));
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(label, value)| format!("{label:<width$}  {value}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Minor units as the major unit with the currency's decimals: 250000 COP → `2500.00 COP`.
pub fn money(minor: i64, currency: Currency) -> String {
    let exponent = u32::from(currency.exponent());
    let code = currency.code();
    if exponent == 0 {
        return format!("{minor} {code}");
    }
    let scale = 10i64.pow(exponent);
    let sign = if minor < 0 { "-" } else { "" };
    let minor = minor.unsigned_abs();
    let scale = scale.unsigned_abs();
    format!(
        "{sign}{}.{:0width$} {code}",
        minor / scale,
        minor % scale,
        width = exponent as usize
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `pay` as a program of its own, the way `pagos` mounts it as a subcommand.
    #[derive(Debug, Parser)]
    struct Pay {
        #[command(flatten)]
        args: PayArgs,
    }

    fn parse(args: &[&str]) -> Result<PayArgs, clap::Error> {
        let all = ["pay"].iter().chain(args.iter()).copied();
        Pay::try_parse_from(all).map(|pay| pay.args)
    }

    const PAY: [&str; 10] = [
        "--url",
        "http://127.0.0.1:8080",
        "--api-key",
        "sk_test_acme",
        "--credito",
        "42",
        "--monto",
        "250000",
        "--moneda",
        "cop",
    ];

    #[test]
    fn the_contracts_command_line_parses_with_its_defaults() {
        let args = parse(&PAY).expect("parses");
        assert_eq!(args.monto, Some(250_000));
        assert_eq!(args.moneda.as_deref(), Some("COP"));
        assert_eq!(args.deadline, Duration::from_secs(120));
        assert_eq!(args.max_attempts, 10);
        assert!(!args.resume && !args.json);
    }

    /// A row this client cannot read (another version's, or damaged) blocks every command
    /// that lists the journal: `--forget` still lets it go by its key.
    #[tokio::test]
    async fn forget_lets_go_of_a_row_this_client_cannot_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.db");
        let journal = Journal::open(&path).await.expect("journal");
        let intent = Intent::new(PaymentRequest::new("42", 250_000, "COP").expect("valid"));
        let url = url::Url::parse("http://127.0.0.1:8080/").expect("url");
        journal
            .record(&intent, &url, "sk_test_acme")
            .await
            .expect("recorded");
        let raw = rusqlite::Connection::open(&path).expect("open");
        raw.execute(
            "UPDATE pending_intents SET body = '{\"monto\": \"much\"}'",
            [],
        )
        .expect("damaged");
        assert!(
            journal.pending().await.is_err(),
            "the journal cannot be listed"
        );
        let key = intent.key().to_string();
        let journal_path = path.to_str().expect("utf-8");

        let exit = run(parse(&["--forget", &key, "--journal", journal_path]).expect("parses"))
            .await
            .expect("ran");

        assert_eq!(format!("{exit:?}"), format!("{:?}", ExitCode::from(0)));
        assert!(journal.pending().await.expect("listed again").is_empty());
    }

    #[test]
    fn resume_needs_only_the_api_key() {
        let args = parse(&["--resume", "--api-key", "sk_test_acme"]).expect("parses");
        assert!(args.resume);
        assert!(parse(&["--forget", "k-1"]).is_ok());
    }

    #[test]
    fn new_is_for_a_payment_only() {
        let mut args = PAY.to_vec();
        args.push("--new");
        assert!(parse(&args).expect("parses").new);
        assert!(parse(&["--resume", "--new", "--api-key", "sk_test_acme"]).is_err());
        assert!(parse(&["--forget", "k-1", "--new"]).is_err());
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_flag() {
        for (flag, value) in [
            ("--monto", "0"),
            ("--monto", "12.5"),
            ("--moneda", "XXX"),
            ("--credito", ""),
            ("--deadline", "soon"),
            ("--deadline", "300000000000y"),
            ("--request-timeout", "400days"),
            ("--retry-max-delay", "18446744073709551615s"),
            ("--key-retention", "1000years"),
            ("--url", "ftp://x"),
            ("--medio-pago", "{\"id\":\"pm 1\"}"),
            ("--medio-pago", "{\"id\":\"visa\",\"cuotas\":0}"),
        ] {
            let mut args = PAY.to_vec();
            args.extend([flag, value]);
            let err = parse(&args).expect_err("refused");
            let shown = err.render().to_string();
            assert!(shown.contains(flag), "{flag} {value}: {shown}");
        }
    }

    #[test]
    fn the_payment_method_is_the_contracts_json_or_a_bare_id() {
        let mut args = PAY.to_vec();
        args.extend([
            "--medio-pago",
            r#"{"id":"visa","token":"ff8080814c11e237014c1ff593b57b4d","cuotas":3,"email":"payer@example.com"}"#,
        ]);
        let method = parse(&args).expect("parses").medio_pago.expect("a method");
        assert_eq!(method.id, "visa");
        assert_eq!(method.installments, Some(3));
        assert_eq!(method.payer_email.as_deref(), Some("payer@example.com"));
        for bare in [
            "pm_1Q0PsIJvEtkwdCNYMSaVuRz6",
            "\"pm_1Q0PsIJvEtkwdCNYMSaVuRz6\"",
        ] {
            let mut args = PAY.to_vec();
            args.extend(["--medio-pago", bare]);
            let method = parse(&args).expect("parses").medio_pago.expect("a method");
            assert_eq!(
                method,
                PaymentMethod::with_id("pm_1Q0PsIJvEtkwdCNYMSaVuRz6")
            );
        }
    }

    #[test]
    fn the_api_key_is_never_shown_by_the_parsed_flags() {
        let args = parse(&["--resume", "--api-key", "sk_live_cli_8d2f6a"]).expect("parses");
        assert!(!format!("{args:?}").contains("sk_live_cli_8d2f6a"));
    }

    #[test]
    fn exit_codes_are_the_contracts_and_the_worst_wins() {
        let codes: Vec<u8> = [Exit::Paid, Exit::Declined, Exit::Pending, Exit::Failed]
            .into_iter()
            .map(Exit::code)
            .collect();
        assert_eq!(codes, [0, 3, 4, 1]);
        assert_eq!(Exit::Paid.max(Exit::Declined), Exit::Declined);
        assert_eq!(Exit::Pending.max(Exit::Declined), Exit::Pending);
        assert_eq!(Exit::Pending.max(Exit::Failed), Exit::Failed);
    }

    #[test]
    fn money_is_shown_in_major_units_with_the_currencys_decimals() {
        let cop = Currency::parse("COP").expect("COP");
        let clp = Currency::parse("CLP").expect("CLP");
        assert_eq!(money(250_000, cop), "2500.00 COP");
        assert_eq!(money(5, cop), "0.05 COP");
        assert_eq!(money(250_000, clp), "250000 CLP");
    }

    #[test]
    fn the_table_is_aligned_and_json_is_the_payment() {
        let payment: crate::Pago = serde_json::from_value(serde_json::json!({
            "id": "0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b", "creditoId": "42", "monto": 250000,
            "moneda": "COP", "estado": "COMPLETADA", "gatewayRef": "ch_1",
            "creadoEn": "2026-01-01T00:00:00.000Z", "actualizadoEn": "2026-01-01T00:00:01.000Z"
        }))
        .expect("payment");
        let key = IntentKey::parse("k-1").expect("key");
        let outcome = Outcome::Paid(payment);
        let table = render(&key, &outcome, false);
        assert!(table.contains("estado          COMPLETADA"), "{table}");
        assert!(
            table.contains("monto           250000 (2500.00 COP)"),
            "{table}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&key, &outcome, true)).expect("json");
        assert_eq!(json["estado"], "COMPLETADA");
        assert_eq!(json["gatewayRef"], "ch_1");
    }
}
