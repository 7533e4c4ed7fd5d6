//! What a provider says, held to what pagos can store. A charge's or refund's id becomes
//! a payment's or refund's `gateway_ref` (at most `MAX_GATEWAY_REF_LEN` characters), a
//! decline or failure code its `decline_code`/`failure_code` (`MAX_DECLINE_CODE_LEN`).
//! A write with a longer value fails on PostgreSQL, and fails again at every retry and
//! every reconciliation pass: the payment would stay `ENVIADA` for good, with no horizon
//! to take it to on-call. So, for every adapter, before anything is decided on an answer:
//! a code is cut to what is stored (it is only a reason), and an id that cannot be stored
//! (empty or too long) is not believed: an unknown outcome, as an answer about another
//! payment is (`retry`), which the reconciler's horizons take to `REVISION_MANUAL`.

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
    let len = id.chars().count();
    if len > MAX_GATEWAY_REF_LEN {
        let start: String = id.chars().take(40).collect();
        return Err(GatewayError::Unknown(format!(
            "the gateway answered a {what} whose id is {len} characters long ({start}…), longer than the {MAX_GATEWAY_REF_LEN} pagos stores: not believed"
        )));
    }
    Ok(())
}

/// `charge` as pagos stores it, or why it is not believed.
pub fn charge(mut charge: Charge) -> Result<Charge, GatewayError> {
    storable_id("charge", &charge.id)?;
    charge.decline_code = charge.decline_code.as_deref().map(decline_code);
    Ok(charge)
}

/// `refund` as pagos stores it, or why it is not believed.
pub fn refund(mut refund: Refund) -> Result<Refund, GatewayError> {
    storable_id("refund", &refund.id)?;
    refund.failure_code = refund.failure_code.as_deref().map(decline_code);
    Ok(refund)
}

#[async_trait]
impl Gateway for Storable {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        charge(self.0.charge(req).await?)
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        self.0
            .lookup(reference)
            .await?
            .into_iter()
            .map(charge)
            .collect()
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        refund(self.0.refund(req).await?)
    }

    async fn lookup_refunds(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        self.0
            .lookup_refunds(lookup)
            .await?
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
}
