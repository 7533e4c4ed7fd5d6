//! Typed settings: every flag of the CLI, each also read from a `PAGOS_…` env var.
//!
//! A bad setting must stop the process at start with one line naming it (exit 2), never
//! surface later as a confusing runtime error.

use crate::merchants::name::MerchantName;

/// The database settings every command that opens one flattens in (defined by `db`, which
/// opens it).
pub use crate::db::DatabaseArgs;
use clap::{Args, Parser, Subcommand, ValueEnum};
use secrecy::{ExposeSecret, SecretString};
use std::net::SocketAddr;
use std::time::Duration;

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}; expected a duration such as 250ms, 30s or 24h"))
        .and_then(crate::domain::at_most_a_century)
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be greater than zero".into()),
        d => Ok(d),
    }
}

/// A gateway's base URL: `http://` or `https://` and a host (`gateway:8090` alone would
/// parse as a URL whose scheme is `gateway`, and every call would fail at run time).
fn gateway_url(s: &str) -> Result<url::Url, String> {
    let refused = |why: &str| {
        format!(
            "{:?} is not an http:// or https:// URL with a host ({why}); expected https://host[:port]",
            shown_url(s)
        )
    };
    let url = url::Url::parse(s).map_err(|e| refused(&e.to_string()))?;
    // A user or password in it: refused by `Settings::validate`, which does not print it
    // (an error here is printed with the value).
    if !url.username().is_empty() || url.password().is_some() {
        return Ok(url);
    }
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused(&format!("its scheme is {}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refused("no host"));
    }
    // Every path is appended to the URL as written: a query or a fragment would send each
    // call to the gateway's root (`/?tenant=1/v1/charges`), where its 404 reads as a
    // decline.
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refused("it has a query or a fragment"));
    }
    Ok(url)
}

/// A URL as a refusal may print it, whether or not it parses: a user and password (before
/// the last `@` of its authority) as `***`, its query and fragment as `?…`: a password or
/// a token there must not reach the logs with the refusal.
pub fn shown_url(raw: &str) -> String {
    let (rest, cut) = match raw.find(['?', '#']) {
        Some(at) => (&raw[..at], "?…"),
        None => (raw, ""),
    };
    let (scheme, after) = match rest.find("://") {
        Some(at) => (&rest[..at + 3], &rest[at + 3..]),
        None => ("", rest),
    };
    let authority_end = after.find('/').unwrap_or(after.len());
    let (authority, path) = after.split_at(authority_end);
    let host = match authority.rfind('@') {
        Some(at) => format!("***@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    format!("{scheme}{host}{path}{cut}")
}

/// `PAGOS_MERCADOPAGO_MONEDA`: one of the currencies Mercado Pago charges in.
fn mercadopago_currency(s: &str) -> Result<String, String> {
    let currencies = pagos_types::request::MERCADOPAGO_CURRENCIES;
    if currencies.contains(&s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a currency Mercado Pago charges in; expected one of {}",
            currencies.join(", ")
        ))
    }
}

/// A header timeout: positive, and at most an hour (a longer one protects nothing, and
/// hyper adds it to the clock of every connection).
fn header_timeout(s: &str) -> Result<Duration, String> {
    match positive_duration(s)? {
        d if d > Duration::from_secs(3600) => Err("must be at most 1h".into()),
        d => Ok(d),
    }
}

/// `PAGOS_STALE_AFTER`: positive, and at most the reconciler's longest wait between two
/// looks (`saga::backoff::LONGEST`, an hour), which a longer value would be cut to.
fn stale_after(s: &str) -> Result<Duration, String> {
    let longest = crate::saga::backoff::LONGEST;
    match positive_duration(s)? {
        d if d > longest => Err(format!(
            "must be at most {}: the reconciler's wait between two looks at a payment is capped there (then ±20 %), so a longer value would be cut to it",
            humantime::format_duration(longest)
        )),
        d => Ok(d),
    }
}

/// A setting that holds a secret: redacted in `Debug`, wiped from memory when dropped.
pub(crate) fn secret(s: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(s))
}

/// A secret setting's value, for the one place that uses it.
pub fn exposed(secret: &Option<SecretString>) -> Option<&str> {
    secret.as_ref().map(ExposeSecret::expose_secret)
}

fn merchant_name(s: &str) -> Result<MerchantName, String> {
    MerchantName::parse(s).map_err(|e| e.to_string())
}

fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("expected a rate between 0 and 1, such as 0.1".into()),
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "pagos",
    version,
    about = "Payments through external gateways, safe to retry",
    long_about = "Payments through external gateways, safe to retry.\n\nEvery flag can also be \
                  set with the environment variable shown next to it."
)]
pub struct Cli {
    /// Log format on stderr (RUST_LOG filters what is logged; colour only when stderr is a
    /// terminal, never with NO_COLOR set)
    #[arg(long, env = "PAGOS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending migrations, then serve the HTTP API, the reconciler and the key reaper
    Serve(Box<Settings>),
    /// Apply pending migrations and exit
    Migrate(DatabaseArgs),
    /// Manage merchants
    Merchants {
        #[command(subcommand)]
        action: MerchantsCommand,
    },
    /// One reconciliation pass over due payments; prints the report as JSON
    Reconcile(ReconcileArgs),
    /// Run the sandbox gateway (the reference protocol, from memory) as an HTTP server
    SandboxGateway(SandboxArgs),
    /// Make one payment with the retrying client (one key per intent, kept in a journal)
    Pay(Box<pagos_client::cli::PayArgs>),
    /// Refund part or all of a payment with the retrying client (one key per refund, kept in a journal)
    Refund(Box<pagos_client::refund_cli::RefundArgs>),
    /// Manage operators: the people of on-call, their tokens and roles
    Operators {
        #[command(subcommand)]
        action: OperatorsCommand,
    },
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Run one pass and exit (the only mode; the periodic reconciler runs inside `serve`)
    #[arg(long, required = true, env = "PAGOS_RECONCILE_ONCE")]
    pub once: bool,
    /// Who runs the pass, as the audit trail of on-call's actions records it: an operator
    /// of `pagos operators list`, not revoked, with the role operador; unset: `cli:` and
    /// the login name (USER, else LOGNAME)
    #[arg(long, env = "PAGOS_OPERATOR", value_name = "NAME",
          value_parser = |s: &str| crate::operators::OperatorName::parse_new(s))]
    pub operador: Option<crate::operators::OperatorName>,
    #[command(flatten)]
    pub settings: Box<Settings>,
}

/// Who runs a pass by hand, as its audit row will name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RanBy {
    /// `--operador`: an operator of the operators table, checked before the pass.
    Operator(crate::operators::OperatorName),
    /// Unnamed: `cli:` and the login name (`cli` alone without one). The `:` keeps it
    /// apart from every operator's name, which cannot hold one.
    Login(String),
}

impl ReconcileArgs {
    /// Who the pass's audit row names: `--operador`, else the login it ran under.
    pub fn operator(&self) -> RanBy {
        match &self.operador {
            Some(name) => RanBy::Operator(name.clone()),
            None => RanBy::Login(cli_operator(
                ["USER", "LOGNAME"]
                    .iter()
                    .find_map(|var| std::env::var(var).ok()),
            )),
        }
    }
}

/// `cli:` and `login` (trimmed, cut to an operator name's length), or `cli` without one.
fn cli_operator(login: Option<String>) -> String {
    match login.as_deref().map(str::trim) {
        Some(login) if !login.is_empty() => {
            let kept = crate::operators::MAX_NAME_CHARS - "cli:".len();
            format!("cli:{}", login.chars().take(kept).collect::<String>())
        }
        _ => "cli".to_owned(),
    }
}

#[derive(Debug, Subcommand)]
pub enum MerchantsCommand {
    /// Create a merchant and print its first API key once (only a hash of it is stored)
    Add(MerchantAddArgs),
    /// List merchants: name, id, created, active keys
    List(MerchantListArgs),
    /// Add, list and revoke a merchant's API keys
    Keys {
        #[command(subcommand)]
        action: KeysCommand,
    },
}

#[derive(Debug, Args)]
pub struct MerchantAddArgs {
    /// The merchant's name: unique, trimmed, at most 64 printable characters
    #[arg(value_parser = merchant_name)]
    pub name: MerchantName,
    /// Use this API key instead of a generated one (a bearer token; a warning is printed
    /// when it is shorter than 24 characters or under 128 bits of apparent entropy)
    #[arg(long, env = "PAGOS_MERCHANT_API_KEY", hide_env_values = true, value_name = "KEY",
          value_parser = secret)]
    pub api_key: Option<SecretString>,
    #[command(flatten)]
    pub key_kind: KeyKindArgs,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct MerchantListArgs {
    /// Print JSON (an array) instead of a table
    #[arg(long, env = "PAGOS_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Generate a new API key for a merchant and print it once (its other keys keep working)
    Add(KeyAddArgs),
    /// A merchant's keys: prefix, created, last used (to the minute), expiry, state
    List(KeyListArgs),
    /// Revoke one of a merchant's keys, named by its prefix: every pagos process refuses it
    /// within 5 seconds
    Revoke(KeyRevokeArgs),
}

#[derive(Debug, Args)]
pub struct KeyAddArgs {
    /// The merchant's name
    #[arg(value_parser = merchant_name)]
    pub name: MerchantName,
    /// The key stops working this long from now (unset: it works until revoked)
    #[arg(long, env = "PAGOS_EXPIRA", value_parser = positive_duration, value_name = "DURATION")]
    pub expira: Option<Duration>,
    #[command(flatten)]
    pub key_kind: KeyKindArgs,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct KeyListArgs {
    /// The merchant's name
    #[arg(value_parser = merchant_name)]
    pub name: MerchantName,
    /// Print JSON (an array) instead of a table
    #[arg(long, env = "PAGOS_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct KeyRevokeArgs {
    /// The merchant's name
    #[arg(value_parser = merchant_name)]
    pub name: MerchantName,
    /// The key's prefix, as `pagos merchants keys list NAME` shows it
    pub prefix: String,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Which kind of key to generate: `sk_test_` when this database's payments go through the
/// sandbox, `sk_live_` otherwise. The gateway the database is pinned to (recorded by the
/// first `pagos serve` or `pagos reconcile`) decides; this setting only until then.
#[derive(Clone, Debug, Args)]
pub struct KeyKindArgs {
    /// Gateway this database will charge through (sandbox, http, stripe, mercadopago), for
    /// a database no `pagos serve` has used yet (afterwards the database's own gateway
    /// decides): sandbox gives sk_test_ keys, any other sk_live_ keys
    #[arg(long, env = "PAGOS_GATEWAY", value_enum, default_value_t = GatewayKind::Sandbox,
          hide_possible_values = true)]
    pub gateway: GatewayKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GatewayKind {
    /// In-process sandbox: answers at once and charges successfully
    Sandbox,
    /// The reference protocol over HTTP at --gateway-url
    Http,
    /// Stripe PaymentIntents (--gateway-url defaults to https://api.stripe.com)
    Stripe,
    /// Mercado Pago payments (--gateway-url defaults to https://api.mercadopago.com)
    #[value(name = "mercadopago")]
    MercadoPago,
}

impl GatewayKind {
    /// What this gateway needs in a payment request (checked before anything is stored).
    pub fn needs(self) -> crate::domain::GatewayNeeds {
        use crate::domain::GatewayNeeds;
        match self {
            GatewayKind::Sandbox | GatewayKind::Http => GatewayNeeds::Nothing,
            GatewayKind::Stripe => GatewayNeeds::Stripe,
            GatewayKind::MercadoPago => GatewayNeeds::MercadoPago,
        }
    }

    /// The longest the provider documents remembering an idempotency key (None: the
    /// reference protocol and the sandbox, which say nothing, and where the setting is
    /// the operator's to know). Mercado Pago documents none: pagos assumes one hour and
    /// never more.
    pub fn documented_key_window(self) -> Option<Duration> {
        match self {
            GatewayKind::Sandbox | GatewayKind::Http => None,
            GatewayKind::Stripe => Some(crate::gateway::stripe::KEY_WINDOW),
            GatewayKind::MercadoPago => Some(crate::gateway::mercadopago::KEY_WINDOW),
        }
    }

    /// Whether the provider's refunds carry pagos' refund id, so that its look-up finds a
    /// refund whose own id pagos never learnt (an answer lost). Mercado Pago's carry none:
    /// its look-up finds a refund only by the id its answer gave.
    pub fn refunds_carry_reference(self) -> bool {
        !matches!(self, GatewayKind::MercadoPago)
    }

    /// The name used in settings and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayKind::Sandbox => "sandbox",
            GatewayKind::Http => "http",
            GatewayKind::Stripe => "stripe",
            GatewayKind::MercadoPago => "mercadopago",
        }
    }
}

/// Everything `pagos serve` needs.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Address the HTTP API listens on
    #[arg(
        long,
        env = "PAGOS_BIND",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub bind: SocketAddr,
    /// Which gateway to charge through
    #[arg(long, env = "PAGOS_GATEWAY", value_enum, default_value_t = GatewayKind::Sandbox)]
    pub gateway: GatewayKind,
    /// Gateway base URL (required by --gateway http; stripe and mercadopago default to the
    /// provider's production API)
    #[arg(long, env = "PAGOS_GATEWAY_URL", value_name = "URL", value_parser = gateway_url,
          default_value_ifs = [
              ("gateway", "stripe", Some(crate::gateway::stripe::PRODUCTION_URL)),
              ("gateway", "mercadopago", Some(crate::gateway::mercadopago::PRODUCTION_URL)),
          ])]
    pub gateway_url: Option<url::Url>,
    /// Secret sent to the gateway as a bearer token (required by stripe: the secret key
    /// sk_…; by mercadopago: the access token)
    #[arg(
        long,
        env = "PAGOS_GATEWAY_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub gateway_secret: Option<SecretString>,
    /// Timeout of one gateway call
    #[arg(long, env = "PAGOS_GATEWAY_TIMEOUT", default_value = "10s", value_parser = positive_duration, value_name = "DURATION")]
    pub gateway_timeout: Duration,
    /// Retries of one gateway call (exponential backoff with jitter, same gateway key)
    #[arg(long, env = "PAGOS_GATEWAY_RETRIES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=10), value_name = "N")]
    pub gateway_retries: u32,
    /// How long the gateway honours a key: resending with it is safe inside this window
    /// (default 24h; 24h for stripe; 1h for mercadopago, which does not document it)
    #[arg(long, env = "PAGOS_GATEWAY_KEY_WINDOW", default_value = "24h", value_parser = positive_duration, value_name = "DURATION",
          default_value_ifs = [("gateway", "mercadopago", Some("1h"))])]
    pub gateway_key_window: Duration,
    /// Bearer token of the admin endpoints (unset: they answer 401)
    #[arg(
        long,
        env = "PAGOS_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        value_parser = secret
    )]
    pub admin_token: Option<SecretString>,
    /// Secret gateway webhooks are signed with (unset: webhooks answer 401)
    #[arg(
        long,
        env = "PAGOS_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub webhook_secret: Option<SecretString>,
    /// Stripe's webhook signing secret (whsec_…) for /v1/webhooks/stripe (unset: it
    /// answers 401)
    #[arg(
        long,
        env = "PAGOS_STRIPE_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub stripe_webhook_secret: Option<SecretString>,
    /// Mercado Pago's webhook secret for /v1/webhooks/mercadopago (unset: it answers 401;
    /// needs --gateway mercadopago, whose API tells the payment's state)
    #[arg(
        long,
        env = "PAGOS_MERCADOPAGO_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub mercadopago_webhook_secret: Option<SecretString>,
    /// The currency Mercado Pago charges the account in (ARS, BRL, CLP, COP, MXN, PEN or
    /// UYU: its country's); unset, pagos asks Mercado Pago once (GET /users/me). Payments
    /// in another currency are refused (422): Mercado Pago would charge their amount in
    /// the account's currency
    #[arg(long, env = "PAGOS_MERCADOPAGO_MONEDA", value_parser = mercadopago_currency, value_name = "CURRENCY")]
    pub mercadopago_moneda: Option<String>,
    /// Period of the background reconciler
    #[arg(long, env = "PAGOS_RECONCILE_EVERY", default_value = "10s", value_parser = positive_duration, value_name = "DURATION")]
    pub reconcile_every: Duration,
    /// A non-terminal payment is due for reconciliation after this long (at most 1h; the
    /// base of the reconciler's backoff)
    #[arg(long, env = "PAGOS_STALE_AFTER", default_value = "30s", value_parser = stale_after, value_name = "DURATION")]
    pub stale_after: Duration,
    /// Idempotency keys of finished payments are kept this long
    #[arg(long, env = "PAGOS_KEY_RETENTION", default_value = "24h", value_parser = positive_duration, value_name = "DURATION")]
    pub key_retention: Duration,
    /// Lease of an in-flight request on its key (must exceed timeout × tries)
    #[arg(long, env = "PAGOS_LEASE", default_value = "60s", value_parser = positive_duration, value_name = "DURATION")]
    pub lease: Duration,
    /// Unresolved this long → REVISION_MANUAL (at least PAGOS_STALE_AFTER)
    #[arg(long, env = "PAGOS_GIVE_UP_AFTER", default_value = "24h", value_parser = positive_duration, value_name = "DURATION")]
    pub give_up_after: Duration,
    /// Processed webhook ids are kept this long (duplicates older than this are not
    /// caught); at least 10m, twice the 5-minute signature tolerance
    #[arg(long, env = "PAGOS_MESSAGE_RETENTION", default_value = "7d", value_parser = positive_duration, value_name = "DURATION")]
    pub message_retention: Duration,
    /// The key reaper deletes at most this many rows per statement, and pauses between
    /// two statements as long as the last one took
    #[arg(long, env = "PAGOS_PURGE_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000), value_name = "N")]
    pub purge_batch: u64,
    /// Concurrent provider look-ups of one reconciliation pass
    #[arg(long, env = "PAGOS_RECONCILE_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024), value_name = "N")]
    pub reconcile_concurrency: u32,
    /// Largest `monto` accepted, in minor units of any currency (1 to 9007199254740991,
    /// 2^53 − 1); above it, or above the gateway's own maximum for the currency, a payment
    /// is refused with 422 before anything is stored
    #[arg(long = "max-monto", env = "PAGOS_MAX_MONTO", default_value_t = DEFAULT_MAX_AMOUNT,
          value_parser = clap::value_parser!(i64).range(1..=crate::domain::MAX_SAFE_AMOUNT),
          value_name = "MINOR_UNITS")]
    pub max_amount: i64,
    /// A connection that has not sent a whole request head within this is closed (also
    /// the longest a keep-alive connection may stay idle between requests, and the
    /// longest a webhook's or console login's body may take to arrive: 408)
    #[arg(long, env = "PAGOS_HEADER_TIMEOUT", default_value = "10s", value_parser = header_timeout, value_name = "DURATION")]
    pub header_timeout: Duration,
    /// No request is held longer than this: it is answered 503 request-timeout, and a
    /// payment it started goes on (default above PAGOS_LEASE, which bounds the gateway work
    /// of a payment request)
    #[arg(long, env = "PAGOS_REQUEST_TIMEOUT", default_value = "70s", value_parser = positive_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
    /// Requests served at once; past it new ones are answered 503 overloaded at once
    /// (/healthz and /metrics are never refused)
    #[arg(long, env = "PAGOS_MAX_IN_FLIGHT", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), value_name = "N")]
    pub max_in_flight: u32,
    /// Serve /admin/*, /consola/* and /metrics only on this address, not on PAGOS_BIND
    /// (unset: everything on PAGOS_BIND)
    #[arg(long, env = "PAGOS_ADMIN_BIND", value_name = "ADDR")]
    pub admin_bind: Option<SocketAddr>,
    /// How often the gauges of stored state (payments by state, oldest unsettled age,
    /// database up) are read from the database; a scrape of /metrics only reads memory
    #[arg(long, env = "PAGOS_METRICS_REFRESH", default_value = "15s", value_parser = positive_duration, value_name = "DURATION")]
    pub metrics_refresh: Duration,
    /// Memory for frozen answers kept to serve replays without the database, in MiB
    /// (0: every replay reads the database); an answer is dropped a minute before its key
    /// may be purged
    #[arg(long, env = "PAGOS_REPLAY_CACHE_MIB", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(0..=65_536), value_name = "MIB")]
    pub replay_cache_mib: u64,
    /// How often the process records its key retention and reads the other processes'
    /// (`idempotency::cache::REFRESH`); hidden: shorter only in tests, and the same in every
    /// process of a deployment (a reaper waits two and a half of its own periods for the
    /// others to read its retention)
    #[arg(long, env = "PAGOS_RETENTION_REFRESH", hide = true, default_value = "60s", value_parser = positive_duration, value_name = "DURATION")]
    pub retention_refresh: Duration,
    /// Failed authentications (API key or admin token) one client address may make in a
    /// minute; past it, its requests get 429 with Retry-After before any key is looked up
    #[arg(long, env = "PAGOS_AUTH_FAILURES_PER_MINUTE", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), value_name = "N")]
    pub auth_failures_per_minute: u32,
    /// Deliveries to merchants' endpoints (PAGOS_WEBHOOKS_*)
    #[command(flatten)]
    pub webhooks: crate::delivery::WebhookSettings,
    /// A charge found for a payment answered FALLIDA (an orphan charge): `refund` it in
    /// full through the refund saga, or send the payment to REVISION_MANUAL (`review`)
    #[arg(long, env = "PAGOS_ORPHAN_CHARGES", value_enum,
          default_value_t = crate::saga::refund::OrphanCharges::Refund)]
    pub orphan_charges: crate::saga::refund::OrphanCharges,
    /// On SIGTERM or Ctrl-C, how long the process goes on serving as before while /readyz
    /// answers 503, so that a load balancer sends new requests elsewhere before the
    /// listener closes (0s: it closes at once); PAGOS_SHUTDOWN_GRACE follows. A Ctrl-C
    /// after the first signal stops the process at once
    #[arg(long, env = "PAGOS_DRAIN_DELAY", default_value = "0s", value_parser = duration, value_name = "DURATION")]
    pub drain_delay: Duration,
    /// On SIGTERM or Ctrl-C, how long requests and the sagas they started may still run;
    /// what is still running then is left to the reconciler (its payments stay ENVIADA or
    /// EN_PROCESO, which is what a crash leaves too)
    #[arg(long, env = "PAGOS_SHUTDOWN_GRACE", default_value = "25s", value_parser = positive_duration, value_name = "DURATION")]
    pub shutdown_grace: Duration,
}

/// Added to a send's worst case when a payment is held for it (`Settings::send_hold`).
pub const SEND_MARGIN: Duration = Duration::from_secs(5);

/// `PAGOS_MAX_MONTO`'s default: twelve digits, the most any gateway pagos speaks to
/// documents for one charge (Stripe, card payments), so by default nothing a provider
/// could charge is refused, while a runaway value (an id or a timestamp pasted into
/// `monto`, a scale applied twice) is. README, "Settings", says how to choose one.
pub const DEFAULT_MAX_AMOUNT: i64 = 999_999_999_999;

/// A setting that is well-formed alone but wrong with the others, or that the host
/// refuses (an address pagos cannot listen on).
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {env} (--{flag}): {message}")]
pub struct SettingError {
    pub env: &'static str,
    pub flag: &'static str,
    pub message: String,
}

impl SettingError {
    /// The address `addr` of the setting `env` (`--flag`) could not be listened on:
    /// `err`, and what it usually means.
    pub fn cannot_listen(
        env: &'static str,
        flag: &'static str,
        addr: SocketAddr,
        err: &std::io::Error,
    ) -> SettingError {
        use std::io::ErrorKind;
        let meaning = match err.kind() {
            ErrorKind::AddrInUse => " (another process listens on that port)",
            ErrorKind::AddrNotAvailable => " (no interface of this host has that address)",
            ErrorKind::PermissionDenied => " (a port below 1024 needs privileges)",
            _ => "",
        };
        SettingError {
            env,
            flag,
            message: format!("cannot listen on {addr}: {err}{meaning}"),
        }
    }
}

impl Settings {
    pub fn retry_policy(&self) -> crate::gateway::retry::RetryPolicy {
        crate::gateway::retry::RetryPolicy::new(self.gateway_retries as usize)
    }

    /// How long one send of a payment can take — every try, every backoff — plus a margin
    /// for the database writes around it: a send starts only from a write that holds the
    /// payment this long, so nobody else can take it before the send is over.
    pub fn send_hold(&self) -> Duration {
        self.send_lasts() + SEND_MARGIN
    }

    /// How long one send of a payment can take, every try and every backoff.
    pub fn send_lasts(&self) -> Duration {
        self.retry_policy().worst_case(self.gateway_timeout)
    }

    /// The provider account and mode the gateway secret speaks for, where the secret says:
    /// a Stripe key names its mode (`sk_live_`/`rk_live_`, `sk_test_`/`rk_test_`), a
    /// Mercado Pago access token its mode (`APP_USR-`, `TEST-`) and, last, the seller's user
    /// id. None where it says nothing (the sandbox, the reference protocol, another form).
    /// Recorded by the first process that uses a database, and checked by every later one:
    /// a payment left in flight looked up in another account (or mode) is found nowhere
    /// and sent again there.
    pub fn gateway_account(&self) -> Option<String> {
        let secret = self.gateway_secret.as_ref()?.expose_secret();
        match self.gateway {
            GatewayKind::Stripe => {
                let mode = ["sk_", "rk_"]
                    .iter()
                    .filter_map(|kind| secret.strip_prefix(kind))
                    .find_map(|rest| {
                        ["live", "test"].into_iter().find(|mode| {
                            rest.strip_prefix(mode).is_some_and(|r| r.starts_with('_'))
                        })
                    })?;
                Some(format!("{mode} mode"))
            }
            GatewayKind::MercadoPago => {
                let (mode, rest) = if let Some(rest) = secret.strip_prefix("APP_USR-") {
                    ("production", rest)
                } else {
                    ("test", secret.strip_prefix("TEST-")?)
                };
                let seller = rest.rsplit('-').next().filter(|id| {
                    rest.contains('-') && !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())
                });
                Some(match seller {
                    Some(id) => format!("{mode} mode, seller {id}"),
                    None => format!("{mode} mode"),
                })
            }
            GatewayKind::Sandbox | GatewayKind::Http => None,
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), SettingError> {
        self.validate_secrets()?;
        // A real gateway's URL or secret with the sandbox (the default): a forgotten or
        // misspelt PAGOS_GATEWAY would answer every payment from the in-process sandbox,
        // COMPLETADA with no money moved.
        if self.gateway == GatewayKind::Sandbox {
            let given = [
                (self.gateway_url.is_some(), "PAGOS_GATEWAY_URL"),
                (self.gateway_secret.is_some(), "PAGOS_GATEWAY_SECRET"),
            ];
            if let Some((_, which)) = given.iter().find(|(set, _)| *set) {
                return Err(SettingError {
                    env: "PAGOS_GATEWAY",
                    flag: "gateway",
                    message: format!(
                        "is sandbox (the default) but {which} is set: the sandbox would answer every payment and no money would move; set PAGOS_GATEWAY to http, stripe or mercadopago, or unset {which}"
                    ),
                });
            }
        }
        if self
            .gateway_url
            .as_ref()
            .is_some_and(|url| !url.username().is_empty() || url.password().is_some())
        {
            // Not printed: what it carries is a secret.
            return Err(SettingError {
                env: "PAGOS_GATEWAY_URL",
                flag: "gateway-url",
                message: "has a user or password in it; give the URL without them, and the secret in PAGOS_GATEWAY_SECRET".into(),
            });
        }
        if self.gateway == GatewayKind::Http && self.gateway_url.is_none() {
            return Err(SettingError {
                env: "PAGOS_GATEWAY_URL",
                flag: "gateway-url",
                message: "required when PAGOS_GATEWAY=http".into(),
            });
        }
        let provider = matches!(self.gateway, GatewayKind::Stripe | GatewayKind::MercadoPago);
        if provider
            && self
                .gateway_secret
                .as_ref()
                .is_none_or(|s| s.expose_secret().is_empty())
        {
            return Err(SettingError {
                env: "PAGOS_GATEWAY_SECRET",
                flag: "gateway-secret",
                message: format!(
                    "required when PAGOS_GATEWAY={} ({})",
                    self.gateway.as_str(),
                    if self.gateway == GatewayKind::Stripe {
                        "the secret key, sk_…"
                    } else {
                        "the access token"
                    }
                ),
            });
        }
        if self.mercadopago_moneda.is_some() && self.gateway != GatewayKind::MercadoPago {
            return Err(SettingError {
                env: "PAGOS_MERCADOPAGO_MONEDA",
                flag: "mercadopago-moneda",
                message: "needs PAGOS_GATEWAY=mercadopago: it is the currency of the Mercado Pago account".into(),
            });
        }
        if self.mercadopago_webhook_secret.is_some() && self.gateway != GatewayKind::MercadoPago {
            return Err(SettingError {
                env: "PAGOS_MERCADOPAGO_WEBHOOK_SECRET",
                flag: "mercadopago-webhook-secret",
                message: "needs PAGOS_GATEWAY=mercadopago: a notification carries only an id, and the payment's state is asked from Mercado Pago's API".into(),
            });
        }
        let worst = self.retry_policy().worst_case(self.gateway_timeout);
        if self.lease <= worst {
            return Err(SettingError {
                env: "PAGOS_LEASE",
                flag: "lease",
                message: format!(
                    "{} must exceed the longest gateway call, {} (PAGOS_GATEWAY_TIMEOUT × tries plus backoff)",
                    humantime::format_duration(self.lease),
                    humantime::format_duration(round_ms(worst)),
                ),
            });
        }
        // A resend is safe only while the gateway surely remembers the key: never assume
        // it remembers longer than it documents.
        if let Some(documented) = self.gateway.documented_key_window()
            && self.gateway_key_window > documented
        {
            return Err(SettingError {
                env: "PAGOS_GATEWAY_KEY_WINDOW",
                flag: "gateway-key-window",
                message: format!(
                    "{} is longer than {} remembers an idempotency key ({}); a resend after that could charge twice",
                    humantime::format_duration(self.gateway_key_window),
                    self.gateway.as_str(),
                    humantime::format_duration(documented),
                ),
            });
        }
        if self.admin_bind == Some(self.bind) && self.bind.port() != 0 {
            return Err(SettingError {
                env: "PAGOS_ADMIN_BIND",
                flag: "admin-bind",
                message: format!(
                    "{} is also PAGOS_BIND; the admin door needs an address of its own",
                    self.bind
                ),
            });
        }
        // Kept as a second line of defence: a key reused after its purge gets a gateway
        // key of its own (its generation), and a retention at least as long as the
        // window keeps even a generation-less key from meeting a gateway that remembers.
        if self.key_retention < self.gateway_key_window {
            return Err(SettingError {
                env: "PAGOS_KEY_RETENTION",
                flag: "key-retention",
                message: format!(
                    "{} is shorter than PAGOS_GATEWAY_KEY_WINDOW ({}); keys must outlive the gateway's memory of them",
                    humantime::format_duration(self.key_retention),
                    humantime::format_duration(self.gateway_key_window),
                ),
            });
        }
        // A signed webhook is accepted while its timestamp is within the tolerance either
        // way, so its id must be remembered at least that long twice over: forgotten
        // sooner, a captured request could be replayed and applied again.
        let replay_window = Duration::from_secs(
            2 * u64::try_from(crate::webhooks::signature::TOLERANCE_SECS).unwrap_or(300),
        );
        if self.message_retention < replay_window {
            return Err(SettingError {
                env: "PAGOS_MESSAGE_RETENTION",
                flag: "message-retention",
                message: format!(
                    "{} is shorter than {}: a signed webhook is accepted up to 5 minutes either side of its timestamp, and its id must be remembered that long",
                    humantime::format_duration(self.message_retention),
                    humantime::format_duration(replay_window),
                ),
            });
        }
        self.validate_reconciler_horizons()
    }

    /// The reconciler's horizons against each other, as its decision table
    /// (`saga::reconcile::decide`) reads them: settings that would send every payment the
    /// gateway left unanswered to on-call before the reconciler could look at it twice.
    fn validate_reconciler_horizons(&self) -> Result<(), SettingError> {
        // Past PAGOS_GIVE_UP_AFTER a payment whose look-up finds it pending, finds nothing,
        // or fails goes to REVISION_MANUAL; the first look comes PAGOS_STALE_AFTER after a
        // hand-over. (Below PAGOS_LEASE is not refused: a payment its request holds is
        // never looked at, so none is given up while it is being sent.)
        if self.give_up_after < self.stale_after {
            return Err(SettingError {
                env: "PAGOS_GIVE_UP_AFTER",
                flag: "give-up-after",
                message: format!(
                    "{} is shorter than PAGOS_STALE_AFTER ({}): a payment handed to the reconciler would be past it at its first look, and go to REVISION_MANUAL unless that look settles it, never looked at again nor resent",
                    humantime::format_duration(self.give_up_after),
                    humantime::format_duration(self.stale_after),
                ),
            });
        }
        // A resend is made only while it ends inside the key window. One look inside it is
        // not enough: the outage that left the send unanswered often fails the first
        // look-up too, and a provider's search may not show a charge made a moment ago.
        let (to_second_look, resend) = self.second_look();
        if to_second_look + resend >= self.gateway_key_window {
            let stale_share = crate::saga::backoff::longest(self.stale_after, 0)
                + crate::saga::backoff::longest(self.stale_after, 1);
            let (env, flag, value) = if stale_share >= self.reconcile_every * 2 {
                ("PAGOS_STALE_AFTER", "stale-after", self.stale_after)
            } else {
                (
                    "PAGOS_RECONCILE_EVERY",
                    "reconcile-every",
                    self.reconcile_every,
                )
            };
            return Err(SettingError {
                env,
                flag,
                message: format!(
                    "{} leaves no room for two looks inside PAGOS_GATEWAY_KEY_WINDOW ({}): a payment the gateway left unanswered is looked at the second time up to {} after it was registered (its send, then PAGOS_STALE_AFTER and twice it, +20% jitter, each up to a PAGOS_RECONCILE_EVERY late), and resent only if the resend ({}) ends inside the window; a look-up that failed once would send it to on-call instead",
                    humantime::format_duration(value),
                    humantime::format_duration(self.gateway_key_window),
                    humantime::format_duration(round_ms(to_second_look)),
                    humantime::format_duration(round_ms(resend)),
                ),
            });
        }
        Ok(())
    }

    /// The latest a payment the gateway left unanswered is looked at the second time,
    /// counted from its registration, and how long a resend then takes: its request's
    /// send (the longest gateway call), the hand-over's wait (`PAGOS_STALE_AFTER`) and
    /// the first reschedule's (twice it), each at the top of its jitter and up to one
    /// `PAGOS_RECONCILE_EVERY` late (the pass that picks it up); the resend is the longest
    /// call again.
    fn second_look(&self) -> (Duration, Duration) {
        use crate::saga::backoff::longest;
        let call = self.retry_policy().worst_case(self.gateway_timeout);
        let waits = longest(self.stale_after, 0) + longest(self.stale_after, 1);
        (call + waits + self.reconcile_every * 2, call)
    }
}

/// The shortest `PAGOS_ADMIN_TOKEN` accepted: it opens every admin endpoint.
pub const ADMIN_TOKEN_MIN_CHARS: usize = 16;

impl Settings {
    /// A secret with white space or control characters around it (a secret file's
    /// trailing newline, `echo … | base64`) could never work: a presented admin token is
    /// read trimmed, so it would never match; a gateway secret with a newline cannot be put
    /// in an `Authorization` header, so every call would fail before it is sent (every
    /// payment pending); a webhook secret would sign differently from the provider (every
    /// webhook 401). Each is refused at start, never echoed. Empty is unset.
    fn validate_secrets(&self) -> Result<(), SettingError> {
        let secrets = [
            (&self.admin_token, "PAGOS_ADMIN_TOKEN", "admin-token"),
            (
                &self.gateway_secret,
                "PAGOS_GATEWAY_SECRET",
                "gateway-secret",
            ),
            (
                &self.webhook_secret,
                "PAGOS_WEBHOOK_SECRET",
                "webhook-secret",
            ),
            (
                &self.stripe_webhook_secret,
                "PAGOS_STRIPE_WEBHOOK_SECRET",
                "stripe-webhook-secret",
            ),
            (
                &self.mercadopago_webhook_secret,
                "PAGOS_MERCADOPAGO_WEBHOOK_SECRET",
                "mercadopago-webhook-secret",
            ),
        ];
        for (secret, env, flag) in secrets {
            let Some(value) = exposed(secret).filter(|t| !t.is_empty()) else {
                continue;
            };
            let refused = |message: &str| SettingError {
                env,
                flag,
                message: message.to_owned(),
            };
            if value.trim() != value {
                return Err(refused(
                    "has white space around it (a secret file's trailing newline?): it could never match what is presented or signed; remove it",
                ));
            }
            if value.chars().any(char::is_control) {
                return Err(refused(
                    "holds a control character: it cannot be sent in an Authorization header nor match a signature",
                ));
            }
        }
        // Stripe's two secrets say what they are: swapped (a paste into the wrong
        // variable), every call was refused 401, every payment answered 202 and, a day
        // later, sent to on-call. Neither is printed.
        if self.gateway == GatewayKind::Stripe
            && let Some(key) = exposed(&self.gateway_secret).filter(|t| !t.is_empty())
            && !(key.starts_with("sk_") || key.starts_with("rk_"))
        {
            return Err(SettingError {
                env: "PAGOS_GATEWAY_SECRET",
                flag: "gateway-secret",
                message: "is not a Stripe secret key (sk_… or a restricted rk_…); a webhook signing secret, whsec_…, goes in PAGOS_STRIPE_WEBHOOK_SECRET".into(),
            });
        }
        if self.gateway == GatewayKind::Stripe
            && let Some(signing) = exposed(&self.stripe_webhook_secret).filter(|t| !t.is_empty())
            && !signing.starts_with("whsec_")
        {
            return Err(SettingError {
                env: "PAGOS_STRIPE_WEBHOOK_SECRET",
                flag: "stripe-webhook-secret",
                message: "is not a Stripe webhook signing secret (whsec_…, the endpoint's in the Stripe Dashboard); the secret key, sk_…, goes in PAGOS_GATEWAY_SECRET".into(),
            });
        }
        Ok(())
    }

    /// Whether `PAGOS_ADMIN_TOKEN` is shorter than `ADMIN_TOKEN_MIN_CHARS`: it opens every
    /// admin endpoint, and `serve` says so at start (a WARN, not a refusal: the contract
    /// takes any token).
    pub fn admin_token_is_short(&self) -> bool {
        exposed(&self.admin_token)
            .is_some_and(|t| !t.is_empty() && t.chars().count() < ADMIN_TOKEN_MIN_CHARS)
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Clone, Debug, Args)]
pub struct SandboxArgs {
    /// Address the sandbox gateway listens on
    #[arg(
        long,
        env = "PAGOS_SANDBOX_BIND",
        default_value = "127.0.0.1:8090",
        value_name = "ADDR"
    )]
    pub bind: SocketAddr,
    /// Bearer secret callers must send (unset: any caller is accepted)
    #[arg(
        long,
        env = "PAGOS_SANDBOX_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub secret: Option<SecretString>,
    /// Time a new charge or refund takes
    #[arg(long, env = "PAGOS_SANDBOX_LATENCY", default_value = "0ms", value_parser = duration, value_name = "DURATION")]
    pub latency: Duration,
    /// Share of charges declined
    #[arg(long, env = "PAGOS_SANDBOX_DECLINE_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub decline_rate: f64,
    /// Share of refunds that fail (at once, or when they settle if left pending)
    #[arg(long, env = "PAGOS_SANDBOX_REFUND_FAILURE_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub refund_failure_rate: f64,
    /// Share of requests answered 503 without charging or refunding
    #[arg(long, env = "PAGOS_SANDBOX_ERROR_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub error_rate: f64,
    /// Share of charges and refunds made whose answer then hangs past the client's timeout
    #[arg(long, env = "PAGOS_SANDBOX_TIMEOUT_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub timeout_rate: f64,
    /// Share of charges and refunds made whose connection is then dropped mid-answer
    #[arg(long, env = "PAGOS_SANDBOX_RESET_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub reset_rate: f64,
    /// Share of charges and refunds left pending, settled later
    #[arg(long, env = "PAGOS_SANDBOX_PENDING_RATE", default_value_t = 0.0, value_parser = rate, value_name = "RATE")]
    pub pending_rate: f64,
    /// How long a pending charge or refund stays pending
    #[arg(long, env = "PAGOS_SANDBOX_PENDING_FOR", default_value = "2s", value_parser = duration, value_name = "DURATION")]
    pub pending_for: Duration,
    /// Seed of the fault and outcome draws (repeatable runs)
    #[arg(long, env = "PAGOS_SANDBOX_SEED", value_name = "N")]
    pub seed: Option<u64>,
    /// Deliver charge and refund events to this URL (pagos: http://HOST:PORT/v1/webhooks/http)
    #[arg(long, env = "PAGOS_SANDBOX_WEBHOOK_URL", value_name = "URL")]
    pub webhook_url: Option<url::Url>,
    /// Secret the events are signed with (pagos' PAGOS_WEBHOOK_SECRET; unset: read from
    /// PAGOS_WEBHOOK_SECRET itself)
    #[arg(
        long,
        env = "PAGOS_SANDBOX_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = secret
    )]
    pub webhook_secret: Option<SecretString>,
    /// Deliver events duplicated, delayed and out of order
    #[arg(long, env = "PAGOS_SANDBOX_CHAOS")]
    pub chaos: bool,
}

/// A command's refusal: its one line on stderr, exit code 2.
pub fn refuse(line: impl std::fmt::Display) -> std::process::ExitCode {
    eprintln!("pagos: {line}");
    std::process::ExitCode::from(2)
}

/// What a command prints for scripts (a key shown once, a table, JSON): stdout, one line.
#[allow(clippy::print_stdout)]
pub fn print_stdout(text: &str) {
    println!("{text}");
}

/// A time as people read it in a command's table: to the minute, in UTC.
pub fn when(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// Columns aligned with two spaces between them, headers in capitals, no borders.
pub fn table<const N: usize>(
    headers: [&str; N],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::NOTHING)
        .set_header(headers.to_vec());
    for row in rows {
        table.add_row(row);
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i + 1 < N { 2 } else { 0 }));
    }
    table.trim_fmt()
}

/// Turns a clap error into the one line the contract asks for, naming flag and env var.
pub fn one_line_error(err: &clap::Error) -> String {
    one_line_error_in(err, std::env::args().skip(1))
}

/// As `one_line_error`, for the command line `args` (without the program name): the
/// subcommand they name decides which env var a flag reads.
pub fn one_line_error_in(err: &clap::Error, args: impl IntoIterator<Item = String>) -> String {
    let rendered = err.render().to_string();
    let mut lines = rendered.lines();
    let mut first = lines
        .next()
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_owned();
    if first.ends_with(':') {
        // "the following required arguments were not provided:" lists them below.
        let listed: Vec<&str> = lines
            .take_while(|l| !l.trim().is_empty())
            .map(str::trim)
            .collect();
        first = format!("{} {}", first, listed.join(", "));
    }
    let root = <Cli as clap::CommandFactory>::command();
    let command = subcommand_of(&root, args);
    // A global flag (`--log-format`) is declared on the root only: clap copies it to the
    // subcommands when it parses, not in the command the factory builds.
    let env = flag_in(&first)
        .and_then(|flag| env_of_flag(command, &flag).or_else(|| env_of_flag(&root, &flag)));
    // clap repeats the value it refused: a URL's password or token masked (`shown_url`).
    if env.as_deref() == Some("PAGOS_GATEWAY_URL")
        && let Some(clap::error::ContextValue::String(raw)) =
            err.get(clap::error::ContextKind::InvalidValue)
    {
        first = first.replace(raw.as_str(), &shown_url(raw));
    }
    match env {
        Some(env) => format!("pagos: invalid setting {env}: {first}"),
        None => format!("pagos: {first}"),
    }
}

/// The deepest subcommand that `args` name.
fn subcommand_of(root: &clap::Command, args: impl IntoIterator<Item = String>) -> &clap::Command {
    let mut command = root;
    for arg in args {
        if let Some(sub) = command.find_subcommand(&arg) {
            command = sub;
        }
    }
    command
}

fn flag_in(line: &str) -> Option<String> {
    let start = line.find("--")? + 2;
    let rest = &line[start..];
    let end = rest.find([' ', '\'', '=', '<', ',']).unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

fn env_of_flag(cmd: &clap::Command, flag: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|arg| arg.get_long() == Some(flag))
        .and_then(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
}

/// `pagos operators …`: the people of on-call and their tokens.
#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Create an operator and print their token `op_…` once (only a hash of it is stored)
    Add(OperatorAddArgs),
    /// Revoke an operator: their token and console sessions are refused from then on
    Revoke(OperatorRevokeArgs),
    /// List operators: name, role, created, state
    List(OperatorListArgs),
}

#[derive(Debug, Args)]
pub struct OperatorAddArgs {
    /// The operator's name (letters, digits, `.`, `_`, `-`, `@`; at most 64): what the
    /// audit trail records for their actions
    pub name: String,
    /// `lector` only reads (the admin API answers 403 to their writes); `operador` also
    /// resolves, reconciles and refunds
    #[arg(long, env = "PAGOS_OPERATOR_ROL", default_value = "operador", value_name = "lector|operador",
          value_parser = |s: &str| s.parse::<crate::entities::operator::Role>())]
    pub rol: crate::entities::operator::Role,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct OperatorRevokeArgs {
    /// The operator's name, as `pagos operators list` shows it
    pub name: String,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct OperatorListArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pagos").chain(args.iter().copied()))
    }

    fn serve_settings(args: &[&str]) -> Settings {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        match parse(&all).map(|cli| cli.command) {
            Ok(Command::Serve(settings)) => *settings,
            other => panic!("not a serve command: {other:?}"),
        }
    }

    #[test]
    fn a_secret_tells_its_account_and_mode_where_its_form_says() {
        let account = |gateway: &str, secret: &str| {
            serve_settings(&["--gateway", gateway, "--gateway-secret", secret]).gateway_account()
        };
        let cases = [
            ("stripe", "sk_live_51Abc", Some("live mode")),
            ("stripe", "rk_live_51Abc", Some("live mode")),
            ("stripe", "sk_test_51Abc", Some("test mode")),
            ("stripe", "sk_livex", None),
            ("stripe", "gw_secret", None),
            (
                "mercadopago",
                "APP_USR-44-1207-9f1e-180054921",
                Some("production mode, seller 180054921"),
            ),
            (
                "mercadopago",
                "TEST-44-1207-9f1e-180054921",
                Some("test mode, seller 180054921"),
            ),
            ("mercadopago", "APP_USR-opaque", Some("production mode")),
            ("mercadopago", "TEST-44-1207-9f1e-x1", Some("test mode")),
            ("mercadopago", "s", None),
            ("http", "sk_live_51Abc", None),
        ];
        for (gateway, secret, expected) in cases {
            assert_eq!(
                account(gateway, secret).as_deref(),
                expected,
                "{gateway} {secret}"
            );
        }
    }

    #[test]
    fn the_defaults_are_the_contracts() {
        let s = serve_settings(&[]);
        assert_eq!(s.database.url, "sqlite://pagos.db?mode=rwc");
        assert_eq!(s.bind.to_string(), "127.0.0.1:8080");
        assert_eq!(s.gateway, GatewayKind::Sandbox);
        assert_eq!(s.gateway_timeout, Duration::from_secs(10));
        assert_eq!(s.gateway_retries, 3);
        assert_eq!(s.lease, Duration::from_secs(60));
        assert_eq!(s.key_retention, Duration::from_secs(86400));
        assert_eq!(s.reconcile_concurrency, 32);
        assert_eq!(s.header_timeout, Duration::from_secs(10));
        assert!(
            s.request_timeout > s.lease,
            "a payment request is never cut by default"
        );
        assert_eq!(s.max_in_flight, 256);
        assert_eq!(s.admin_bind, None);
        assert_eq!(s.metrics_refresh, Duration::from_secs(15));
        assert_eq!(s.auth_failures_per_minute, 60);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn a_bad_duration_is_one_line_naming_flag_and_env() {
        let err = parse(&["serve", "--gateway-timeout", "soon"]).expect_err("refused");
        let line = one_line_error_in(&err, ["serve".to_owned()]);
        assert!(line.contains("PAGOS_GATEWAY_TIMEOUT"), "{line}");
        assert!(line.contains("--gateway-timeout"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_missing_required_flag_is_named_on_the_one_line() {
        let err = parse(&["reconcile"]).expect_err("refused");
        let line = one_line_error_in(&err, ["reconcile".to_owned()]);
        assert!(line.contains("--once"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_pass_by_hand_names_its_operator_or_the_login_it_ran_under() {
        let named = match parse(&["reconcile", "--once", "--operador", " ana "]) {
            Ok(Cli {
                command: Command::Reconcile(args),
                ..
            }) => args,
            other => panic!("not a reconcile command: {other:?}"),
        };
        assert_eq!(
            named.operator(),
            RanBy::Operator(crate::operators::OperatorName::parse("ana").expect("a name"))
        );
        for bad in ["admin", "reconciler", "", "ana p", "cli:ana"] {
            let err = parse(&["reconcile", "--once", "--operador", bad]).expect_err(bad);
            let line = one_line_error_in(&err, ["reconcile".to_owned()]);
            assert!(line.contains("PAGOS_OPERATOR"), "{bad}: {line}");
            assert!(line.contains("--operador"), "{bad}: {line}");
            assert!(!line.contains('\n'), "{bad}: {line}");
        }
        assert_eq!(cli_operator(Some("maria".into())), "cli:maria");
        assert_eq!(cli_operator(Some("  ".into())), "cli");
        assert_eq!(cli_operator(None), "cli");
        let long = cli_operator(Some("x".repeat(100)));
        assert_eq!(long.chars().count(), crate::operators::MAX_NAME_CHARS);
    }

    #[test]
    fn the_env_var_named_is_the_one_of_the_subcommand_used() {
        let err =
            parse(&["merchants", "add", "x", "--database-pool-size", "0"]).expect_err("refused");
        let line = one_line_error_in(&err, ["merchants".to_owned(), "add".to_owned()]);
        assert!(line.contains("PAGOS_DATABASE_POOL_SIZE"), "{line}");
    }

    #[test]
    fn a_bad_pay_flag_is_one_line_naming_the_flag_and_its_env_var() {
        let pay = [
            "pay",
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
        for (flag, value, env) in [
            ("--monto", "0", "PAGOS_MONTO"),
            ("--monto", "12.5", "PAGOS_MONTO"),
            ("--moneda", "XXX", "PAGOS_MONEDA"),
            ("--credito", "", "PAGOS_CREDITO"),
            ("--deadline", "soon", "PAGOS_DEADLINE"),
            ("--url", "ftp://x", "PAGOS_URL"),
            ("--medio-pago", "{\"id\":\"pm 1\"}", "PAGOS_MEDIO_PAGO"),
        ] {
            let mut args = pay.to_vec();
            args.extend([flag, value]);
            let err = parse(&args).expect_err("refused");
            let line = one_line_error_in(&err, ["pay".to_owned()]);
            assert!(line.contains(env), "{flag} {value}: {line}");
            assert!(line.contains(flag), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn a_lease_shorter_than_the_gateway_call_is_refused() {
        let s = serve_settings(&["--lease", "20s"]);
        let err = s.validate().expect_err("refused");
        assert_eq!(err.env, "PAGOS_LEASE");
    }

    /// Settings that would hand every payment the gateway left unanswered to on-call
    /// before the reconciler could look at it twice, and those that leave room.
    #[test]
    fn the_reconcilers_horizons_must_leave_it_two_looks_before_on_call() {
        let mp = ["--gateway", "mercadopago", "--gateway-secret", "sk_test_s"];
        let with = |extra: &[&str]| {
            let mut args = mp.to_vec();
            args.extend_from_slice(extra);
            serve_settings(&args)
        };
        for (extra, env) in [
            (&["--give-up-after", "20s"][..], "PAGOS_GIVE_UP_AFTER"),
            // Mercado Pago's hour: the second look at 52s + 20m × 1.2 × 3 + 20s.
            (&["--stale-after", "20m"][..], "PAGOS_STALE_AFTER"),
            (&["--stale-after", "17m"][..], "PAGOS_STALE_AFTER"),
            (&["--reconcile-every", "30m"][..], "PAGOS_RECONCILE_EVERY"),
        ] {
            let err = with(extra).validate().expect_err(extra[1]);
            assert_eq!(err.env, env, "{extra:?}: {err}");
            let line = err.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(
                line.contains("PAGOS_STALE_AFTER") || line.contains("key window"),
                "says why: {line}"
            );
        }
        for extra in [
            &[][..],
            &["--stale-after", "16m"][..],
            &["--give-up-after", "30s"][..],
            // Equal: the tests' "give up at the first look".
            &["--give-up-after", "1s", "--stale-after", "1s"][..],
        ] {
            assert!(with(extra).validate().is_ok(), "{extra:?}");
        }
        // A day's window (the reference protocol, Stripe) takes the longest stale.
        assert!(serve_settings(&["--stale-after", "1h"]).validate().is_ok());
        assert!(
            serve_settings(&[
                "--reconcile-every",
                "1h",
                "--give-up-after",
                "1s",
                "--stale-after",
                "1s"
            ])
            .validate()
            .is_ok(),
            "a pass only on demand, giving up at the first look (the console's browser test)"
        );
        let err = parse(&["serve", "--stale-after", "61m"]).expect_err("over an hour");
        let line = one_line_error_in(&err, ["serve".to_owned()]);
        assert!(line.contains("PAGOS_STALE_AFTER"), "{line}");
        assert!(line.contains("at most 1h"), "{line}");
    }

    #[test]
    fn a_url_shown_in_a_refusal_hides_its_password_and_its_query() {
        for (raw, shown) in [
            (
                "https://gw.example:8090/base",
                "https://gw.example:8090/base",
            ),
            ("https://pagos:hunter2@gw.example", "https://***@gw.example"),
            (
                "https://pagos:p@ss@gw.example:99999/x",
                "https://***@gw.example:99999/x",
            ),
            (
                "https://gw.example/v1?access_token=hunter2",
                "https://gw.example/v1?…",
            ),
            ("https://gw.example#hunter2", "https://gw.example?…"),
            ("pagos:hunter2@gw example", "***@gw example"),
        ] {
            assert_eq!(shown_url(raw), shown, "{raw}");
        }
    }

    #[test]
    fn each_provider_defaults_to_its_production_api_and_key_window() {
        for (kind, url, window) in [
            ("stripe", "https://api.stripe.com/", 24 * 3600),
            ("mercadopago", "https://api.mercadopago.com/", 3600),
        ] {
            let s = serve_settings(&["--gateway", kind, "--gateway-secret", "sk_test_s"]);
            assert_eq!(s.gateway.as_str(), kind);
            assert_eq!(s.gateway_url.as_ref().map(url::Url::as_str), Some(url));
            assert_eq!(s.gateway_key_window, Duration::from_secs(window), "{kind}");
            assert!(s.validate().is_ok(), "{kind}");
        }
        let sandbox = serve_settings(&[]);
        assert_eq!(sandbox.gateway_url, None);
        assert_eq!(sandbox.gateway_key_window, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn explicit_url_and_key_window_win_over_the_providers_defaults() {
        let s = serve_settings(&[
            "--gateway",
            "mercadopago",
            "--gateway-secret",
            "s",
            "--gateway-url",
            "http://127.0.0.1:9/",
            "--gateway-key-window",
            "10m",
        ]);
        assert_eq!(
            s.gateway_url.as_ref().map(url::Url::as_str),
            Some("http://127.0.0.1:9/")
        );
        assert_eq!(s.gateway_key_window, Duration::from_secs(600));
    }

    #[test]
    fn a_provider_needs_its_secret() {
        for kind in ["stripe", "mercadopago"] {
            let err = serve_settings(&["--gateway", kind])
                .validate()
                .expect_err("refused");
            assert_eq!(err.env, "PAGOS_GATEWAY_SECRET");
            assert!(err.to_string().contains(kind), "{err}");
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn key_retention_must_cover_the_providers_key_window() {
        let s = serve_settings(&[
            "--gateway",
            "stripe",
            "--gateway-secret",
            "sk_test_s",
            "--key-retention",
            "12h",
        ]);
        assert_eq!(
            s.validate().expect_err("refused").env,
            "PAGOS_KEY_RETENTION"
        );
        let s = serve_settings(&[
            "--gateway",
            "mercadopago",
            "--gateway-secret",
            "s",
            "--key-retention",
            "2h",
        ]);
        assert!(s.validate().is_ok(), "1h window, 2h retention");
    }

    #[test]
    fn a_key_window_longer_than_the_provider_remembers_keys_is_refused() {
        for (kind, window) in [("stripe", "25h"), ("mercadopago", "2h")] {
            let s = serve_settings(&[
                "--gateway",
                kind,
                "--gateway-secret",
                "sk_test_s",
                "--gateway-key-window",
                window,
                "--key-retention",
                "48h",
            ]);
            let err = s.validate().expect_err("refused");
            assert_eq!(err.env, "PAGOS_GATEWAY_KEY_WINDOW", "{kind}");
            assert!(err.to_string().contains(kind), "{err}");
        }
        let s = serve_settings(&["--gateway-key-window", "72h", "--key-retention", "72h"]);
        assert!(s.validate().is_ok(), "the sandbox documents no window");
    }

    #[test]
    fn mercadopago_webhooks_need_the_mercadopago_gateway() {
        let s = serve_settings(&["--mercadopago-webhook-secret", "x"]);
        assert_eq!(
            s.validate().expect_err("refused").env,
            "PAGOS_MERCADOPAGO_WEBHOOK_SECRET"
        );
    }

    #[test]
    fn the_maximum_amount_defaults_to_twelve_digits_and_cannot_pass_two_to_the_53() {
        assert_eq!(serve_settings(&[]).max_amount, 999_999_999_999);
        assert_eq!(
            serve_settings(&["--max-monto", "9007199254740991"]).max_amount,
            crate::domain::MAX_SAFE_AMOUNT
        );
        for bad in ["9007199254740992", "0", "-1", "1e6"] {
            let arg = format!("--max-monto={bad}");
            let err = parse(&["serve", &arg]).expect_err(bad);
            let line = one_line_error_in(&err, ["serve".to_owned()]);
            assert!(line.contains("PAGOS_MAX_MONTO"), "{line}");
        }
    }

    #[test]
    fn debug_output_of_the_settings_never_shows_a_secret() {
        let secrets = [
            ("--gateway-secret", "gw-secret-4f7a1c"),
            ("--admin-token", "admin-secret-9b2e5d"),
            ("--webhook-secret", "webhook-secret-1d8c3a"),
            ("--stripe-webhook-secret", "whsec_stripe-7e6f2b"),
            ("--mercadopago-webhook-secret", "mp-secret-3a9d4e"),
        ];
        let flags: Vec<&str> = secrets.iter().flat_map(|(f, v)| [*f, *v]).collect();
        let settings = serve_settings(&flags);
        assert_eq!(exposed(&settings.admin_token), Some("admin-secret-9b2e5d"));
        let shown = format!("{settings:?}");
        for (flag, secret) in secrets {
            assert!(!shown.contains(secret), "{flag} shown: {shown}");
        }
        assert!(shown.contains("REDACTED"), "{shown}");

        let sandbox = match parse(&[
            "sandbox-gateway",
            "--secret",
            "sandbox-5c1b7f",
            "--webhook-secret",
            "sandbox-wh-2f8e9a",
        ])
        .map(|cli| cli.command)
        {
            Ok(Command::SandboxGateway(args)) => args,
            other => panic!("not the sandbox: {other:?}"),
        };
        let shown = format!("{sandbox:?}");
        assert!(!shown.contains("sandbox-5c1b7f") && !shown.contains("sandbox-wh-2f8e9a"));

        for args in [
            &[
                "merchants",
                "add",
                "acme",
                "--api-key",
                "sk_live_cli_8d2f6a",
            ][..],
            &[
                "pay",
                "--url",
                "http://x",
                "--api-key",
                "sk_live_cli_8d2f6a",
                "--resume",
            ][..],
        ] {
            let cli = parse(args).expect("parsed");
            let shown = format!("{cli:?}");
            assert!(!shown.contains("sk_live_cli_8d2f6a"), "{shown}");
        }
    }

    #[test]
    fn webhook_ids_must_outlive_the_signature_tolerance() {
        let s = serve_settings(&["--message-retention", "5m"]);
        assert_eq!(
            s.validate().expect_err("refused").env,
            "PAGOS_MESSAGE_RETENTION"
        );
        assert!(
            serve_settings(&["--message-retention", "10m"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn the_admin_door_needs_an_address_of_its_own() {
        let s = serve_settings(&["--admin-bind", "127.0.0.1:8080"]);
        let err = s.validate().expect_err("refused");
        assert_eq!(err.env, "PAGOS_ADMIN_BIND");
        assert!(
            serve_settings(&["--admin-bind", "127.0.0.1:9090"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn only_the_sandbox_gateway_gives_test_keys() {
        use crate::merchants::key::KeyKind;
        for kind in GatewayKind::value_variants() {
            let expected = if *kind == GatewayKind::Sandbox {
                KeyKind::Test
            } else {
                KeyKind::Live
            };
            assert_eq!(KeyKind::of_gateway(kind.as_str()), expected, "{kind:?}");
            let value = kind.to_possible_value().map(|v| v.get_name().to_owned());
            assert_eq!(
                value.as_deref(),
                Some(kind.as_str()),
                "the pinned name is as_str"
            );
        }
    }

    #[test]
    fn a_gateway_url_or_secret_with_the_sandbox_is_refused_naming_pagos_gateway() {
        for flags in [
            &["--gateway-url", "https://gw.example"][..],
            &["--gateway-secret", "sk_test_s"][..],
            &[
                "--gateway",
                "sandbox",
                "--gateway-url",
                "https://gw.example",
            ][..],
        ] {
            let err = serve_settings(flags).validate().expect_err("refused");
            assert_eq!(err.env, "PAGOS_GATEWAY", "{flags:?}");
            assert!(err.to_string().contains("no money would move"), "{err}");
        }
        let http = serve_settings(&["--gateway", "http", "--gateway-url", "https://gw.example"]);
        assert!(http.validate().is_ok());
    }

    #[test]
    fn a_gateway_url_without_http_or_https_and_a_host_is_refused() {
        for bad in [
            "gateway:8090",
            "ftp://gw.example",
            "gw.example",
            "file:///tmp/x",
        ] {
            let err = parse(&["serve", "--gateway", "http", "--gateway-url", bad])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("--gateway-url"), "{bad}: {err}");
            assert!(err.contains("http:// or https://"), "{bad}: {err}");
        }
        for good in [
            "http://gateway:8090",
            "https://api.stripe.com/",
            "http://127.0.0.1:9/",
        ] {
            let s = serve_settings(&["--gateway", "http", "--gateway-url", good]);
            assert!(s.validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn a_duration_past_a_century_is_refused_at_start() {
        for flag in [
            "--lease",
            "--key-retention",
            "--gateway-timeout",
            "--give-up-after",
            "--webhooks-disable-after",
            "--webhooks-schedule",
        ] {
            let err = parse(&["serve", flag, "300000y"])
                .expect_err(flag)
                .to_string();
            assert!(err.contains("at most 100 years"), "{flag}: {err}");
        }
        let err = parse(&["serve", "--webhooks-schedule", "0s,5s,101y"])
            .expect_err("a wait past a century")
            .to_string();
        assert!(
            err.contains("wait 3") && err.contains("at most 100 years"),
            "{err}"
        );
        let s = serve_settings(&["--key-retention", "100y", "--message-retention", "100y"]);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn the_admin_token_is_refused_with_blanks_or_control_characters_and_a_short_one_is_warned_about()
     {
        for bad in [
            "a-long-enough-admin-token\n",
            "a-long-enough-admin-token\r\n",
            " a-long-enough-admin-token",
            "a-long-enough\tadmin-token",
            "\u{7f}a-long-enough-admin-token",
            "   ",
        ] {
            let err = serve_settings(&["--admin-token", bad])
                .validate()
                .expect_err(bad);
            assert_eq!(err.env, "PAGOS_ADMIN_TOKEN", "{bad:?}");
            let line = err.to_string();
            assert!(!line.contains('\n'), "one line: {line:?}");
            assert!(!line.contains("a-long-enough"), "never the token: {line}");
        }
        for good in ["admin-secret-9b2e5d", "0123456789abcdef", "short-token"] {
            assert!(
                serve_settings(&["--admin-token", good]).validate().is_ok(),
                "{good}"
            );
        }
        // A short one is served, with a warning at start.
        assert!(serve_settings(&["--admin-token", "short-token"]).admin_token_is_short());
        assert!(!serve_settings(&["--admin-token", "0123456789abcdef"]).admin_token_is_short());
    }

    #[test]
    fn the_http_gateway_needs_a_url() {
        let s = serve_settings(&["--gateway", "http"]);
        assert_eq!(s.validate().expect_err("refused").env, "PAGOS_GATEWAY_URL");
    }
}

/// The webhook delivery settings, as `pagos serve` parses them.
#[cfg(test)]
mod webhook_settings {
    use crate::config::{Cli, Command, one_line_error_in};
    use clap::Parser;
    use std::time::Duration;

    fn serve(args: &[&str]) -> Result<crate::delivery::WebhookSettings, String> {
        let all = std::iter::once("pagos")
            .chain(std::iter::once("serve"))
            .chain(args.iter().copied());
        match Cli::try_parse_from(all) {
            Ok(Cli {
                command: Command::Serve(settings),
                ..
            }) => Ok(settings.webhooks),
            Ok(other) => panic!("not serve: {other:?}"),
            Err(e) => Err(one_line_error_in(&e, ["serve".to_owned()])),
        }
    }

    #[test]
    fn the_defaults_are_the_contracts() {
        let s = serve(&[]).expect("defaults parse");
        assert_eq!(s.timeout, Duration::from_secs(15));
        assert_eq!(s.disable_after, Duration::from_secs(5 * 24 * 3600));
        assert_eq!(s.schedule.attempts(), 8);
        assert!(!s.allow_private);
        assert_eq!(s.policy(), crate::delivery::AddressPolicy::PublicOnly);
    }

    #[test]
    fn allowing_private_addresses_takes_a_flag_or_a_boolean() {
        assert!(
            serve(&["--webhooks-allow-private"])
                .expect("parses")
                .allow_private
        );
        assert!(
            serve(&["--webhooks-allow-private=true"])
                .expect("parses")
                .allow_private
        );
        assert!(
            !serve(&["--webhooks-allow-private=false"])
                .expect("parses")
                .allow_private
        );
        let line = serve(&["--webhooks-allow-private=maybe"]).expect_err("refused");
        assert!(line.contains("PAGOS_WEBHOOKS_ALLOW_PRIVATE"), "{line}");
    }

    #[test]
    fn each_bad_setting_is_one_line_naming_its_flag_and_env() {
        for (args, env) in [
            (&["--webhooks-timeout", "0s"][..], "PAGOS_WEBHOOKS_TIMEOUT"),
            (&["--webhooks-timeout", "10m"][..], "PAGOS_WEBHOOKS_TIMEOUT"),
            (
                &["--webhooks-schedule", "0s,5x"][..],
                "PAGOS_WEBHOOKS_SCHEDULE",
            ),
            (
                &["--webhooks-disable-after", "soon"][..],
                "PAGOS_WEBHOOKS_DISABLE_AFTER",
            ),
            (
                &["--webhooks-disable-after", "0s"][..],
                "PAGOS_WEBHOOKS_DISABLE_AFTER",
            ),
        ] {
            let line = serve(args).expect_err("refused");
            assert!(line.contains(env), "{args:?}: {line}");
            assert!(line.contains(args[0]), "{args:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}
