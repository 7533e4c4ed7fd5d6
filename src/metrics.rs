//! Prometheus metrics: one registry per running process, rendered at `GET /metrics`.
//!
//! Counters are bumped where things happen; gauges of stored state (payments by state,
//! age of the oldest unsettled payment, database up) are read from the database by a
//! background task every `PAGOS_METRICS_REFRESH`, so every process reports the same
//! truth. A scrape never runs a query: it renders memory, however often it comes.
//! Labels never carry ids, keys or secrets.

use crate::gateway::mercadopago::{MercadoPagoGateway, Payment};
use crate::gateway::stripe::{PaymentIntent, StripeGateway};
use crate::gateway::{
    Charge, ChargeRequest, Gateway, GatewayError, Refund, RefundLookup, RefundRequest, RefundStatus,
};
use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sea_orm::DatabaseConnection;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// What a request under an `Idempotency-Key` asked for: keys are scoped per operation, so
/// a key's hash alone does not say which table holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyed {
    /// `POST /v1/pagos`: the key is on `idempotency_keys` (and the payment).
    Payment,
    /// `POST /v1/pagos/{id}/reembolsos` and on-call's `POST /admin/pagos/{id}/reembolsos`:
    /// the key is on the refund's own row.
    Refund,
}

impl Keyed {
    pub fn as_str(self) -> &'static str {
        match self {
            Keyed::Payment => "payment",
            Keyed::Refund => "refund",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyedLabel {
    /// `payment` or `refund` (`Keyed`).
    pub operation: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayLabel {
    pub operation: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The request's method (`OTHER` for any but those of RFC 9110 and PATCH, which no
    /// route takes), a static string: no allocation per request.
    pub method: &'static str,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub estado: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PurgedLabel {
    /// `event_ids` (processed webhook ids), `charge_reports` or `refund_reports`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `max_in_flight` or `unauthenticated` (shed), `request_timeout` (cut), `body_timeout`
    /// (a body read before auth not received in time).
    pub limit: &'static str,
}

/// How often the gauges of stored state are refreshed unless `PAGOS_METRICS_REFRESH` says.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(15);

pub struct Metrics {
    registry: Registry,
    /// Requests under an `Idempotency-Key` (payments and refunds) by what their key's row
    /// decided.
    pub idempotency: Family<KeyedLabel, Counter>,
    pub gateway_calls: Family<GatewayLabel, Counter>,
    pub gateway_latency: Family<OperationLabel, Histogram>,
    pub reconciler_decisions: Family<DecisionLabel, Counter>,
    pub reconciler_passes: Counter,
    pub webhook_events: Family<OutcomeLabel, Counter>,
    pub keys_purged: Counter,
    /// Gateway webhook records the reaper deleted past their retention, by kind.
    pub webhook_records_purged: Family<PurgedLabel, Counter>,
    pub payments: Family<StateLabel, Gauge>,
    /// 1 when the last refresh could read the database.
    pub database_up: Gauge,
    /// Answers by route and status code.
    pub http_responses: Family<RouteLabel, Counter>,
    pub oldest_unsettled_age: Gauge<f64, AtomicU64>,
    /// Seconds since the newest payment (`operation="payment"`) or refund (`"refund"`)
    /// under review moved there (its row's `updated_at`); absent while none is under
    /// review. What pages for a new one while older ones wait on the provider.
    pub newest_manual_review_age: Family<OperationLabel, Gauge<f64, AtomicU64>>,
    /// Requests answered 503 by a limit of the doors.
    pub http_limited: Family<LimitLabel, Counter>,
    /// Requests being served under `PAGOS_MAX_IN_FLIGHT`, set when scraped.
    pub http_in_flight: Gauge,
    /// Refunds by state (`pagos_refunds{estado}`), read like `payments`.
    pub refunds: Family<StateLabel, Gauge>,
    /// Webhook attempts to merchants' endpoints by outcome (delivered, failed, gone, refused).
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
    /// Deliveries given up (`ABANDONADA`: their schedule ran out): pagos sends them no
    /// more, unless the merchant asks for them again (`reenviarDesde`).
    pub webhook_deliveries_given_up: Counter,
    /// Seconds since the oldest event not yet delivered to every `ACTIVO` endpoint that
    /// wants it was written (a `DESACTIVADO` endpoint's are in `webhook_endpoints_disabled`).
    pub oldest_undelivered_event_age: Gauge<f64, AtomicU64>,
    /// Webhook endpoints `DESACTIVADO`.
    pub webhook_endpoints_disabled: Gauge,
    /// Replays of frozen answers by operation and where they were read: `memory` or
    /// `database`.
    pub replays: Family<SourceLabel, Counter>,
    /// Share of payment replays served from memory since the process started, set when
    /// scraped (refund answers are never cached: their replays are left out).
    pub replay_cache_hit_ratio: Gauge<f64, AtomicU64>,
    /// Entries and bytes held by the replay cache, set when scraped.
    pub replay_cache_entries: Gauge,
    pub replay_cache_bytes: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `payment` or `refund` (`Keyed`).
    pub operation: &'static str,
    /// `memory` (the replay cache, payments only) or `database`.
    pub source: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::refreshed_every(DEFAULT_REFRESH)
    }

    /// The registry, its gauges' help text naming how often they are refreshed.
    pub fn refreshed_every(refresh: Duration) -> Self {
        let every = humantime::format_duration(refresh);
        let mut registry = Registry::with_prefix("pagos");
        let idempotency = Family::<KeyedLabel, Counter>::default();
        registry.register(
            "idempotency_requests",
            "Requests under an Idempotency-Key by operation (payment, refund) and outcome (new, replayed, unsettled, in_flight, mismatch)",
            idempotency.clone(),
        );
        let gateway_calls = Family::<GatewayLabel, Counter>::default();
        registry.register(
            "gateway_calls",
            "Gateway calls (single tries) by operation and outcome",
            gateway_calls.clone(),
        );
        // Every process's charge and look-up series start at 0, not at their first call:
        // Prometheus's `increase` counts no series' first sample, and the alert on payments
        // the reconciler cannot settle reads "no look-up since" from them. After a deploy,
        // a payment pending at the provider is looked up again only when its backoff says
        // (up to 72 minutes): a new process's first look-up must count, and its series
        // must not be absent meanwhile.
        for (operation, outcomes) in [
            (
                "charge",
                &["succeeded", "declined", "pending", "unknown", "rejected"][..],
            ),
            ("lookup", &["found", "not_found", "unknown", "rejected"][..]),
            (
                "refund",
                &["succeeded", "failed", "pending", "unknown", "rejected"][..],
            ),
            (
                "refund_lookup",
                &["found", "not_found", "unknown", "rejected"][..],
            ),
        ] {
            for &outcome in outcomes {
                let _ = gateway_calls.get_or_create(&GatewayLabel { operation, outcome });
            }
        }
        let gateway_latency = Family::<OperationLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        registry.register(
            "gateway_call_duration_seconds",
            "Duration of one gateway call (single try)",
            gateway_latency.clone(),
        );
        let reconciler_decisions = Family::<DecisionLabel, Counter>::default();
        registry.register(
            "reconciler_decisions",
            "Reconciler decisions by kind",
            reconciler_decisions.clone(),
        );
        let reconciler_passes = Counter::default();
        registry.register(
            "reconciler_passes",
            "Reconciliation passes run",
            reconciler_passes.clone(),
        );
        let webhook_events = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_events",
            "Gateway webhook deliveries by outcome (aplicado, duplicado, obsoleto, huerfano, refused_signature, refused_timestamp, secret_unset, …)",
            webhook_events.clone(),
        );
        // At 0 from the start, as the gateway's calls: an alert on `increase` sees a
        // series' first sample as nothing, and the first orphan charge a process meets
        // would page nobody.
        let _ = webhook_events.get_or_create(&OutcomeLabel {
            outcome: "huerfano",
        });
        let keys_purged = Counter::default();
        registry.register(
            "idempotency_keys_purged",
            "Idempotency keys deleted by the reaper",
            keys_purged.clone(),
        );
        let webhook_records_purged = Family::<PurgedLabel, Counter>::default();
        registry.register(
            "webhook_records_purged",
            "Gateway webhook records deleted by the reaper past their retention, by kind (event_ids, charge_reports, refund_reports)",
            webhook_records_purged.clone(),
        );
        let payments = Family::<StateLabel, Gauge>::default();
        registry.register(
            "payments",
            format!("Payments by state (read from the database every {every}, not at scrape time)"),
            payments.clone(),
        );
        let refunds = Family::<StateLabel, Gauge>::default();
        registry.register(
            "refunds",
            format!("Refunds by state (read from the database every {every}, not at scrape time)"),
            refunds.clone(),
        );
        let oldest_unsettled_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "oldest_unsettled_payment_age_seconds",
            format!(
                "Age of the oldest payment in EN_PROCESO or ENVIADA (0 when none; read from the database every {every})"
            ),
            oldest_unsettled_age.clone(),
        );
        let newest_manual_review_age = Family::<OperationLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "newest_manual_review_age_seconds",
            format!(
                "Seconds since the newest payment (operation=payment) or refund (operation=refund) in REVISION_MANUAL moved there (absent when none; read from the database every {every})"
            ),
            newest_manual_review_age.clone(),
        );
        let database_up = Gauge::default();
        registry.register(
            "database_up",
            format!(
                "1 when the last refresh of the gauges (every {every}) could read the database, 0 when not"
            ),
            database_up.clone(),
        );
        let http_responses = Family::<RouteLabel, Counter>::default();
        registry.register(
            "http_responses",
            "HTTP answers by method, route template and status code",
            http_responses.clone(),
        );
        let http_limited = Family::<LimitLabel, Counter>::default();
        registry.register(
            "http_limited",
            "Requests refused by a limit: shed past PAGOS_MAX_IN_FLIGHT (max_in_flight) or past the slots of unauthenticated requests (unauthenticated), cut at PAGOS_REQUEST_TIMEOUT (request_timeout), or whose body was not received within PAGOS_HEADER_TIMEOUT (body_timeout, 408)",
            http_limited.clone(),
        );
        let http_in_flight = Gauge::default();
        registry.register(
            "http_requests_in_flight",
            "Requests being served that count against PAGOS_MAX_IN_FLIGHT (at scrape time)",
            http_in_flight.clone(),
        );
        let webhook_deliveries = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook attempts to merchants' endpoints by outcome (delivered, failed, gone, refused)",
            webhook_deliveries.clone(),
        );
        let webhook_deliveries_given_up = Counter::default();
        registry.register(
            "webhook_deliveries_given_up",
            "Deliveries to merchants' endpoints given up (ABANDONADA: PAGOS_WEBHOOKS_SCHEDULE ran out); pagos sends them no more unless the merchant reactivates its endpoint with reenviarDesde",
            webhook_deliveries_given_up.clone(),
        );
        let oldest_undelivered_event_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "oldest_undelivered_event_age_seconds",
            format!(
                "Age of the oldest event pagos is still delivering to an ACTIVO endpoint, or has not fanned out yet (0 when none; deliveries given up are left out, counted by pagos_webhook_deliveries_given_up_total, and so are endpoints DESACTIVADO, counted by pagos_webhook_endpoints_disabled; read from the database every {every})"
            ),
            oldest_undelivered_event_age.clone(),
        );
        let webhook_endpoints_disabled = Gauge::default();
        registry.register(
            "webhook_endpoints_disabled",
            format!("Webhook endpoints DESACTIVADO (read from the database every {every})"),
            webhook_endpoints_disabled.clone(),
        );
        let replays = Family::<SourceLabel, Counter>::default();
        registry.register(
            "replays",
            "Replays of frozen answers by operation (payment, refund) and where they were read: memory (the replay cache, payments only) or database",
            replays.clone(),
        );
        let replay_cache_hit_ratio = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "replay_cache_hit_ratio",
            "Share of payment replays served from the replay cache since the process started (at scrape time; 0 before the first replay)",
            replay_cache_hit_ratio.clone(),
        );
        let replay_cache_entries = Gauge::default();
        registry.register(
            "replay_cache_entries",
            "Frozen answers held by the replay cache (at scrape time)",
            replay_cache_entries.clone(),
        );
        let replay_cache_bytes = Gauge::default();
        registry.register(
            "replay_cache_bytes",
            "Bytes of keys, fingerprints and answers held by the replay cache, bounded by PAGOS_REPLAY_CACHE_MIB (at scrape time)",
            replay_cache_bytes.clone(),
        );
        Metrics {
            webhook_deliveries,
            webhook_deliveries_given_up,
            oldest_undelivered_event_age,
            webhook_endpoints_disabled,
            registry,
            replays,
            replay_cache_hit_ratio,
            replay_cache_entries,
            replay_cache_bytes,
            http_limited,
            http_in_flight,
            database_up,
            http_responses,
            idempotency,
            gateway_calls,
            gateway_latency,
            reconciler_decisions,
            reconciler_passes,
            webhook_events,
            keys_purged,
            webhook_records_purged,
            payments,
            oldest_unsettled_age,
            newest_manual_review_age,
            refunds,
        }
    }

    /// What a request under a key of `operation` got: `new`, `replayed`, `unsettled`,
    /// `in_flight` (409) or `mismatch` (422).
    pub fn idempotency_outcome(&self, operation: Keyed, outcome: &'static str) {
        self.idempotency
            .get_or_create(&KeyedLabel {
                operation: operation.as_str(),
                outcome,
            })
            .inc();
    }

    /// A replay served, from `memory` or the `database`.
    pub fn replay(&self, operation: Keyed, source: &'static str) {
        self.replays
            .get_or_create(&SourceLabel {
                operation: operation.as_str(),
                source,
            })
            .inc();
    }

    /// Sets the replay cache's gauges from what it holds and the payment replays counted
    /// so far (the cache holds payments' answers only).
    pub fn observe_replay_cache(&self, entries: u64, bytes: u64) {
        let read = |source| {
            self.replays
                .get_or_create(&SourceLabel {
                    operation: Keyed::Payment.as_str(),
                    source,
                })
                .get()
        };
        let (memory, database) = (read("memory"), read("database"));
        let total = memory + database;
        self.replay_cache_hit_ratio.set(if total == 0 {
            0.0
        } else {
            memory as f64 / total as f64
        });
        self.replay_cache_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        self.replay_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `count` webhook records of `kind` deleted by the reaper.
    pub fn webhook_records_purged(&self, kind: &'static str, count: u64) {
        self.webhook_records_purged
            .get_or_create(&PurgedLabel { kind })
            .inc_by(count);
    }

    pub fn webhook_event(&self, outcome: &'static str) {
        self.webhook_events
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    pub fn decision(&self, decision: &'static str) {
        self.reconciler_decisions
            .get_or_create(&DecisionLabel { decision })
            .inc();
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %err, "encoding metrics");
        }
        out
    }
}

/// Reads the gauges of stored state from the database every `period`, until dropped:
/// `pagos serve` runs it beside the listeners, and a scrape only renders what it read.
/// The first refresh is at once.
pub async fn keep_gauges_fresh(db: DatabaseConnection, metrics: Arc<Metrics>, period: Duration) {
    // The pool waits up to 10 s for a connection; a refresh longer than that (or than the
    // period) is a database that hangs, not one that is slow.
    let within = period.max(Duration::from_secs(10));
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut terminal = TerminalCounts::default();
    loop {
        ticks.tick().await;
        refresh_gauges_with(&db, &metrics, within, &mut terminal).await;
    }
}

/// The counts of terminal states (COMPLETADA, FALLIDA; COMPLETADO, FALLIDO), which only
/// grow: counting them reads every payment (or refund) ever made, so a full count is
/// taken at most once per fifty times what the last one took (a database of ten million
/// payments: a few seconds of work every few minutes; an ordinary one: every refresh).
/// The other states, the ones alerts watch, are counted on every refresh through their
/// indexes.
#[derive(Debug, Default)]
pub struct TerminalCounts {
    payments: Vec<(String, i64)>,
    refunds: Vec<(String, i64)>,
    next_full_count: Option<std::time::Instant>,
}

impl TerminalCounts {
    /// A full count's share of the time, at most: one part in this many.
    const DUTY: u32 = 50;

    fn due(&self) -> bool {
        self.next_full_count
            .is_none_or(|at| std::time::Instant::now() >= at)
    }

    fn counted(&mut self, took: Duration) {
        self.next_full_count = Some(std::time::Instant::now() + took * Self::DUTY);
    }
}

/// One refresh of the gauges of stored state, every state counted. A refresh that fails,
/// or takes longer than `within` (a database that hangs), reports the database down.
pub async fn refresh_gauges(db: &DatabaseConnection, metrics: &Metrics, within: Duration) {
    refresh_gauges_with(db, metrics, within, &mut TerminalCounts::default()).await;
}

async fn refresh_gauges_with(
    db: &DatabaseConnection,
    metrics: &Metrics,
    within: Duration,
    terminal: &mut TerminalCounts,
) {
    let read = match tokio::time::timeout(within, read_gauges(db, terminal)).await {
        Ok(read) => read,
        Err(_) => Err(sea_orm::DbErr::Custom(format!(
            "reading the gauges took longer than {}",
            humantime::format_duration(within)
        ))),
    };
    match read {
        Ok(gauges) => {
            for (estado, n) in gauges.payments {
                metrics
                    .payments
                    .get_or_create(&StateLabel { estado })
                    .set(n);
            }
            for (estado, n) in gauges.refunds {
                metrics.refunds.get_or_create(&StateLabel { estado }).set(n);
            }
            metrics
                .oldest_unsettled_age
                .set(gauges.oldest_unsettled_age);
            for (operation, age) in gauges.newest_manual_review_age {
                let label = OperationLabel { operation };
                match age {
                    Some(age) => {
                        metrics
                            .newest_manual_review_age
                            .get_or_create(&label)
                            .set(age);
                    }
                    None => {
                        metrics.newest_manual_review_age.remove(&label);
                    }
                }
            }
            metrics
                .oldest_undelivered_event_age
                .set(gauges.oldest_undelivered_event_age);
            metrics
                .webhook_endpoints_disabled
                .set(gauges.webhook_endpoints_disabled);
            metrics.database_up.set(1);
        }
        Err(err) => {
            // Stale gauges would look healthy exactly when they matter: drop them.
            tracing::warn!(error = %err, "metrics: could not read payment gauges");
            metrics.database_up.set(0);
            metrics.payments.clear();
            metrics.refunds.clear();
            metrics.oldest_unsettled_age.set(f64::NAN);
            metrics.newest_manual_review_age.clear();
            metrics.oldest_undelivered_event_age.set(f64::NAN);
        }
    }
}

struct StoredGauges {
    payments: Vec<(&'static str, i64)>,
    oldest_unsettled_age: f64,
    newest_manual_review_age: [(&'static str, Option<f64>); 2],
    refunds: Vec<(&'static str, i64)>,
    oldest_undelivered_event_age: f64,
    webhook_endpoints_disabled: i64,
}

async fn read_gauges(
    db: &DatabaseConnection,
    terminal: &mut TerminalCounts,
) -> Result<StoredGauges, sea_orm::DbErr> {
    use crate::entities::{payment, refund};
    use pagos_types::{PaymentState, RefundState};
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

    // Every state when a full count is due; else the states that still move.
    let full = terminal.due();
    let started = std::time::Instant::now();
    let mut payments_query = payment::Entity::find()
        .select_only()
        .column(payment::Column::State)
        .column_as(payment::Column::Id.count(), "n")
        .group_by(payment::Column::State);
    let mut refunds_query = refund::Entity::find()
        .select_only()
        .column(refund::Column::State)
        .column_as(refund::Column::Id.count(), "n")
        .group_by(refund::Column::State);
    if !full {
        let moving = PaymentState::ALL.into_iter().filter(|s| !s.is_terminal());
        payments_query =
            payments_query.filter(payment::Column::State.is_in(moving.map(|s| s.as_str())));
        let moving = RefundState::ALL.into_iter().filter(|s| !s.is_terminal());
        refunds_query =
            refunds_query.filter(refund::Column::State.is_in(moving.map(|s| s.as_str())));
    }
    let counts: Vec<(String, i64)> = payments_query.into_tuple().all(db).await?;
    let refund_counts: Vec<(String, i64)> = refunds_query.into_tuple().all(db).await?;
    if full {
        let is_terminal = |s: &str, all: &[&str]| all.contains(&s);
        let payment_terminal: Vec<&str> = PaymentState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        let refund_terminal: Vec<&str> = RefundState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        terminal.payments = counts
            .iter()
            .filter(|(s, _)| is_terminal(s, &payment_terminal))
            .cloned()
            .collect();
        terminal.refunds = refund_counts
            .iter()
            .filter(|(s, _)| is_terminal(s, &refund_terminal))
            .cloned()
            .collect();
        terminal.counted(started.elapsed());
    }
    let count_of = |counts: &[(String, i64)], kept: &[(String, i64)], estado: &str| {
        counts
            .iter()
            .chain(kept)
            .find(|(s, _)| s == estado)
            .map_or(0, |(_, n)| *n)
    };
    let payments = PaymentState::ALL
        .iter()
        .map(|estado| {
            let kept = if full {
                &[][..]
            } else {
                &terminal.payments[..]
            };
            (estado.as_str(), count_of(&counts, kept, estado.as_str()))
        })
        .collect();
    let refunds = RefundState::ALL
        .iter()
        .map(|estado| {
            let kept = if full { &[][..] } else { &terminal.refunds[..] };
            (
                estado.as_str(),
                count_of(&refund_counts, kept, estado.as_str()),
            )
        })
        .collect();
    let oldest: Option<chrono::DateTime<chrono::Utc>> = payment::Entity::find()
        .select_only()
        .column_as(payment::Column::CreatedAt.min(), "oldest")
        .filter(payment::Column::State.is_in(PaymentState::IN_FLIGHT.map(|s| s.as_str())))
        .into_tuple::<Option<chrono::DateTime<chrono::Utc>>>()
        .one(db)
        .await?
        .flatten();
    let oldest_unsettled_age =
        oldest.map_or(0.0, |t| (crate::db::now() - t).as_seconds_f64().max(0.0));
    // Few rows are under review: the state's index finds them.
    let newest_payment: Option<chrono::DateTime<chrono::Utc>> = payment::Entity::find()
        .select_only()
        .column_as(payment::Column::UpdatedAt.max(), "newest")
        .filter(payment::Column::State.eq(PaymentState::RevisionManual.as_str()))
        .into_tuple::<Option<chrono::DateTime<chrono::Utc>>>()
        .one(db)
        .await?
        .flatten();
    let newest_refund: Option<chrono::DateTime<chrono::Utc>> = refund::Entity::find()
        .select_only()
        .column_as(refund::Column::UpdatedAt.max(), "newest")
        .filter(refund::Column::State.eq(RefundState::RevisionManual.as_str()))
        .into_tuple::<Option<chrono::DateTime<chrono::Utc>>>()
        .one(db)
        .await?
        .flatten();
    let age = |newest: Option<chrono::DateTime<chrono::Utc>>| {
        newest.map(|t| (crate::db::now() - t).as_seconds_f64().max(0.0))
    };
    let newest_manual_review_age = [
        ("payment", age(newest_payment)),
        ("refund", age(newest_refund)),
    ];
    let oldest_undelivered_event_age = crate::outbox::events::oldest_undelivered(db)
        .await?
        .map_or(0.0, |t| (crate::db::now() - t).as_seconds_f64().max(0.0));
    let webhook_endpoints_disabled = crate::outbox::endpoints::count_disabled(db).await?;
    Ok(StoredGauges {
        payments,
        oldest_unsettled_age,
        newest_manual_review_age,
        oldest_undelivered_event_age,
        webhook_endpoints_disabled,
        refunds,
    })
}

/// Wraps a gateway to count and time every single try.
pub struct MeteredGateway {
    inner: Arc<dyn Gateway>,
    metrics: Arc<Metrics>,
}

impl MeteredGateway {
    pub fn wrap(inner: Arc<dyn Gateway>, metrics: Arc<Metrics>) -> Arc<dyn Gateway> {
        Arc::new(MeteredGateway { inner, metrics })
    }

    fn observe(&self, operation: &'static str, outcome: &'static str, started: Instant) {
        self.metrics.gateway_call(operation, outcome, started);
    }

    /// A refund look-up (by refund, or of a charge's whole list): found, not found, or how
    /// it failed.
    fn observe_refund_lookup(&self, result: &Result<Vec<Refund>, GatewayError>, started: Instant) {
        let outcome = match result {
            Ok(refunds) if refunds.is_empty() => "not_found",
            Ok(_) => "found",
            Err(err) => error_outcome(err),
        };
        self.observe("refund_lookup", outcome, started);
    }
}

impl Metrics {
    /// One gateway call (a single try) of `operation`, ended with `outcome`, begun at
    /// `started`: counted and timed.
    pub fn gateway_call(&self, operation: &'static str, outcome: &'static str, started: Instant) {
        self.gateway_calls
            .get_or_create(&GatewayLabel { operation, outcome })
            .inc();
        self.gateway_latency
            .get_or_create(&OperationLabel { operation })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// The Mercado Pago client the webhook handler asks for a notified payment's state
/// (`GET /v1/payments/{id}`): one per process, metered as operation `fetch` like every
/// other gateway call.
pub struct MeteredMercadoPago {
    inner: MercadoPagoGateway,
    metrics: Arc<Metrics>,
}

impl MeteredMercadoPago {
    pub fn new(inner: MercadoPagoGateway, metrics: Arc<Metrics>) -> Self {
        MeteredMercadoPago { inner, metrics }
    }

    /// The payment as Mercado Pago holds it now; None when it has no such payment.
    pub async fn fetch(&self, id: &str) -> Result<Option<Payment>, GatewayError> {
        metered_fetch(&self.metrics, self.inner.fetch(id)).await
    }
}

/// The Stripe client the webhook handler asks for a disputed charge's PaymentIntent
/// (`GET /v1/payment_intents/{id}`: a Dispute carries no pagos reference): one per
/// process, metered as operation `fetch` like every other gateway call.
pub struct MeteredStripe {
    inner: StripeGateway,
    metrics: Arc<Metrics>,
}

impl MeteredStripe {
    pub fn new(inner: StripeGateway, metrics: Arc<Metrics>) -> Self {
        MeteredStripe { inner, metrics }
    }

    /// The PaymentIntent as Stripe holds it now; None when it has no such PaymentIntent.
    pub async fn fetch_intent(&self, id: &str) -> Result<Option<PaymentIntent>, GatewayError> {
        metered_fetch(&self.metrics, self.inner.fetch_intent(id)).await
    }
}

/// A provider's read of one object, counted as operation `fetch`: `found`, `not_found`,
/// or the error's outcome.
async fn metered_fetch<T>(
    metrics: &Metrics,
    read: impl std::future::Future<Output = Result<Option<T>, GatewayError>>,
) -> Result<Option<T>, GatewayError> {
    let started = Instant::now();
    let result = read.await;
    let outcome = match &result {
        Ok(Some(_)) => "found",
        Ok(None) => "not_found",
        Err(err) => error_outcome(err),
    };
    metrics.gateway_call("fetch", outcome, started);
    result
}

fn error_outcome(err: &GatewayError) -> &'static str {
    match err {
        GatewayError::Unknown(_) => "unknown",
        GatewayError::Rejected { .. } => "rejected",
    }
}

#[async_trait]
impl Gateway for MeteredGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let started = Instant::now();
        let result = self.inner.charge(req).await;
        let outcome = match &result {
            Ok(charge) => match charge.status {
                crate::gateway::ChargeStatus::Succeeded => "succeeded",
                crate::gateway::ChargeStatus::Declined => "declined",
                crate::gateway::ChargeStatus::Pending => "pending",
            },
            Err(err) => error_outcome(err),
        };
        self.observe("charge", outcome, started);
        result
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let started = Instant::now();
        let result = self.inner.lookup(reference).await;
        let outcome = match &result {
            Ok(charges) if charges.is_empty() => "not_found",
            Ok(_) => "found",
            Err(err) => error_outcome(err),
        };
        self.observe("lookup", outcome, started);
        result
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        let started = Instant::now();
        let result = self.inner.refund(req).await;
        let outcome = match &result {
            Ok(refund) => match refund.status {
                RefundStatus::Succeeded => "succeeded",
                RefundStatus::Failed => "failed",
                RefundStatus::Pending => "pending",
            },
            Err(err) => error_outcome(err),
        };
        self.observe("refund", outcome, started);
        result
    }

    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        let started = Instant::now();
        let result = self.inner.lookup_refunds(refund).await;
        self.observe_refund_lookup(&result, started);
        result
    }

    async fn refunds_of_charge(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        let started = Instant::now();
        let result = self.inner.refunds_of_charge(refund).await;
        self.observe_refund_lookup(&result, started);
        result
    }

    async fn account_currency(&self) -> Result<Option<String>, GatewayError> {
        self.inner.account_currency().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::sandbox::{Outcomes, SandboxGateway};

    #[test]
    fn a_new_process_exports_its_charge_and_look_up_series_at_zero_before_any_call() {
        assert_lines(
            &Metrics::new(),
            &[
                r#"pagos_gateway_calls_total{operation="lookup",outcome="found"} 0"#,
                r#"pagos_gateway_calls_total{operation="lookup",outcome="unknown"} 0"#,
                r#"pagos_gateway_calls_total{operation="charge",outcome="succeeded"} 0"#,
                r#"pagos_gateway_calls_total{operation="refund_lookup",outcome="found"} 0"#,
            ],
        );
    }

    fn has_line(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    /// Every one of `lines` is a line of what `metrics` exports.
    fn assert_lines(metrics: &Metrics, lines: &[&str]) {
        let text = metrics.render();
        for line in lines {
            assert!(has_line(&text, line), "{line} in\n{text}");
        }
    }

    #[test]
    fn terminal_states_are_counted_again_after_fifty_times_what_their_count_took() {
        let mut terminal = TerminalCounts::default();
        assert!(terminal.due(), "the first refresh counts every state");
        terminal.counted(Duration::ZERO);
        assert!(
            terminal.due(),
            "a quick count is taken again on the next refresh"
        );
        terminal.counted(Duration::from_secs(2));
        assert!(
            !terminal.due(),
            "a two-second count waits a hundred seconds"
        );
        assert!(
            terminal.next_full_count.expect("set")
                >= std::time::Instant::now() + Duration::from_secs(99)
        );
    }

    #[tokio::test]
    async fn refunds_and_their_lookups_are_counted_and_timed_like_charges() {
        let metrics = Arc::new(Metrics::new());
        let gateway = MeteredGateway::wrap(
            Arc::new(SandboxGateway::new(Outcomes::default())),
            metrics.clone(),
        );
        let charge = gateway
            .charge(&ChargeRequest {
                gateway_key: "k".into(),
                amount: 100,
                currency: "COP".into(),
                reference: Uuid::nil(),
                description: None,
                payment_method: None,
            })
            .await
            .expect("charged");
        let req = RefundRequest {
            gateway_key: "rk".into(),
            charge: charge.id,
            amount: 100,
            currency: "COP".into(),
            reference: Uuid::from_u128(1),
            reason: None,
            whole: true,
        };
        gateway.refund(&req).await.expect("refunded");
        let over = RefundRequest {
            gateway_key: "rk2".into(),
            reference: Uuid::from_u128(2),
            amount: 1,
            whole: false,
            ..req.clone()
        };
        gateway.refund(&over).await.expect_err("nothing is left");
        gateway
            .lookup_refunds(&req.lookup(None))
            .await
            .expect("found");
        gateway
            .lookup_refunds(&over.lookup(None))
            .await
            .expect("none");

        assert_lines(
            &metrics,
            &[
                r#"pagos_gateway_calls_total{operation="refund",outcome="succeeded"} 1"#,
                r#"pagos_gateway_calls_total{operation="refund",outcome="rejected"} 1"#,
                r#"pagos_gateway_calls_total{operation="refund_lookup",outcome="found"} 1"#,
                r#"pagos_gateway_calls_total{operation="refund_lookup",outcome="not_found"} 1"#,
                r#"pagos_gateway_call_duration_seconds_count{operation="refund"} 2"#,
                r#"pagos_gateway_call_duration_seconds_count{operation="refund_lookup"} 2"#,
            ],
        );
    }
}
