//! Who is calling: merchants by API key (only its SHA-256 is stored), on-call by the admin
//! token (compared in constant time). Never logs a key or a token.

use super::AppState;
use super::problem::{ApiError, Kind, Problem};
use crate::entities::merchant;
use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::RwLock;
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// API keys are long random strings, so a fast hash is enough to store them safely.
pub fn hash_api_key(api_key: &str) -> String {
    hex::encode(Sha256::digest(api_key.as_bytes()))
}

/// Known API key hashes → merchant. Merchants are never deleted, so a hit stays true;
/// a miss always asks the database (a merchant added by another process is found).
#[derive(Default)]
pub struct MerchantCache(RwLock<HashMap<String, Uuid>>);

impl MerchantCache {
    fn get(&self, hash: &str) -> Option<Uuid> {
        self.0.read().ok()?.get(hash).copied()
    }

    fn put(&self, hash: String, merchant: Uuid) {
        if let Ok(mut map) = self.0.write() {
            map.insert(hash, merchant);
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

fn unauthorized(detail: &str) -> ApiError {
    Problem::new(Kind::Unauthorized).detail(detail).into()
}

/// The authenticated merchant of a request.
#[derive(Clone, Copy, Debug)]
pub struct Merchant(pub Uuid);

impl FromRequestParts<AppState> for Merchant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Some(token) = bearer(&parts.headers).filter(|t| !t.is_empty()) else {
            return Err(unauthorized(
                "Send your API key as `Authorization: Bearer <key>`.",
            ));
        };
        let hash = hash_api_key(token);
        if let Some(id) = state.merchants.get(&hash) {
            return Ok(Merchant(id));
        }
        let found = merchant::Entity::find()
            .filter(merchant::Column::ApiKeyHash.eq(hash.clone()))
            .one(&state.db)
            .await?;
        match found {
            Some(m) => {
                state.merchants.put(hash, m.id);
                Ok(Merchant(m.id))
            }
            None => Err(unauthorized("Unknown API key.")),
        }
    }
}

/// An on-call request carrying the admin token.
#[derive(Clone, Copy, Debug)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Some(expected) = state
            .settings
            .admin_token
            .as_deref()
            .filter(|t| !t.is_empty())
        else {
            return Err(unauthorized(
                "Admin endpoints are disabled: PAGOS_ADMIN_TOKEN is not set.",
            ));
        };
        let given = bearer(&parts.headers).unwrap_or("");
        // Compare hashes so the comparison's length is fixed too.
        let matches: bool = Sha256::digest(given.as_bytes())
            .ct_eq(&Sha256::digest(expected.as_bytes()))
            .into();
        if matches {
            Ok(Admin)
        } else {
            Err(unauthorized(
                "Send the admin token as `Authorization: Bearer <token>`.",
            ))
        }
    }
}
