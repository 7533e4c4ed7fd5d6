//! The reference-protocol adapter (`PAGOS_GATEWAY=http`): `POST /v1/charges` and
//! `POST /v1/refunds` with the gateway key in `Idempotency-Key`; `GET /v1/charges?reference=`
//! and `GET /v1/refunds?reference=` for lookups.
//!
//! It reads answers through the shared classifier (`classify`), nothing more: 5xx, 409,
//! 429, 401/403, 422 (the key used with another body), timeouts, resets and unreadable
//! bodies are `Unknown` (the charge or refund may exist); other 4xx are `Rejected`, and a
//! refund refused with `{"error":"amount_exceeds_remaining"}` says so. A lookup's answer is
//! a readable list or `Unknown`, never a refusal.

use super::classify::{AmountSaid, KeySaid, refund_refusal};
use super::{
    Charge, ChargeBody, ChargeRequest, Gateway, GatewayError, Refund, RefundBody, RefundLookup,
    RefundRequest,
};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::time::Duration;
use uuid::Uuid;

pub struct HttpGateway {
    api: Api,
}

/// How an HTTP adapter reaches its provider: the client, the API's base URL (no trailing
/// slash) and the secret key its requests are authenticated with.
pub(super) struct Api {
    pub(super) client: reqwest::Client,
    pub(super) base: String,
    pub(super) secret: String,
}

impl Api {
    pub(super) fn new(base: &str, secret: &str, timeout: Duration) -> Result<Api, reqwest::Error> {
        Api::with_headers(base, secret, timeout, reqwest::header::HeaderMap::new())
    }

    /// As `new`, and every request carries `headers` (Stripe's pinned `Stripe-Version`).
    pub(super) fn with_headers(
        base: &str,
        secret: &str,
        timeout: Duration,
        headers: reqwest::header::HeaderMap,
    ) -> Result<Api, reqwest::Error> {
        Ok(Api {
            client: client_builder(timeout).default_headers(headers).build()?,
            base: base.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// `POST {base}{path}`, authenticated.
    pub(super) fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.secret)
    }

    /// `GET {base}{path}`, authenticated.
    pub(super) fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.secret)
    }
}

/// The HTTP client every adapter uses: `timeout` bounds one whole try.
///
/// Redirects are never followed: a followed 301/302/303 turns the POST that may have
/// charged (or refunded) into a GET of another URL, and that GET's answer — a 404 for a
/// path the provider does not serve, say — would be read as the provider's answer to the
/// POST, a refusal that "proves" nothing was made. A 3xx is read as what it is, an answer
/// that says nothing of the charge or refund (`classify::refusal`: unknown), and a
/// look-up answered with one is unknown too.
fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("pagos/", env!("CARGO_PKG_VERSION")))
}

/// The first 300 characters of an answer's body, for an error's detail.
pub(super) async fn detail(resp: reqwest::Response) -> String {
    excerpt(&resp.text().await.unwrap_or_default())
}

/// The first 300 characters of `text`.
pub(super) fn excerpt(text: &str) -> String {
    text.chars().take(300).collect()
}

/// The whole body of a refusal of a charge or refund: what it says may turn the refusal
/// into an unknown outcome (the key used with another request: something exists under
/// it), so a body that breaks off before its end (the connection dropped, a timeout) is
/// an unknown outcome itself, never a refusal read from its first half.
pub(super) async fn refusal_body(resp: reqwest::Response) -> Result<String, GatewayError> {
    let status = resp.status();
    resp.text().await.map_err(|e| {
        GatewayError::Unknown(format!(
            "the {status} answer broke off before its end, so what it said is not known: {e}"
        ))
    })
}

impl HttpGateway {
    pub fn new(base: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(HttpGateway {
            api: Api::new(base, secret, timeout)?,
        })
    }
}

/// `{"data":[…]}`: the reference protocol's lists.
#[derive(Deserialize)]
struct List<T> {
    data: Vec<T>,
}

/// The reference protocol's refusal of a refund over what is left of its charge.
pub const AMOUNT_EXCEEDS_REMAINING: &str = "amount_exceeds_remaining";

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
pub(super) async fn search<T: DeserializeOwned>(
    api: &Api,
    url: url::Url,
    what: &str,
) -> Result<T, GatewayError> {
    ask(api.client.get(url).bearer_auth(&api.secret), what).await
}

/// Sends a read-only `request` (`what` names it in errors): its answer, or `Unknown` for
/// any answer but a readable success.
pub(super) async fn ask<T: DeserializeOwned>(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<T, GatewayError> {
    let resp = request.send().await.map_err(|e| transport(&e))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(GatewayError::Unknown(format!(
            "{what} answered {status}: {}",
            detail(resp).await
        )));
    }
    read(resp, &format!("{what} answer")).await
}

/// `GET {base}{path}`, one object of a provider's (`what` names it in errors): None when
/// the provider has no such object (404); `Unknown` for any other answer but a readable
/// success.
pub(super) async fn fetch_one<T: DeserializeOwned>(
    api: &Api,
    path: &str,
    what: &str,
) -> Result<Option<T>, GatewayError> {
    let resp = api.get(path).send().await.map_err(|e| transport(&e))?;
    let status = resp.status();
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(GatewayError::Unknown(format!(
            "{what} answered {status}: {}",
            detail(resp).await
        )));
    }
    read(resp, what).await.map(Some)
}

/// The body of `resp` as a `T`; `Unknown` when it cannot be read (`what` names it).
pub(super) async fn read<T: DeserializeOwned>(
    resp: reqwest::Response,
    what: &str,
) -> Result<T, GatewayError> {
    let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::Unknown(format!("unreadable {what}: {e}")))
}

/// The answer to `POST /v1/charges` or `POST /v1/refunds`: what was made, or what the
/// shared classifier makes of the refusal. In the reference protocol a 422 means "this key
/// was used with another body": something exists under the key. Only a refund can be over
/// what is left of its charge, but the error is read the same way for both.
async fn created<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, GatewayError> {
    let status = resp.status();
    if status.is_success() {
        // A success whose body cannot be read may still be a charge: unknown, not failed.
        return read(resp, &format!("{status} answer")).await;
    }
    let said = if status == StatusCode::UNPROCESSABLE_ENTITY {
        KeySaid::UsedWithAnotherRequest
    } else {
        KeySaid::Nothing
    };
    let text = refusal_body(resp).await?;
    Err(refund_refusal(
        "the gateway",
        status,
        said,
        amount_said(&text),
        &excerpt(&text),
    ))
}

/// Whether an error body is `{"error":"amount_exceeds_remaining"}`.
pub(super) fn amount_said(body: &str) -> AmountSaid {
    let said = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(|e| e == AMOUNT_EXCEEDS_REMAINING));
    if said == Some(true) {
        AmountSaid::ExceedsRemaining
    } else {
        AmountSaid::Nothing
    }
}

impl HttpGateway {
    /// `{base}/v1/{what}?reference=…`
    fn by_reference(&self, what: &str, reference: Uuid) -> Result<url::Url, GatewayError> {
        let mut url = url::Url::parse(&format!("{}/v1/{what}", self.api.base))
            .map_err(|e| GatewayError::Unknown(format!("bad gateway URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("reference", &reference.to_string());
        Ok(url)
    }
}

#[async_trait]
impl Gateway for HttpGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let resp = self
            .api
            .post("/v1/charges")
            .header("Idempotency-Key", &req.gateway_key)
            .json(&ChargeBody::from(req))
            .send()
            .await
            .map_err(|e| transport(&e))?;
        created(resp).await
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let url = self.by_reference("charges", reference)?;
        let found: List<Charge> = search(&self.api, url, "gateway lookup").await?;
        // The reference is the payment's; a gateway answering another's (a filter it
        // ignored, a proxy's cache) is not believed: settling on it would tell the merchant
        // of a charge that is not theirs.
        Ok(found
            .data
            .into_iter()
            .filter(|c| c.is_for(reference))
            .collect())
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        let resp = self
            .api
            .post("/v1/refunds")
            .header("Idempotency-Key", &req.gateway_key)
            .json(&RefundBody::from(req))
            .send()
            .await
            .map_err(|e| transport(&e))?;
        created(resp).await
    }

    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        let url = self.by_reference("refunds", refund.reference)?;
        let found: List<Refund> = search(&self.api, url, "gateway refund lookup").await?;
        // The reference is the refund's, in whatever spelling of the UUID the gateway
        // writes it (as for charges); a gateway answering another's is not believed.
        Ok(found
            .data
            .into_iter()
            .filter(|r| r.is_for(refund.reference))
            .collect())
    }
}
