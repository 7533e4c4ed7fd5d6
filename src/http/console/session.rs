//! Console sessions: a random cookie value whose SHA-256 names the session in this
//! process's memory (never the value itself), for 12 hours; the CSRF token of its forms;
//! and the one-time value that ties a login form to the browser that loaded it.
//!
//! Kept in memory: a restart, or a request answered by another `pagos serve` process,
//! asks the operator to log in again. Every page re-reads the operator, so revoking one
//! ends their sessions at once.

use crate::operators::{self, Role};
use axum::http::HeaderMap;
use rand::distr::{Alphanumeric, SampleString};
use sha2::{Digest, Sha256};
use std::time::Duration;
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// How long a session lasts from login.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// The session cookie.
pub const SESSION_COOKIE: &str = "pagos_consola";
/// The login form's own value (double submit): a form posted from elsewhere lacks it.
pub const LOGIN_COOKIE: &str = "pagos_consola_login";
const SESSIONS_CAPACITY: u64 = 10_000;

/// Who a session belongs to.
#[derive(Clone, Debug)]
pub struct Session {
    /// `None` for the break-glass admin token.
    pub operator: Option<Uuid>,
    pub name: String,
    pub role: Role,
    /// Every form that changes something carries it.
    pub csrf: String,
}

impl Session {
    /// Whether `given` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, given: Option<&str>) -> bool {
        given.is_some_and(|given| bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes())))
    }
}

/// The live sessions of this process, by the SHA-256 of their cookie value.
#[derive(Clone)]
pub struct Sessions {
    live: moka::future::Cache<String, Session>,
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions {
            live: moka::future::Cache::builder()
                .max_capacity(SESSIONS_CAPACITY)
                .time_to_live(SESSION_LIFETIME)
                .build(),
        }
    }
}

/// A random value for a cookie or a form: 32 base62 characters (190 bits).
pub fn random_value() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

fn hash(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

impl Sessions {
    /// Opens a session; the cookie value to hand the browser.
    pub async fn open(&self, operator: Option<Uuid>, name: String, role: Role) -> String {
        let value = random_value();
        let session = Session {
            operator,
            name,
            role,
            csrf: random_value(),
        };
        self.live.insert(hash(&value), session).await;
        value
    }

    pub async fn find(&self, value: &str) -> Option<Session> {
        self.live.get(&hash(value)).await
    }

    pub async fn close(&self, value: &str) {
        self.live.invalidate(&hash(value)).await;
    }

    /// Keeps the session's role in step with the operator's row.
    pub async fn update(&self, value: &str, session: Session) {
        self.live.insert(hash(value), session).await;
    }
}

/// The value of cookie `name` in the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, for the console's paths; `Secure`
/// when the request came over HTTPS (a TLS proxy's `X-Forwarded-Proto`).
pub fn set_cookie(name: &str, value: &str, max_age: Duration, headers: &HeaderMap) -> String {
    let secure = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    format!(
        "{name}={value}; Max-Age={}; Path=/consola; HttpOnly; SameSite=Strict{}",
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// A `Set-Cookie` value that removes cookie `name`.
pub fn clear_cookie(name: &str) -> String {
    format!("{name}=; Max-Age=0; Path=/consola; HttpOnly; SameSite=Strict")
}

/// The name a break-glass session shows and records.
pub fn break_glass_name() -> String {
    operators::BREAK_GLASS.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_is_found_by_its_cookie_only_and_closes() {
        let sessions = Sessions::default();
        let value = sessions.open(None, "admin".into(), Role::Operador).await;
        let found = sessions.find(&value).await.expect("open");
        assert_eq!(found.name, "admin");
        assert!(found.csrf_matches(Some(&found.csrf)));
        assert!(!found.csrf_matches(Some("x")));
        assert!(!found.csrf_matches(None));
        assert!(sessions.find(&random_value()).await.is_none());
        assert!(sessions.live.get(&value).await.is_none(), "stored by hash");
        sessions.close(&value).await;
        assert!(sessions.find(&value).await.is_none());
    }

    #[test]
    fn cookies_are_http_only_strict_and_read_back() {
        let mut headers = HeaderMap::new();
        let set = set_cookie(SESSION_COOKIE, "abc", SESSION_LIFETIME, &headers);
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert!(set.contains("Max-Age=43200") && !set.contains("Secure"));
        headers.insert("x-forwarded-proto", "https".parse().expect("value"));
        assert!(set_cookie(SESSION_COOKIE, "abc", SESSION_LIFETIME, &headers).contains("; Secure"));
        headers.insert(
            "cookie",
            "a=1; pagos_consola=xyz; b=2".parse().expect("value"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("xyz"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
