//! Refunds with the same discipline as payments: one `Idempotency-Key` per refund intent
//! (made once, never per attempt), written to the journal before the first request and
//! kept there until a terminal answer, retried with backoff and jitter on answers that
//! leave the outcome unknown or the server busy, never on a refusal.
//!
//! A refund intent still in the journal is found again by what it asks (the payment and
//! the body): asking for the same refund again after a crash sends its old key, so the
//! server answers the refund it has instead of making another. [`Client::kept_refund`]
//! gives back the one made at this client's server with its API key;
//! [`Journal::find_refunds`](crate::Journal::find_refunds) lists them all, wherever made.

use crate::answer::{Head, Problem, ProblemType};
use crate::intent::IntentKey;
use crate::retry::{Budget, Unsettled};
use crate::{Client, JournalError, PayError, lock};
use pagos_types::{FieldError, NewRefund, Reembolso, RefundState};
use reqwest::header::{AUTHORIZATION, RETRY_AFTER};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};
use uuid::Uuid;

/// What a refund asks: part (`amount`) or all of a payment, and why. Valid by
/// construction (the server's own rules, `pagos_types::NewRefund`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundRequest {
    payment: Uuid,
    refund: NewRefund,
}

impl RefundRequest {
    /// A refund of `payment`: `amount` minor units (None: everything not yet refunded).
    pub fn new(
        payment: Uuid,
        amount: Option<i64>,
        reason: Option<&str>,
    ) -> Result<RefundRequest, Vec<FieldError>> {
        let mut body = serde_json::Map::new();
        if let Some(amount) = amount {
            body.insert("monto".into(), json!(amount));
        }
        if let Some(reason) = reason {
            body.insert("motivo".into(), json!(reason));
        }
        let refund = NewRefund::from_json(&Value::Object(body), false)?;
        Ok(RefundRequest { payment, refund })
    }

    pub fn payment(&self) -> Uuid {
        self.payment
    }

    /// The body sent, as the contract writes it.
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::Map::new();
        if let Some(amount) = self.refund.amount {
            body.insert("monto".into(), json!(amount));
        }
        if let Some(reason) = &self.refund.reason {
            body.insert("motivo".into(), json!(reason));
        }
        Value::Object(body)
    }
}

/// One refund the merchant means to make, with its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundIntent {
    key: IntentKey,
    request: RefundRequest,
}

impl RefundIntent {
    /// A new intent: a new key.
    pub fn new(request: RefundRequest) -> RefundIntent {
        RefundIntent {
            key: IntentKey::generate(),
            request,
        }
    }

    /// The same intent again, with the key it was first sent with.
    pub fn with_key(key: IntentKey, request: RefundRequest) -> RefundIntent {
        RefundIntent { key, request }
    }

    pub fn key(&self) -> &IntentKey {
        &self.key
    }

    pub fn request(&self) -> &RefundRequest {
        &self.request
    }
}

/// What became of a refund intent.
#[derive(Clone, Debug, PartialEq)]
pub enum RefundOutcome {
    /// COMPLETADO: the money went back, once.
    Refunded(Reembolso),
    /// FALLIDO: the gateway refused it; no money went back. A new intent may try again.
    Refused { refund: Reembolso, problem: Problem },
    /// The server has the refund but no outcome at the deadline; it settles it on its own.
    /// Refund with the same intent later to learn the outcome.
    Pending(Reembolso),
}

/// What one answer means for a refund intent.
enum Read {
    Done(RefundOutcome),
    /// With the answer's `Retry-After`: not asked again sooner.
    Pending(Reembolso, Option<std::time::Duration>),
    Transient {
        why: String,
        retry_after: Option<std::time::Duration>,
    },
    /// 409 `request-in-flight`: waited out within the deadline, no attempt used up.
    InFlight {
        why: String,
        retry_after: Option<std::time::Duration>,
    },
    KeyReused(Problem),
    Refused {
        status: u16,
        problem: Problem,
    },
    /// A 3xx: the request never reached pagos.
    Redirected {
        status: u16,
        location: Option<String>,
    },
    Unexpected(String),
}

fn read_answer(head: &Head, body: &[u8]) -> Read {
    let refund = |body: &[u8]| serde_json::from_slice::<Reembolso>(body).map_err(|e| e.to_string());
    match head.status {
        201 => match refund(body) {
            Ok(r) if r.state == RefundState::Completado => Read::Done(RefundOutcome::Refunded(r)),
            Ok(r) => Read::Unexpected(format!("201 with estado {}", r.state)),
            Err(why) => Read::Unexpected(format!("201 without a refund: {why}")),
        },
        202 => match refund(body) {
            Ok(r) => Read::Pending(r, head.retry_after),
            Err(why) => Read::Unexpected(format!("202 without a refund: {why}")),
        },
        422 => {
            let problem = Problem::read(422, body);
            if problem.kind() == Some(ProblemType::RefundRefused) {
                match problem
                    .extensions
                    .get("reembolso")
                    .cloned()
                    .map(serde_json::from_value::<Reembolso>)
                {
                    Some(Ok(refund)) => Read::Done(RefundOutcome::Refused { refund, problem }),
                    _ => Read::Unexpected("422 refund-refused without `reembolso`".into()),
                }
            } else {
                into_read(crate::answer::read_other(head, body))
            }
        }
        _ => into_read(crate::answer::read_other(head, body)),
    }
}

fn into_read(reading: crate::answer::Reading) -> Read {
    use crate::answer::Reading;
    match reading {
        Reading::Transient { why, retry_after } => Read::Transient { why, retry_after },
        Reading::InFlight { why, retry_after } => Read::InFlight { why, retry_after },
        Reading::KeyReused(problem) => Read::KeyReused(problem),
        Reading::Refused { status, problem } => Read::Refused { status, problem },
        Reading::Redirected { status, location } => Read::Redirected { status, location },
        Reading::Unexpected(why) => Read::Unexpected(why),
        other => Read::Unexpected(format!("not a refund answer: {other:?}")),
    }
}

impl Client {
    /// Refunds `intent`: sends it with its key, retries what may be retried (the same
    /// key, the same body), and while the server answers 202 asks again (the server
    /// settles a refund that is due when its retry comes) until the deadline, not before
    /// the 202's `Retry-After` (one past the deadline ends it at once, pending).
    ///
    /// With a journal, the intent is written down before the first request, each request
    /// is counted there before it leaves, and the intent is let go only on a terminal
    /// answer: refunded, refused by the gateway, or a refusal or redirect of its first
    /// request ever (by any process: a refusal after an earlier request whose outcome is
    /// unknown keeps it, since that request may have made the refund). One let go by
    /// another process meanwhile is still sent with its key, uncounted, and written back
    /// under that key without a terminal answer.
    pub async fn refund(&self, intent: &RefundIntent) -> Result<RefundOutcome, PayError> {
        if let Some(journal) = &self.journal {
            journal
                .record_refund(intent, &self.base_url, &self.api_key)
                .await?;
        }
        let url = self
            .base_url
            .join(&format!("v1/pagos/{}/reembolsos", intent.request.payment))
            .map_err(|e| PayError::Unexpected(e.to_string()))?;
        let body = intent.request.to_json();
        let budget = Mutex::new(Budget::new(&self.policy, Instant::now()));
        let mut backoff = self.policy.backoff();
        let mut attempts = 0u32;
        let mut last_pending = None;
        // No request of this intent was sent before the last one, by any process.
        let mut first_contact = false;
        // The intent left the journal while this process asked it (another one settled
        // it, or a human forgot it).
        let mut left = false;
        let result = loop {
            attempts += 1;
            // Counted before it leaves: a process that dies now leaves it counted.
            let before = match &self.journal {
                Some(journal) => match journal.count_refund_attempt(&intent.key).await {
                    Ok(before) => before,
                    // Another process got its terminal answer and let it go while this one
                    // waited, or a human forgot it: the same key, sent uncounted, gets the
                    // server's answer for that key. Stopping would leave nothing kept, and
                    // the refund asked again would be made under a new key.
                    Err(JournalError::Gone(_)) => {
                        left = true;
                        1
                    }
                    Err(err) => break Err(err.into()),
                },
                None => attempts - 1,
            };
            first_contact = before == 0;
            let timeout =
                lock(&budget).request_timeout(self.policy.request_timeout, Instant::now());
            let sent = self
                .http
                .post(url.clone())
                .header(AUTHORIZATION, self.authorization.clone())
                .header("Idempotency-Key", intent.key.as_str())
                .json(&body)
                .timeout(timeout)
                .send()
                .await;
            let read = match sent {
                Err(err) => match crate::network(&err) {
                    crate::answer::Reading::Transient { why, retry_after } => {
                        Read::Transient { why, retry_after }
                    }
                    other => into_read(other),
                },
                Ok(response) => {
                    let head = Head {
                        status: response.status().as_u16(),
                        retry_after: response
                            .headers()
                            .get(RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| crate::answer::parse_retry_after(v, SystemTime::now())),
                        location: crate::location(&response),
                    };
                    match response.bytes().await {
                        Ok(bytes) => read_answer(&head, &bytes),
                        Err(err) => into_read(crate::network(&err)),
                    }
                }
            };
            let unsettled = match read {
                Read::Done(outcome) => break Ok(outcome),
                Read::Pending(r, retry_after) => {
                    last_pending = Some(r);
                    Unsettled::Pending { retry_after }
                }
                Read::Transient { why, retry_after } => {
                    tracing::warn!(key = %intent.key, attempt = attempts, why, "refund attempt failed; retrying with the same key");
                    Unsettled::Failed { retry_after }
                }
                Read::InFlight { why, retry_after } => {
                    tracing::info!(key = %intent.key, attempt = attempts, why, "the first request of this refund is still in flight; asking again with the same key");
                    Unsettled::InFlight { retry_after }
                }
                Read::KeyReused(problem) => {
                    break Err(PayError::KeyReused {
                        key: intent.key.clone(),
                        problem,
                    });
                }
                Read::Refused { status, problem } => {
                    break Err(PayError::Rejected { status, problem });
                }
                Read::Redirected { status, location } => {
                    break Err(PayError::Redirected { status, location });
                }
                Read::Unexpected(why) => break Err(PayError::Unexpected(why)),
            };
            let jittered = backoff.next().unwrap_or_default();
            let wait = lock(&budget).next_wait(unsettled, jittered, Instant::now());
            match wait {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(_) => {
                    break match last_pending.take() {
                        Some(r) => Ok(RefundOutcome::Pending(r)),
                        None => Err(PayError::GaveUp {
                            attempts,
                            elapsed: lock(&budget).elapsed(Instant::now()),
                            last: "the refund's outcome is still unknown".into(),
                        }),
                    };
                }
            }
        };
        if let Some(journal) = &self.journal {
            let filed = match &result {
                Ok(RefundOutcome::Refunded(_) | RefundOutcome::Refused { .. }) => {
                    journal.remove_refund(&intent.key).await.map(drop)
                }
                // A refusal of the intent's first request ever, by any process: nothing
                // was registered. After an earlier request (this process's, or another's
                // that timed out), that request may have made the refund: kept. So is a
                // redirect, of any request: a proxy may have forwarded it to pagos and
                // answered its own timeout with a redirect.
                Err(PayError::Rejected { .. }) if first_contact => {
                    journal.remove_refund(&intent.key).await.map(drop)
                }
                // Let go by another process (or a human) while this one asked it, and no
                // terminal answer here: written back with its key, counted as sent, so the
                // same command run again asks it with that key, not a new one.
                _ if left => {
                    match journal
                        .record_refund(intent, &self.base_url, &self.api_key)
                        .await
                    {
                        Ok(()) => journal.count_refund_attempt(&intent.key).await.map(drop),
                        Err(err) => Err(err),
                    }
                }
                _ => Ok(()),
            };
            if let Err(err) = filed {
                tracing::warn!(key = %intent.key, error = %err, "could not update the journal");
            }
        }
        result
    }

    /// The refund intent to ask `request` with: the one the journal keeps for this very
    /// request at this client's server with its API key (it may have made the refund, so
    /// its key is the one to send), or else a new one, written down in the same journal
    /// transaction, so the same refund asked twice at once is made under one key. Without
    /// a journal, a new intent. One kept only under another URL or API key (a key rotated
    /// since) may have made the refund: [`PayError::KeptElsewhere`], and no new intent
    /// ([`Journal::find_refunds`](crate::Journal::find_refunds) lists those).
    pub async fn refund_intent_for(
        &self,
        request: RefundRequest,
    ) -> Result<RefundIntent, PayError> {
        let fresh = RefundIntent::new(request);
        let Some(journal) = &self.journal else {
            return Ok(fresh);
        };
        match journal
            .kept_refunds_or_record(
                &fresh,
                &self.base_url,
                &self.api_key,
                crate::Beside::Nothing,
            )
            .await?
        {
            crate::Kept::Recorded => Ok(fresh),
            crate::Kept::Found(kept) => self.kept_here(kept),
        }
    }

    /// The refund intent the journal keeps for this request at this server with this API
    /// key, if any: its key is the one to send again. One kept under another URL or API
    /// key is not given back ([`Journal::find_refunds`](crate::Journal::find_refunds)
    /// lists those too): it may have made the refund already, so a caller that finds one
    /// should not make a new intent beside it without a human.
    pub async fn kept_refund(
        &self,
        request: &RefundRequest,
    ) -> Result<Option<RefundIntent>, PayError> {
        match &self.journal {
            Some(journal) => Ok(journal
                .find_refund(request, &self.base_url, &self.api_key)
                .await?),
            None => Ok(None),
        }
    }
}
