//! The registry of idempotency keys: looks a key up and registers it with its payment
//! when it is new, then lets `idempotency::decide` say what the request gets.
//!
//! It never holds a transaction open across the work it guards: a lease on the key row
//! marks the owner; the row's primary key settles races.

use crate::domain::NewPayment;
use crate::idempotency::{Begin, IdempotencyKey, decide};
use crate::saga::store::{self, Registered, Registration};
use sea_orm::{DatabaseConnection, DbErr};
use std::time::Duration;
use uuid::Uuid;

/// Looks the key up (one query: the whole cost of a replay) and registers it with its
/// payment if it is new.
pub async fn begin(
    db: &DatabaseConnection,
    merchant: Uuid,
    key: &IdempotencyKey,
    fingerprint: &str,
    new_payment: &NewPayment,
    lease: Duration,
) -> Result<Begin, DbErr> {
    if let Some(existing) = store::find_key(db, merchant, key.as_str()).await? {
        return Ok(decide(&existing, fingerprint, crate::db::now()));
    }
    let registration = Registration {
        merchant,
        key,
        fingerprint,
        payment: new_payment,
        lease,
    };
    Ok(match store::register(db, registration).await? {
        Registered::Started(p) => Begin::Started(Box::new(p)),
        Registered::Taken(existing) => decide(&existing, fingerprint, crate::db::now()),
    })
}
