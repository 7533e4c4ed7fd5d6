//! One attempt of one delivery: check the endpoint's address, sign, POST the event, and
//! say what the answer means — and what the attempt leaves to be stored.
//!
//! A 2xx is delivered; `410 Gone` deactivates the endpoint at once; anything else — a 3xx
//! (redirects are never followed: a redirected POST could land on an internal address the
//! guard never saw), a 4xx or 5xx, no answer within `PAGOS_WEBHOOKS_TIMEOUT`, a reset, a
//! refused connection — is a failed attempt, retried on the schedule, and a 429 or 503
//! with `Retry-After` not before that. A URL the guard refuses is not sent at all.
//!
//! The connection goes only to the addresses the guard checked: the HTTP client is pinned
//! to them, and it has no resolver of its own (nor a proxy) to reach anything else.
//!
//! Never logs a URL, a secret or a body: what an attempt returns is for the delivery
//! worker to store.

use super::guard::{self, AddressPolicy, Destination, Refusal, Resolve, SystemResolver};
use super::settings::WebhookSettings;
use super::signing::{self, Keys};
use chrono::{DateTime, TimeDelta, Utc};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use url::Url;

/// How much of an answer's body is kept.
pub const ANSWER_BYTES: usize = 1024;

/// What pagos tells receivers it is.
pub const USER_AGENT: &str = concat!("pagos-webhooks/", env!("CARGO_PKG_VERSION"));

/// One event to deliver: its id (the `webhook-id`) and its body, the exact bytes signed
/// and sent.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    pub id: &'a str,
    pub body: &'a [u8],
}

/// What an attempt means for the delivery and its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx: done.
    Delivered,
    /// `410 Gone`: the receiver says the endpoint is no more; deactivate it now.
    Gone,
    /// Try again on the schedule; not before `not_before` (the receiver's `Retry-After`).
    Failed { not_before: Option<DateTime<Utc>> },
    /// Not sent: the guard refuses the URL's addresses. Counted as a failed attempt (the
    /// name may point elsewhere later; the endpoint is deactivated if it never does).
    Refused,
}

impl Outcome {
    /// The label of the outcome in metrics and the stored attempt.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Gone => "gone",
            Outcome::Failed { .. } => "failed",
            Outcome::Refused => "refused",
        }
    }
}

/// One attempt, as it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// When it started; also its `webhook-timestamp`.
    pub at: DateTime<Utc>,
    /// The answer's status (None: no answer).
    pub status: Option<u16>,
    /// From the start of the attempt to the answer's head (or the failure).
    pub latency: Duration,
    /// The first `ANSWER_BYTES` of the answer's body, valid UTF-8 (cut on a character,
    /// bytes that are not UTF-8 and NULs replaced), empty when there was none.
    pub answer: String,
    /// Why there was no answer (a timeout, a refused connection, the guard's refusal).
    pub error: Option<String>,
    /// The address connected to.
    pub remote: Option<SocketAddr>,
    pub outcome: Outcome,
}

/// Sends attempts. One per process: it keeps one HTTP client per checked destination, so
/// deliveries to an endpoint reuse their connections. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Deliverer {
    policy: AddressPolicy,
    timeout: Duration,
    resolver: Arc<dyn Resolve>,
    clients: moka::future::Cache<Pin, reqwest::Client>,
}

/// A client is valid for exactly the addresses it was pinned to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pin {
    name: Option<String>,
    addrs: Vec<SocketAddr>,
}

impl Deliverer {
    pub fn new(settings: &WebhookSettings) -> Deliverer {
        Deliverer::with_resolver(
            settings.policy(),
            settings.timeout,
            Arc::new(SystemResolver),
        )
    }

    /// With another resolver (tests: a name that answers differently each time).
    pub fn with_resolver(
        policy: AddressPolicy,
        timeout: Duration,
        resolver: Arc<dyn Resolve>,
    ) -> Deliverer {
        Deliverer {
            policy,
            timeout,
            resolver,
            clients: moka::future::Cache::builder()
                .max_capacity(1024)
                .time_to_idle(Duration::from_secs(300))
                .build(),
        }
    }

    /// The guard's check of `url` with this deliverer's policy and resolver (for a
    /// registration: the API answers 422 with the refusal).
    pub async fn check(&self, url: &Url) -> Result<Destination, Refusal> {
        guard::check(url, self.policy, &*self.resolver).await
    }

    /// One attempt of `message` to `url`, signed with `keys`, within the timeout. Never
    /// fails: whatever happens is in the attempt.
    pub async fn deliver(&self, url: &Url, message: Message<'_>, keys: &Keys) -> Attempt {
        self.deliver_within(url, message, keys, self.timeout).await
    }

    /// The timeout of one attempt (`PAGOS_WEBHOOKS_TIMEOUT`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One attempt as `deliver`, over by `within` from now if that is sooner than the
    /// timeout (the delivery worker: before its claim on the delivery runs out).
    pub async fn deliver_within(
        &self,
        url: &Url,
        message: Message<'_>,
        keys: &Keys,
        within: Duration,
    ) -> Attempt {
        let at = Utc::now();
        let started = Instant::now();
        let budget = within.min(self.timeout);
        let deadline = tokio::time::Instant::from_std(started + budget);
        let mut attempt = Attempt {
            at,
            status: None,
            latency: Duration::ZERO,
            answer: String::new(),
            error: None,
            remote: None,
            outcome: Outcome::Failed { not_before: None },
        };
        let no_answer = |mut attempt: Attempt, outcome: Outcome, error: String| {
            attempt.latency = started.elapsed();
            attempt.outcome = outcome;
            attempt.error = Some(error);
            attempt
        };

        let checked = tokio::time::timeout_at(deadline, self.check(url)).await;
        let destination = match checked {
            Ok(Ok(destination)) => destination,
            // The stored attempt is the merchant's to read (`GET /v1/eventos/{id}`): it says
            // what the registration's 422 says, never the address a name resolved to nor
            // the resolver's words; the whole refusal is in the log, for on-call.
            Ok(Err(refusal)) if refusal.is_about_the_url() => {
                tracing::warn!(%refusal, "webhook attempt not sent: the address guard refused its host");
                let error = format!("not sent: {}", refusal.for_merchant());
                return no_answer(attempt, Outcome::Refused, error);
            }
            Ok(Err(refusal)) => {
                tracing::warn!(%refusal, "webhook attempt not sent: its host did not resolve");
                let failed = Outcome::Failed { not_before: None };
                let error = format!("not sent: {}", refusal.for_merchant());
                return no_answer(attempt, failed, error);
            }
            Err(_) => {
                let failed = Outcome::Failed { not_before: None };
                let error = format!("the host did not resolve within {}", show(budget));
                return no_answer(attempt, failed, error);
            }
        };
        let signed = match signing::sign(message.id, at.timestamp(), message.body, keys) {
            Ok(signed) => signed,
            Err(e) => {
                let failed = Outcome::Failed { not_before: None };
                return no_answer(attempt, failed, format!("not sent: {e}"));
            }
        };
        let client = match self.client_for(&destination).await {
            Ok(client) => client,
            Err(e) => {
                let failed = Outcome::Failed { not_before: None };
                return no_answer(attempt, failed, format!("not sent: {e}"));
            }
        };

        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut request = client
            .post(destination.url().clone())
            .timeout(remaining)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(message.body.to_vec());
        for (name, value) in signed.pairs() {
            request = request.header(name, value);
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let failed = Outcome::Failed { not_before: None };
                return no_answer(attempt, failed, describe(&e, budget));
            }
        };
        attempt.latency = started.elapsed();
        attempt.remote = response.remote_addr();
        let status = response.status().as_u16();
        attempt.status = Some(status);
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        attempt.outcome = classify(status, retry_after.as_deref(), at);
        // The status decides; the body is only kept for the merchant to read, as far as it
        // came within the timeout.
        let mut body = Vec::with_capacity(ANSWER_BYTES);
        while body.len() < ANSWER_BYTES {
            match tokio::time::timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
                _ => break,
            }
        }
        attempt.answer = answer_text(&body);
        attempt
    }

    async fn client_for(&self, destination: &Destination) -> Result<reqwest::Client, String> {
        let pin = Pin {
            name: destination.name().map(str::to_owned),
            addrs: destination.addrs().to_vec(),
        };
        let build = {
            let pin = pin.clone();
            async move { pinned_client(&pin) }
        };
        self.clients
            .try_get_with(pin, build)
            .await
            .map_err(|e| e.to_string())
    }
}

fn pinned_client(pin: &Pin) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // A proxy would connect wherever the name leads it, past the guard.
        .no_proxy()
        .user_agent(USER_AGENT)
        // Every name this client may meet is pinned below; any other is refused.
        .dns_resolver(Arc::new(NoResolution));
    if let Some(name) = &pin.name {
        builder = builder.resolve_to_addrs(name, &pin.addrs);
    }
    builder
        .build()
        .map_err(|e| format!("the HTTP client cannot be built: {e}"))
}

/// The resolver of a pinned client: names are resolved by the guard, never by the client.
struct NoResolution;

impl reqwest::dns::Resolve for NoResolution {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async {
            Err::<reqwest::dns::Addrs, _>("names are resolved only by the address guard".into())
        })
    }
}

/// What an answer means.
pub fn classify(status: u16, retry_after: Option<&str>, at: DateTime<Utc>) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        410 => Outcome::Gone,
        429 | 503 => Outcome::Failed {
            not_before: retry_after.and_then(|v| retry_after_time(v, at)),
        },
        _ => Outcome::Failed { not_before: None },
    }
}

/// A `Retry-After` value — delay seconds or an HTTP date — as a time, relative to `at`.
pub fn retry_after_time(value: &str, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<i64>().ok()?;
        return at.checked_add_signed(TimeDelta::try_seconds(secs)?);
    }
    httpdate::parse_http_date(value)
        .ok()
        .map(DateTime::<Utc>::from)
}

/// The first `ANSWER_BYTES` of a body as text that any database column takes.
pub fn answer_text(body: &[u8]) -> String {
    let mut head = &body[..body.len().min(ANSWER_BYTES)];
    // A character the cut split is dropped, not shown as a replacement.
    if let Err(e) = std::str::from_utf8(head)
        && e.error_len().is_none()
    {
        head = &head[..e.valid_up_to()];
    }
    // What is not UTF-8 becomes U+FFFD, and so does NUL (PostgreSQL's text refuses it).
    // Both can lengthen it: cut again, on a character.
    let text = String::from_utf8_lossy(head).replace('\0', "\u{FFFD}");
    let end = text.floor_char_boundary(ANSWER_BYTES);
    let mut text = text;
    text.truncate(end);
    text
}

/// Why a request got no answer, in words, without the URL (it may carry a token).
fn describe(err: &reqwest::Error, timeout: Duration) -> String {
    if err.is_timeout() {
        return format!("no answer within {}", show(timeout));
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            match io.kind() {
                ConnectionRefused => return "connection refused".into(),
                ConnectionReset => return "connection reset".into(),
                ConnectionAborted => return "connection aborted".into(),
                TimedOut => return format!("no answer within {}", show(timeout)),
                _ => {}
            }
        }
        source = e.source();
    }
    let mut text = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let part = if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            // reqwest's own text may name the URL: never kept.
            if r.is_connect() {
                "cannot connect".to_owned()
            } else {
                "request failed".to_owned()
            }
        } else {
            e.to_string()
        };
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
        source = e.source();
    }
    text
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        "2026-03-01T12:00:00Z".parse().expect("a time")
    }

    #[test]
    fn only_a_2xx_is_delivered_and_only_410_deactivates() {
        for status in [200, 201, 202, 204, 299] {
            assert_eq!(classify(status, None, at()), Outcome::Delivered, "{status}");
        }
        assert_eq!(classify(410, Some("60"), at()), Outcome::Gone);
        for status in [
            100, 301, 302, 303, 307, 308, 400, 401, 404, 408, 409, 500, 502, 504,
        ] {
            assert_eq!(
                classify(status, Some("60"), at()),
                Outcome::Failed { not_before: None },
                "{status} fails, and its Retry-After is not read"
            );
        }
    }

    #[test]
    fn a_429_or_503_with_retry_after_in_seconds_or_as_a_date_is_not_retried_before_it() {
        for status in [429, 503] {
            assert_eq!(
                classify(status, Some("120"), at()),
                Outcome::Failed {
                    not_before: Some(at() + TimeDelta::seconds(120))
                }
            );
            assert_eq!(
                classify(status, Some("Sun, 01 Mar 2026 13:00:00 GMT"), at()),
                Outcome::Failed {
                    not_before: Some(at() + TimeDelta::hours(1))
                }
            );
            assert_eq!(
                classify(status, None, at()),
                Outcome::Failed { not_before: None }
            );
        }
        assert_eq!(
            retry_after_time("Sunday, 01-Mar-26 13:00:00 GMT", at()),
            Some(at() + TimeDelta::hours(1)),
            "the obsolete RFC 850 form too"
        );
        assert_eq!(retry_after_time(" 0 ", at()), Some(at()));
        for garbage in ["", "-5", "1.5", "soon", "99999999999999999999999"] {
            assert_eq!(retry_after_time(garbage, at()), None, "{garbage:?}");
        }
    }

    #[test]
    fn the_answer_kept_is_the_first_kib_cut_on_a_character() {
        assert_eq!(answer_text(b"ok"), "ok");
        assert_eq!(answer_text(b""), "");
        let body = "é".repeat(1000); // 2000 bytes
        let kept = answer_text(body.as_bytes());
        assert_eq!(kept, "é".repeat(512));
        let odd = format!("x{}", "é".repeat(1000));
        let kept = answer_text(odd.as_bytes());
        assert!(kept.len() <= ANSWER_BYTES);
        assert_eq!(kept, format!("x{}", "é".repeat(511)));
        let binary: Vec<u8> = (0..=255u8).cycle().take(4000).collect();
        let kept = answer_text(&binary);
        assert!(kept.len() <= ANSWER_BYTES, "{}", kept.len());
        assert!(!kept.contains('\0'));
    }
}
