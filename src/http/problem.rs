//! RFC 9457 problem+json: the one place where errors become HTTP answers.
//!
//! Each kind of error has a stable `type` URI (`pagos_types::ProblemType`, shared with the
//! client); clients branch on it, never on `title`.
//! Unexpected errors are logged once here and become a 500 that leaks nothing.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub use pagos_types::problem::{PROBLEM_JSON, Problem, ProblemType};

/// Problems become answers here: the body as `serde_json` writes it, the problem+json
/// content type, and `Retry-After` when the problem carries one. (An extension trait:
/// `Problem` is a wire type of its own crate, shared with the client.)
pub trait ProblemResponse {
    fn into_response(self) -> Response;
}

impl ProblemResponse for Problem {
    fn into_response(self) -> Response {
        let status = self
            .status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_bytes()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The 413 of an endpoint that reads a JSON body under `DefaultBodyLimit` of 64 KiB
/// (`payments::MAX_BODY`, `webhooks::MAX_EVENT_BODY`: payments, refunds, provider
/// webhooks), as its OpenAPI operation documents it (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 413,
    description = "Body over 64 KiB",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct BodyTooLarge(Problem);

/// The 408 of a body read before anyone is known (a webhook) not received within
/// `PAGOS_HEADER_TIMEOUT` (`http::unauthenticated`): nothing read or stored.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 408,
    description = "The body was not received within PAGOS_HEADER_TIMEOUT (`/problems/body-timeout`): nothing was read or stored; send it again, whole",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct BodyTimeout(Problem);

/// The 413 of an endpoint that reads its body whole as raw bytes under
/// `extract::RAW_BODY_LIMIT` (2 MiB: webhook endpoints, their reactivation, on-call's
/// reconciliation and resolution), as its OpenAPI operation documents it (documentation
/// only: `extract::bytes` answers it).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 413,
    description = "Body over 2 MiB",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct RawBodyTooLarge(Problem);

/// The 400 of an endpoint that reads its JSON body with `extract::json_object`, for a
/// body that is not JSON at all (JSON of another shape is a 422 listing the fields;
/// documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 400,
    description = "Body is not JSON",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct MalformedBody(Problem);

/// The 415 of an endpoint that reads a JSON body (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 415,
    description = "Content type is not JSON",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct NotJson(Problem);

/// The 503 of a create under an `Idempotency-Key` (documentation only). Every 503 of
/// such a route carries `Retry-After` (`http::declare_limits` adds the doors' own).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 503,
    description = "Temporarily unavailable (`service-unavailable`); retry with the same key after Retry-After",
    content_type = "application/problem+json",
    headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))
)]
#[allow(dead_code)]
pub struct RetryWithSameKey(Problem);

/// The 405 of a path asked with a method it does not serve (`method-not-allowed`, with
/// `Allow`), which any path may answer: declared once, among the document's reusable
/// responses, rather than on operations (an operation is a method a path serves).
/// Documentation only: the doors' `method_not_allowed_fallback` answers it.
#[derive(utoipa::ToResponse)]
#[response(
    description = "This path does not take this method (`method-not-allowed`); `Allow` lists those it takes. Any path of this document answers it for a method it does not list",
    content_type = "application/problem+json",
    headers(("Allow" = String, description = "The methods this path takes"))
)]
#[allow(dead_code)]
pub struct MethodNotAllowed(Problem);

/// The 404 of a merchant's endpoint about one of its payments (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 404,
    description = "No such payment for this merchant",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct NoSuchPayment(Problem);

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
                Problem::new(ProblemType::Unavailable)
                    .detail("The request could not be completed. Retry it with the same Idempotency-Key.")
                    .retry_after(1)
                    .into_response()
            }
        }
    }
}
