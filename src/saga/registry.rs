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

/// The replay of a key this process holds the frozen answer of, when `sent` is, byte for
/// byte, the body that answer was frozen for: known before the body is parsed. None
/// otherwise (not held, or another body: `remembered` decides once it is parsed).
pub fn remembered_as_sent(
    cache: &ReplayCache,
    merchant: Uuid,
    key: &IdempotencyKey,
    sent: &str,
) -> Option<Begin> {
    let frozen = cache.get(merchant, key.as_str())?;
    frozen.sent_as(sent).then(|| Begin::Replay {
        payment_id: frozen.payment_id,
        answer: frozen.answer.clone(),
        from_memory: true,
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
    let epoch = cache.epoch();
    if !store::one_statement(db)
        && let Some(taken) = taken(db, cache, merchant, key, request).await?
    {
        return Ok(taken);
    }
    let registration = Registration {
        merchant,
        key,
        fingerprint: request.fingerprint(),
        payment: new_payment,
        lease,
    };
    Ok(match store::register(db, registration).await? {
        Registered::Started(p) => Begin::Started(Box::new(p)),
        Registered::Taken(existing) => decided(cache, &existing, request, epoch),
    })
}

/// What a key already taken gets, read from its row; None when the key is not taken.
///
/// For a request whose body today's settings refuse: a retry of a payment made under
/// other settings (a lower `PAGOS_MAX_MONTO`, another gateway, another process of a
/// rolling deploy) or written otherwise (`250000.0` for `250000`) is still the request
/// its key was taken with, and gets that key's answer, never "nothing was stored".
pub async fn taken(
    db: &DatabaseConnection,
    cache: &ReplayCache,
    merchant: Uuid,
    key: &IdempotencyKey,
    request: &Fingerprinted<'_>,
) -> Result<Option<Begin>, DbErr> {
    let epoch = cache.epoch();
    let existing = store::find_key(db, merchant, key.as_str()).await?;
    Ok(existing.map(|existing| decided(cache, &existing, request, epoch)))
}

/// What `decide` says of a taken key's row; a frozen answer is kept in the cache, with
/// the request's body when it is the request the answer was frozen for. `epoch`: the
/// cache's before the row was read.
fn decided(
    cache: &ReplayCache,
    existing: &keys::Model,
    request: &Fingerprinted<'_>,
    epoch: u64,
) -> Begin {
    let fingerprint = request.fingerprint();
    let now = crate::db::now();
    let same = existing.fingerprint == fingerprint;
    cache.keep(existing, now, same.then(|| request.sent()), epoch);
    decide(existing, fingerprint, now)
}
