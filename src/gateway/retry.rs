//! The retry policy for one gateway call: exponential backoff with jitter (backon), the
//! same request (and so the same gateway key) on every try, and only on errors that leave
//! the outcome unknown. Charges and refunds share one rule (`send`): a refusal proves
//! nothing once an earlier try may have reached the gateway.

use super::{
    Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError, Refund, RefundRequest,
    RefundStatus, RejectReason,
};
use backon::{ExponentialBuilder, Retryable};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How hard to try one gateway call.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Retries after the first try.
    pub retries: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    pub fn new(retries: usize) -> Self {
        RetryPolicy {
            retries,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.retries)
            .with_jitter()
    }

    /// The longest a call can take, sleeps included, given a per-try timeout.
    pub fn worst_case(&self, per_try: Duration) -> Duration {
        let tries = u32::try_from(self.retries + 1).unwrap_or(u32::MAX);
        let sleeps = self.max_delay * 2 * u32::try_from(self.retries).unwrap_or(u32::MAX);
        per_try.saturating_mul(tries) + sleeps
    }
}

/// What a charge call came to, after retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    Succeeded(Charge),
    Declined(Charge),
    /// The gateway accepted the charge and will settle it later.
    Pending(Charge),
    /// The gateway refused the request: no charge exists.
    Rejected {
        status: u16,
        detail: String,
    },
    /// Nobody knows whether the charge exists: the reconciler must ask.
    Unknown(String),
}

/// What a refund call came to, after retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefundOutcome {
    Succeeded(Refund),
    /// The gateway made the refund and it failed: no money went back.
    Failed(Refund),
    /// The gateway accepted the refund and will settle it later.
    Pending(Refund),
    /// The gateway refused the request: no refund exists. `reason` tells a refund over
    /// what is left of the charge apart.
    Rejected {
        status: u16,
        detail: String,
        reason: RejectReason,
    },
    /// Nobody knows whether the refund exists: the reconciler must ask.
    Unknown(String),
}

/// How one gateway call ended after its retries, before its answer is read.
enum Sent<T> {
    /// The answer, and whether a try before it (or an earlier send) may have reached the
    /// gateway.
    Answered(T, bool),
    /// A refusal that proves nothing was made: no try before it may have reached the gateway.
    Rejected {
        status: u16,
        detail: String,
        reason: RejectReason,
    },
    Unknown(String),
}

/// One gateway call, retried with the same request (and so the same key) on unknown
/// outcomes; the rule every operation that makes something shares.
///
/// `maybe_sent_before`: an earlier send of the same thing may have reached the gateway.
/// Then, as after any try of this call whose outcome was unknown, a refusal proves nothing
/// — what an earlier try may have made still may exist — and the outcome stays `Unknown`:
/// only a readable answer settles it.
async fn send<T, F, Fut>(
    call: F,
    policy: RetryPolicy,
    maybe_sent_before: bool,
    on_retry: impl Fn(&GatewayError, Duration),
) -> Sent<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, GatewayError>>,
{
    // Set once a try may have made something whose existence is unknown.
    let uncertain = AtomicBool::new(maybe_sent_before);
    let result = call
        .retry(policy.backoff())
        .when(GatewayError::is_retryable)
        .notify(|err, delay| {
            uncertain.store(true, Ordering::Relaxed);
            on_retry(err, delay);
        })
        .await;
    match result {
        Ok(answer) => Sent::Answered(answer, uncertain.load(Ordering::Relaxed)),
        // A refusal proves nothing was made only if no earlier try may have made it.
        Err(GatewayError::Rejected { status, detail, .. }) if uncertain.load(Ordering::Relaxed) => {
            Sent::Unknown(format!(
                "refused with {status}, but an earlier try may have reached the gateway: {detail}"
            ))
        }
        Err(GatewayError::Rejected {
            status,
            detail,
            reason,
        }) => Sent::Rejected {
            status,
            detail,
            reason,
        },
        Err(GatewayError::Unknown(why)) => Sent::Unknown(why),
    }
}

/// One charge call, retried with the same request on unknown outcomes.
///
/// `maybe_sent_before`: an earlier send of this payment may have reached the gateway (it
/// was ENVIADA). Then, as after any try of this call whose outcome was unknown, a refusal
/// proves nothing — the charge an earlier try may have made still may exist — and the
/// outcome stays `Unknown`: only a readable charge status settles such a payment.
///
/// An answer is believed only about the payment asked for: a charge whose reference is
/// another payment's, or that carries none (every protocol pagos speaks echoes it: the
/// reference protocol's `reference`, Stripe's `metadata.pagos_reference`, Mercado Pago's
/// `external_reference`), says nothing of this payment's — a gateway bug, a proxy or cache
/// answering another request. Such an answer is an unknown outcome, as the look-ups'
/// filter makes it (`Gateway::lookup` keeps the payment's own charges only): retried with
/// the same key like any unknown outcome, and if no try is answered about this payment,
/// `Unknown`: the reconciler then asks the provider by reference.
pub async fn charge(
    gateway: &dyn Gateway,
    req: &ChargeRequest,
    policy: RetryPolicy,
    maybe_sent_before: bool,
) -> ChargeOutcome {
    let sent = send(
        || async { about_this_payment(gateway.charge(req).await?, req) },
        policy,
        maybe_sent_before,
        |err, delay| {
            tracing::warn!(payment_id = %req.reference, error = %err, retry_in = ?delay, "gateway call failed, retrying with the same key");
        },
    )
    .await;
    match sent {
        // Declined as a duplicate of a recent payment of the same card and amount, after
        // a try that may have reached the gateway: the duplicate may be this payment's own
        // first charge, made under a key the gateway has since forgotten. Not "no money
        // taken": the reconciler asks the provider by reference.
        Sent::Answered(charge, after_doubt)
            if after_doubt
                && charge.status == ChargeStatus::Declined
                && charge.declined_as_duplicate() =>
        {
            ChargeOutcome::Unknown(format!(
                "charge {} declined as a duplicate ({}) after an earlier try may have reached the gateway: that try's charge may be this payment's",
                charge.id,
                charge.decline_code.as_deref().unwrap_or("-")
            ))
        }
        Sent::Answered(charge, _) => match charge.status {
            ChargeStatus::Succeeded => ChargeOutcome::Succeeded(charge),
            ChargeStatus::Declined => ChargeOutcome::Declined(charge),
            ChargeStatus::Pending => ChargeOutcome::Pending(charge),
        },
        Sent::Rejected { status, detail, .. } => ChargeOutcome::Rejected { status, detail },
        Sent::Unknown(why) => ChargeOutcome::Unknown(why),
    }
}

/// `charge` if it is about the payment `req` asked for; otherwise an unknown outcome.
fn about_this_payment(charge: Charge, req: &ChargeRequest) -> Result<Charge, GatewayError> {
    if charge.is_for(req.reference) {
        return Ok(charge);
    }
    let named = if charge.reference.is_empty() {
        "no payment".to_owned()
    } else {
        format!("payment {}", charge.reference)
    };
    let status = match charge.status {
        ChargeStatus::Succeeded => "succeeded",
        ChargeStatus::Declined => "declined",
        ChargeStatus::Pending => "pending",
    };
    Err(GatewayError::Unknown(format!(
        "the gateway answered charge {} ({status}) naming {named}, not this one: not believed",
        charge.id
    )))
}

/// One refund call, with exactly the charge's rules: retried with the same request on
/// unknown outcomes, and a refusal proves no refund exists only if no earlier try of this
/// refund may have reached the gateway (`maybe_sent_before`: it was sent before). A refusal
/// of a resend — "over what is left of the charge" included, which is just what a gateway
/// that forgot the key answers once the first try's refund took what was left — stays
/// `Unknown`.
///
/// As for a charge, an answer is believed only about the refund asked for: a refund whose
/// reference is another refund's, or that carries none, says nothing of this one — a
/// gateway bug, a proxy or cache answering another request. Believed, it would settle
/// this refund COMPLETADO on money another refund returned (or FALLIDO on another's
/// failure), or hand it over with another refund's id to be looked up by. It is an unknown
/// outcome, retried with the same key, and if no try is answered about this refund,
/// `Unknown`: the reconciler then asks the provider, whose look-up keeps this refund's own
/// (`Gateway::lookup_refunds`). The reference protocol and Stripe echo the reference they
/// were sent; Mercado Pago's refunds carry none, and its adapter checks what they do carry
/// (the payment and the amount asked) before naming the refund.
pub async fn refund(
    gateway: &dyn Gateway,
    req: &RefundRequest,
    policy: RetryPolicy,
    maybe_sent_before: bool,
) -> RefundOutcome {
    let sent = send(
        || async { about_this_refund(gateway.refund(req).await?, req) },
        policy,
        maybe_sent_before,
        |err, delay| {
            tracing::warn!(refund_id = %req.reference, error = %err, retry_in = ?delay, "gateway refund call failed, retrying with the same key");
        },
    )
    .await;
    match sent {
        Sent::Answered(refund, _) => match refund.status {
            RefundStatus::Succeeded => RefundOutcome::Succeeded(refund),
            RefundStatus::Failed => RefundOutcome::Failed(refund),
            RefundStatus::Pending => RefundOutcome::Pending(refund),
        },
        Sent::Rejected {
            status,
            detail,
            reason,
        } => RefundOutcome::Rejected {
            status,
            detail,
            reason,
        },
        Sent::Unknown(why) => RefundOutcome::Unknown(why),
    }
}

/// `refund` if it is about the refund `req` asked for; otherwise an unknown outcome.
fn about_this_refund(refund: Refund, req: &RefundRequest) -> Result<Refund, GatewayError> {
    if refund.is_for(req.reference) {
        return Ok(refund);
    }
    let named = if refund.reference.is_empty() {
        "no refund".to_owned()
    } else {
        format!("refund {}", refund.reference)
    };
    let status = match refund.status {
        RefundStatus::Succeeded => "succeeded",
        RefundStatus::Failed => "failed",
        RefundStatus::Pending => "pending",
    };
    Err(GatewayError::Unknown(format!(
        "the gateway answered refund {} ({status}) naming {named}, not this one: not believed",
        refund.id
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{Charge, RefundLookup};
    use async_trait::async_trait;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    use uuid::Uuid;

    /// Answers each try with the next scripted result; counts the tries.
    struct Scripted {
        charges: Mutex<Vec<Result<Charge, GatewayError>>>,
        refunds: Mutex<Vec<Result<Refund, GatewayError>>>,
        tries: AtomicUsize,
    }

    fn scripted(script: Vec<Result<Charge, GatewayError>>) -> Scripted {
        Scripted {
            charges: Mutex::new(script),
            refunds: Mutex::new(Vec::new()),
            tries: AtomicUsize::new(0),
        }
    }

    fn scripted_refunds(script: Vec<Result<Refund, GatewayError>>) -> Scripted {
        Scripted {
            charges: Mutex::new(Vec::new()),
            refunds: Mutex::new(script),
            tries: AtomicUsize::new(0),
        }
    }

    fn next<T>(script: &Mutex<Vec<Result<T, GatewayError>>>) -> Result<T, GatewayError> {
        let mut script = script.lock().unwrap_or_else(|e| e.into_inner());
        if script.is_empty() {
            return Err(GatewayError::Unknown("script ended".into()));
        }
        script.remove(0)
    }

    impl Scripted {
        fn tries(&self) -> usize {
            self.tries.load(Ordering::Relaxed)
        }
    }

    #[async_trait]
    impl Gateway for Scripted {
        async fn charge(&self, _req: &ChargeRequest) -> Result<Charge, GatewayError> {
            self.tries.fetch_add(1, Ordering::Relaxed);
            next(&self.charges)
        }

        async fn lookup(&self, _reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
            Ok(vec![])
        }

        async fn refund(&self, _req: &RefundRequest) -> Result<Refund, GatewayError> {
            self.tries.fetch_add(1, Ordering::Relaxed);
            next(&self.refunds)
        }

        async fn lookup_refunds(
            &self,
            _refund: &RefundLookup,
        ) -> Result<Vec<Refund>, GatewayError> {
            Ok(vec![])
        }
    }

    fn request() -> ChargeRequest {
        ChargeRequest {
            gateway_key: "k".into(),
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil(),
            description: None,
            payment_method: None,
        }
    }

    fn refund_request() -> RefundRequest {
        RefundRequest {
            gateway_key: "rk".into(),
            charge: "ch_1".into(),
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil(),
            reason: None,
            whole: false,
        }
    }

    fn made(status: RefundStatus) -> Refund {
        Refund {
            id: "re_1".into(),
            status,
            charge: "ch_1".into(),
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            failure_code: (status == RefundStatus::Failed).then(|| "declined".into()),
        }
    }

    fn fast(retries: usize) -> RetryPolicy {
        RetryPolicy {
            retries,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    fn rejected() -> GatewayError {
        GatewayError::rejected(400, "bad")
    }

    fn over_remaining() -> GatewayError {
        GatewayError::Rejected {
            status: 400,
            detail: "amount_exceeds_remaining".into(),
            reason: RejectReason::ExceedsRemaining,
        }
    }

    #[tokio::test]
    async fn a_refusal_on_the_first_try_means_no_charge() {
        let gateway = scripted(vec![Err(rejected())]);
        let outcome = charge(&gateway, &request(), fast(3), false).await;
        assert!(matches!(
            outcome,
            ChargeOutcome::Rejected { status: 400, .. }
        ));
    }

    #[tokio::test]
    async fn a_refusal_after_an_unknown_try_stays_unknown() {
        let gateway = scripted(vec![
            Err(GatewayError::Unknown("timed out".into())),
            Err(rejected()),
        ]);
        let outcome = charge(&gateway, &request(), fast(3), false).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_refusal_of_a_resend_stays_unknown() {
        let gateway = scripted(vec![Err(rejected())]);
        let outcome = charge(&gateway, &request(), fast(3), true).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)), "{outcome:?}");
        assert_eq!(gateway.tries(), 1, "a refusal is not retried");
    }

    #[tokio::test]
    async fn a_readable_charge_settles_a_resend() {
        let declined = Charge {
            id: "ch_1".into(),
            status: ChargeStatus::Declined,
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            decline_code: Some("insufficient_funds".into()),
            charged_back: false,
        };
        let gateway = scripted(vec![Ok(declined)]);
        let outcome = charge(&gateway, &request(), fast(3), true).await;
        assert!(matches!(outcome, ChargeOutcome::Declined(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_decline_as_a_duplicate_after_a_try_that_may_have_charged_is_unknown() {
        let duplicate = |code: &str| Charge {
            id: "ch_2".into(),
            status: ChargeStatus::Declined,
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            decline_code: Some(code.into()),
            charged_back: false,
        };
        for code in ["cc_rejected_duplicated_payment", "duplicate_transaction"] {
            // A resend (the payment was ENVIADA), or a retry after a timeout.
            let gateway = scripted(vec![Ok(duplicate(code))]);
            let outcome = charge(&gateway, &request(), fast(3), true).await;
            assert!(
                matches!(&outcome, ChargeOutcome::Unknown(why) if why.contains(code)),
                "{code}: {outcome:?}"
            );
            let timed_out = Err(GatewayError::Unknown("timed out".into()));
            let gateway = scripted(vec![timed_out, Ok(duplicate(code))]);
            let outcome = charge(&gateway, &request(), fast(3), false).await;
            assert!(
                matches!(outcome, ChargeOutcome::Unknown(_)),
                "{code}: {outcome:?}"
            );
            // The first try of a payment: a decline like any other.
            let gateway = scripted(vec![Ok(duplicate(code))]);
            let outcome = charge(&gateway, &request(), fast(3), false).await;
            assert!(
                matches!(outcome, ChargeOutcome::Declined(_)),
                "{code}: {outcome:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_answer_about_another_payment_or_none_is_unknown_and_retried() {
        let about = |id: &str, reference: String, status| Charge {
            id: id.into(),
            status,
            amount: 1,
            currency: "COP".into(),
            reference,
            decline_code: None,
            charged_back: false,
        };
        for reference in [Uuid::from_u128(7).to_string(), String::new()] {
            for status in [ChargeStatus::Succeeded, ChargeStatus::Declined] {
                let foreign = || Ok(about("ch_other", reference.clone(), status));
                let gateway = scripted(vec![foreign(), foreign()]);
                let outcome = charge(&gateway, &request(), fast(1), false).await;
                assert!(
                    matches!(&outcome, ChargeOutcome::Unknown(why) if why.contains("ch_other")),
                    "{reference:?} {status:?}: {outcome:?}"
                );
                assert_eq!(gateway.tries(), 2, "retried with the same key");

                // A retry answered about this payment settles it.
                let own = about("ch_own", Uuid::nil().to_string(), ChargeStatus::Succeeded);
                let gateway = scripted(vec![foreign(), Ok(own.clone())]);
                let outcome = charge(&gateway, &request(), fast(1), false).await;
                assert_eq!(outcome, ChargeOutcome::Succeeded(own));
            }
        }
    }

    #[tokio::test]
    async fn retries_stop_at_the_budget() {
        let gateway = scripted(vec![]);
        let outcome = charge(&gateway, &request(), fast(2), false).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)));
        assert_eq!(gateway.tries(), 3, "one try and two retries");
    }

    #[tokio::test]
    async fn each_refund_status_is_its_own_outcome_even_for_a_resend() {
        for (status, resend) in [
            (RefundStatus::Succeeded, false),
            (RefundStatus::Failed, true),
            (RefundStatus::Pending, true),
        ] {
            let gateway = scripted_refunds(vec![Ok(made(status))]);
            let outcome = refund(&gateway, &refund_request(), fast(3), resend).await;
            let expected = match status {
                RefundStatus::Succeeded => RefundOutcome::Succeeded(made(status)),
                RefundStatus::Failed => RefundOutcome::Failed(made(status)),
                RefundStatus::Pending => RefundOutcome::Pending(made(status)),
            };
            assert_eq!(outcome, expected);
        }
    }

    #[tokio::test]
    async fn an_over_refund_on_the_first_try_is_a_refusal_that_says_so() {
        let gateway = scripted_refunds(vec![Err(over_remaining())]);
        let outcome = refund(&gateway, &refund_request(), fast(3), false).await;
        assert!(
            matches!(
                outcome,
                RefundOutcome::Rejected {
                    status: 400,
                    reason: RejectReason::ExceedsRemaining,
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(gateway.tries(), 1, "a refusal is not retried");
    }

    #[tokio::test]
    async fn a_refund_refused_after_a_timeout_or_on_a_resend_stays_unknown() {
        let gateway = scripted_refunds(vec![
            Err(GatewayError::Unknown("timed out".into())),
            Err(over_remaining()),
        ]);
        let outcome = refund(&gateway, &refund_request(), fast(3), false).await;
        assert!(matches!(outcome, RefundOutcome::Unknown(_)), "{outcome:?}");
        assert_eq!(gateway.tries(), 2, "retried once with the same request");

        let gateway = scripted_refunds(vec![Err(over_remaining())]);
        let outcome = refund(&gateway, &refund_request(), fast(3), true).await;
        assert!(matches!(outcome, RefundOutcome::Unknown(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_refund_answer_about_another_refund_or_none_is_unknown_and_retried() {
        for reference in [Uuid::from_u128(7).to_string(), String::new()] {
            for status in [
                RefundStatus::Succeeded,
                RefundStatus::Failed,
                RefundStatus::Pending,
            ] {
                let foreign = || {
                    Ok(Refund {
                        id: "re_other".into(),
                        reference: reference.clone(),
                        ..made(status)
                    })
                };
                let gateway = scripted_refunds(vec![foreign(), foreign()]);
                let outcome = refund(&gateway, &refund_request(), fast(1), false).await;
                assert!(
                    matches!(&outcome, RefundOutcome::Unknown(why) if why.contains("re_other")),
                    "{reference:?} {status:?}: {outcome:?}"
                );
                assert_eq!(gateway.tries(), 2, "retried with the same key");

                // A retry answered about this refund settles it.
                let own = made(RefundStatus::Succeeded);
                let gateway = scripted_refunds(vec![foreign(), Ok(own.clone())]);
                let outcome = refund(&gateway, &refund_request(), fast(1), false).await;
                assert_eq!(outcome, RefundOutcome::Succeeded(own));
            }
        }
    }

    #[tokio::test]
    async fn refund_retries_stop_at_the_budget() {
        let gateway = scripted_refunds(vec![]);
        let outcome = refund(&gateway, &refund_request(), fast(1), false).await;
        assert!(matches!(outcome, RefundOutcome::Unknown(_)));
        assert_eq!(gateway.tries(), 2, "one try and one retry");
    }
}
