//! What a provider says, held to what pagos can store. A charge's or refund's id becomes
//! a payment's or refund's `gateway_ref` (at most `MAX_GATEWAY_REF_LEN` characters), a
//! decline or failure code its `decline_code`/`failure_code` (`MAX_DECLINE_CODE_LEN`).
//! A write with a longer value fails on PostgreSQL, and fails again at every retry and
//! every reconciliation pass: the payment would stay `ENVIADA` for good, with no horizon
//! to take it to on-call. So, for every adapter, before anything is decided on an answer:
//! a code is cut to what is stored (it is only a reason), and an id that cannot be stored
//! (empty, too long, or with a NUL) is not believed: an unknown outcome, as an answer about
//! another payment is (`retry`), which the reconciler's horizons take to `REVISION_MANUAL`.
//!
//! PostgreSQL's text refuses NUL (`\u0000` in a JSON answer, or a raw byte in an error
//! body read as text): a code, and the words of an error that become an audit row's reason
//! or a payment's `last_error`, keep it as U+FFFD (`words`).

use super::{
    Charge, ChargeRequest, Gateway, GatewayError, Refund, RefundLookup, RefundRequest, decline_code,
};
use async_trait::async_trait;
use std::sync::Arc;
use uuid::Uuid;

/// The longest provider id pagos stores (`payments.gateway_ref`, `refunds.gateway_ref`).
pub const MAX_GATEWAY_REF_LEN: usize = 255;

/// A gateway whose answers are held to what pagos stores (the module's rule).
pub struct Storable(pub Arc<dyn Gateway>);

impl Storable {
    pub fn wrap(inner: Arc<dyn Gateway>) -> Arc<dyn Gateway> {
        Arc::new(Storable(inner))
    }
}

fn storable_id(what: &str, id: &str) -> Result<(), GatewayError> {
    if id.trim().is_empty() {
        return Err(GatewayError::Unknown(format!(
            "the gateway answered a {what} with no id: not believed"
        )));
    }
    if id.contains('\0') {
        let start: String = words(id.chars().take(40).collect());
        return Err(GatewayError::Unknown(format!(
            "the gateway answered a {what} whose id ({start}) holds a NUL, which pagos cannot store: not believed"
        )));
    }
    let len = id.chars().count();
    if len > MAX_GATEWAY_REF_LEN {
        let start: String = id.chars().take(40).collect();
        return Err(GatewayError::Unknown(format!(
            "the gateway answered a {what} whose id is {len} characters long ({start}…), longer than the {MAX_GATEWAY_REF_LEN} pagos stores: not believed"
        )));
    }
    Ok(())
}

/// `text` with every NUL as U+FFFD: what PostgreSQL's text stores.
pub fn words(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// `err` with words pagos can store (`words`).
fn storable_error(err: GatewayError) -> GatewayError {
    match err {
        GatewayError::Unknown(why) => GatewayError::Unknown(words(why)),
        GatewayError::Rejected {
            status,
            detail,
            reason,
        } => GatewayError::Rejected {
            status,
            detail: words(detail),
            reason,
        },
    }
}

/// `charge` as pagos stores it, or why it is not believed.
pub fn charge(mut charge: Charge) -> Result<Charge, GatewayError> {
    storable_id("charge", &charge.id)?;
    charge.decline_code = charge.decline_code.as_deref().map(decline_code);
    // Compared with the payment's, and said in a reason or an error when they differ.
    charge.reference = words(charge.reference);
    charge.currency = currency(charge.currency);
    Ok(charge)
}

/// The longest currency code pagos stores with a provider's report.
const MAX_CURRENCY_LEN: usize = 16;

/// A currency as pagos stores it with a report (16 characters at most, no NUL): one that
/// is not the payment's is told as such, never written as the provider sent it.
fn currency(code: String) -> String {
    if code.len() <= MAX_CURRENCY_LEN && !code.contains('\0') {
        return code;
    }
    words(code.chars().take(MAX_CURRENCY_LEN).collect())
}

/// `refund` as pagos stores it, or why it is not believed.
pub fn refund(mut refund: Refund) -> Result<Refund, GatewayError> {
    storable_id("refund", &refund.id)?;
    // Some answers name no charge (the adapter fills in the one asked about).
    if !refund.charge.is_empty() {
        storable_id("refund's charge", &refund.charge)?;
    }
    refund.failure_code = refund.failure_code.as_deref().map(decline_code);
    refund.reference = words(refund.reference);
    refund.currency = currency(refund.currency);
    Ok(refund)
}

#[async_trait]
impl Gateway for Storable {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        charge(self.0.charge(req).await.map_err(storable_error)?)
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        self.0
            .lookup(reference)
            .await
            .map_err(storable_error)?
            .into_iter()
            .map(charge)
            .collect()
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        refund(self.0.refund(req).await.map_err(storable_error)?)
    }

    async fn lookup_refunds(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        self.0
            .lookup_refunds(lookup)
            .await
            .map_err(storable_error)?
            .into_iter()
            .map(refund)
            .collect()
    }

    async fn account_currency(&self) -> Result<Option<String>, GatewayError> {
        self.0.account_currency().await
    }

    async fn refunds_of_charge(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        self.0
            .refunds_of_charge(lookup)
            .await
            .map_err(storable_error)?
            .into_iter()
            .map(refund)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{ChargeStatus, RefundStatus};

    fn a_charge(id: &str, code: Option<&str>) -> Charge {
        Charge {
            id: id.into(),
            status: ChargeStatus::Declined,
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            decline_code: code.map(Into::into),
            charged_back: false,
        }
    }

    #[test]
    fn a_code_is_cut_to_what_is_stored_and_an_id_too_long_or_empty_is_not_believed() {
        let long_code = "x".repeat(300);
        let kept = charge(a_charge("ch_1", Some(&long_code))).expect("believed");
        assert_eq!(kept.decline_code.as_deref().map(str::len), Some(100));
        assert!(charge(a_charge(&"c".repeat(255), None)).is_ok());
        for id in ["c".repeat(256), String::new(), " ".into()] {
            let err = charge(a_charge(&id, None)).expect_err("not believed");
            assert!(err.is_retryable(), "an unknown outcome: {err}");
        }
        let r = Refund {
            id: "r".repeat(256),
            status: RefundStatus::Succeeded,
            charge: "ch_1".into(),
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            failure_code: None,
        };
        assert!(refund(r).is_err());
    }

    #[test]
    fn a_nul_is_kept_as_u_fffd_in_codes_and_words_and_an_id_with_one_is_not_believed() {
        let kept = charge(a_charge("ch_1", Some("do_not\0honor"))).expect("believed");
        assert_eq!(kept.decline_code.as_deref(), Some("do_not\u{FFFD}honor"));
        let err = charge(a_charge("ch_\u{0}1", None)).expect_err("not believed");
        assert!(err.is_retryable(), "an unknown outcome: {err}");
        assert!(!err.to_string().contains('\0'), "{err}");
        let words = storable_error(GatewayError::rejected(400, "bad\0thing")).to_string();
        assert!(words.ends_with("bad\u{FFFD}thing"), "{words}");
    }
}
