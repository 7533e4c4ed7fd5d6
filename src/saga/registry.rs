//! The registry of idempotency keys: registers a key with its payment when it is new,
//! finds its row when it is taken, then lets `idempotency::decide` say what the request gets.
//!
//! It never holds a transaction open across the work it guards: a lease on the key row
//! marks the owner; the row's primary key settles races.

use crate::domain::NewPayment;
use crate::entities::idempotency_key as keys;
use crate::idempotency::cache::ReplayCache;
use crate::idempotency::fingerprint::Fingerprinted;
use crate::idempotency::{Begin, IdempotencyKey, decide};
use crate::saga::store::{self, Registered, Registration};
use sea_orm::{DatabaseConnection, DbErr};
use std::time::Duration;
use uuid::Uuid;

/// What the replay cache alone says of the key: the frozen answer to replay, or a
/// mismatch; None when the cache does not hold it (then `begin` asks the database).
pub fn remembered(
    cache: &ReplayCache,
    merchant: Uuid,
    key: &IdempotencyKey,
    request: &Fingerprinted<'_>,
) -> Option<Begin> {
    let frozen = cache.get(merchant, key.as_str())?;
    Some(if frozen.answers(request) {
        Begin::Replay {
            payment_id: frozen.payment_id,
            answer: frozen.answer.clone(),
            from_memory: true,
        }
    } else {
        Begin::Mismatch
    })
}

/// Registers the key with its payment if it is new, for a key `remembered` did not find
/// in the replay cache; a key already taken gets what `decide` says of its row. A frozen
/// answer read from the database is kept in the cache, with the request's body when it is
/// the request the answer was frozen for.
///
/// One statement either way on PostgreSQL, where the registration answers with the row of
/// a taken key. On SQLite the key is looked up first: registering there takes the
/// database's write lock, which a replay has no need of.
pub async fn begin(
    db: &DatabaseConnection,
    cache: &ReplayCache,
    merchant: Uuid,
    key: &IdempotencyKey,
    request: &Fingerprinted<'_>,
    new_payment: &NewPayment,
    lease: Duration,
) -> Result<Begin, DbErr> {
    let fingerprint = request.fingerprint();
    let taken = |existing: keys::Model| {
        let now = crate::db::now();
        let same = existing.fingerprint == fingerprint;
        cache.keep(&existing, now, same.then(|| request.body()));
        decide(&existing, fingerprint, now)
    };
    if !store::one_statement(db)
        && let Some(existing) = store::find_key(db, merchant, key.as_str()).await?
    {
        return Ok(taken(existing));
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
        Registered::Taken(existing) => taken(existing),
    })
}
