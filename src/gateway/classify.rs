//! One reading of gateway answers, shared by every adapter: which answers leave a charge's
//! (or a refund's) existence unknown and which prove the gateway refused the request.
//!
//! Pure: a status and what the provider said, in; a `GatewayError`, out. Adapters only
//! say what their provider's body means ("this key was used with another request", "the
//! refund is over what is left of the charge"); they never decide on their own that an
//! answer is a refusal. The rule that a refusal proves nothing once an earlier try may
//! have reached the gateway is the saga's (`retry::charge`, `retry::refund`), because only
//! the saga knows the history of what it sends.

use super::{GatewayError, RejectReason};
use reqwest::StatusCode;

/// What a provider's error body says about the idempotency key, beyond its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySaid {
    /// Nothing about the key.
    Nothing,
    /// "This key was already used with other parameters": a charge (or refund) may exist under it
    /// (reference protocol 422 on a charge, Stripe's `idempotency_error`, Mercado Pago's
    /// idempotency conflicts). Never a decline.
    UsedWithAnotherRequest,
}

/// What a provider's error body says about a refused refund's amount, beyond its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmountSaid {
    /// Nothing about the amount.
    Nothing,
    /// "The refund is over what is left of the charge" (reference protocol
    /// `amount_exceeds_remaining`, Stripe `charge_already_refunded`, …).
    ExceedsRemaining,
}

/// What a non-success answer to a request that creates something (a charge, a refund)
/// means.
///
/// - 5xx, 408, 409 (a request with this key still in flight), 425, 429: the request may
///   or may not have been applied — unknown.
/// - 401, 403: our credentials are wrong, not the payment. Nothing is known about a
///   charge an earlier try may have made, and failing every payment during a
///   credentials incident would be worse than waiting — unknown.
/// - The key used with another request: a charge exists under the key — unknown.
/// - Anything that is not a 4xx (a 3xx pagos did not follow, a 1xx): unknown.
/// - Any other 4xx: the gateway refused this request — `Rejected`.
pub fn refusal(provider: &str, status: StatusCode, said: KeySaid, detail: &str) -> GatewayError {
    let code = status.as_u16();
    if status.is_server_error() || matches!(code, 408 | 409 | 425 | 429) {
        return GatewayError::Unknown(format!("{provider} answered {status}: {detail}"));
    }
    if matches!(code, 401 | 403) {
        return GatewayError::Unknown(format!(
            "{provider} refused our credentials ({status}): check PAGOS_GATEWAY_SECRET"
        ));
    }
    if said == KeySaid::UsedWithAnotherRequest {
        return GatewayError::Unknown(format!(
            "{provider} holds another request under this key ({status}), so a charge or refund may exist under it: {detail}"
        ));
    }
    if !status.is_client_error() {
        return GatewayError::Unknown(format!("{provider} answered {status}: {detail}"));
    }
    GatewayError::rejected(code, detail)
}

/// What a non-success answer to a refund means: as `refusal`, and a refusal whose body says
/// the amount is over what is left of the charge is told apart (the saga answers it as
/// such). What the body says never turns an unknown outcome into a refusal: a 5xx or a 409
/// that mentions the amount stays unknown.
pub fn refund_refusal(
    provider: &str,
    status: StatusCode,
    said: KeySaid,
    amount: AmountSaid,
    detail: &str,
) -> GatewayError {
    match refusal(provider, status, said, detail) {
        GatewayError::Rejected { status, detail, .. } if amount == AmountSaid::ExceedsRemaining => {
            GatewayError::Rejected {
                status,
                detail,
                reason: RejectReason::ExceedsRemaining,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(code: u16, said: KeySaid) -> &'static str {
        let status = StatusCode::from_u16(code).expect("a status");
        match refusal("gw", status, said, "x") {
            GatewayError::Unknown(_) => "unknown",
            GatewayError::Rejected { .. } => "rejected",
        }
    }

    #[test]
    fn only_a_plain_client_error_is_a_refusal() {
        for code in [500, 502, 503, 504, 408, 409, 425, 429, 401, 403, 302, 304] {
            assert_eq!(class(code, KeySaid::Nothing), "unknown", "{code}");
        }
        for code in [400, 402, 404, 410, 413, 422] {
            assert_eq!(class(code, KeySaid::Nothing), "rejected", "{code}");
        }
    }

    #[test]
    fn a_key_used_with_another_request_is_never_a_refusal() {
        for code in [400, 409, 422] {
            assert_eq!(
                class(code, KeySaid::UsedWithAnotherRequest),
                "unknown",
                "{code}"
            );
        }
    }

    #[test]
    fn an_over_refund_is_told_apart_only_when_it_is_a_refusal() {
        let read = |code: u16, said: KeySaid| {
            let status = StatusCode::from_u16(code).expect("a status");
            refund_refusal("gw", status, said, AmountSaid::ExceedsRemaining, "over")
        };
        for code in [400, 402, 422] {
            assert!(
                matches!(
                    read(code, KeySaid::Nothing),
                    GatewayError::Rejected {
                        reason: RejectReason::ExceedsRemaining,
                        ..
                    }
                ),
                "{code}"
            );
        }
        for code in [500, 503, 409, 429, 401] {
            assert!(
                matches!(read(code, KeySaid::Nothing), GatewayError::Unknown(_)),
                "{code}"
            );
        }
        assert!(matches!(
            read(422, KeySaid::UsedWithAnotherRequest),
            GatewayError::Unknown(_)
        ));
        let plain = refund_refusal(
            "gw",
            StatusCode::BAD_REQUEST,
            KeySaid::Nothing,
            AmountSaid::Nothing,
            "bad",
        );
        assert!(matches!(
            plain,
            GatewayError::Rejected {
                status: 400,
                reason: RejectReason::Other,
                ..
            }
        ));
    }

    #[test]
    fn credentials_name_the_setting_to_fix() {
        let err = refusal("Stripe", StatusCode::UNAUTHORIZED, KeySaid::Nothing, "");
        assert!(err.to_string().contains("PAGOS_GATEWAY_SECRET"), "{err}");
    }
}
