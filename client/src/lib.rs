//! `pagos-client`: the retrying client of a pagos server, for merchants. One idempotency
//! key per intent to pay (not per attempt), kept in a journal across crashes, retried with
//! exponential backoff and full jitter on answers that leave the outcome unknown or the
//! server busy; and `pagos pay`, its command line ([`cli`]).
//!
//! It must never send an intent under a new key, never retry a refusal (a 4xx other
//! than 408, a 409 `request-in-flight`, 425 and 429: the request itself needs
//! correcting), and never forget an intent before the server gave a terminal answer
//! about it. It depends on the wire types it shares with the server (`pagos-types`) and
//! on nothing of the server itself.
//!
//! # A merchant's whole integration
//!
//! ```no_run
//! use pagos_client::{
//!     Client, Intent, IntentKey, Journal, Outcome, PayError, PayPolicy, PaymentMethod,
//!     PaymentRequest, ProblemType,
//! };
//! use std::time::Duration;
//!
//! # async fn integration() -> Result<(), Box<dyn std::error::Error>> {
//! // Once, at start: a client of the pagos server, as this merchant, with a journal (a
//! // local SQLite file) that keeps every intent and its key until a terminal answer.
//! let journal = Journal::open("/var/lib/shop/pagos-journal.db").await?;
//! let client = Client::new("https://pagos.internal", "sk_live_…")?
//!     .with_journal(journal)
//!     .with_policy(PayPolicy {
//!         deadline: Duration::from_secs(30),
//!         ..PayPolicy::default()
//!     });
//!
//! // A process that died mid-payment left intents behind: pay them first, each with its
//! // own key (never a new one).
//! for resumed in client.resume().await? {
//!     println!("{}: {:?}", resumed.pending.intent.key(), resumed.result);
//! }
//!
//! // One intent per payment the customer means to make: its key is made here, once. A
//! // Stripe server needs the saved PaymentMethod (a Mercado Pago one, the card token and
//! // the payer's e-mail: see `PaymentRequest::with_payment_method`).
//! let request = PaymentRequest::new("credit-42", 250_000, "COP")? // 2500.00 COP
//!     .with_description("installment 3")?
//!     .with_payment_method(PaymentMethod {
//!         customer: Some("cus_NffrFeUfNV2Hib".into()),
//!         ..PaymentMethod::with_id("pm_1Q0PsIJvEtkwdCNYMSaVuRz6")
//!     })?;
//! let intent = Intent::new(request);
//! // Keep `intent.key()` next to the order if the order outlives this process, with when
//! // it was first sent: a retry is `Intent::with_key(IntentKey::parse(&kept)?, request)
//! // .first_sent_at(sent)`, never a new intent. A key is a retry only within the server's
//! // PAGOS_KEY_RETENTION (24 h by default) of its first request; past it the same key
//! // would make a new payment, so `pay` refuses it (`PayError::Expired`): look the payment
//! // up instead (GET /v1/pagos/{id}, or GET /v1/pagos?creditoId=…), and only if it is not
//! // there make a new intent.
//! let kept_key: String = intent.key().to_string();
//! let sent = chrono::Utc::now(); // just before its first request
//! # let _ = Intent::with_key(IntentKey::parse(&kept_key)?, intent.request().clone())
//! #     .first_sent_at(sent);
//!
//! match client.pay(&intent).await {
//!     Ok(Outcome::Paid(payment)) => println!("paid: {} ({:?})", payment.id, payment.gateway_ref),
//!     Ok(Outcome::Declined { payment, problem }) => {
//!         // No money moved. `declineCode` says why (insufficient_funds, …).
//!         let code = problem.as_ref().and_then(|p| p.extensions.get("declineCode"));
//!         println!("declined: {} {code:?}", payment.id);
//!     }
//!     Ok(Outcome::Pending(payment)) => {
//!         // The server has it and settles it on its own: pay the same intent later.
//!         println!("still {} at the deadline: {}", payment.state, payment.id);
//!     }
//!     Err(PayError::Rejected { status, problem }) => {
//!         // The request needs correcting; branch on the problem's type, never its title.
//!         if problem.kind() == Some(ProblemType::Validation) {
//!             println!("{status}: {:?}", problem.extensions.get("errores"));
//!         }
//!     }
//!     Err(PayError::GaveUp { .. } | PayError::Unread { .. }) => {
//!         // Unknown outcome: the payment may exist (Unread: the server named it, its state
//!         // could not be read). The journal keeps the intent; the next `resume` (or
//!         // paying this same intent) finds out, with the same key. Never a new intent.
//!     }
//!     Err(err @ (PayError::KeyReused { .. } | PayError::Blocked { .. } | PayError::Expired { .. } | PayError::Lost { .. })) => {
//!         // A human checks what the key paid, then `pagos pay --forget KEY`.
//!         eprintln!("needs a human: {err}");
//!     }
//!     Err(err) => eprintln!("{err}"),
//! }
//! # Ok(()) }
//! ```
//!
//! What is retried, for how long, and when an intent leaves the journal: `docs/client.md`.

pub mod answer;
pub mod cli;
pub mod intent;
pub mod journal;
pub mod refund;
pub mod refund_cli;
pub mod retry;
pub mod webhooks;

pub use answer::{MedioPago, Pago, Problem};
pub use intent::{Intent, IntentKey, InvalidRequest, PaymentRequest};
pub use journal::{Beside, Journal, JournalError, Kept, PendingIntent, PendingRefund};
pub use pagos_types::request::PayerDocument;
pub use pagos_types::{Currency, FieldError, PaymentMethod, PaymentState, ProblemType};
pub use pagos_types::{Reembolso, RefundState};
pub use refund::{RefundIntent, RefundOutcome, RefundRequest};
pub use retry::PayPolicy;

use answer::{Head, Reading};
use backon::Retryable;
use reqwest::header::{AUTHORIZATION, HeaderValue, LOCATION, RETRY_AFTER};
use retry::{Budget, Exhausted, Unsettled};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use url::Url;
use uuid::Uuid;

/// What became of an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// COMPLETADA: charged, once.
    Paid(Pago),
    /// FALLIDA: declined or refused by the gateway; no money moved. The problem (with its
    /// `declineCode`) comes with a `POST` answer, not with a look-up by id.
    Declined {
        payment: Pago,
        problem: Option<Problem>,
    },
    /// The server has the payment but no outcome yet at the deadline. It settles it on its
    /// own (its reconciler); pay the same intent again later to learn the outcome.
    Pending(Pago),
}

impl Outcome {
    pub fn payment(&self) -> &Pago {
        match self {
            Outcome::Paid(p) | Outcome::Pending(p) => p,
            Outcome::Declined { payment, .. } => payment,
        }
    }
}

/// Why `pay` has no outcome to give.
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    /// The server refused the request (400, 401, 403, 404, 413, 415, validation 422, …).
    /// Retrying the same request cannot help: it needs correcting.
    #[error("{status} {}", headline(problem))]
    Rejected { status: u16, problem: Problem },
    /// 422 `idempotency-key-reused`: the key already belongs to another request. The
    /// intent stays in the journal, blocked: a human must find out what the key paid.
    #[error(
        "Idempotency-Key {key} was already used for a different request ({}); the intent is kept in the journal but will not be sent again until someone checks it",
        headline(problem)
    )]
    KeyReused { key: IntentKey, problem: Problem },
    /// The journal holds this intent as blocked (see `KeyReused`): nothing was sent.
    #[error("intent {key} is blocked and was not sent: {why}")]
    Blocked { key: IntentKey, why: String },
    /// Attempts or time ran out with the outcome still unknown. The payment may exist:
    /// pay the same intent (same key) again later, never a new one.
    #[error("gave up after {attempts} attempt(s) in {}: {last}", humantime::format_duration(round(*elapsed)))]
    GaveUp {
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
    /// The server named this intent's payment before (the journal keeps its id), and
    /// attempts or time ran out while its state could not be read (the look-ups failed or
    /// went unanswered): it is still pending as far as anyone knows, not a failure. The
    /// intent stays in the journal; `pagos pay --resume` (or [`Client::resume`]) reads it
    /// later. The command line exits 4, as for a payment seen pending.
    #[error(
        "the server holds payment {payment_id} for intent {key}, but its state could not be read in {} ({last}): it is still pending as far as anyone knows; `pagos pay --resume` reads it later",
        humantime::format_duration(round(*elapsed))
    )]
    Unread {
        key: IntentKey,
        payment_id: Uuid,
        elapsed: Duration,
        last: String,
    },
    /// The server URL answered a redirect (3xx): something in front of pagos (a load
    /// balancer sending `http://` to `https://`, a moved host, or a proxy that answers its
    /// own timeout with a redirect to an error page), since pagos never redirects.
    /// Redirects are never followed (a redirected `POST` could become a `GET` elsewhere).
    /// Whether the request reached pagos is not known: a proxy may have forwarded it and
    /// redirected only once pagos was slow to answer. A journal keeps the intent; once
    /// the payment is known not to exist (`GET /v1/pagos?creditoId=`), let it go
    /// (`pagos pay --forget`) and pay at the URL it leads to, if it is pagos'.
    #[error(
        "the server URL answered {status} {}, redirecting to {}: pagos never redirects, so something in front of it answered, and whether the request reached pagos is not known",
        answer::reason(*status),
        location.as_deref().unwrap_or("nowhere (no Location header)")
    )]
    Redirected {
        status: u16,
        location: Option<String>,
    },
    /// The server answered outside the protocol.
    #[error("unexpected answer from the server: {0}")]
    Unexpected(String),
    /// The intent's first request left as long ago as the server keeps keys, less the
    /// hundredth of it the client keeps in hand (as the journal or
    /// [`Intent::first_sent_at`] tells, or an earlier `pay` of the same intent or a clone
    /// of it, or this `pay`'s own first request), and the server never named its
    /// payment: sent again, it could arrive after the server let
    /// the key go, be taken for a new payment and pay twice. Checked before every `POST`,
    /// so a retry budget longer than the retention ends here too. Nothing more was sent; with a journal, the intent
    /// stays there for a human. Look the payment up (`GET /v1/pagos/{id}`, or
    /// `GET /v1/pagos?creditoId=…`) before paying anew.
    #[error(
        "intent {key} was first sent at {first_sent}, too long ago for the server's key retention ({}, less the hundredth kept in hand); sending it again could pay twice, so it was not sent",
        humantime::format_duration(*key_retention)
    )]
    Expired {
        key: IntentKey,
        first_sent: chrono::DateTime<chrono::Utc>,
        key_retention: Duration,
    },
    /// The server named this intent's payment, then answered it has no such payment (its
    /// database lost it), and the intent was first sent longer than
    /// [`LOST_PAYMENT_RESEND`] ago: sent again, the server would make it anew and send it
    /// with a gateway key the gateway may have let go, charging twice. Nothing more was
    /// sent; with a journal, the intent stays there blocked, with the payment's id. Look
    /// at the gateway first (the payment id is the charge's reference).
    #[error(
        "the server has no payment {payment_id}, which it named for intent {key} (its database restored from before it?), and the intent was first sent more than {} ago: the gateway may have charged it and may no longer know its key, so it was not sent again; check the gateway for a charge of reference {payment_id} before anything",
        humantime::format_duration(LOST_PAYMENT_RESEND.to_std().unwrap_or_default())
    )]
    Lost { key: IntentKey, payment_id: Uuid },
    /// [`intent_for`](Client::intent_for) or
    /// [`refund_intent_for`](Client::refund_intent_for): the journal keeps an intent for
    /// this very request made at another server URL (the same server written another way)
    /// or with another API key (one rotated since), and none made here. It may have paid
    /// (refunded) already, and only the server knows whether the two keys are one
    /// merchant's, so no second intent was made: nothing was sent. Settle the kept one
    /// where it was made (`pagos pay --resume`, the same `pagos refund`, or a client with
    /// that URL and API key); with this client only when you know the two API keys are one
    /// merchant's at one server ([`Journal::find`], then [`Client::pay`] with its intent);
    /// or make a new payment explicitly ([`Intent::new`]) once you know what the kept one
    /// did.
    #[error(
        "the journal keeps intent {key} for this same request, made at {base_url} with {}; it may have paid already, so no second intent was made and nothing was sent: settle it where it was made (pagos pay --resume for a payment, the same pagos refund for a refund, with its URL and API key), or make a new one explicitly once you know what it did",
        if *same_api_key { "this API key" } else { "another API key" }
    )]
    KeptElsewhere {
        key: IntentKey,
        base_url: Url,
        same_api_key: bool,
    },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("this client has no journal to resume from")]
    NoJournal,
}

impl PayError {
    /// The problem document the server answered with, for a refusal.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            PayError::Rejected { problem, .. } | PayError::KeyReused { problem, .. } => {
                Some(problem)
            }
            _ => None,
        }
    }
}

fn headline(problem: &Problem) -> String {
    problem.headline()
}

fn round(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("invalid base URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("the API key must be non-empty visible ASCII")]
    BadApiKey,
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// Why the client is about to wait, told to the `on_retry` hook before each wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryNotice {
    pub key: IntentKey,
    /// Requests made so far for this `pay`.
    pub attempt: u32,
    pub waiting: Waiting,
    pub wait: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// The outcome is unknown or the server is busy: the same request goes again.
    Failed {
        why: String,
        retry_after: Option<Duration>,
    },
    /// The payment has no outcome yet: it is looked up again.
    Pending {
        payment_id: Uuid,
        state: PaymentState,
    },
}

impl fmt::Display for RetryNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wait = humantime::format_duration(round(self.wait));
        match &self.waiting {
            Waiting::Failed { why, retry_after } => {
                write!(f, "attempt {} failed ({why}); ", self.attempt)?;
                if retry_after.is_some_and(|ra| ra >= self.wait) {
                    write!(f, "the server asks to wait (Retry-After): ")?;
                }
                write!(f, "trying again with the same key in {wait}")
            }
            Waiting::Pending { payment_id, state } => write!(
                f,
                "payment {payment_id} is {state}, outcome not known yet; looking again in {wait}"
            ),
        }
    }
}

type Hook = Arc<dyn Fn(&RetryNotice) + Send + Sync>;

/// A client of one pagos server, as one merchant. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: Url,
    payments_url: Url,
    api_key: Arc<str>,
    authorization: HeaderValue,
    policy: PayPolicy,
    key_retention: Duration,
    journal: Option<Journal>,
    on_retry: Hook,
}

/// The server's default `PAGOS_KEY_RETENTION`.
pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long after an intent's first send a payment the server named and then lost (404)
/// is sent again with its key: inside the hour the gateways with the shortest key window
/// keep their keys (Mercado Pago), with room for the server's own send, so the gateway
/// answers the charge it made. Checked before every `POST` after the 404; past it, the
/// intent is blocked for a human ([`PayError::Lost`]).
pub const LOST_PAYMENT_RESEND: chrono::TimeDelta = chrono::TimeDelta::minutes(45);

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.base_url.as_str())
            .field("api_key", &"<redacted>")
            .field("policy", &self.policy)
            .field("journal", &self.journal.as_ref().map(Journal::path))
            .finish()
    }
}

/// A pagos base URL, normalised so that `v1/pagos` joins under it (a path prefix such as
/// `https://api.example/pagos/` is kept).
pub fn base_url(raw: &str) -> Result<Url, SetupError> {
    let bad = |why: &str| SetupError::BadUrl {
        url: raw.to_owned(),
        why: why.to_owned(),
    };
    let mut url = Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad("expected http://HOST[:PORT] or https://HOST[:PORT]"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a base URL has no query or fragment"));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds good data.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why one try did not give an outcome (backon's error type).
#[derive(Debug)]
enum Stop {
    /// With the answer's `Retry-After`: not looked at again sooner.
    Pending(Box<Pago>, Option<Duration>),
    Transient {
        why: String,
        retry_after: Option<Duration>,
    },
    /// 409 `request-in-flight`: waited out within the deadline, never an attempt used up.
    InFlight {
        why: String,
        retry_after: Option<Duration>,
    },
    KeyReused(Problem),
    Refused {
        status: u16,
        problem: Problem,
        /// No earlier request of this intent may have reached the server.
        first_contact: bool,
    },
    /// A 3xx: something in front of pagos answered; the request may have reached it.
    Redirected {
        status: u16,
        location: Option<String>,
    },
    /// The next `POST` would leave once the server may have let the key go.
    Expired(chrono::DateTime<chrono::Utc>),
    /// The server lost the payment it named, past `LOST_PAYMENT_RESEND`.
    Lost(Uuid),
    Unexpected(String),
    Journal(JournalError),
}

impl Stop {
    fn unsettled(&self) -> Option<Unsettled> {
        match self {
            Stop::Pending(_, retry_after) => Some(Unsettled::Pending {
                retry_after: *retry_after,
            }),
            Stop::Transient { retry_after, .. } => Some(Unsettled::Failed {
                retry_after: *retry_after,
            }),
            Stop::InFlight { retry_after, .. } => Some(Unsettled::InFlight {
                retry_after: *retry_after,
            }),
            _ => None,
        }
    }
}

/// One intent paid to the end of its budget.
struct Settling<'a> {
    client: &'a Client,
    intent: &'a Intent,
    body: serde_json::Value,
    known: Mutex<Option<Uuid>>,
    /// A payment the server named and then said it has not (404): resent with its key
    /// only within `LOST_PAYMENT_RESEND` of the first send.
    lost: Mutex<Option<Uuid>>,
    budget: Mutex<Budget>,
    tries: AtomicU32,
    exhausted: Mutex<Option<Exhausted>>,
    /// The payment as the server last showed it while not settled: what the merchant is
    /// told if the deadline comes in the middle of a later look-up.
    last_pending: Mutex<Option<Pago>>,
    /// When the intent's first request left, or a moment before it (never after, so its
    /// age errs long): as kept (journal, [`Intent::first_sent_at`], an earlier `pay` of
    /// this intent or a clone), or else when this `pay` began (any request of it, this
    /// one's or a concurrent one's, left after). No `POST` leaves once this is
    /// `key_retention` old.
    first_sent: chrono::DateTime<chrono::Utc>,
}

impl Client {
    /// A client of the pagos server at `base_url`, as the merchant whose API key is
    /// `api_key`, with the default [`PayPolicy`] and no journal.
    pub fn new(base_url: &str, api_key: &str) -> Result<Client, SetupError> {
        let base = self::base_url(base_url)?;
        let payments_url = base.join("v1/pagos").map_err(|e| SetupError::BadUrl {
            url: base_url.to_owned(),
            why: e.to_string(),
        })?;
        if api_key.is_empty() || !api_key.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(SetupError::BadApiKey);
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {api_key}"))
            .map_err(|_| SetupError::BadApiKey)?;
        authorization.set_sensitive(true);
        let http = reqwest::Client::builder()
            // A redirected POST could turn into a GET elsewhere: never follow one.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("pagos-client/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Client {
            http,
            base_url: base,
            payments_url,
            api_key: Arc::from(api_key),
            authorization,
            policy: PayPolicy::default(),
            key_retention: DEFAULT_KEY_RETENTION,
            journal: None,
            on_retry: Arc::new(log_notice),
        })
    }

    /// Retries by this policy instead of the default one.
    pub fn with_policy(mut self, policy: PayPolicy) -> Client {
        self.policy = policy;
        self
    }

    /// How long the server keeps idempotency keys (its `PAGOS_KEY_RETENTION`, 24 h by
    /// default). An intent first sent (by the journal, by [`Intent::first_sent_at`], or
    /// earlier in the same `pay`) 99 % of this ago or longer, whose payment the server
    /// never named, is not sent again: [`PayError::Expired`], before any `POST`. A
    /// [`PayPolicy::deadline`] shorter than 99 % of this never meets it within one `pay`.
    pub fn with_key_retention(mut self, key_retention: Duration) -> Client {
        self.key_retention = key_retention;
        self
    }

    /// How old an intent sent before (and never named by the server) may be when a
    /// `POST` of it leaves: the key retention less a hundredth of it (14 min 24 s of
    /// 24 h), kept in hand for the request's time in transit, the journal's write before
    /// it and the gap between this machine's clock and the server's.
    fn sendable_for(&self) -> Duration {
        self.key_retention - self.key_retention / 100
    }

    /// Keeps every intent in `journal` from before its first request until a terminal
    /// answer, so a process that dies can [`resume`](Client::resume) it with its key.
    pub fn with_journal(mut self, journal: Journal) -> Client {
        self.journal = Some(journal);
        self
    }

    /// Calls `hook` before each wait (the default logs through `tracing`).
    pub fn on_retry(mut self, hook: impl Fn(&RetryNotice) + Send + Sync + 'static) -> Client {
        self.on_retry = Arc::new(hook);
        self
    }

    pub fn base_url(&self) -> &Url {
        &self.base_url
    }

    pub fn policy(&self) -> &PayPolicy {
        &self.policy
    }

    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// Pays `intent`: sends it with its key, retries what may be retried, and, when the
    /// server answers 202, looks the payment up until it settles or the deadline comes
    /// (not before the 202's `Retry-After`: one past the deadline ends the `pay` at once,
    /// pending).
    ///
    /// With a journal, the intent is written down before the first request and let go
    /// only on a terminal answer (`docs/client.md` lists the cases). One let go by another
    /// process while this one pays it (the same payment run twice at once) is still sent
    /// with its key, uncounted: the server answers what that key made; without a terminal
    /// answer, it is written back under that key.
    ///
    /// The intent remembers its first send (so do its clones): paying the same value
    /// again later is held to the server's key retention from then, journal or not.
    pub async fn pay(&self, intent: &Intent) -> Result<Outcome, PayError> {
        // Before the journal is read: a request another process counts after that read
        // leaves after this.
        let began = chrono::Utc::now();
        let mut known = None;
        let mut first_sent = intent.first_sent();
        if let Some(journal) = &self.journal {
            let kept = journal
                .record(intent, &self.base_url, &self.api_key)
                .await?;
            // The same key and request kept for another server or API key (a journal
            // shared by two merchants' clients, a key the caller made): its payment is not
            // this client's to read (a 404 taken for a lost payment) nor its key to send.
            if kept.base_url != self.base_url || !kept.made_with(&self.api_key) {
                return Err(PayError::KeptElsewhere {
                    key: intent.key().clone(),
                    same_api_key: kept.made_with(&self.api_key),
                    base_url: kept.base_url,
                });
            }
            if let Some(why) = kept.blocked {
                return Err(PayError::Blocked {
                    key: intent.key().clone(),
                    why,
                });
            }
            if kept.attempts > 0 {
                let made = kept.created_at;
                first_sent = Some(first_sent.map_or(made, |sent| sent.min(made)));
            }
            known = kept.payment_id;
        }
        // Sent before, never named by the server, and older than its key retention: the
        // server may have let the key go, and the same key would make a new payment.
        if let Some(first_sent) = first_sent
            && known.is_none()
        {
            let age = (chrono::Utc::now() - first_sent)
                .to_std()
                .unwrap_or_default();
            if age >= self.sendable_for() {
                return Err(PayError::Expired {
                    key: intent.key().clone(),
                    first_sent,
                    key_retention: self.key_retention,
                });
            }
        }
        let settling = Settling {
            client: self,
            intent,
            body: intent.request().to_json(),
            known: Mutex::new(known),
            lost: Mutex::new(None),
            budget: Mutex::new(Budget::new(&self.policy, Instant::now())),
            tries: AtomicU32::new(0),
            exhausted: Mutex::new(None),
            last_pending: Mutex::new(None),
            first_sent: first_sent.unwrap_or(began),
        };
        let mut result = settling.run().await;
        // The deadline came, or the attempts ran out, while a look-up of a payment the
        // server had already shown pending was unanswered: it is still pending as far as
        // anyone knows, not a failure.
        if matches!(result, Err(Stop::Transient { .. }))
            && lock(&settling.exhausted).is_some()
            && let Some(p) = lock(&settling.last_pending).take()
        {
            result = Err(Stop::Pending(Box::new(p), None));
        }
        let named = *lock(&settling.known);
        self.file(intent, &result, named).await;
        let elapsed = lock(&settling.budget).elapsed(Instant::now());
        let attempts = settling.tries.load(Ordering::SeqCst);
        match result {
            Ok(outcome) => Ok(outcome),
            Err(Stop::Pending(p, _)) => Ok(Outcome::Pending(*p)),
            Err(Stop::Transient { why, .. } | Stop::InFlight { why, .. }) => {
                let limit = match *lock(&settling.exhausted) {
                    Some(Exhausted::Attempts) => " (attempts used up)",
                    Some(Exhausted::Time) => " (deadline reached)",
                    None => "",
                };
                // A payment the server named before (the journal's), whose look-ups ran
                // out unanswered: pending as far as anyone knows, as one seen pending
                // in this run is.
                if lock(&settling.exhausted).is_some()
                    && let Some(payment_id) = *lock(&settling.known)
                {
                    return Err(PayError::Unread {
                        key: intent.key().clone(),
                        payment_id,
                        elapsed,
                        last: format!("{why}{limit}"),
                    });
                }
                Err(PayError::GaveUp {
                    attempts,
                    elapsed,
                    last: format!("{why}{limit}"),
                })
            }
            Err(Stop::KeyReused(problem)) => Err(PayError::KeyReused {
                key: intent.key().clone(),
                problem,
            }),
            Err(Stop::Refused {
                status, problem, ..
            }) => Err(PayError::Rejected { status, problem }),
            Err(Stop::Expired(first_sent)) => Err(PayError::Expired {
                key: intent.key().clone(),
                first_sent,
                key_retention: self.key_retention,
            }),
            Err(Stop::Lost(payment_id)) => Err(PayError::Lost {
                key: intent.key().clone(),
                payment_id,
            }),
            Err(Stop::Redirected {
                status, location, ..
            }) => Err(PayError::Redirected { status, location }),
            Err(Stop::Unexpected(why)) => Err(PayError::Unexpected(why)),
            Err(Stop::Journal(e)) => Err(PayError::Journal(e)),
        }
    }

    /// Pays again, one after the other, every intent in the journal that was made at this
    /// client's server with its API key, each with its own key. Blocked intents are not
    /// sent; their result is [`PayError::Blocked`].
    ///
    /// Intents made at another server or with another API key are left in the journal
    /// and are not in the answer: an empty answer does not mean an empty journal
    /// ([`Journal::pending`] lists every intent). The journal knows an API key only by its
    /// SHA-256, and only the server knows whether two keys are one merchant's, so after a
    /// key rotation the old key's intents wait for the old key (`docs/client.md`,
    /// "Rotating the API key").
    pub async fn resume(&self) -> Result<Vec<Resumed>, PayError> {
        let journal = self.journal.as_ref().ok_or(PayError::NoJournal)?;
        let mut resumed = Vec::new();
        for kept in journal.pending().await? {
            if kept.base_url != self.base_url || !kept.made_with(&self.api_key) {
                continue;
            }
            let result = self.pay(&kept.intent).await;
            resumed.push(Resumed {
                pending: kept,
                result,
            });
        }
        Ok(resumed)
    }

    /// The intent to pay `request` with: the one the journal keeps for this very request
    /// at this client's server with its API key (it may have paid already, so its key is
    /// the one to send), or else a new one, written down in the same journal transaction,
    /// so a form sent twice while the first is pending pays under one key. Without a
    /// journal, a new intent (keeping it is then the caller's, see [`Intent::with_key`]).
    ///
    /// Only while pending: a paid or declined intent leaves the journal, and the same
    /// request asked afterwards is a new intent (a second payment). Whether that was meant
    /// is the application's to know (its own records, or the payments of the credit).
    ///
    /// One kept for the same request only under another URL or API key (a key rotated
    /// since) may have paid: [`PayError::KeptElsewhere`], and no new intent, as `pagos pay`
    /// refuses it too ([`Journal::find`] lists those).
    pub async fn intent_for(&self, request: PaymentRequest) -> Result<Intent, PayError> {
        let fresh = Intent::new(request);
        let Some(journal) = &self.journal else {
            return Ok(fresh);
        };
        match journal
            .kept_or_record(&fresh, &self.base_url, &self.api_key, Beside::Nothing)
            .await?
        {
            Kept::Recorded => Ok(fresh),
            Kept::Found(kept) => self.kept_here(kept),
        }
    }

    /// Of the intents kept for one request, the one made here (this client's server and
    /// API key), or else [`PayError::KeptElsewhere`] naming the first.
    #[allow(
        clippy::result_large_err,
        reason = "the error every Client method answers with, handed on as it is"
    )]
    pub(crate) fn kept_here<K: journal::KeptIntent>(
        &self,
        kept: Vec<K>,
    ) -> Result<K::Intent, PayError> {
        let hash = journal::api_key_sha256(&self.api_key);
        let first = kept.first().ok_or_else(|| {
            PayError::Unexpected("the journal found a kept intent and then none".into())
        })?;
        let elsewhere = PayError::KeptElsewhere {
            key: first.key().clone(),
            base_url: first.base_url().clone(),
            same_api_key: first.api_key_sha256() == hash,
        };
        kept.into_iter()
            .find(|k| *k.base_url() == self.base_url && k.api_key_sha256() == hash)
            .map(journal::KeptIntent::into_intent)
            .ok_or(elsewhere)
    }

    /// The pending intent the journal keeps for this very request, made at this client's
    /// server with its API key (the oldest, if several): paying the same payment again
    /// must send its key, since it may have paid already. `None` without a journal, which
    /// is then the caller's to keep the intent (see [`Intent::with_key`]). Looking and then
    /// making a new intent are two steps: where the same payment may be asked twice at
    /// once, [`intent_for`](Client::intent_for) does both in one.
    pub async fn kept_payment(
        &self,
        request: &PaymentRequest,
    ) -> Result<Option<PendingIntent>, PayError> {
        let Some(journal) = &self.journal else {
            return Ok(None);
        };
        Ok(journal
            .find(request)
            .await?
            .into_iter()
            .find(|k| k.base_url == self.base_url && k.made_with(&self.api_key)))
    }

    /// Writes down in the journal what the last try taught. A failure here never hides
    /// the outcome: at worst the intent is kept, and paying it again replays the answer.
    /// `named`: the payment the server named for it, if any.
    async fn file(&self, intent: &Intent, result: &Result<Outcome, Stop>, named: Option<Uuid>) {
        let Some(journal) = &self.journal else {
            return;
        };
        let key = intent.key();
        let mut filed = self.file_once(journal, intent, result).await;
        if let Err(JournalError::Gone(_)) = filed {
            // Another process let it go (or a human forgot it) while this one paid it, and
            // this pay ends without a terminal answer (gave up, pending, …): written back
            // with its key, as sent, so the command run again resumes it. Left out, the
            // next run would find nothing and pay under a new key.
            tracing::info!(key = %key, "the intent left the journal while being paid; written back");
            filed = match self.write_back(journal, intent, named).await {
                Ok(()) => self.file_once(journal, intent, result).await,
                Err(err) => Err(err),
            };
        }
        if let Err(err) = filed {
            tracing::warn!(key = %key, error = %err, "could not update the journal");
        }
    }

    /// The intent written down again, as sent (its first send is what it remembers, so
    /// its age is kept), with the payment the server named for it.
    async fn write_back(
        &self,
        journal: &Journal,
        intent: &Intent,
        named: Option<Uuid>,
    ) -> Result<(), JournalError> {
        journal
            .record(intent, &self.base_url, &self.api_key)
            .await?;
        match named {
            Some(id) => journal.payment_known(intent.key(), id).await,
            None => Ok(()),
        }
    }

    /// [`file`](Client::file), once: [`JournalError::Gone`] when the intent to keep is no
    /// longer there.
    async fn file_once(
        &self,
        journal: &Journal,
        intent: &Intent,
        result: &Result<Outcome, Stop>,
    ) -> Result<(), JournalError> {
        let key = intent.key();
        match result {
            // A redirect, even of the first request ever, is kept: a proxy in front of
            // pagos may have forwarded the request and answered its own timeout with a
            // redirect (an error page's), after pagos took the payment.
            Ok(Outcome::Paid(_) | Outcome::Declined { .. })
            | Err(Stop::Refused {
                first_contact: true,
                ..
            }) => journal.remove(key).await.map(drop),
            Ok(Outcome::Pending(p)) => journal.note(key, &still(p)).await,
            Err(Stop::Pending(p, _)) => journal.note(key, &still(p)).await,
            Err(Stop::Transient { why, .. } | Stop::InFlight { why, .. }) => {
                journal.note(key, why).await
            }
            Err(Stop::KeyReused(problem)) => journal.block(key, &headline(problem)).await,
            Err(Stop::Refused {
                status, problem, ..
            }) => {
                journal
                    .note(key, &format!("{status} {}", headline(problem)))
                    .await
            }
            Err(Stop::Lost(id)) => {
                let why = format!(
                    "the server has no payment {id}, which it named; first sent more than {} ago, the gateway may have charged it: check the gateway (reference {id}) before anything; not sent again",
                    humantime::format_duration(LOST_PAYMENT_RESEND.to_std().unwrap_or_default())
                );
                journal.block(key, &why).await
            }
            Err(Stop::Expired(first_sent)) => {
                let first_sent = first_sent.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let why = format!(
                    "first sent at {first_sent}, too long ago for the server's Idempotency-Key retention; not sent again"
                );
                journal.note(key, &why).await
            }
            Err(Stop::Redirected {
                status, location, ..
            }) => {
                let to = location
                    .as_deref()
                    .unwrap_or("nowhere (no Location header)");
                journal
                    .note(key, &format!("{status} redirecting to {to}"))
                    .await
            }
            Err(Stop::Unexpected(why)) => journal.note(key, why).await,
            Err(Stop::Journal(_)) => Ok(()),
        }
    }

    async fn post(&self, intent: &Intent, body: &serde_json::Value, timeout: Duration) -> Reading {
        let sent = self
            .http
            .post(self.payments_url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header("Idempotency-Key", intent.key().as_str())
            .json(body)
            .timeout(timeout)
            .send()
            .await;
        read(sent, answer::read_post).await
    }

    async fn look_up(&self, id: Uuid, timeout: Duration) -> Reading {
        let url = match self.base_url.join(&format!("v1/pagos/{id}")) {
            Ok(url) => url,
            Err(e) => return Reading::Unexpected(e.to_string()),
        };
        let sent = self
            .http
            .get(url)
            .header(AUTHORIZATION, self.authorization.clone())
            .timeout(timeout)
            .send()
            .await;
        read(sent, answer::read_get).await
    }
}

/// An intent paid again from the journal.
#[derive(Debug)]
pub struct Resumed {
    pub pending: PendingIntent,
    pub result: Result<Outcome, PayError>,
}

fn still(p: &Pago) -> String {
    format!("payment {} still {}", p.id, p.state)
}

fn log_notice(notice: &RetryNotice) {
    match notice.waiting {
        Waiting::Failed { .. } => tracing::warn!(key = %notice.key, "{notice}"),
        Waiting::Pending { .. } => tracing::info!(key = %notice.key, "{notice}"),
    }
}

async fn read(
    sent: Result<reqwest::Response, reqwest::Error>,
    reader: fn(&Head, &[u8]) -> Reading,
) -> Reading {
    let response = match sent {
        Ok(response) => response,
        Err(err) => return network(&err),
    };
    let head = Head {
        status: response.status().as_u16(),
        retry_after: response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| answer::parse_retry_after(v, SystemTime::now())),
        location: location(&response),
    };
    match response.bytes().await {
        Ok(body) => reader(&head, &body),
        Err(err) => network(&err),
    }
}

/// An answer's `Location`, as sent: where a redirect leads.
pub(crate) fn location(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(LOCATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// A request that got no (whole) answer: the outcome is unknown, so it may be sent again.
pub(crate) fn network(err: &reqwest::Error) -> Reading {
    if err.is_builder() {
        return Reading::Unexpected(chain(err));
    }
    let why = if err.is_timeout() {
        "no answer in time".to_owned()
    } else if err.is_connect() {
        format!("cannot connect: {}", root(err))
    } else {
        format!("connection lost: {}", root(err))
    };
    Reading::Transient {
        why,
        retry_after: None,
    }
}

fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

fn root(err: &dyn std::error::Error) -> String {
    let mut last = err;
    while let Some(e) = last.source() {
        last = e;
    }
    last.to_string()
}

impl Settling<'_> {
    async fn run(&self) -> Result<Outcome, Stop> {
        (|| self.try_once())
            .retry(self.client.policy.backoff())
            .when(|stop: &Stop| stop.unsettled().is_some())
            .adjust(|stop, jittered| {
                let why = stop.unsettled()?;
                let waited = lock(&self.budget).next_wait(why, jittered?, Instant::now());
                waited
                    .map_err(|exhausted| *lock(&self.exhausted) = Some(exhausted))
                    .ok()
            })
            .notify(|stop, wait| self.notify(stop, wait))
            .await
    }

    fn notify(&self, stop: &Stop, wait: Duration) {
        let waiting = match stop {
            Stop::Pending(p, _) => Waiting::Pending {
                payment_id: p.id,
                state: p.state,
            },
            Stop::Transient { why, retry_after } | Stop::InFlight { why, retry_after } => {
                Waiting::Failed {
                    why: why.clone(),
                    retry_after: *retry_after,
                }
            }
            _ => return,
        };
        (self.client.on_retry)(&RetryNotice {
            key: self.intent.key().clone(),
            attempt: self.tries.load(Ordering::SeqCst),
            waiting,
            wait,
        });
    }

    async fn try_once(&self) -> Result<Outcome, Stop> {
        let client = self.client;
        let key = self.intent.key();
        self.tries.fetch_add(1, Ordering::SeqCst);
        let timeout =
            lock(&self.budget).request_timeout(client.policy.request_timeout, Instant::now());
        let known = *lock(&self.known);
        let (reading, first_contact) = match known {
            // The server named the payment: reading it is enough, and safe at any age.
            Some(id) => (client.look_up(id, timeout).await, false),
            None => {
                // The server may have let the key go since its first request: the same
                // key could make a new payment. A look-up by id (above) is safe at any age.
                let age = (chrono::Utc::now() - self.first_sent)
                    .to_std()
                    .unwrap_or_default();
                if age >= client.sendable_for() {
                    return Err(Stop::Expired(self.first_sent));
                }
                if let Some(id) = *lock(&self.lost)
                    && self.past_lost_resend()
                {
                    return Err(Stop::Lost(id));
                }
                let before = match &client.journal {
                    Some(journal) => match journal.count_attempt(key).await {
                        Ok(before) => before,
                        // Another process settled the intent and let it go while this one
                        // waited (the same payment run twice at once: its 201 came during
                        // our 409's Retry-After), or a human forgot it. Not damage: the same
                        // key, sent uncounted, gets the server's answer for that key (its
                        // stored answer replayed, or 409 while its request runs). Stopping
                        // here instead would leave nothing pending, and the run asked again
                        // would pay under a new key. Counted as sent before: it was.
                        Err(JournalError::Gone(_)) => 1,
                        Err(err) => return Err(Stop::Journal(err)),
                    },
                    // Without a journal: this pay's own tries, and any sent before by the
                    // caller (`Intent::first_sent_at`) or an earlier pay of this intent.
                    None => {
                        self.tries.load(Ordering::SeqCst).saturating_sub(1)
                            + u32::from(self.intent.first_sent().is_some())
                    }
                };
                // The intent (and every clone of it) remembers its first send, so a later
                // `pay` of the same value, journal or not, is held to the key retention
                // from then, not from its own start.
                self.intent.sending(self.first_sent);
                (
                    client.post(self.intent, &self.body, timeout).await,
                    before == 0,
                )
            }
        };
        match reading {
            Reading::Paid(p) => self.ours(p).map(Outcome::Paid),
            Reading::Declined(p, problem) => self
                .ours(p)
                .map(|payment| Outcome::Declined { payment, problem }),
            Reading::Pending(p, retry_after) => {
                let p = self.ours(p)?;
                if known.is_none() {
                    *lock(&self.known) = Some(p.id);
                    if let Some(journal) = &client.journal {
                        match journal.payment_known(key, p.id).await {
                            // Let go meanwhile by another process (or a human): the payment
                            // is read by its id all the same, which is safe at any age.
                            Ok(()) | Err(JournalError::Gone(_)) => {}
                            Err(err) => return Err(Stop::Journal(err)),
                        }
                    }
                }
                *lock(&self.last_pending) = Some(p.clone());
                Err(Stop::Pending(Box::new(p), retry_after))
            }
            Reading::Transient { why, retry_after } => Err(Stop::Transient { why, retry_after }),
            Reading::InFlight { why, retry_after } => Err(Stop::InFlight { why, retry_after }),
            Reading::KeyReused(problem) => Err(Stop::KeyReused(problem)),
            // The server named this payment, and now answers it has no such payment (its
            // own problem, not a proxy's page): its database lost it (restored from before
            // it, a replica behind). Its key brings it back: the same key makes the same
            // payment id and gateway key, so the gateway answers the charge it made rather
            // than make another, as long as the gateway still keeps that key. So only
            // within `LOST_PAYMENT_RESEND` of the first send (Mercado Pago keeps keys an
            // hour), checked again before every resend; past it, a human checks the
            // gateway first. The journal keeps the id, which a later look-up reads again.
            Reading::Refused {
                status: 404,
                problem,
            } if problem.kind() == Some(ProblemType::NotFound)
                && let Some(id) = known =>
            {
                *lock(&self.lost) = Some(id);
                if self.past_lost_resend() {
                    return Err(Stop::Lost(id));
                }
                *lock(&self.known) = None;
                *lock(&self.last_pending) = None;
                Err(Stop::Transient {
                    why: format!(
                        "the server has no payment {id}, which it named for this intent (its database restored from before it?): to be sent again with the same key"
                    ),
                    retry_after: None,
                })
            }
            Reading::Refused { status, problem } => Err(Stop::Refused {
                status,
                problem,
                first_contact,
            }),
            Reading::Redirected { status, location } => Err(Stop::Redirected { status, location }),
            Reading::Unexpected(why) => Err(Stop::Unexpected(why)),
        }
    }

    /// Whether a payment the server lost is too old to send again (`LOST_PAYMENT_RESEND`).
    fn past_lost_resend(&self) -> bool {
        chrono::Utc::now() - self.first_sent >= LOST_PAYMENT_RESEND
    }

    /// The server answered about this intent's payment, not another one.
    fn ours(&self, p: Pago) -> Result<Pago, Stop> {
        let request = self.intent.request();
        let same = p.credit_id == request.credit_id()
            && p.amount == request.amount()
            && p.currency == request.currency().code();
        if same {
            Ok(p)
        } else {
            Err(Stop::Unexpected(format!(
                "the server answered about payment {} ({} {} {}), not this intent",
                p.id, p.credit_id, p.amount, p.currency
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_a_trailing_slash_and_keeps_its_prefix() {
        let client = Client::new("http://127.0.0.1:8080", "sk_test").expect("client");
        assert_eq!(
            client.payments_url.as_str(),
            "http://127.0.0.1:8080/v1/pagos"
        );
        let client = Client::new("https://api.example/pagos", "sk_test").expect("client");
        assert_eq!(
            client.payments_url.as_str(),
            "https://api.example/pagos/v1/pagos"
        );
        assert!(Client::new("ftp://example", "k").is_err());
        assert!(Client::new("not a url", "k").is_err());
        assert!(Client::new("http://h/?x=1", "k").is_err());
    }

    #[test]
    fn an_api_key_that_cannot_be_a_header_is_refused_and_never_shown() {
        assert!(matches!(
            Client::new("http://h", "sk with space"),
            Err(SetupError::BadApiKey)
        ));
        assert!(matches!(
            Client::new("http://h", ""),
            Err(SetupError::BadApiKey)
        ));
        let client = Client::new("http://h", "sk_secret_value").expect("client");
        assert!(!format!("{client:?}").contains("sk_secret_value"));
    }

    #[test]
    fn paying_is_a_future_that_can_be_spawned() {
        fn assert_send<T: Send>(_: &T) {}
        let client = Client::new("http://h", "k").expect("client");
        let intent = Intent::new(PaymentRequest::new("42", 1, "COP").expect("valid"));
        let paying = client.pay(&intent);
        assert_send(&paying);
    }

    #[test]
    fn a_notice_says_the_attempt_why_and_how_long() {
        let notice = RetryNotice {
            key: IntentKey::parse("k-1").expect("key"),
            attempt: 2,
            waiting: Waiting::Failed {
                why: "409 Conflict".into(),
                retry_after: Some(Duration::from_secs(1)),
            },
            wait: Duration::from_secs(1),
        };
        assert_eq!(
            notice.to_string(),
            "attempt 2 failed (409 Conflict); the server asks to wait (Retry-After): trying again with the same key in 1s"
        );
    }
}
