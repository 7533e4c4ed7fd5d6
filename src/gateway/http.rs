//! The reference-protocol adapter (`PAGOS_GATEWAY=http`): `POST /v1/charges` with the
//! gateway key in `Idempotency-Key`, `GET /v1/charges?reference=` for lookups.
//!
//! It classifies answers, nothing more: 5xx, 409, 429, timeouts, resets and unreadable
//! bodies are `Unknown` (the charge may exist); other 4xx are `Rejected`.

use super::{Charge, ChargeBody, ChargeRequest, Gateway, GatewayError};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use std::time::Duration;
use uuid::Uuid;

pub struct HttpGateway {
    client: reqwest::Client,
    base: String,
    secret: String,
}

/// The HTTP client every adapter uses: `timeout` bounds one whole try.
pub(super) fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(concat!("pagos/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The first 300 characters of an answer's body, for an error's detail.
pub(super) async fn detail(resp: reqwest::Response) -> String {
    let text = resp.text().await.unwrap_or_default();
    text.chars().take(300).collect()
}

/// Statuses after which the request may or may not have been applied.
pub(super) fn outcome_unknown(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

impl HttpGateway {
    pub fn new(base: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = client(timeout)?;
        Ok(HttpGateway {
            client,
            base: base.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
        })
    }
}

#[derive(Deserialize)]
struct ChargeList {
    data: Vec<Charge>,
}

/// A request that got no answer: the outcome is unknown.
pub(super) fn transport(err: &reqwest::Error) -> GatewayError {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "connection failed"
    };
    GatewayError::Unknown(format!("{kind}: {err}"))
}

/// A provider's search for the charges of one payment (`what` names it in errors). Any
/// answer but a readable success says nothing about the charge: `Unknown`, never
/// `Rejected`, so the reconciler looks again later.
pub(super) async fn search<T: for<'de> Deserialize<'de>>(
    client: &reqwest::Client,
    url: url::Url,
    secret: &str,
    what: &str,
) -> Result<T, GatewayError> {
    let resp = client
        .get(url)
        .bearer_auth(secret)
        .send()
        .await
        .map_err(|e| transport(&e))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(GatewayError::Unknown(format!(
            "{what} answered {status}: {}",
            detail(resp).await
        )));
    }
    let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::Unknown(format!("unreadable {what} answer: {e}")))
}

async fn classify<T: for<'de> Deserialize<'de>>(
    resp: reqwest::Response,
) -> Result<T, GatewayError> {
    let status = resp.status();
    if status.is_success() {
        // A success whose body cannot be read may still be a charge: unknown, not failed.
        let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
        return serde_json::from_slice(&bytes)
            .map_err(|e| GatewayError::Unknown(format!("unreadable {status} answer: {e}")));
    }
    let detail = detail(resp).await;
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // Our credentials, not the payment, are wrong: nothing was charged, but failing
        // every payment during a credentials incident would be worse than waiting. The
        // reconciler sends them once PAGOS_GATEWAY_SECRET is fixed.
        return Err(GatewayError::Unknown(format!(
            "gateway refused our credentials ({status}): check PAGOS_GATEWAY_SECRET"
        )));
    }
    if outcome_unknown(status) {
        Err(GatewayError::Unknown(format!(
            "gateway answered {status}: {detail}"
        )))
    } else {
        Err(GatewayError::Rejected {
            status: status.as_u16(),
            detail,
        })
    }
}

#[async_trait]
impl Gateway for HttpGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let resp = self
            .client
            .post(format!("{}/v1/charges", self.base))
            .bearer_auth(&self.secret)
            .header("Idempotency-Key", &req.gateway_key)
            .json(&ChargeBody::from(req))
            .send()
            .await
            .map_err(|e| transport(&e))?;
        classify(resp).await
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let resp = self
            .client
            .get(format!("{}/v1/charges?reference={reference}", self.base))
            .bearer_auth(&self.secret)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        classify::<ChargeList>(resp).await.map(|list| list.data)
    }
}
