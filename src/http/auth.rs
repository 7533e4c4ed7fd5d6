//! Who is calling: merchants by API key (only its SHA-256 is stored), on-call by the admin
//! token (compared in constant time). Never logs a key or a token.
//!
//! Two memories keep this cheap and hard to abuse:
//! - what a process learnt about a key (which merchant, revoked, unknown) is kept for
//!   `KEY_CACHE_TTL`, so repeated requests with one key, known or not, reach the database
//!   once per that period, and a key revoked or expiring anywhere is refused by every
//!   process within 5 seconds;
//! - failed authentications per client address: past `PAGOS_AUTH_FAILURES_PER_MINUTE`, the
//!   address gets 429 with `Retry-After` before any key is looked up.

use super::AppState;
use super::problem::{ApiError, Problem, ProblemType};
pub use crate::merchants::key::hash_api_key;
use crate::merchants::store::{self, Credential};
use crate::operators::{self, Role};
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sea_orm::DatabaseConnection;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// How long a process trusts what it learnt about a key, counted from when the look-up
/// began (`FromTheLookUp`). A key revoked, expired or added in the database is seen by
/// every process within this, inside the contract's 5 seconds, however long the look-up
/// that learnt it took.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(4);
/// Keys remembered at once; past it the least used are forgotten (and looked up again).
const KEY_CACHE_CAPACITY: u64 = 100_000;
/// Addresses remembered as over the limit at once.
const BLOCKED_CAPACITY: u64 = 100_000;
/// How often the failure counters of quiet addresses are dropped.
const FORGET_QUIET_EVERY: Duration = Duration::from_secs(60);

/// What a process learnt about a key, and when the look-up that learnt it began.
#[derive(Clone, Debug)]
struct Learnt {
    credential: Credential,
    asked_at: Instant,
}

/// A key cache entry lives `KEY_CACHE_TTL` from when its look-up began, not from when it
/// ended: a look-up held up (its write of the key's last use waiting on a lock, say) while
/// the key was revoked would otherwise keep the key working for that long past the TTL.
struct FromTheLookUp;

impl moka::Expiry<String, Learnt> for FromTheLookUp {
    fn expire_after_create(
        &self,
        _hash: &String,
        learnt: &Learnt,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(KEY_CACHE_TTL.saturating_sub(created_at.saturating_duration_since(learnt.asked_at)))
    }
}

/// Authentication's shared state: the key cache and the failure limiter.
pub struct Authenticator {
    keys: moka::future::Cache<String, Learnt>,
    failures: DefaultKeyedRateLimiter<IpAddr>,
    /// Addresses over the limit, with when they may try again: checked before any look-up.
    blocked: moka::future::Cache<IpAddr, Instant>,
    /// One turn per address for credentials not known from the cache: see `turn`.
    turns: moka::future::Cache<IpAddr, Arc<tokio::sync::Mutex<()>>>,
    last_forgot: Mutex<Instant>,
}

/// An address's turn to have a credential checked (`Authenticator::turn`): held until its
/// failure, if it fails, is counted.
pub struct Turn {
    _held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// How long an address over the limit of failed authentications is refused: the minute
/// its whole allowance takes to come back.
const BLOCKED_FOR: Duration = Duration::from_secs(60);

impl Authenticator {
    /// `failures_per_minute`: failed authentications one address may make in a minute
    /// (that many at once; past them, refused for a minute).
    pub fn new(failures_per_minute: u32) -> Authenticator {
        let per_minute = NonZeroU32::new(failures_per_minute).unwrap_or(NonZeroU32::MIN);
        Authenticator {
            keys: moka::future::Cache::builder()
                .max_capacity(KEY_CACHE_CAPACITY)
                .time_to_live(KEY_CACHE_TTL)
                .expire_after(FromTheLookUp)
                .build(),
            failures: RateLimiter::keyed(Quota::per_minute(per_minute)),
            blocked: moka::future::Cache::builder()
                .max_capacity(BLOCKED_CAPACITY)
                .time_to_live(Duration::from_secs(60))
                .build(),
            turns: moka::future::Cache::builder()
                .max_capacity(BLOCKED_CAPACITY)
                .time_to_idle(Duration::from_secs(60))
                .build(),
            last_forgot: Mutex::new(Instant::now()),
        }
    }

    /// Whether the API key whose hash is `hash` is known from the cache (valid, revoked
    /// or unknown): checking it reaches no database and cannot be a new guess.
    fn knows_key(&self, hash: &Option<String>) -> bool {
        hash.as_ref()
            .is_some_and(|hash| self.keys.contains_key(hash))
    }

    /// `client`'s turn to have a credential checked, then 429 if it is blocked by now.
    ///
    /// The limit counts failures once they are known; without turns, every request of a
    /// burst in flight when an address was blocked had its credential checked already,
    /// so a client sending as many guesses at once as the server takes got that many
    /// per allowance instead of one. With turns, the credentials of one address that the
    /// cache does not know (every guess) are checked one at a time, each after the
    /// failure before it was counted.
    pub async fn turn(&self, client: Option<IpAddr>) -> Result<Turn, ApiError> {
        let Some(address) = client else {
            return Ok(Turn { _held: None });
        };
        let lock = self
            .turns
            .get_with(address, async { Arc::new(tokio::sync::Mutex::new(())) })
            .await;
        let turn = Turn {
            _held: Some(lock.lock_owned().await),
        };
        self.refuse_if_blocked(client).await?;
        Ok(turn)
    }

    /// What is known about the key whose hash is `hash`: from the cache, or from one
    /// look-up shared by every request that asks meanwhile.
    async fn credential(
        &self,
        db: &DatabaseConnection,
        hash: String,
    ) -> Result<Credential, ApiError> {
        if let Some(known) = self.keys.get(&hash).await {
            return Ok(known.credential);
        }
        // Boxed: the database's future is large, and inline it would make every
        // request's future larger, cached key or not.
        let lookup = async {
            let asked_at = Instant::now();
            let credential = store::lookup(db, &hash).await?;
            Ok::<_, sea_orm::DbErr>(Learnt {
                credential,
                asked_at,
            })
        };
        Box::pin(self.keys.try_get_with(hash.clone(), lookup))
            .await
            .map(|learnt| learnt.credential)
            .map_err(|err| ApiError::Internal(anyhow::anyhow!("looking up an API key: {err}")))
    }

    /// 429 when `client` is over the limit of failed authentications.
    async fn refuse_if_blocked(&self, client: Option<IpAddr>) -> Result<(), ApiError> {
        let Some(client) = client else {
            return Ok(());
        };
        match self.blocked.get(&client).await {
            Some(until) if until > Instant::now() => Err(too_many_failures(
                until.saturating_duration_since(Instant::now()),
            )),
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication of `client`: the 401 to answer, or a 429 when this
    /// failure is one too many.
    async fn failed(&self, client: Option<IpAddr>, refusal: Refusal) -> ApiError {
        let Some(client) = client else {
            return unauthorized(refusal);
        };
        self.forget_quiet_addresses();
        match self.failures.check_key(&client) {
            Ok(()) => unauthorized(refusal),
            Err(_) => {
                // Blocked until its allowance is whole again, a minute: unblocked at the
                // next single allowance (a second, at 60 a minute), an address got about
                // twice the limit's guesses checked in its first minute, and one more
                // every second after it.
                let wait = BLOCKED_FOR;
                self.blocked.insert(client, Instant::now() + wait).await;
                tracing::warn!(%client, "too many failed authentications: refused with 429");
                too_many_failures(wait)
            }
        }
    }

    /// Counts the failed authentication `refusal` of `client` (`failed`): its 401, with
    /// the `WWW-Authenticate` challenge of `realm` (RFC 9110 §15.5.2: every 401 has one),
    /// or the 429.
    async fn refuse(&self, client: Option<IpAddr>, realm: Realm, refusal: Refusal) -> Response {
        let mut response = self.failed(client, refusal).await.into_response();
        if response.status() == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, refusal.challenge(realm));
        }
        response
    }

    /// Drops the counters of addresses that have been quiet long enough to be back at a
    /// full allowance, so an attack from many addresses does not grow memory for good.
    fn forget_quiet_addresses(&self) {
        if let Ok(mut last) = self.last_forgot.try_lock()
            && last.elapsed() >= FORGET_QUIET_EVERY
        {
            *last = Instant::now();
            self.failures.retain_recent();
            self.failures.shrink_to_fit();
        }
    }
}

/// The address failures are counted by: the peer's IP (an IPv6 client by its /64, which
/// one host usually holds whole). Requests through a proxy all share the proxy's address.
fn client_address(parts: &Parts) -> Option<IpAddr> {
    let ConnectInfo(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>()?;
    Some(match peer.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
        v4 => v4,
    })
}

fn too_many_failures(wait: Duration) -> ApiError {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    Problem::new(ProblemType::TooManyAuthFailures)
        .detail(
            "Too many requests from this address failed to authenticate. Wait for Retry-After, \
             then send valid credentials.",
        )
        .retry_after(seconds.max(1))
        .into()
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case; blanks around
/// the token ignored), read as a typed header.
fn bearer(headers: &HeaderMap) -> Option<String> {
    use headers::HeaderMapExt;
    use headers::authorization::{Authorization, Bearer};
    let header = headers.typed_get::<Authorization<Bearer>>()?;
    Some(header.token().trim().to_owned())
}

/// The protection space of a 401's challenge: merchants' API keys or on-call's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Realm {
    /// The merchant API (`/v1/…`): API keys.
    Merchants,
    /// The admin API (`/admin/…`): the admin token or an operator's.
    Admin,
}

impl Realm {
    fn name(self) -> &'static str {
        match self {
            Realm::Merchants => "pagos",
            Realm::Admin => "pagos-admin",
        }
    }
}

/// Why a request's credentials were refused: the 401's detail, and the error code
/// (RFC 6750 §3.1) of its `WWW-Authenticate: Bearer` challenge. A request that sent no
/// bearer token gets a challenge without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Refusal {
    detail: &'static str,
    error: Option<&'static str>,
}

impl Refusal {
    /// No `Authorization: Bearer` (or an empty token): a challenge without error code.
    const fn missing(detail: &'static str) -> Refusal {
        Refusal {
            detail,
            error: None,
        }
    }

    /// A token that is unknown, revoked or expired.
    const fn invalid(detail: &'static str) -> Refusal {
        Refusal {
            detail,
            error: Some("invalid_token"),
        }
    }

    /// The `WWW-Authenticate` challenge of this refusal in `realm` (RFC 6750 §3):
    /// `Bearer realm="pagos"`, with `error="…"` when a token was sent.
    fn challenge(self, realm: Realm) -> HeaderValue {
        let mut challenge = format!("Bearer realm=\"{}\"", realm.name());
        if let Some(error) = self.error {
            challenge.push_str(&format!(", error=\"{error}\""));
        }
        HeaderValue::try_from(challenge).unwrap_or(HeaderValue::from_static("Bearer"))
    }
}

/// A request with more than one `Authorization` header: which one is meant cannot be
/// told, so none is checked.
const MORE_THAN_ONE_AUTHORIZATION: Refusal = Refusal {
    detail: "This request has more than one `Authorization` header. Send exactly one: \
             `Authorization: Bearer <token>`.",
    error: Some("invalid_request"),
};

/// The 401 problem of `refusal` (`Authenticator::refuse` adds its challenge).
fn unauthorized(refusal: Refusal) -> ApiError {
    Problem::new(ProblemType::Unauthorized)
        .detail(refusal.detail)
        .into()
}

/// The token of the request's one `Authorization: Bearer` header (None: no bearer
/// token); refused when there is more than one `Authorization` header, whatever they
/// hold, before any is read.
fn one_bearer(headers: &HeaderMap) -> Result<Option<String>, Refusal> {
    if headers.get_all(AUTHORIZATION).iter().nth(1).is_some() {
        return Err(MORE_THAN_ONE_AUTHORIZATION);
    }
    Ok(bearer(headers))
}

/// What a bearer token proves: who sent the request, or why its authentication failed.
type Identified<T> = Result<T, Refusal>;

/// `FromRequestParts` for who a bearer token proves a request is from, as `$identify`
/// reads the credential `$read` makes of the token (None: no `Authorization: Bearer`):
/// 429 first when the client's address failed too often; a failed authentication is
/// counted against the address, and its 401 challenges for `$realm`. A credential `$known`
/// does not say is cached is checked in the address's turn (`Authenticator::turn`).
macro_rules! from_bearer {
    ($who:ty, $realm:expr, $read:expr, $identify:ident, $known:expr) => {
        impl FromRequestParts<AppState> for $who {
            type Rejection = Response;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &AppState,
            ) -> Result<Self, Self::Rejection> {
                let auth = &state.auth;
                let client = client_address(parts);
                auth.refuse_if_blocked(client)
                    .await
                    .map_err(IntoResponse::into_response)?;
                let token = match one_bearer(&parts.headers) {
                    Ok(token) => token,
                    Err(refusal) => return Err(auth.refuse(client, $realm, refusal).await),
                };
                let credential = $read(token);
                let _turn = if $known(auth, &credential) {
                    Turn { _held: None }
                } else {
                    auth.turn(client)
                        .await
                        .map_err(IntoResponse::into_response)?
                };
                match $identify(state, credential)
                    .await
                    .map_err(IntoResponse::into_response)?
                {
                    Ok(who) => Ok(who),
                    Err(refusal) => Err(auth.refuse(client, $realm, refusal).await),
                }
            }
        }
    };
}

/// The authenticated merchant of a request.
#[derive(Clone, Copy, Debug)]
pub struct Merchant(pub Uuid);

from_bearer!(
    Merchant,
    Realm::Merchants,
    api_key_hash,
    merchant_of,
    Authenticator::knows_key
);

/// The hash of the API key `token` (None: no key), computed once per request: the cache
/// and the database know a key by it.
fn api_key_hash(token: Option<String>) -> Option<String> {
    token.filter(|t| !t.is_empty()).map(|t| hash_api_key(&t))
}

/// The merchant whose API key has the hash `hash`.
async fn merchant_of(
    state: &AppState,
    hash: Option<String>,
) -> Result<Identified<Merchant>, ApiError> {
    let Some(hash) = hash else {
        return Ok(Err(Refusal::missing(
            "Send your API key as `Authorization: Bearer <key>`.",
        )));
    };
    let auth = &state.auth;
    let detail = match auth.credential(&state.db, hash).await? {
        Credential::Known {
            merchant,
            expires_at,
        } => {
            if expires_at.is_none_or(|at| at > chrono::Utc::now()) {
                return Ok(Ok(Merchant(merchant)));
            }
            "This API key has expired. Use another key of this merchant."
        }
        Credential::Revoked => "This API key was revoked. Use another key of this merchant.",
        Credential::Unknown => "Unknown API key.",
    };
    Ok(Err(Refusal::invalid(detail)))
}

/// The 401 of an on-call endpoint, as its OpenAPI operation documents it (documentation
/// only: the extractor answers it).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "Missing or wrong admin token, or more than one `Authorization` header",
    content_type = "application/problem+json",
    headers(
        ("WWW-Authenticate" = String, description = "`Bearer realm=\"pagos-admin\"`, with `error=\"invalid_token\"` for a token sent but refused")
    )
)]
#[allow(dead_code)]
pub struct AdminTokenRefused(Problem);

/// The 403 of an on-call endpoint that writes, for an operator who may only read
/// (documentation only: `Admin::may_act` answers it).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 403,
    description = "The operator's role (lector) may only read",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct ReadOnlyRole(Problem);

/// The 404 of an on-call endpoint about a payment (documentation only).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 404,
    description = "No such payment",
    content_type = "application/problem+json"
)]
#[allow(dead_code)]
pub struct PaymentNotFound(Problem);

/// The 401 of a merchant's endpoint, as its OpenAPI operation documents it (documentation
/// only: the `Merchant` extractor answers it).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "Missing, unknown, expired or revoked API key, or more than one `Authorization` header",
    content_type = "application/problem+json",
    headers(
        ("WWW-Authenticate" = String, description = "`Bearer realm=\"pagos\"`, with `error=\"invalid_token\"` for a key sent but refused")
    )
)]
#[allow(dead_code)]
pub struct ApiKeyRefused(Problem);

/// The 429 of every endpoint that takes an API key or an admin token, as its OpenAPI
/// operation documents it (documentation only: the `Merchant` and `Admin` extractors
/// answer it, before any credential is looked up).
#[derive(utoipa::IntoResponses)]
#[response(
    status = 429,
    description = "Too many failed authentications from this address (`too-many-failed-authentications`: more than `PAGOS_AUTH_FAILURES_PER_MINUTE` a minute); every request from it is refused, valid credentials or not, until Retry-After has passed. Nothing was done",
    content_type = "application/problem+json",
    headers(
        ("Retry-After" = u64, description = "Seconds until requests from this address are looked at again")
    )
)]
#[allow(dead_code)]
pub struct TooManyFailedAuthentications(Problem);

/// An on-call request: the break-glass admin token (`PAGOS_ADMIN_TOKEN`, recorded as
/// `admin`) or an operator's token (`op_…`, recorded by the operator's name).
#[derive(Clone, Debug)]
pub struct Admin {
    /// What the audit trail records: the operator's name, or `admin`.
    pub name: String,
    pub role: Role,
    /// The operator's id; None for the break-glass admin token.
    pub operator: Option<Uuid>,
}

impl Admin {
    fn break_glass() -> Admin {
        Admin {
            name: crate::operators::BREAK_GLASS.to_owned(),
            role: Role::Operador,
            operator: None,
        }
    }

    /// 403 for a role that may only read.
    pub fn may_act(&self) -> Result<(), ApiError> {
        if self.role.may_act() {
            Ok(())
        } else {
            Err(Problem::new(ProblemType::Forbidden)
                .detail(format!(
                    "Operator {:?} has the role lector, which may only read. Ask for an operador.",
                    self.name
                ))
                .into())
        }
    }
}

/// Who a token is: the admin token (compared in constant time) or an active operator's.
pub async fn who_is(state: &AppState, given: &str) -> Result<Option<Admin>, ApiError> {
    use secrecy::ExposeSecret;
    if given.is_empty() {
        return Ok(None);
    }
    if let Some(expected) = state
        .settings
        .admin_token
        .as_ref()
        .map(ExposeSecret::expose_secret)
        .filter(|t| !t.is_empty())
    {
        // Compare hashes so the comparison's length is fixed too.
        let matches: bool = Sha256::digest(given.as_bytes())
            .ct_eq(&Sha256::digest(expected.as_bytes()))
            .into();
        if matches {
            return Ok(Some(Admin::break_glass()));
        }
    }
    if !given.starts_with(crate::operators::TOKEN_SCHEME) {
        return Ok(None);
    }
    let found = operators::store::active_by_token(&state.db, &operators::hash_token(given)).await?;
    Ok(found.map(|op| Admin {
        name: op.name,
        role: op.role,
        operator: Some(op.id),
    }))
}

// On-call's credentials are not cached: every check takes the address's turn (on-call
// sends few requests).
from_bearer!(
    Admin,
    Realm::Admin,
    std::convert::identity,
    admin_of,
    |_: &Authenticator, _: &Option<String>| false
);

/// On-call as `token` (the admin token or an operator's) proves it.
async fn admin_of(state: &AppState, token: Option<String>) -> Result<Identified<Admin>, ApiError> {
    const HOW: &str =
        "Send the admin token or an operator's token as `Authorization: Bearer <token>`.";
    let given = token.unwrap_or_default();
    let refusal = if given.is_empty() {
        Refusal::missing(HOW)
    } else {
        Refusal::invalid(HOW)
    };
    Ok(who_is(state, &given).await?.ok_or(refusal))
}

impl Authenticator {
    /// For the console's login: counts a failed attempt (the 401 or 429 to show).
    pub async fn count_failure(&self, client: Option<IpAddr>) -> ApiError {
        self.failed(client, Refusal::invalid("Unknown or revoked token."))
            .await
    }
}

/// The address failed authentications are counted by, for rooms with their own login.
pub fn client_of(parts: &Parts) -> Option<IpAddr> {
    client_address(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_from(peer: &str) -> Parts {
        let mut request = axum::http::Request::new(());
        request
            .extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().expect("address")));
        request.into_parts().0
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        let a = client_address(&parts_from("[2001:db8:1:2:aaaa::1]:5000"));
        let b = client_address(&parts_from("[2001:db8:1:2:bbbb::9]:6000"));
        let other = client_address(&parts_from("[2001:db8:1:3::1]:5000"));
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert_eq!(
            client_address(&parts_from("[::ffff:192.0.2.7]:80")),
            Some("192.0.2.7".parse().expect("ip"))
        );
    }

    #[tokio::test]
    async fn the_failure_past_the_limit_is_a_429_and_the_address_stays_refused() {
        let auth = Authenticator::new(3);
        let client = Some("192.0.2.1".parse().expect("ip"));
        for _ in 0..3 {
            let err = auth.failed(client, Refusal::invalid("no")).await;
            assert!(matches!(err, ApiError::Problem(p) if p.status == Some(401)));
        }
        let err = auth.failed(client, Refusal::invalid("no")).await;
        assert!(
            matches!(&err, ApiError::Problem(p) if p.status == Some(429) && p.retry_after >= Some(1)),
            "{err:?}"
        );
        assert!(auth.refuse_if_blocked(client).await.is_err());
        let other = Some("192.0.2.2".parse().expect("ip"));
        assert!(auth.refuse_if_blocked(other).await.is_ok());
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_blanks_around_the_token_are_ignored() {
        let read = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                "authorization",
                axum::http::HeaderValue::from_str(value).expect("value"),
            );
            bearer(&headers)
        };
        assert_eq!(read("Bearer sk_1").as_deref(), Some("sk_1"));
        assert_eq!(read("bearer sk_1").as_deref(), Some("sk_1"));
        assert_eq!(read("BEARER  sk_1").as_deref(), Some("sk_1"));
        assert_eq!(read("Bearer "), Some(String::new()));
        assert_eq!(read("Bearer"), None);
        assert_eq!(read("Bearersk_1"), None);
        assert_eq!(read("Basic c2tfMTo="), None);
        assert_eq!(read("Token sk_1"), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn a_cached_key_is_looked_up_again_within_the_contracts_5_seconds_however_often_it_is_used() {
        // Time to live, counted from the look-up: a key in constant use is read again every
        // KEY_CACHE_TTL. A time to idle would keep a busy revoked key working for ever.
        let auth = Authenticator::new(60);
        let policy = auth.keys.policy();
        assert_eq!(policy.time_to_live(), Some(KEY_CACHE_TTL));
        assert_eq!(policy.time_to_idle(), None);
        // One more look-up (bounded by the database's answer) must fit in the 5 seconds.
        assert!(KEY_CACHE_TTL + Duration::from_secs(1) <= Duration::from_secs(5));
    }
}
