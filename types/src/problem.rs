//! RFC 9457 problem documents: the body of every refusal pagos answers, and what the
//! client reads them into.
//!
//! Each kind has a stable `type` (`/problems/<slug>`): clients branch on it, never on
//! `title`. The server renders a [`Problem`] with `serde_json` (its field order is the
//! bytes of every frozen answer, so it never changes); the client reads any body into one,
//! a proxy's HTML page included ([`Problem::read`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The kinds of problem pagos answers with. `type` is `/problems/<slug>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemType {
    Unauthorized,
    /// An operator whose role may only read (`lector`) asked to change something.
    Forbidden,
    TooManyAuthFailures,
    NotFound,
    /// A path pagos serves, asked with a method it does not serve there (`Allow` lists
    /// those it does).
    MethodNotAllowed,
    MissingKey,
    MalformedKey,
    MalformedJson,
    Validation,
    BodyTooLarge,
    UnsupportedMediaType,
    KeyReused,
    RequestInFlight,
    NotUnderReview,
    PaymentDeclined,
    GatewayRejected,
    Unavailable,
    /// Shed at `PAGOS_MAX_IN_FLIGHT`: not started, nothing stored.
    Overloaded,
    /// Cut at `PAGOS_REQUEST_TIMEOUT`: a payment it started goes on.
    RequestTimeout,
    /// A body read before anyone is known (a webhook, a console login) not received within
    /// `PAGOS_HEADER_TIMEOUT`: nothing read or stored.
    BodyTimeout,
    Internal,
    /// The gateway refused a refund (the refund, `FALLIDO`, under `reembolso`).
    RefundRefused,
    /// A refund of a payment that is not `COMPLETADA`.
    PaymentNotRefundable,
    /// A refund over what is left of the payment (`restante`).
    RefundExceedsRemaining,
    /// On-call's resolution of a payment under review contradicts what the provider shows
    /// for it (`cargos`: the charges found); nothing was changed.
    ProviderDisagrees,
    /// On-call's resolution of a payment names a charge (`cargo`) that is already another
    /// payment's, by pagos' records or the provider's own reports: recorded, a refund of
    /// this payment would refund that payment's customer; nothing was changed.
    ChargeOfAnotherPayment,
    /// On-call's COMPLETADA for a payment the merchant was told FALLIDA (its key answers
    /// 402, "no money taken", for as long as it is kept); nothing was changed.
    ToldFailed,
}

impl ProblemType {
    pub const ALL: [ProblemType; 27] = [
        ProblemType::Unauthorized,
        ProblemType::Forbidden,
        ProblemType::TooManyAuthFailures,
        ProblemType::NotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::MissingKey,
        ProblemType::MalformedKey,
        ProblemType::MalformedJson,
        ProblemType::Validation,
        ProblemType::BodyTooLarge,
        ProblemType::UnsupportedMediaType,
        ProblemType::KeyReused,
        ProblemType::RequestInFlight,
        ProblemType::NotUnderReview,
        ProblemType::PaymentDeclined,
        ProblemType::GatewayRejected,
        ProblemType::Unavailable,
        ProblemType::Overloaded,
        ProblemType::RequestTimeout,
        ProblemType::BodyTimeout,
        ProblemType::Internal,
        ProblemType::RefundRefused,
        ProblemType::PaymentNotRefundable,
        ProblemType::RefundExceedsRemaining,
        ProblemType::ProviderDisagrees,
        ProblemType::ChargeOfAnotherPayment,
        ProblemType::ToldFailed,
    ];

    /// The stable last segment of `type`.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemType::Unauthorized => "unauthorized",
            ProblemType::Forbidden => "forbidden",
            ProblemType::TooManyAuthFailures => "too-many-failed-authentications",
            ProblemType::NotFound => "not-found",
            ProblemType::MethodNotAllowed => "method-not-allowed",
            ProblemType::MissingKey => "idempotency-key-missing",
            ProblemType::MalformedKey => "idempotency-key-malformed",
            ProblemType::MalformedJson => "malformed-json",
            ProblemType::Validation => "validation-failed",
            ProblemType::BodyTooLarge => "body-too-large",
            ProblemType::UnsupportedMediaType => "unsupported-media-type",
            ProblemType::KeyReused => "idempotency-key-reused",
            ProblemType::RequestInFlight => "request-in-flight",
            ProblemType::NotUnderReview => "not-under-review",
            ProblemType::PaymentDeclined => "payment-declined",
            ProblemType::GatewayRejected => "gateway-rejected",
            ProblemType::Unavailable => "service-unavailable",
            ProblemType::Overloaded => "overloaded",
            ProblemType::RequestTimeout => "request-timeout",
            ProblemType::BodyTimeout => "body-timeout",
            ProblemType::Internal => "internal-error",
            ProblemType::RefundRefused => "refund-refused",
            ProblemType::PaymentNotRefundable => "payment-not-refundable",
            ProblemType::RefundExceedsRemaining => "refund-exceeds-remaining",
            ProblemType::ProviderDisagrees => "provider-disagrees",
            ProblemType::ChargeOfAnotherPayment => "charge-belongs-to-another-payment",
            ProblemType::ToldFailed => "payment-told-failed",
        }
    }

    /// The kind whose slug this is.
    pub fn from_slug(slug: &str) -> Option<ProblemType> {
        ProblemType::ALL
            .into_iter()
            .find(|kind| kind.slug() == slug)
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> u16 {
        match self {
            ProblemType::Unauthorized => 401,
            ProblemType::Forbidden => 403,
            ProblemType::TooManyAuthFailures => 429,
            ProblemType::NotFound => 404,
            ProblemType::MethodNotAllowed => 405,
            ProblemType::MissingKey | ProblemType::MalformedKey | ProblemType::MalformedJson => 400,
            ProblemType::Validation | ProblemType::KeyReused => 422,
            ProblemType::BodyTooLarge => 413,
            ProblemType::BodyTimeout => 408,
            ProblemType::UnsupportedMediaType => 415,
            ProblemType::RequestInFlight | ProblemType::NotUnderReview => 409,
            ProblemType::PaymentDeclined | ProblemType::GatewayRejected => 402,
            ProblemType::Unavailable | ProblemType::Overloaded | ProblemType::RequestTimeout => 503,
            ProblemType::Internal => 500,
            ProblemType::RefundRefused | ProblemType::RefundExceedsRemaining => 422,
            ProblemType::PaymentNotRefundable
            | ProblemType::ProviderDisagrees
            | ProblemType::ChargeOfAnotherPayment
            | ProblemType::ToldFailed => 409,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemType::Unauthorized => "Missing or invalid credentials",
            ProblemType::Forbidden => "Your role may not do this",
            ProblemType::TooManyAuthFailures => "Too many failed authentications from this address",
            ProblemType::NotFound => "Not found",
            ProblemType::MethodNotAllowed => "Method not allowed on this path",
            ProblemType::MissingKey => "Idempotency-Key header missing",
            ProblemType::MalformedKey => "Idempotency-Key header malformed",
            ProblemType::MalformedJson => "Body is not valid JSON",
            ProblemType::Validation => "Request failed validation",
            ProblemType::BodyTooLarge => "Body too large",
            ProblemType::UnsupportedMediaType => "Content type must be application/json",
            ProblemType::KeyReused => "Idempotency-Key already used with another request",
            ProblemType::RequestInFlight => "A request with this Idempotency-Key is in progress",
            ProblemType::NotUnderReview => "The payment is not under manual review",
            ProblemType::PaymentDeclined => "Payment declined",
            ProblemType::GatewayRejected => "Payment refused by the gateway",
            ProblemType::Unavailable => "Service temporarily unavailable",
            ProblemType::Overloaded => "Too many requests in progress",
            ProblemType::RequestTimeout => "The request took too long",
            ProblemType::BodyTimeout => "The body was not received in time",
            ProblemType::Internal => "Internal error",
            ProblemType::RefundRefused => "Refund refused by the gateway",
            ProblemType::PaymentNotRefundable => "The payment cannot be refunded",
            ProblemType::RefundExceedsRemaining => "The refund exceeds what is left of the payment",
            ProblemType::ProviderDisagrees => "The provider's records contradict this resolution",
            ProblemType::ChargeOfAnotherPayment => "The charge is another payment's",
            ProblemType::ToldFailed => "The merchant was told this payment failed",
        }
    }
}

/// A problem document. Its extension members (`extensions`: `errores`, `declineCode`,
/// `pago`, …) are written at the top level of the body, beside `type` and `title`; the
/// OpenAPI document names them (`ProblemSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type", default = "about_blank")]
    pub type_uri: String,
    #[serde(default)]
    pub title: String,
    // Always set by pagos; a body from elsewhere may lack it (`Problem::read` fills it in
    // from the answer's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
    /// Seconds for the `Retry-After` header that goes with it: never part of the body.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

/// The OpenAPI schema of [`Problem`]: the body as it is on the wire, every extension
/// member pagos sends named as an optional property, so a client generated from the
/// document reads them. Documentation only; the body is written from `Problem`.
#[cfg(feature = "openapi")]
mod schema {
    use crate::payment::Pago;
    use crate::refund::Reembolso;
    use crate::request::FieldError;
    use crate::state::PaymentState;
    use std::borrow::Cow;
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;

    /// An RFC 9457 problem document (`application/problem+json`). Extension members are
    /// top-level members of the body, beside `type`, `title`, `status` and `detail`; those
    /// pagos sends are listed below, each present only on the problems that carry it.
    /// Branch on `type`, never on `title`.
    #[derive(utoipa::ToSchema)]
    #[schema(as = Problem)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct ProblemSchema {
        /// `/problems/<slug>`, stable: `validation-failed`, `payment-declined`,
        /// `refund-refused`, `overloaded`, … (`about:blank` only from a proxy).
        #[serde(rename = "type")]
        #[schema(example = "/problems/validation-failed")]
        type_uri: String,
        /// For a human; may change.
        title: String,
        /// The answer's HTTP status.
        #[schema(minimum = 100, maximum = 599)]
        status: u16,
        /// What happened and what to do, for a human.
        #[schema(required = false)]
        detail: String,
        /// 422 `validation-failed`: every field (or query parameter) at fault, each once.
        #[schema(required = false)]
        errores: Vec<FieldError>,
        /// 402 `payment-declined` and `gateway-rejected`: the payment, `FALLIDA`.
        #[schema(required = false)]
        pago: Pago,
        /// 402: why the gateway declined (`insufficient_funds`, `card_declined`, …).
        #[schema(required = false)]
        decline_code: String,
        /// 422 `refund-refused`: the refund, `FALLIDO`.
        #[schema(required = false)]
        reembolso: Reembolso,
        /// 422 `refund-refused`: why the gateway did not refund.
        #[schema(required = false)]
        failure_code: String,
        /// 422 `refund-exceeds-remaining`: what is left to refund, in minor units.
        #[schema(required = false, minimum = 0)]
        restante: i64,
        /// 409 `payment-not-refundable` of a refund request: the payment's state.
        #[schema(required = false)]
        estado: PaymentState,
        /// 409 `payment-not-refundable` of a resolution with `reembolsar`: the provider's
        /// charge that cannot be refunded now.
        #[schema(required = false)]
        cargo: String,
        /// 409 `payment-not-refundable` of a resolution with `reembolsar`: the refund of
        /// that charge still in flight or under review, when there is one.
        #[schema(required = false)]
        reembolso_id: uuid::Uuid,
        /// 422 of a webhook endpoint over the most a merchant may have: that most.
        #[schema(required = false, minimum = 1)]
        limite: u32,
        /// 409 `provider-disagrees` of a payment's resolution: the charges the provider
        /// shows for it.
        #[schema(required = false)]
        cargos: Vec<CargoVisto>,
        /// 409 `provider-disagrees` of a refund's resolution: the provider's refunds
        /// found for it.
        #[schema(required = false)]
        reembolsos: Vec<ReembolsoVisto>,
    }

    /// Where a refusal saw a provider's charge or refund: `busqueda` (its search, now) or
    /// `webhook` (its events, which its search does not show yet).
    #[derive(utoipa::ToSchema)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Fuente {
        Busqueda,
        Webhook,
    }

    /// A provider's charge, as a `provider-disagrees` problem lists it.
    #[derive(utoipa::ToSchema)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct CargoVisto {
        id: String,
        /// `succeeded`, `declined` or `pending`.
        status: String,
        amount: i64,
        currency: String,
        #[schema(required = false)]
        decline_code: String,
        #[schema(inline)]
        fuente: Fuente,
    }

    /// A provider's refund, as a `provider-disagrees` problem lists it.
    #[derive(utoipa::ToSchema)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct ReembolsoVisto {
        id: String,
        /// `succeeded`, `failed` or `pending`.
        status: String,
        amount: i64,
        currency: String,
        /// The provider's id of the charge refunded.
        charge: String,
        #[schema(required = false)]
        failure_code: String,
        #[schema(inline)]
        fuente: Fuente,
    }

    impl utoipa::PartialSchema for super::Problem {
        fn schema() -> RefOr<Schema> {
            <ProblemSchema as utoipa::PartialSchema>::schema()
        }
    }

    impl utoipa::ToSchema for super::Problem {
        fn name() -> Cow<'static, str> {
            <ProblemSchema as utoipa::ToSchema>::name()
        }

        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            <ProblemSchema as utoipa::ToSchema>::schemas(schemas);
        }
    }
}

fn about_blank() -> String {
    "about:blank".into()
}

impl Problem {
    pub fn new(kind: ProblemType) -> Self {
        Problem {
            type_uri: format!("/problems/{}", kind.slug()),
            title: kind.title().to_owned(),
            status: Some(kind.status()),
            detail: None,
            extensions: Map::new(),
            retry_after: None,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with(mut self, name: &str, value: impl Serialize) -> Self {
        self.extensions.insert(
            name.to_owned(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The body, as sent.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The last segment of `type`: `idempotency-key-reused` for
    /// `/problems/idempotency-key-reused`.
    pub fn slug(&self) -> &str {
        self.type_uri
            .rsplit('/')
            .next()
            .unwrap_or(self.type_uri.as_str())
    }

    /// The kind of problem, when `type` is one of pagos' own.
    pub fn kind(&self) -> Option<ProblemType> {
        self.type_uri
            .strip_prefix("/problems/")
            .and_then(ProblemType::from_slug)
    }

    /// Reads a problem body answered with `status`; anything else (a proxy's HTML page,
    /// an empty body) becomes an `about:blank` problem titled with the status' reason
    /// phrase.
    pub fn read(status: u16, body: &[u8]) -> Problem {
        match serde_json::from_slice::<Problem>(body) {
            Ok(mut problem) if !problem.title.is_empty() || problem.type_uri != "about:blank" => {
                problem.status.get_or_insert(status);
                problem
            }
            _ => {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                Problem {
                    type_uri: about_blank(),
                    title: reason(status).to_owned(),
                    status: Some(status),
                    detail: (!text.is_empty()).then(|| text.chars().take(200).collect()),
                    extensions: Map::new(),
                    retry_after: None,
                }
            }
        }
    }

    /// `detail`, or `title` when there is none: one line for a human.
    pub fn headline(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{}: {detail}", self.title),
            None => self.title.clone(),
        }
    }
}

/// The status' reason phrase (RFC 9110), from the `http` crate's table.
fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unexpected status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slug_names_its_kind_and_no_two_kinds_share_one() {
        for kind in ProblemType::ALL {
            assert_eq!(ProblemType::from_slug(kind.slug()), Some(kind));
            let problem = Problem::new(kind);
            assert_eq!(problem.kind(), Some(kind));
            assert_eq!(problem.slug(), kind.slug());
            assert_eq!(problem.status, Some(kind.status()));
        }
        assert_eq!(ProblemType::from_slug("no-such-problem"), None);
    }

    #[test]
    fn the_body_is_written_type_title_status_detail_then_extensions() {
        let problem = Problem::new(ProblemType::PaymentDeclined)
            .detail("The gateway declined the payment: insufficient_funds.")
            .with("declineCode", "insufficient_funds")
            .retry_after(3);
        assert_eq!(
            String::from_utf8(problem.to_bytes()).expect("utf-8"),
            r#"{"type":"/problems/payment-declined","title":"Payment declined","status":402,"detail":"The gateway declined the payment: insufficient_funds.","declineCode":"insufficient_funds"}"#
        );
    }

    #[test]
    fn a_body_that_is_not_a_problem_gets_the_reason_phrase_as_title() {
        let p = Problem::read(401, b"<html>denied</html>");
        assert_eq!(p.title, "Unauthorized");
        assert_eq!(p.type_uri, "about:blank");
        assert_eq!(p.detail.as_deref(), Some("<html>denied</html>"));
        assert_eq!(Problem::read(503, b"").title, "Service Unavailable");
    }

    #[test]
    fn a_problem_without_status_gets_the_answers() {
        let p = Problem::read(
            409,
            br#"{"type":"/problems/request-in-flight","title":"Busy"}"#,
        );
        assert_eq!(p.status, Some(409));
        assert_eq!(p.kind(), Some(ProblemType::RequestInFlight));
    }
}
