//! `pagos sandbox-gateway`: the reference protocol served over HTTP from memory, with
//! fault injection for tests and demos: charges (`/v1/charges`) and refunds of them
//! (`/v1/refunds`, contract section 6), under the same rules and the same faults.
//!
//! Faults are drawn per request: `error` answers 503 without charging (or refunding);
//! `timeout` charges (refunds) then hangs past any client's patience; `reset` charges
//! (refunds) then breaks the connection mid-answer. Each leaves the client not knowing,
//! which is the point. A refund over what is left of its charge, or of a charge that did
//! not succeed, is refused with 400 as a real gateway refuses it.
//!
//! With `--webhook-url`, every change of a charge or refund (made; settled after
//! `--pending-for` if it was pending) becomes a signed `charge.updated` or
//! `refund.updated` event with the charge's (refund's) next sequence, delivered at least
//! once: retried with backoff until answered 2xx. Under
//! `--chaos` events are also duplicated (sometimes two copies at the same instant),
//! delayed (so a charge's events arrive out of order) and an acknowledgement is now and
//! then "lost" (the event is delivered again). `GET /sandbox/stats` counts them.

use super::sandbox::{Begin, Change, Outcomes, SandboxCore};
use super::{Charge, ChargeBody, ChargeStatus, Refund, RefundBody};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use backon::{ExponentialBuilder, Retryable};
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Fault rates, each in [0, 1].
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub latency: Duration,
    pub error_rate: f64,
    pub timeout_rate: f64,
    pub reset_rate: f64,
}

pub struct SandboxServer {
    core: SandboxCore,
    faults: Faults,
    secret: Option<String>,
    webhooks: Option<Webhooks>,
}

/// Where and how to deliver events.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    pub url: url::Url,
    /// pagos' `PAGOS_WEBHOOK_SECRET`.
    pub secret: String,
    pub chaos: bool,
}

impl SandboxServer {
    pub fn new(outcomes: Outcomes, faults: Faults, secret: Option<String>) -> Arc<Self> {
        Arc::new(SandboxServer {
            core: SandboxCore::new(outcomes),
            faults,
            secret,
            webhooks: None,
        })
    }

    /// A server that also delivers webhooks. Starts the delivery task: call it inside a
    /// Tokio runtime.
    pub fn with_webhooks(
        outcomes: Outcomes,
        faults: Faults,
        secret: Option<String>,
        config: WebhookConfig,
    ) -> anyhow::Result<Arc<Self>> {
        let (changes, received) = tokio::sync::mpsc::unbounded_channel();
        let client = reqwest::Client::builder()
            .timeout(DELIVERY_TIMEOUT)
            .user_agent("pagos-sandbox-gateway")
            .build()?;
        let server = Arc::new(SandboxServer {
            core: SandboxCore::reporting(outcomes, changes),
            faults,
            secret,
            webhooks: Some(Webhooks {
                config,
                client,
                stats: WebhookStats::default(),
            }),
        });
        tokio::spawn(dispatch(server.clone(), received));
        Ok(server)
    }

    pub fn core(&self) -> &SandboxCore {
        &self.core
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/charges", post(create::<ChargeBody>).get(list_charges))
            .route("/v1/refunds", post(create::<RefundBody>).get(list_refunds))
            .route("/sandbox/stats", get(stats))
            .with_state(self)
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn authorized(server: &SandboxServer, headers: &HeaderMap) -> bool {
    let Some(secret) = &server.secret else {
        return true;
    };
    let expected = format!("Bearer {secret}");
    headers
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == expected.as_bytes())
}

/// A request body that makes something (a charge, a refund): what the core makes of it,
/// and what a body that does not parse was meant to be (in its 400).
trait Making: DeserializeOwned + Send + 'static {
    type Made: Serialize + Send + 'static;
    const WHAT: &'static str;
    fn begin(&self, core: &SandboxCore, key: &str) -> Begin<Self::Made>;
    /// Makes the thing, or says why not (answered 400 with that body).
    fn complete(&self, core: &SandboxCore, key: &str) -> Result<Self::Made, serde_json::Value>;
}

impl Making for ChargeBody {
    type Made = Charge;
    const WHAT: &'static str = "a charge request";
    fn begin(&self, core: &SandboxCore, key: &str) -> Begin<Charge> {
        core.begin(key, self)
    }
    fn complete(&self, core: &SandboxCore, key: &str) -> Result<Charge, serde_json::Value> {
        Ok(core.complete(key, self))
    }
}

impl Making for RefundBody {
    type Made = Refund;
    const WHAT: &'static str = "a refund request";
    fn begin(&self, core: &SandboxCore, key: &str) -> Begin<Refund> {
        core.begin_refund(key, self)
    }
    fn complete(&self, core: &SandboxCore, key: &str) -> Result<Refund, serde_json::Value> {
        core.complete_refund(key, self)
            .map_err(|refused| refused.body())
    }
}

/// A request that makes something (a charge, a refund), served by the same rules and
/// faults whatever it makes: the key replays, is in flight (409) or was used with another
/// body (422); `complete` makes the thing or says why not (answered 400 with that body).
async fn create<B: Making>(
    State(server): State<Arc<SandboxServer>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&server, &headers) {
        return error(StatusCode::UNAUTHORIZED, "bad or missing bearer secret");
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "Idempotency-Key is required");
    };
    let Ok(body) = serde_json::from_slice::<B>(&body) else {
        return error(StatusCode::BAD_REQUEST, &format!("body is not {}", B::WHAT));
    };
    if server.core.roll() < server.faults.error_rate {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected fault: unavailable",
        );
    }
    let made = match body.begin(&server.core, &key) {
        Begin::New => {
            // Its own task: like a real gateway, the request goes through even if the
            // caller hangs up while waiting (otherwise the key would stay in flight).
            let worker = server.clone();
            let making = tokio::spawn(async move {
                if !worker.faults.latency.is_zero() {
                    tokio::time::sleep(worker.faults.latency).await;
                }
                body.complete(&worker.core, &key)
            });
            match making.await {
                Ok(Ok(made)) => made,
                Ok(Err(refused)) => {
                    return (StatusCode::BAD_REQUEST, Json(refused)).into_response();
                }
                Err(_) => return error(StatusCode::INTERNAL_SERVER_ERROR, "the task failed"),
            }
        }
        Begin::Replay(made) => made,
        Begin::InFlight => {
            return error(StatusCode::CONFLICT, "a request with this key is in flight");
        }
        Begin::Mismatch => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this key was used with another body",
            );
        }
    };
    if server.core.roll() < server.faults.timeout_rate {
        // Made; the answer never comes in time.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if server.core.roll() < server.faults.reset_rate {
        return broken_answer();
    }
    (StatusCode::CREATED, Json(made)).into_response()
}

/// Headers go out, then the body fails: the client's connection breaks mid-answer.
fn broken_answer() -> Response {
    let stream = futures::stream::once(async {
        Err::<bytes::Bytes, std::io::Error>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected fault: connection reset",
        ))
    });
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[derive(Deserialize)]
struct ReferenceQuery {
    reference: String,
}

async fn list_charges(
    State(server): State<Arc<SandboxServer>>,
    headers: HeaderMap,
    Query(query): Query<ReferenceQuery>,
) -> Response {
    listed(&server, &headers, |core| core.charges_for(&query.reference))
}

async fn list_refunds(
    State(server): State<Arc<SandboxServer>>,
    headers: HeaderMap,
    Query(query): Query<ReferenceQuery>,
) -> Response {
    listed(&server, &headers, |core| core.refunds_for(&query.reference))
}

/// A list's answer, `{"data": […]}` of what `find` finds: 401 without the bearer secret,
/// or an injected 503.
fn listed<T: Serialize>(
    server: &SandboxServer,
    headers: &HeaderMap,
    find: impl FnOnce(&SandboxCore) -> Vec<T>,
) -> Response {
    if !authorized(server, headers) {
        return error(StatusCode::UNAUTHORIZED, "bad or missing bearer secret");
    }
    if server.core.roll() < server.faults.error_rate {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected fault: unavailable",
        );
    }
    let data = find(&server.core);
    Json(json!({ "data": data })).into_response()
}

/// Counts for soak tests and demos: charges made and references charged twice; refunds
/// made, the amount refunded and the charges refunded over their amount (never); and the
/// webhooks delivered (`null` without `--webhook-url`).
async fn stats(State(server): State<Arc<SandboxServer>>) -> Response {
    let charges = server.core.all_charges();
    let (total, duplicated) = server.core.totals();
    let refunds = server.core.refund_totals();
    let count = |status| charges.iter().filter(|c| c.status == status).count();
    Json(json!({
        "charges": total,
        "duplicatedReferences": duplicated,
        "succeeded": count(ChargeStatus::Succeeded),
        "declined": count(ChargeStatus::Declined),
        "pending": count(ChargeStatus::Pending),
        "refunds": {
            "made": refunds.made,
            "succeeded": refunds.succeeded,
            "failed": refunds.failed,
            "pending": refunds.pending,
            "refundedAmount": refunds.refunded_amount,
            "refundedCharges": refunds.refunded_charges,
            "overRefundedCharges": refunds.over_refunded_charges,
            "duplicatedReferences": refunds.duplicated_references,
        },
        "webhooks": server.webhooks.as_ref().map(|w| w.stats.to_json()),
    }))
    .into_response()
}

// ---- Webhook delivery -------------------------------------------------------------

/// One delivery attempt's patience.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// A copy still unacknowledged after this long is given up (and counted).
const GIVE_UP_AFTER: Duration = Duration::from_secs(3600);
/// Under chaos, each copy waits up to this long before its first attempt: longer than
/// the default `--pending-for`, so a charge's two events often arrive swapped.
const CHAOS_MAX_DELAY: Duration = Duration::from_millis(2500);

struct Webhooks {
    config: WebhookConfig,
    client: reqwest::Client,
    stats: WebhookStats,
}

#[derive(Default)]
struct WebhookStats {
    /// Distinct events made (one per change of a charge or refund).
    events: AtomicU64,
    /// Distinct events answered 2xx at least once.
    events_acknowledged: AtomicU64,
    /// Extra copies sent by chaos (each one delivered until acknowledged too).
    duplicates: AtomicU64,
    /// HTTP attempts, and how they ended.
    attempts: AtomicU64,
    acknowledged: AtomicU64,
    refused: AtomicU64,
    unreachable: AtomicU64,
    /// 2xx answers chaos pretended not to have received (the copy is sent again).
    acks_dropped: AtomicU64,
    /// Copies given up after `GIVE_UP_AFTER`.
    abandoned: AtomicU64,
    /// Copies not yet acknowledged nor given up.
    in_flight: AtomicU64,
    /// What the receiver said it did, by its answer's `resultado` (pagos: `aplicado`,
    /// `duplicado`, `obsoleto`, …): shows duplicates and reordering were met.
    results: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl WebhookStats {
    fn to_json(&self) -> serde_json::Value {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        json!({
            "events": get(&self.events),
            "eventsAcknowledged": get(&self.events_acknowledged),
            "duplicates": get(&self.duplicates),
            "attempts": get(&self.attempts),
            "acknowledged": get(&self.acknowledged),
            "refused": get(&self.refused),
            "unreachable": get(&self.unreachable),
            "acksDropped": get(&self.acks_dropped),
            "abandoned": get(&self.abandoned),
            "inFlight": get(&self.in_flight),
            "results": self.results.lock().map(|r| json!(*r)).unwrap_or_default(),
        })
    }

    fn count_result(&self, body: &[u8]) {
        let word = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["resultado"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "(other)".into());
        if let Ok(mut results) = self.results.lock() {
            *results.entry(word).or_default() += 1;
        }
    }
}

/// One event, as every copy of it sends it: same id, same bytes.
struct OutgoingEvent {
    id: String,
    body: bytes::Bytes,
    acknowledged: AtomicBool,
}

/// Settles the pending charge or refund `id` (`settle`) once `wait` has passed.
fn settle_after(
    server: &Arc<SandboxServer>,
    wait: Duration,
    id: &str,
    settle: fn(&SandboxCore, &str),
) {
    let (server, id) = (server.clone(), id.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        settle(&server.core, &id);
    });
}

/// Turns each change of a charge or refund into an event and schedules its copies;
/// settles pending charges and refunds when their time comes (which reports the second
/// change).
async fn dispatch(server: Arc<SandboxServer>, mut changes: UnboundedReceiver<Change>) {
    while let Some(change) = changes.recv().await {
        let wait = server.core.outcomes().pending_for + Duration::from_millis(1);
        let (kind, sequence, data) = match change {
            Change::Charge(change) => {
                if change.charge.status == ChargeStatus::Pending {
                    settle_after(&server, wait, &change.charge.id, |core, id| {
                        core.settle_due(id);
                    });
                }
                let data = serde_json::to_value(&change.charge).unwrap_or_default();
                ("charge.updated", change.sequence, data)
            }
            Change::Refund(change) => {
                if change.refund.status == super::RefundStatus::Pending {
                    settle_after(&server, wait, &change.refund.id, |core, id| {
                        core.settle_refund_due(id);
                    });
                }
                let data = serde_json::to_value(&change.refund).unwrap_or_default();
                ("refund.updated", change.sequence, data)
            }
        };
        let Some(webhooks) = &server.webhooks else {
            continue;
        };
        let body = json!({
            "id": format!("evt_{}", uuid::Uuid::new_v4().simple()),
            "type": kind,
            "sequence": sequence,
            "data": data,
        });
        let event = Arc::new(OutgoingEvent {
            id: body["id"].as_str().unwrap_or_default().to_owned(),
            body: serde_json::to_vec(&body).unwrap_or_default().into(),
            acknowledged: AtomicBool::new(false),
        });
        webhooks.stats.events.fetch_add(1, Ordering::Relaxed);
        for copy in plan_copies(&server.core, webhooks.config.chaos) {
            if copy.duplicate {
                webhooks.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            webhooks.stats.in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(deliver(server.clone(), event.clone(), copy));
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct CopyPlan {
    delay: Duration,
    duplicate: bool,
    drop_first_ack: bool,
}

/// One copy, at once, without chaos. Under chaos: one to three copies, each after a
/// random delay; sometimes a twin of the first at the very same instant; now and then
/// an acknowledgement "lost".
fn plan_copies(core: &SandboxCore, chaos: bool) -> Vec<CopyPlan> {
    if !chaos {
        return vec![CopyPlan {
            delay: Duration::ZERO,
            duplicate: false,
            drop_first_ack: false,
        }];
    }
    let delay = || CHAOS_MAX_DELAY.mul_f64(core.roll());
    let first = CopyPlan {
        delay: delay(),
        duplicate: false,
        drop_first_ack: core.roll() < 0.1,
    };
    let mut copies = vec![first];
    if core.roll() < 0.25 {
        copies.push(CopyPlan {
            duplicate: true,
            drop_first_ack: false,
            ..first
        });
    }
    for share in [0.5, 0.2] {
        if core.roll() < share {
            copies.push(CopyPlan {
                delay: delay(),
                duplicate: true,
                drop_first_ack: core.roll() < 0.1,
            });
        }
    }
    copies
}

#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error("answered {0}")]
    Refused(reqwest::StatusCode),
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("acknowledgement dropped by chaos")]
    AckDropped,
}

/// Delivers one copy until it is answered 2xx (or `GIVE_UP_AFTER` passes), signing each
/// attempt afresh: the timestamp is part of what is signed.
async fn deliver(server: Arc<SandboxServer>, event: Arc<OutgoingEvent>, copy: CopyPlan) {
    let Some(webhooks) = &server.webhooks else {
        return;
    };
    let stats = &webhooks.stats;
    tokio::time::sleep(copy.delay).await;
    let drop_ack = AtomicBool::new(copy.drop_first_ack);
    let attempt = || async {
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let t = chrono::Utc::now().timestamp();
        let signature =
            crate::webhooks::signature::sign(webhooks.config.secret.as_bytes(), t, &event.body);
        let answer = webhooks
            .client
            .post(webhooks.config.url.clone())
            .header("content-type", "application/json")
            .header("gateway-signature", signature)
            .body(event.body.clone())
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status().is_success() => {
                // Answered 2xx: delivered, whatever the body; it is only counted.
                stats.count_result(&answer.bytes().await.unwrap_or_default());
                if drop_ack.swap(false, Ordering::Relaxed) {
                    stats.acks_dropped.fetch_add(1, Ordering::Relaxed);
                    return Err(DeliveryError::AckDropped);
                }
                Ok(())
            }
            Ok(answer) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                Err(DeliveryError::Refused(answer.status()))
            }
            Err(err) => {
                stats.unreachable.fetch_add(1, Ordering::Relaxed);
                Err(DeliveryError::Unreachable(err.to_string()))
            }
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
        .with_total_delay(Some(GIVE_UP_AFTER))
        .with_jitter();
    let delivered = attempt
        .retry(backoff)
        .notify(|err, delay| {
            tracing::debug!(event_id = event.id, error = %err, retry_in = ?delay, "webhook not acknowledged; retrying");
        })
        .await;
    match delivered {
        Ok(()) => {
            stats.acknowledged.fetch_add(1, Ordering::Relaxed);
            if !event.acknowledged.swap(true, Ordering::Relaxed) {
                stats.events_acknowledged.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(err) => {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(event_id = event.id, error = %err, "webhook given up");
        }
    }
    stats.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// `pagos sandbox-gateway`: serves until Ctrl-C or SIGTERM.
pub async fn run(args: crate::config::SandboxArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let outcomes = Outcomes {
        decline_rate: args.decline_rate,
        refund_failure_rate: args.refund_failure_rate,
        pending_rate: args.pending_rate,
        pending_for: args.pending_for,
        seed: args.seed,
    };
    let faults = Faults {
        latency: args.latency,
        error_rate: args.error_rate,
        timeout_rate: args.timeout_rate,
        reset_rate: args.reset_rate,
    };
    let server = match args.webhook_url {
        Some(url) => {
            // Its own setting, or else pagos' PAGOS_WEBHOOK_SECRET itself: an environment
            // set for both processes signs what the one sends as the other checks it.
            let secret = crate::config::exposed(&args.webhook_secret)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .or_else(|| {
                    std::env::var("PAGOS_WEBHOOK_SECRET")
                        .ok()
                        .filter(|s| !s.is_empty())
                })
                .ok_or_else(|| crate::config::SettingError {
                    env: "PAGOS_SANDBOX_WEBHOOK_SECRET",
                    flag: "webhook-secret",
                    message: "is required with --webhook-url (or PAGOS_WEBHOOK_SECRET, pagos' own): the events are signed with pagos' PAGOS_WEBHOOK_SECRET".to_owned(),
                })?;
            tracing::info!(%url, chaos = args.chaos, "delivering webhooks");
            SandboxServer::with_webhooks(
                outcomes,
                faults,
                crate::config::exposed(&args.secret).map(str::to_owned),
                WebhookConfig {
                    url,
                    secret,
                    chaos: args.chaos,
                },
            )?
        }
        None => {
            if args.chaos || args.webhook_secret.is_some() {
                tracing::warn!("--chaos and --webhook-secret do nothing without --webhook-url");
            }
            SandboxServer::new(
                outcomes,
                faults,
                crate::config::exposed(&args.secret).map(str::to_owned),
            )
        }
    };
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|err| {
            crate::config::SettingError::cannot_listen(
                "PAGOS_SANDBOX_BIND",
                "bind",
                args.bind,
                &err,
            )
        })?;
    tracing::info!(addr = %listener.local_addr()?, "sandbox gateway listening");
    // As `pagos serve`: the first signal lets the answers in flight (held by
    // `--latency`) finish; a Ctrl-C after it stops at once.
    let mut signals = crate::signals::Signals::install();
    let stopped = async move {
        let _ = signals.next().await;
        tracing::info!("shutting down: finishing requests in flight; Ctrl-C stops at once");
        tokio::spawn(async move {
            while signals.next().await == crate::signals::Stop::Terminate {}
            tracing::warn!("Ctrl-C after the first signal: stopping at once");
            std::process::exit(130);
        });
    };
    axum::serve(listener, server.router())
        .with_graceful_shutdown(stopped)
        .await
        .context("serving the sandbox gateway")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    async fn serve(server: Arc<SandboxServer>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, server.router()).await;
        });
        format!("http://{addr}")
    }

    async fn stats_of(client: &reqwest::Client, base: &str) -> serde_json::Value {
        let answer = client
            .get(format!("{base}/sandbox/stats"))
            .send()
            .await
            .expect("stats");
        answer.json().await.expect("JSON")
    }

    /// The stats once `events` events are acknowledged, looked at up to 100 times `every`
    /// apart (the last look's, if they never are).
    async fn acknowledged(
        client: &reqwest::Client,
        base: &str,
        events: u64,
        every: Duration,
    ) -> serde_json::Value {
        let mut stats = stats_of(client, base).await;
        for _ in 0..100 {
            if stats["webhooks"]["eventsAcknowledged"] == events {
                break;
            }
            tokio::time::sleep(every).await;
            stats = stats_of(client, base).await;
        }
        stats
    }

    /// A sandbox served on a free port (its base URL) whose charges and refunds are all
    /// pending for 50 ms, signing its webhooks with `whsec_test` to `receiver`.
    /// pagos' webhook path on the receiver, answered with `status`.
    fn webhooks_answered(status: u16) -> Mock {
        Mock::given(method("POST"))
            .and(path("/v1/webhooks/http"))
            .respond_with(ResponseTemplate::new(status))
    }

    async fn serve_pending(receiver: &MockServer) -> String {
        let server = SandboxServer::with_webhooks(
            Outcomes {
                pending_rate: 1.0,
                pending_for: Duration::from_millis(50),
                ..Outcomes::default()
            },
            Faults::default(),
            None,
            WebhookConfig {
                url: format!("{}/v1/webhooks/http", receiver.uri())
                    .parse()
                    .expect("url"),
                secret: "whsec_test".into(),
                chaos: false,
            },
        )
        .expect("server");
        serve(server).await
    }

    #[tokio::test]
    async fn each_change_of_a_charge_is_delivered_signed_in_sequence_until_acknowledged() {
        let receiver = MockServer::start().await;
        // The first delivery fails: it must be retried.
        webhooks_answered(503)
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&receiver)
            .await;
        webhooks_answered(200)
            .with_priority(2)
            .mount(&receiver)
            .await;
        let base = serve_pending(&receiver).await;
        let client = reqwest::Client::new();
        let made = client
            .post(format!("{base}/v1/charges"))
            .header("idempotency-key", "k")
            .json(&json!({"amount": 5, "currency": "COP", "reference": "r-1"}))
            .send()
            .await
            .expect("charge");
        assert_eq!(made.status(), 201);

        let stats = acknowledged(&client, &base, 2, Duration::from_millis(50)).await;
        let webhooks = &stats["webhooks"];
        assert_eq!(webhooks["events"], 2, "{stats}");
        assert_eq!(webhooks["eventsAcknowledged"], 2, "{stats}");
        assert_eq!(webhooks["refused"], 1, "{stats}");
        assert_eq!(webhooks["inFlight"], 0, "{stats}");

        let received = receiver.received_requests().await.unwrap_or_default();
        assert_eq!(received.len(), 3, "one retry");
        let mut seen = Vec::new();
        for request in &received {
            let signature = request.headers["gateway-signature"].as_bytes();
            let now = chrono::Utc::now().timestamp();
            crate::webhooks::signature::verify_header(
                std::iter::once(signature),
                b"whsec_test",
                &request.body,
                now,
            )
            .expect("signed with the webhook secret");
            let event: serde_json::Value = serde_json::from_slice(&request.body).expect("JSON");
            assert_eq!(event["type"], "charge.updated");
            assert_eq!(event["data"]["reference"], "r-1");
            seen.push((
                event["id"].as_str().unwrap_or_default().to_owned(),
                event["sequence"].as_u64().unwrap_or_default(),
                event["data"]["status"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ));
        }
        // The retry of the first may well arrive after the second: order is not promised.
        seen.sort_by_key(|(_, n, _)| *n);
        seen.dedup();
        let statuses: Vec<_> = seen.iter().map(|(_, n, s)| (*n, s.as_str())).collect();
        assert_eq!(statuses, vec![(1, "pending"), (2, "succeeded")], "{seen:?}");
        assert_ne!(seen[0].0, seen[1].0, "one id per event");
    }

    #[tokio::test]
    async fn a_pending_refund_settles_and_each_of_its_changes_is_a_refund_event_in_sequence() {
        let receiver = MockServer::start().await;
        webhooks_answered(200).mount(&receiver).await;
        let base = serve_pending(&receiver).await;
        let client = reqwest::Client::new();
        let charge: serde_json::Value = client
            .post(format!("{base}/v1/charges"))
            .header("idempotency-key", "k")
            .json(&json!({"amount": 100, "currency": "COP", "reference": "p-1"}))
            .send()
            .await
            .expect("charge")
            .json()
            .await
            .expect("JSON");
        let refund = |amount: i64| {
            client
                .post(format!("{base}/v1/refunds"))
                .header("idempotency-key", format!("rk-{amount}"))
                .json(
                    &json!({"charge": charge["id"], "amount": amount, "currency": "COP",
                              "reference": format!("r-{amount}")}),
                )
                .send()
        };
        // Still pending, the charge cannot be refunded.
        let early = refund(60).await.expect("sent");
        assert_eq!(early.status(), 400);
        let early: serde_json::Value = early.json().await.expect("JSON");
        assert_eq!(early["error"], "charge_not_refundable");

        acknowledged(&client, &base, 2, Duration::from_millis(20)).await;
        let made = refund(60).await.expect("sent");
        assert_eq!(made.status(), 201);
        let made: serde_json::Value = made.json().await.expect("JSON");
        assert_eq!(made["status"], "pending");
        let stats = acknowledged(&client, &base, 4, Duration::from_millis(20)).await;
        assert_eq!(stats["webhooks"]["events"], 4, "{stats}");
        assert_eq!(stats["refunds"]["succeeded"], 1, "{stats}");
        assert_eq!(stats["refunds"]["refundedAmount"], 60, "{stats}");

        let received = receiver.received_requests().await.unwrap_or_default();
        let mut refund_events: Vec<(u64, String)> = received
            .iter()
            .filter_map(|request| {
                let event: serde_json::Value = serde_json::from_slice(&request.body).ok()?;
                (event["type"] == "refund.updated").then(|| {
                    assert_eq!(event["data"]["id"], made["id"]);
                    assert_eq!(event["data"]["reference"], "r-60");
                    assert_eq!(event["data"]["charge"], charge["id"]);
                    (
                        event["sequence"].as_u64().unwrap_or_default(),
                        event["data"]["status"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
            })
            .collect();
        refund_events.sort();
        assert_eq!(
            refund_events,
            vec![(1, "pending".to_owned()), (2, "succeeded".to_owned())]
        );
    }

    #[test]
    fn chaos_plans_duplicates_and_delays_and_plain_delivery_plans_one_copy() {
        let core = SandboxCore::new(Outcomes {
            seed: Some(7),
            ..Outcomes::default()
        });
        let plain = plan_copies(&core, false);
        assert_eq!(plain.len(), 1);
        assert!(plain[0].delay.is_zero() && !plain[0].drop_first_ack);
        let plans: Vec<_> = (0..200).map(|_| plan_copies(&core, true)).collect();
        assert!(plans.iter().all(|p| (1..=4).contains(&p.len())));
        assert!(
            plans.iter().any(|p| p.len() > 1),
            "some events are duplicated"
        );
        assert!(
            plans
                .iter()
                .any(|p| p.len() > 1 && p[1].delay == p[0].delay),
            "some copies go at the same instant"
        );
        assert!(plans.iter().flatten().all(|c| c.delay <= CHAOS_MAX_DELAY));
        assert!(plans.iter().flatten().any(|c| c.drop_first_ack));
    }
}
