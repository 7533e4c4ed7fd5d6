//! The delivery worker of `pagos serve`: sends the outbox's events to the merchants'
//! endpoints, off the payment path (a dead endpoint never slows a payment: the saga only
//! writes the event row).
//!
//! It fans out new events into deliveries, claims the due ones (`SKIP LOCKED` on
//! PostgreSQL, so several processes share the work and never send one attempt twice; at
//! most `PER_ENDPOINT` in flight per endpoint, so one that hangs delays nobody else),
//! sends each in a task of its own outside any transaction (`delivery::Deliverer`: the address
//! guard, the signature, the timeout), and store every attempt with what it means
//! (`decide`, pure): delivered; retried on `PAGOS_WEBHOOKS_SCHEDULE`, not before a
//! `Retry-After`; given up when the schedule runs out; the endpoint deactivated at once on
//! a `410`, or once all its deliveries have failed for `PAGOS_WEBHOOKS_DISABLE_AFTER`.
//!
//! It gets exactly what it uses (`Dispatcher`), never the handlers' state. A crash at any
//! line loses nothing: an event is in the database from its transition on, and a claim
//! that is never stored runs out and is claimed again (the receiver may then get the
//! event twice: consumers dedupe by `webhook-id`).

use crate::db::now;
use crate::delivery::schedule::{Failure, Next, Retries};
use crate::delivery::{Attempt, Deliverer, Keys, Message, Outcome, Secret};
use crate::failpoint;
use crate::metrics::{Metrics, OutcomeLabel};
use crate::outbox::deliveries::{self, After, Due, EndpointAfter, Recorded};
use crate::outbox::endpoints::replaced_secrets_at;
use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::{DatabaseConnection, DbErr};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tracing::Instrument;
use uuid::Uuid;

/// What the worker needs, and nothing else.
#[derive(Clone)]
pub struct Dispatcher {
    pub db: DatabaseConnection,
    pub deliverer: Deliverer,
    pub retries: Retries,
    pub metrics: Arc<Metrics>,
    /// Attempts in flight at once (each a task of its own).
    pub batch: u64,
    /// Events fanned out per round: only rows are written, so many at once (a busy payment
    /// path then costs the worker a few transactions a second).
    pub fan_out_batch: u64,
    /// How long a claim holds a delivery: longer than one attempt (`PAGOS_WEBHOOKS_TIMEOUT`)
    /// plus storing it.
    pub claim_for: Duration,
    /// The wait between rounds when there was nothing to do.
    pub idle: Duration,
}

/// How long after an attempt's timeout its claim still holds.
pub const CLAIM_MARGIN: Duration = Duration::from_secs(STORE_MARGIN.as_secs() + 2);

/// How long before its claim runs out an attempt is over at the latest, to be stored
/// while the claim holds (less than `CLAIM_MARGIN`: an attempt that begins at once after
/// its claim gets the whole timeout). The claim's end is written on the claiming host's
/// clock and read on the others', each up to `db::MAX_CLOCK_SKEW` off the database: two
/// hosts may disagree by twice that, which another host may see the claim run out early
/// by; two seconds are left to store the attempt.
pub const STORE_MARGIN: Duration =
    Duration::from_secs(2 * crate::db::MAX_CLOCK_SKEW.num_seconds().unsigned_abs() + 2);

/// Attempts in flight at once to one endpoint, in one process: an endpoint that hangs
/// (every attempt waits out `PAGOS_WEBHOOKS_TIMEOUT`) holds at most these of the
/// worker's `batch` slots, and everybody else's deliveries go on in the others.
pub const PER_ENDPOINT: usize = 8;

/// The worker until `stop` says so: up to `batch` attempts in flight, each a task of its
/// own, topped up as they finish. Not rounds that wait for their slowest attempt: with
/// one hanging endpoint in every batch, every round lasted the whole timeout and each
/// process made about two attempts a second for everybody.
///
/// Each top-up fans out new events and claims as many due deliveries as there are free
/// slots, at most `PER_ENDPOINT` in flight per endpoint. It runs when a quarter of the
/// slots are free, when the worker is idle, or every `idle` otherwise, so that events
/// written one by one are taken up in batches: a busy payment path then costs the worker a
/// few transactions a second, not one per payment. A top-up that filled its fan-out is
/// followed at once by the next (a backlog drains at full speed).
///
/// On `stop`, the attempts in flight are finished and stored before it returns (each is
/// bounded by the timeout), and deliveries claimed after the signal are given back, not
/// begun; a crash instead leaves their claims to run out.
pub async fn run_periodically(d: Dispatcher, mut stop: tokio::sync::watch::Receiver<bool>) {
    let d = Arc::new(d);
    let slots = usize::try_from(d.batch).unwrap_or(usize::MAX).max(1);
    let fan_out_full = usize::try_from(d.fan_out_batch).unwrap_or(usize::MAX);
    let mut in_flight: JoinSet<(Uuid, Result<(), DbErr>)> = JoinSet::new();
    let mut per_endpoint: HashMap<Uuid, usize> = HashMap::new();
    let finished = |done: Result<(Uuid, Result<(), DbErr>), tokio::task::JoinError>,
                    per_endpoint: &mut HashMap<Uuid, usize>| {
        match done {
            Ok((endpoint, stored)) => {
                if let Some(n) = per_endpoint.get_mut(&endpoint) {
                    *n -= 1;
                    if *n == 0 {
                        per_endpoint.remove(&endpoint);
                    }
                }
                if let Err(err) = stored {
                    tracing::warn!(error = %err, "a webhook attempt could not be stored; its claim runs out and it is sent again");
                }
            }
            // A panicked attempt: its claim runs out and it is sent again. Its endpoint's
            // count is not known here; the counts are rebuilt when nothing is in flight.
            Err(err) => tracing::error!(error = %err, "a webhook attempt panicked"),
        }
    };
    loop {
        if *stop.borrow() {
            break;
        }
        // Attempts that ended since the last wait free their slots before the top-up: a
        // fan-out backlog (top-ups back to back) must not keep the slots looking busy.
        while let Some(done) = in_flight.try_join_next() {
            finished(done, &mut per_endpoint);
        }
        if in_flight.is_empty() {
            per_endpoint.clear();
        }
        let free = slots.saturating_sub(in_flight.len());
        let (fanned, claimed) = match top_up(&d, free, &per_endpoint).await {
            // Told to stop while claiming: no attempt begins after the signal (a grace
            // shorter than the timeout would cut it, and another process send it again);
            // the claims are given back for another process to take at once.
            Ok((_, due)) if *stop.borrow() => {
                if let Err(err) = deliveries::release(&d.db, &due).await {
                    tracing::warn!(error = %err, "claims of webhook attempts not begun could not be given back; they run out");
                }
                break;
            }
            Ok((fanned, due)) => {
                let claimed = due.len();
                for due in due {
                    let endpoint = due.endpoint.id;
                    *per_endpoint.entry(endpoint).or_default() += 1;
                    let d = d.clone();
                    in_flight.spawn(
                        async move { (endpoint, deliver_one(&d, &due).await) }.in_current_span(),
                    );
                }
                (fanned, claimed)
            }
            Err(err) => {
                tracing::warn!(error = %err, "webhook delivery round failed; retrying");
                (0, 0)
            }
        };
        if fanned >= fan_out_full {
            continue;
        }
        // Until a quarter of the slots are free (or none is busy), `idle` at the most.
        let backlog = claimed > 0 && claimed >= free;
        let idle = tokio::time::sleep(d.idle);
        tokio::pin!(idle);
        loop {
            tokio::select! {
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    finished(done, &mut per_endpoint);
                    while let Some(done) = in_flight.try_join_next() {
                        finished(done, &mut per_endpoint);
                    }
                    let free = slots.saturating_sub(in_flight.len());
                    if in_flight.is_empty() || (backlog && free * 4 >= slots) {
                        break;
                    }
                }
                () = &mut idle => break,
                changed = stop.changed() => {
                    // Stopped, or the sender is gone: nobody can tell this worker to stop
                    // any more.
                    if changed.is_err() || *stop.borrow() {
                        while let Some(done) = in_flight.join_next().await {
                            finished(done, &mut per_endpoint);
                        }
                        return;
                    }
                }
            }
        }
    }
    while let Some(done) = in_flight.join_next().await {
        finished(done, &mut per_endpoint);
    }
}

/// Fans out new events, then claims up to `free` due deliveries, none to an endpoint with
/// `PER_ENDPOINT` attempts in flight (`busy`, by endpoint): the events fanned out and
/// the deliveries claimed.
async fn top_up(
    d: &Dispatcher,
    free: usize,
    busy: &HashMap<Uuid, usize>,
) -> Result<(usize, Vec<Due>), DbErr> {
    let retries = d.retries.clone();
    let fanned = deliveries::fan_out(&d.db, d.fan_out_batch, |created_at| {
        retries.first_attempt(created_at, rand::random())
    })
    .await?;
    if free == 0 {
        return Ok((fanned, Vec::new()));
    }
    let hold = TimeDelta::from_std(d.claim_for).unwrap_or(TimeDelta::MAX);
    let due = deliveries::claim_due(&d.db, now(), free as u64, hold, PER_ENDPOINT, busy).await?;
    if !due.is_empty() {
        failpoint::hit("delivery_claimed");
        failpoint::pause("delivery_claimed").await;
    }
    Ok((fanned, due))
}

/// How long an attempt begun at `at` may take, when its claim holds the delivery until
/// `claimed_until`: the timeout, or less so that it is over `STORE_MARGIN` before the
/// claim runs out (whole milliseconds); `None` when no time is left (the attempt is not
/// made). The claim's time starts when its rows are locked, the attempt's only once the
/// claim's reads are done: a wait between them (a connection, the write lock) is taken
/// from the attempt, never added past the claim.
pub fn attempt_budget(
    claimed_until: DateTime<Utc>,
    at: DateTime<Utc>,
    timeout: Duration,
) -> Option<Duration> {
    let margin = TimeDelta::from_std(STORE_MARGIN).unwrap_or(TimeDelta::MAX);
    let left = (claimed_until - margin - at).to_std().ok()?;
    let left = Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    (!left.is_zero()).then(|| left.min(timeout))
}

/// The keys that sign an attempt at `at`: the endpoint's secret, and each secret a
/// rotation replaced while its own 24 h last.
fn keys_of(due: &Due, at: DateTime<Utc>) -> Result<Keys, String> {
    let parse = |text: &str| Secret::parse(text).map_err(|e| e.to_string());
    let mut keys = Keys::new(parse(&due.endpoint.secret)?);
    for replaced in replaced_secrets_at(&due.endpoint, at) {
        keys = keys.also(parse(replaced)?);
    }
    Ok(keys)
}

async fn deliver_one(d: &Dispatcher, due: &Due) -> Result<(), DbErr> {
    let keys = match keys_of(due, now()) {
        Ok(keys) => keys,
        Err(err) => {
            tracing::error!(endpoint_id = %due.endpoint.id, error = %err, "an endpoint's stored secret does not parse; not sent");
            return Ok(());
        }
    };
    let url = match url::Url::parse(&due.endpoint.url) {
        Ok(url) => url,
        Err(err) => {
            tracing::error!(endpoint_id = %due.endpoint.id, error = %err, "an endpoint's stored URL does not parse; not sent");
            return Ok(());
        }
    };
    let message = Message {
        id: &due.event.id,
        body: due.event.body.as_bytes(),
    };
    // Over before the claim runs out, with the margin to store it: past that, another
    // worker may claim the delivery and send this same attempt again.
    let Some(within) = attempt_budget(due.delivery.next_attempt_at, now(), d.deliverer.timeout())
    else {
        tracing::warn!(event_id = %due.event.id, endpoint_id = %due.endpoint.id, "a claim ran out before its attempt began; not sent (it is claimed again)");
        return Ok(());
    };
    let attempt = d
        .deliverer
        .deliver_within(&url, message, &keys, within)
        .await;
    failpoint::hit("delivery_sent");
    // Decided in the round the delivery is in when it is stored: a reactivation while the
    // attempt was in flight started a new one, and the old round's last step would give
    // the delivery up.
    let mut due = std::borrow::Cow::Borrowed(due);
    let (endpoint, recorded, after) = loop {
        let (after, endpoint) = decide(&d.retries, &due, &attempt, rand::random());
        match deliveries::record(&d.db, &due, &attempt, after, endpoint.clone()).await? {
            Recorded::RoundMoved { round_start } => {
                due.to_mut().delivery.round_start = round_start;
            }
            recorded => break (endpoint, recorded, after),
        }
    };
    let due = due.as_ref();
    if recorded == Recorded::Raced {
        tracing::warn!(event_id = %due.event.id, endpoint_id = %due.endpoint.id, "another worker stored this attempt first");
        return Ok(());
    }
    d.metrics
        .webhook_deliveries
        .get_or_create(&OutcomeLabel {
            outcome: attempt.outcome.as_str(),
        })
        .inc();
    if after == deliveries::After::GiveUp {
        d.metrics.webhook_deliveries_given_up.inc();
        tracing::warn!(event_id = %due.event.id, endpoint_id = %due.endpoint.id, "webhook delivery given up: its schedule ran out; sent again only if the merchant reactivates the endpoint with reenviarDesde");
    }
    tracing::info!(
        event_id = %due.event.id,
        endpoint_id = %due.endpoint.id,
        attempt = due.delivery.attempts + 1,
        outcome = attempt.outcome.as_str(),
        status = ?attempt.status,
        "webhook attempt"
    );
    if recorded == Recorded::StoredAndDeactivated
        && let EndpointAfter::Deactivate { reason, .. } | EndpointAfter::Failed { reason, .. } =
            &endpoint
    {
        tracing::warn!(endpoint_id = %due.endpoint.id, %reason, "webhook endpoint deactivated");
    }
    Ok(())
}

/// What an attempt means for its delivery and its endpoint. Pure: `jitter` in [0, 1).
///
/// Whether a failure deactivates the endpoint is not decided here, on the endpoint as it
/// was claimed: the store decides on its row as it is then (`EndpointAfter::Failed`).
pub fn decide(
    retries: &Retries,
    due: &Due,
    attempt: &Attempt,
    jitter: f64,
) -> (After, EndpointAfter) {
    let in_round = due.delivery.attempts + 1 - due.delivery.round_start;
    let next = |not_before| {
        let failure = Failure {
            attempt: u32::try_from(in_round).unwrap_or(u32::MAX),
            at: attempt.at,
            not_before,
        };
        match retries.after_failure(&failure, jitter) {
            Next::At(t) => After::RetryAt(t),
            Next::GiveUp => After::GiveUp,
        }
    };
    match &attempt.outcome {
        Outcome::Delivered => (After::Delivered, EndpointAfter::Succeeded),
        Outcome::Gone => (
            next(None),
            EndpointAfter::Deactivate {
                at: attempt.at,
                as_read: due.endpoint.updated_at,
                reason: "the endpoint answered 410 Gone".into(),
            },
        ),
        Outcome::Failed { not_before } => {
            (next(*not_before), failed(retries, attempt.at, in_round > 1))
        }
        Outcome::Refused => (next(None), failed(retries, attempt.at, in_round > 1)),
    }
}

/// A failure at `at`: the endpoint is deactivated if, when this is stored, it has been
/// failing for `PAGOS_WEBHOOKS_DISABLE_AFTER`, and this is not its delivery's first
/// attempt (`retried`). Every delivery since the endpoint's first failure may have
/// failed days ago and been given up, with nothing tried since: one passing error of the
/// next event's first attempt, a week later, is not the endpoint down for days. Its
/// retry failing too is: an endpoint down for good is deactivated at its next event's
/// second attempt, however few events it gets.
fn failed(retries: &Retries, at: DateTime<Utc>, retried: bool) -> EndpointAfter {
    EndpointAfter::Failed {
        at,
        disable_if_failing_since: retried.then(|| retries.disable_if_failing_since(at)),
        reason: format!(
            "every delivery failed for {} (PAGOS_WEBHOOKS_DISABLE_AFTER)",
            humantime::format_duration(retries.disable_after)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::schedule::Schedule;
    use crate::entities::webhook_delivery::DeliveryState;
    use crate::entities::{event, webhook_delivery, webhook_endpoint};
    use pagos_types::EventType;
    use uuid::Uuid;

    fn retries() -> Retries {
        Retries {
            schedule: Schedule::parse("0s,10s,1m").expect("schedule"),
            disable_after: Duration::from_secs(3600),
        }
    }

    fn due(attempts: i32, failing_since: Option<DateTime<Utc>>) -> Due {
        let at = now();
        Due {
            delivery: webhook_delivery::Model {
                event_id: "evt_1".into(),
                endpoint_id: Uuid::nil(),
                merchant_id: Uuid::nil(),
                state: DeliveryState::Pending,
                attempts,
                round_start: 0,
                next_attempt_at: at,
                claimed_until: None,
                delivered_at: None,
                created_at: at,
                updated_at: at,
            },
            event: event::Model {
                id: "evt_1".into(),
                merchant_id: Uuid::nil(),
                event_type: EventType::PagoCompletado,
                subject_id: Uuid::nil(),
                sequence: 1,
                body: "{}".into(),
                created_at: at,
            },
            endpoint: webhook_endpoint::Model {
                failing_since,
                ..crate::outbox::endpoints::fresh("whsec_x", at)
            },
        }
    }

    #[test]
    fn an_attempt_is_signed_with_every_replaced_secret_until_its_own_24_hours_end() {
        let (a, b, c) = (Secret::generate(), Secret::generate(), Secret::generate());
        let at = now();
        let mut due = due(0, None);
        due.endpoint.secret = c.expose().to_owned();
        due.endpoint.previous_secret = Some(b.expose().to_owned());
        due.endpoint.previous_secret_until = Some(at + TimeDelta::hours(23));
        due.endpoint.older_secret = Some(a.expose().to_owned());
        due.endpoint.older_secret_until = Some(at + TimeDelta::hours(1));
        let verifying = |when: DateTime<Utc>| -> Vec<bool> {
            let keys = keys_of(&due, when).expect("keys");
            let signed = crate::delivery::signing::sign("evt_1", now().timestamp(), b"{}", &keys)
                .expect("signed");
            let mut headers = http::HeaderMap::new();
            for (name, value) in signed.pairs() {
                headers.insert(name, value.parse().expect("a header value"));
            }
            [&a, &b, &c]
                .iter()
                .map(|secret| {
                    standardwebhooks::Webhook::new(secret.expose())
                        .expect("secret")
                        .verify(b"{}", &headers)
                        .is_ok()
                })
                .collect()
        };
        assert_eq!(verifying(at), [true, true, true]);
        assert_eq!(verifying(at + TimeDelta::hours(1)), [false, true, true]);
        assert_eq!(verifying(at + TimeDelta::hours(23)), [false, false, true]);
    }

    fn attempt(outcome: Outcome) -> Attempt {
        Attempt {
            at: now(),
            status: None,
            latency: Duration::ZERO,
            answer: String::new(),
            error: None,
            remote: None,
            outcome,
        }
    }

    #[test]
    fn an_attempt_is_over_before_its_claim_runs_out() {
        let timeout = Duration::from_secs(15);
        let at = now();
        let margin = TimeDelta::from_std(STORE_MARGIN).expect("margin");
        let claimed_for = |d: TimeDelta| at + d;
        // A claim made a moment ago (timeout and `CLAIM_MARGIN`): the whole timeout.
        let held = TimeDelta::from_std(timeout + CLAIM_MARGIN).expect("held");
        assert_eq!(
            attempt_budget(claimed_for(held - TimeDelta::milliseconds(30)), at, timeout),
            Some(timeout)
        );
        // One whose reads waited 12 s for a connection has 11 s left: 5 s, then the margin
        // (6 s: the 4 s two hosts' clocks may be apart, and 2 s to store the attempt).
        assert_eq!(STORE_MARGIN, Duration::from_secs(6));
        assert_eq!(
            attempt_budget(claimed_for(TimeDelta::seconds(11)), at, timeout),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            attempt_budget(
                claimed_for(TimeDelta::milliseconds(6_500) + TimeDelta::microseconds(7)),
                at,
                timeout
            ),
            Some(Duration::from_millis(500)),
            "whole milliseconds"
        );
        // Nothing left but the margin, or less: not sent.
        assert_eq!(attempt_budget(claimed_for(margin), at, timeout), None);
        assert_eq!(
            attempt_budget(claimed_for(TimeDelta::seconds(5)), at, timeout),
            None
        );
        assert_eq!(
            attempt_budget(claimed_for(-TimeDelta::seconds(1)), at, timeout),
            None
        );
    }

    #[test]
    fn a_2xx_delivers_and_ends_the_endpoints_failures() {
        let (after, endpoint) = decide(
            &retries(),
            &due(0, Some(now())),
            &attempt(Outcome::Delivered),
            0.5,
        );
        assert_eq!(after, After::Delivered);
        assert_eq!(endpoint, EndpointAfter::Succeeded);
    }

    #[test]
    fn a_failure_is_retried_on_the_schedule_until_it_runs_out() {
        let failed = attempt(Outcome::Failed { not_before: None });
        let (after, endpoint) = decide(&retries(), &due(1, None), &failed, 0.5);
        assert_eq!(after, After::RetryAt(failed.at + TimeDelta::seconds(60)));
        assert!(matches!(endpoint, EndpointAfter::Failed { at, .. } if at == failed.at));
        let (after, _) = decide(&retries(), &due(2, None), &failed, 0.5);
        assert_eq!(after, After::GiveUp);
    }

    #[test]
    fn a_redelivery_starts_the_schedule_over() {
        let failed = attempt(Outcome::Failed { not_before: None });
        let mut again = due(2, None);
        again.delivery.round_start = 2;
        let (after, _) = decide(&retries(), &again, &failed, 0.5);
        assert_eq!(after, After::RetryAt(failed.at + TimeDelta::seconds(10)));
    }

    #[test]
    fn a_retry_after_is_waited_for() {
        let later = now() + TimeDelta::seconds(120);
        let failed = attempt(Outcome::Failed {
            not_before: Some(later),
        });
        let (after, _) = decide(&retries(), &due(0, None), &failed, 0.5);
        assert_eq!(after, After::RetryAt(later));
    }

    #[test]
    fn a_410_deactivates_the_endpoint_at_once() {
        let (_, endpoint) = decide(&retries(), &due(0, None), &attempt(Outcome::Gone), 0.5);
        assert!(matches!(endpoint, EndpointAfter::Deactivate { .. }));
    }

    #[test]
    fn a_failure_leaves_deactivation_to_the_endpoints_row_whatever_the_claim_read() {
        let failed = attempt(Outcome::Refused);
        let horizon = failed.at - TimeDelta::seconds(3600);
        for failing_since in [None, Some(now() - TimeDelta::seconds(7200))] {
            // A delivery's first attempt never deactivates its endpoint; its retry may.
            let (_, first) = decide(&retries(), &due(0, failing_since), &failed, 0.5);
            assert!(
                matches!(
                    first,
                    EndpointAfter::Failed {
                        disable_if_failing_since: None,
                        ..
                    }
                ),
                "{first:?}"
            );
            let (_, endpoint) = decide(&retries(), &due(1, failing_since), &failed, 0.5);
            assert_eq!(
                endpoint,
                EndpointAfter::Failed {
                    at: failed.at,
                    disable_if_failing_since: Some(horizon),
                    reason: "every delivery failed for 1h (PAGOS_WEBHOOKS_DISABLE_AFTER)".into(),
                },
                "{failing_since:?}"
            );
        }
    }
}
