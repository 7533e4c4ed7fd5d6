//! Reading the server's answers: the payment and problem documents, and what each answer
//! means for the intent (settled, still pending, worth another try, or refused).
//!
//! Pure: no I/O and no clock of its own. It must never treat an answer whose outcome is
//! unknown as a refusal (that would forget a payment that may exist), nor a refusal as
//! worth retrying (the same request gets the same refusal).

use pagos_types::PaymentState;
use std::time::{Duration, SystemTime};

pub use pagos_types::payment::{MedioPago, Pago};
pub use pagos_types::problem::{Problem, ProblemType};

pub(crate) fn reason(status: u16) -> &'static str {
    reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unexpected status")
}

/// The header of an answer the reading needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub retry_after: Option<Duration>,
    /// `Location`, read for a redirect.
    pub location: Option<String>,
}

/// What one answer (or a failure to get one) means for the intent.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// COMPLETADA: charged. Final.
    Paid(Pago),
    /// FALLIDA: declined or refused by the gateway; no money moved. Final.
    Declined(Pago, Option<Problem>),
    /// The server has the payment but not its outcome yet (202, or a pending state), and
    /// when to look again (`Retry-After`: five minutes for one in REVISION_MANUAL).
    Pending(Pago, Option<Duration>),
    /// The outcome is unknown or the server is busy: the same request may be sent again.
    Transient {
        why: String,
        retry_after: Option<Duration>,
    },
    /// 409 `request-in-flight`: the first request with this key is still being worked on;
    /// the same request may be sent again, after `Retry-After`. Not a failure.
    InFlight {
        why: String,
        retry_after: Option<Duration>,
    },
    /// The key already belongs to another request.
    KeyReused(Problem),
    /// The server refused the request itself: sending it again cannot help.
    Refused { status: u16, problem: Problem },
    /// A 3xx, to `location`: not pagos' answer (pagos never redirects) but something in
    /// front of it (a load balancer sending http to https, a moved host), so the request
    /// never reached pagos. Not followed: a redirected POST could become a GET elsewhere.
    Redirected {
        status: u16,
        location: Option<String>,
    },
    /// Not the protocol: a human must look.
    Unexpected(String),
}

/// Reads the answer to `POST /v1/pagos`.
pub fn read_post(head: &Head, body: &[u8]) -> Reading {
    match head.status {
        201 => match payment(body) {
            Ok(p) if p.state == PaymentState::Completada => Reading::Paid(p),
            Ok(p) => Reading::Unexpected(format!("201 with estado {}", p.state)),
            Err(why) => Reading::Unexpected(format!("201 without a payment: {why}")),
        },
        202 => match payment(body) {
            Ok(p) => Reading::Pending(p, head.retry_after),
            Err(why) => Reading::Unexpected(format!("202 without a payment: {why}")),
        },
        402 => {
            let problem = Problem::read(402, body);
            match problem
                .extensions
                .get("pago")
                .cloned()
                .map(serde_json::from_value::<Pago>)
            {
                Some(Ok(p)) => Reading::Declined(p, Some(problem)),
                Some(Err(e)) => Reading::Unexpected(format!("402 with a bad `pago`: {e}")),
                None => Reading::Unexpected("402 without the payment under `pago`".into()),
            }
        }
        _ => read_other(head, body),
    }
}

/// Reads the answer to `GET /v1/pagos/{id}`.
pub fn read_get(head: &Head, body: &[u8]) -> Reading {
    match head.status {
        200 => match payment(body) {
            Ok(p) => match settled_or_pending(p) {
                Reading::Pending(p, _) => Reading::Pending(p, head.retry_after),
                settled => settled,
            },
            Err(why) => Reading::Unexpected(format!("200 without a payment: {why}")),
        },
        _ => read_other(head, body),
    }
}

/// A payment read by id is settled when its state is terminal.
pub fn settled_or_pending(p: Pago) -> Reading {
    match p.state {
        PaymentState::Completada => Reading::Paid(p),
        PaymentState::Fallida => Reading::Declined(p, None),
        PaymentState::EnProceso | PaymentState::Enviada | PaymentState::RevisionManual => {
            Reading::Pending(p, None)
        }
    }
}

pub(crate) fn read_other(head: &Head, body: &[u8]) -> Reading {
    let status = head.status;
    match status {
        // 408 and 425 say the request was not processed; a 409 `request-in-flight` that
        // the first one still is; 429 and 5xx that the server is busy or does not know (a
        // proxy's 502/504). Any other 409 (`payment-not-refundable`, …) is a refusal.
        408 | 425 | 429 | 500..=599 => {
            let problem = Problem::read(status, body);
            Reading::Transient {
                why: format!("{status} {}", problem.title),
                retry_after: head.retry_after,
            }
        }
        409 => {
            let problem = Problem::read(status, body);
            if problem.kind() == Some(ProblemType::RequestInFlight) {
                Reading::InFlight {
                    why: format!("{status} {}", problem.title),
                    retry_after: head.retry_after,
                }
            } else {
                Reading::Refused { status, problem }
            }
        }
        400..=499 => {
            let problem = Problem::read(status, body);
            if status == 422 && problem.kind() == Some(ProblemType::KeyReused) {
                Reading::KeyReused(problem)
            } else {
                Reading::Refused { status, problem }
            }
        }
        300..=399 => Reading::Redirected {
            status,
            location: head.location.clone(),
        },
        _ => Reading::Unexpected(format!("unexpected status {status} {}", reason(status))),
    }
}

fn payment(body: &[u8]) -> Result<Pago, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

/// `Retry-After` in either form: delta-seconds (`7`) or an HTTP date, counted from `now`,
/// in any of the three forms a recipient must read (RFC 9110 §5.6.7: IMF-fixdate, and the
/// obsolete RFC 850 and asctime forms an older proxy may still send).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    // A date with a numeric zone (`+0000`) is no HTTP date, but a server that sends one
    // still means it.
    let at = httpdate::parse_http_date(value).ok().or_else(|| {
        chrono::DateTime::parse_from_rfc2822(value)
            .ok()
            .map(|at| SystemTime::from(at.with_timezone(&chrono::Utc)))
    })?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn head(status: u16) -> Head {
        Head {
            status,
            ..Head::default()
        }
    }

    fn pago(estado: &str) -> Value {
        json!({"id": "0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b", "creditoId": "42", "monto": 250000,
               "moneda": "COP", "estado": estado, "gatewayRef": "ch_1",
               "creadoEn": "2026-01-01T00:00:00.000Z", "actualizadoEn": "2026-01-01T00:00:01.000Z"})
    }

    fn bytes(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).expect("json")
    }

    fn problem(status: u16, slug: &str, title: &str) -> Vec<u8> {
        bytes(&json!({"type": format!("/problems/{slug}"), "title": title, "status": status}))
    }

    #[test]
    fn a_201_is_paid_a_202_is_pending_and_a_402_is_declined() {
        assert!(matches!(
            read_post(&head(201), &bytes(&pago("COMPLETADA"))),
            Reading::Paid(p) if p.gateway_ref.as_deref() == Some("ch_1")
        ));
        assert!(matches!(
            read_post(&head(202), &bytes(&pago("ENVIADA"))),
            Reading::Pending(p, None) if p.state == PaymentState::Enviada
        ));
        let under_review = Head {
            status: 202,
            retry_after: Some(Duration::from_secs(300)),
            ..Head::default()
        };
        assert!(matches!(
            read_post(&under_review, &bytes(&pago("REVISION_MANUAL"))),
            Reading::Pending(_, Some(ra)) if ra == Duration::from_secs(300)
        ));
        let declined = json!({"type": "/problems/payment-declined", "title": "Pago declined",
                              "status": 402, "declineCode": "insufficient_funds", "pago": pago("FALLIDA")});
        match read_post(&head(402), &bytes(&declined)) {
            Reading::Declined(p, Some(problem)) => {
                assert_eq!(p.state, PaymentState::Fallida);
                assert_eq!(problem.extensions["declineCode"], "insufficient_funds");
            }
            other => panic!("not a decline: {other:?}"),
        }
    }

    #[test]
    fn busy_and_failing_servers_are_worth_another_try_with_their_retry_after() {
        for status in [408, 409, 425, 429, 500, 502, 503, 504] {
            let h = Head {
                status,
                retry_after: Some(Duration::from_secs(2)),
                ..Head::default()
            };
            match read_post(&h, &problem(status, "request-in-flight", "Busy")) {
                Reading::Transient { why, retry_after }
                | Reading::InFlight { why, retry_after } => {
                    assert!(why.starts_with(&status.to_string()), "{why}");
                    assert_eq!(retry_after, Some(Duration::from_secs(2)));
                }
                other => panic!("{status} is not transient: {other:?}"),
            }
        }
    }

    #[test]
    fn a_409_is_worth_another_try_only_when_the_first_request_is_in_flight() {
        let in_flight = problem(409, "request-in-flight", "In progress");
        assert!(matches!(
            read_post(&head(409), &in_flight),
            Reading::InFlight { .. }
        ));
        let not_refundable = problem(409, "payment-not-refundable", "Not COMPLETADA");
        let from_a_proxy = b"<html>409 Conflict</html>".to_vec();
        for body in [not_refundable, from_a_proxy] {
            for reading in [read_post(&head(409), &body), read_get(&head(409), &body)] {
                assert!(
                    matches!(reading, Reading::Refused { status: 409, .. }),
                    "{reading:?}"
                );
            }
        }
    }

    #[test]
    fn other_4xx_are_refusals_that_carry_the_problem() {
        for status in [400, 401, 403, 404, 413, 415, 422] {
            match read_post(&head(status), &problem(status, "validation-failed", "Nope")) {
                Reading::Refused { status: s, problem } => {
                    assert_eq!(s, status);
                    assert_eq!(problem.title, "Nope");
                }
                other => panic!("{status} is not a refusal: {other:?}"),
            }
        }
    }

    #[test]
    fn a_reused_key_is_its_own_reading() {
        let body = problem(
            422,
            ProblemType::KeyReused.slug(),
            "Idempotency-Key already used",
        );
        assert!(matches!(
            read_post(&head(422), &body),
            Reading::KeyReused(p) if p.kind() == Some(ProblemType::KeyReused)
        ));
    }

    #[test]
    fn redirects_are_their_own_reading_and_broken_bodies_are_unexpected() {
        let moved = Head {
            status: 301,
            location: Some("https://pagos.example/v1/pagos".into()),
            ..Head::default()
        };
        assert!(matches!(
            read_post(&moved, b""),
            Reading::Redirected { status: 301, location: Some(l) } if l == "https://pagos.example/v1/pagos"
        ));
        assert!(matches!(
            read_get(&head(307), b""),
            Reading::Redirected {
                status: 307,
                location: None
            }
        ));
        assert!(matches!(
            read_post(&head(201), b"{}"),
            Reading::Unexpected(_)
        ));
        assert!(matches!(
            read_post(&head(201), &bytes(&pago("ENVIADA"))),
            Reading::Unexpected(_)
        ));
    }

    #[test]
    fn a_payment_read_by_id_is_settled_only_in_a_terminal_state() {
        let read = |estado| read_get(&head(200), &bytes(&pago(estado)));
        assert!(matches!(read("COMPLETADA"), Reading::Paid(_)));
        assert!(matches!(read("FALLIDA"), Reading::Declined(_, None)));
        for estado in ["EN_PROCESO", "ENVIADA", "REVISION_MANUAL"] {
            assert!(matches!(read(estado), Reading::Pending(..)), "{estado}");
        }
        assert!(matches!(
            read_get(&head(404), &problem(404, "not-found", "Not found")),
            Reading::Refused { status: 404, .. }
        ));
    }

    #[test]
    fn retry_after_is_read_in_seconds_or_as_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:30 GMT", now),
            Some(Duration::ZERO)
        );
        for obsolete in [
            "Sunday, 06-Nov-94 08:49:47 GMT",
            "Sun Nov  6 08:49:47 1994",
            "Sun, 06 Nov 1994 08:49:47 +0000",
        ] {
            assert_eq!(
                parse_retry_after(obsolete, now),
                Some(Duration::from_secs(10)),
                "{obsolete}"
            );
        }
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
