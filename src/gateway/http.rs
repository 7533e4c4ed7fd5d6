//! The reference-protocol adapter (`PAGOS_GATEWAY=http`): `POST /v1/charges` with the
//! gateway key in `Idempotency-Key`, `GET /v1/charges?reference=` for lookups.
//!
//! It reads answers through the shared classifier (`classify`), nothing more: 5xx, 409,
//! 429, 401/403, 422 (the key used with another body), timeouts, resets and unreadable
//! bodies are `Unknown` (the charge may exist); other 4xx are `Rejected`. A lookup's
//! answer is a readable list or `Unknown`, never a refusal.

use super::classify::{KeySaid, refusal};
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

/// The answer to `POST /v1/charges`: a charge, or what the shared classifier makes of the
/// refusal. In the reference protocol a 422 on a charge means "this key was used with
/// another body": a charge exists under the key.
async fn charge_answer(resp: reqwest::Response) -> Result<Charge, GatewayError> {
    let status = resp.status();
    if status.is_success() {
        // A success whose body cannot be read may still be a charge: unknown, not failed.
        let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
        return serde_json::from_slice(&bytes)
            .map_err(|e| GatewayError::Unknown(format!("unreadable {status} answer: {e}")));
    }
    let said = if status == StatusCode::UNPROCESSABLE_ENTITY {
        KeySaid::UsedWithAnotherRequest
    } else {
        KeySaid::Nothing
    };
    Err(refusal("the gateway", status, said, &detail(resp).await))
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
        charge_answer(resp).await
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let mut url = url::Url::parse(&format!("{}/v1/charges", self.base))
            .map_err(|e| GatewayError::Unknown(format!("bad gateway URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("reference", &reference.to_string());
        let found: ChargeList = search(&self.client, url, &self.secret, "gateway lookup").await?;
        Ok(found.data)
    }
}
