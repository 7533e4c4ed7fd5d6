//! RFC 9457 problem+json: the one place where errors become HTTP answers.
//!
//! Each kind of error has a stable `type` URI; clients branch on it, never on `title`.
//! Unexpected errors are logged once here and become a 500 that leaks nothing.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The kinds of problem pagos answers with. `type` is `/problems/<slug>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Unauthorized,
    TooManyAuthFailures,
    NotFound,
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
    Internal,
}

impl Kind {
    pub fn slug(self) -> &'static str {
        match self {
            Kind::Unauthorized => "unauthorized",
            Kind::TooManyAuthFailures => "too-many-failed-authentications",
            Kind::NotFound => "not-found",
            Kind::MissingKey => "idempotency-key-missing",
            Kind::MalformedKey => "idempotency-key-malformed",
            Kind::MalformedJson => "malformed-json",
            Kind::Validation => "validation-failed",
            Kind::BodyTooLarge => "body-too-large",
            Kind::UnsupportedMediaType => "unsupported-media-type",
            Kind::KeyReused => "idempotency-key-reused",
            Kind::RequestInFlight => "request-in-flight",
            Kind::NotUnderReview => "not-under-review",
            Kind::PaymentDeclined => "payment-declined",
            Kind::GatewayRejected => "gateway-rejected",
            Kind::Unavailable => "service-unavailable",
            Kind::Overloaded => "overloaded",
            Kind::RequestTimeout => "request-timeout",
            Kind::Internal => "internal-error",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::TooManyAuthFailures => StatusCode::TOO_MANY_REQUESTS,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::MissingKey | Kind::MalformedKey | Kind::MalformedJson => StatusCode::BAD_REQUEST,
            Kind::Validation | Kind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::RequestInFlight | Kind::NotUnderReview => StatusCode::CONFLICT,
            Kind::PaymentDeclined | Kind::GatewayRejected => StatusCode::PAYMENT_REQUIRED,
            Kind::Unavailable | Kind::Overloaded | Kind::RequestTimeout => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Unauthorized => "Missing or invalid credentials",
            Kind::TooManyAuthFailures => "Too many failed authentications from this address",
            Kind::NotFound => "Not found",
            Kind::MissingKey => "Idempotency-Key header missing",
            Kind::MalformedKey => "Idempotency-Key header malformed",
            Kind::MalformedJson => "Body is not valid JSON",
            Kind::Validation => "Request failed validation",
            Kind::BodyTooLarge => "Body too large",
            Kind::UnsupportedMediaType => "Content type must be application/json",
            Kind::KeyReused => "Idempotency-Key already used with another request",
            Kind::RequestInFlight => "A request with this Idempotency-Key is in progress",
            Kind::NotUnderReview => "The payment is not under manual review",
            Kind::PaymentDeclined => "Payment declined",
            Kind::GatewayRejected => "Payment refused by the gateway",
            Kind::Unavailable => "Service temporarily unavailable",
            Kind::Overloaded => "Too many requests in progress",
            Kind::RequestTimeout => "The request took too long",
            Kind::Internal => "Internal error",
        }
    }
}

/// A problem document. Extension members go in `extensions`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: String,
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extensions: Map<String, Value>,
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(kind: Kind) -> Self {
        Problem {
            type_uri: format!("/problems/{}", kind.slug()),
            title: kind.title().to_owned(),
            status: kind.status().as_u16(),
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

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_bytes()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A handler's error: a problem to show, or a failure to log and hide.
#[derive(Debug)]
pub enum ApiError {
    Problem(Box<Problem>),
    Internal(anyhow::Error),
}

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> Self {
        ApiError::Problem(Box::new(problem))
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(err: sea_orm::DbErr) -> Self {
        ApiError::Internal(err.into())
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(err: anyhow::Error) -> Self {
        ApiError::Internal(err)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Problem(problem) => problem.into_response(),
            ApiError::Internal(err) => {
                tracing::error!(error = format!("{err:#}"), "request failed");
                Problem::new(Kind::Unavailable)
                    .detail("The request could not be completed. Retry it with the same Idempotency-Key.")
                    .retry_after(1)
                    .into_response()
            }
        }
    }
}
