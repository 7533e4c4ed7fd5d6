//! Extractors and rejections that never answer axum's plain text: a request pagos cannot
//! read gets the contract's problem+json (or, for the console, its own page), like every
//! other refusal. Handlers take these, or axum's own wrapped in a `Result`, never a bare
//! `Path`, `Query`, `Json` or `Bytes`, whose rejections are plain text.
//!
//! Nothing here reads the database or knows a route.

use super::problem::{ApiError, Problem, ProblemType};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::StatusCode;
use axum::http::request::Parts;
use std::convert::Infallible;

/// The `{id}` of a route, as text. A segment that is not UTF-8 once percent-decoded
/// (`/v1/pagos/%FF`) reads as "", which is no id: the handler answers it as any id it does
/// not know (its own 404), where axum's `Path` would answer a plain-text 400.
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Infallible> {
        let id = Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| id)
            .unwrap_or_default();
        Ok(PathId(id))
    }
}

/// The limit of a body read whole as raw bytes (`bytes`) where a room sets no limit of its
/// own: axum's default, 2 MiB, stated here (each such room sets it as its
/// `DefaultBodyLimit`) so the 413 its OpenAPI operations list (`problem::RawBodyTooLarge`)
/// is the limit the router enforces, whatever a later axum's default.
pub const RAW_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// A body read whole: over the route's limit (axum's default where no `DefaultBodyLimit`
/// says otherwise) a 413 problem, a body that could not be read (the client went away)
/// a 400 problem.
pub fn bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(ProblemType::BodyTooLarge)
                .detail("The body is over this endpoint's limit.")
                .into()
        } else {
            Problem::new(ProblemType::MalformedJson)
                .detail("The body could not be read.")
                .into()
        }
    })
}
