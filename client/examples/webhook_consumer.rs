//! An endpoint that receives pagos' webhooks and applies each event once: the whole
//! merchant side, with `pagos_client::webhooks`.
//!
//! ```sh
//! PAGOS_WEBHOOK_SECRET=whsec_… cargo run -p pagos-client --example webhook_consumer -- 127.0.0.1:9000 orders.db
//! ```
//!
//! Register `http://127.0.0.1:9000/` as the endpoint (`PAGOS_WEBHOOKS_ALLOW_PRIVATE=true`
//! on the pagos side for a local address). During a secret rotation, set
//! `PAGOS_WEBHOOK_PREVIOUS_SECRET` to the old secret too. Its "effect" is a row in the
//! `orders` table of the same SQLite file: the payment's last known state.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use pagos_client::webhooks::{Applied, Inbox, InboxError, Verifier};
use std::sync::Arc;

struct Consumer {
    verifier: Verifier,
    inbox: Inbox,
}

async fn receive(
    State(consumer): State<Arc<Consumer>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    // Verify the raw body first: a reparsed body is other bytes.
    let event = match consumer.verifier.verify(&headers, &body) {
        Ok(event) => event,
        Err(refused) => {
            let status = StatusCode::from_u16(refused.status()).unwrap_or(StatusCode::BAD_REQUEST);
            return (status, refused.to_string());
        }
    };
    let consumer = Arc::clone(&consumer);
    // SQLite is blocking: off the async threads.
    let applied = tokio::task::spawn_blocking(move || {
        consumer.inbox.apply(&event, |tx, e| {
            // The merchant's own effect, in the same transaction as the event's id.
            tx.execute(
                "INSERT INTO orders (payment_id, estado) VALUES (?1, ?2)
                 ON CONFLICT (payment_id) DO UPDATE SET estado = excluded.estado",
                (
                    e.datos["id"].as_str().unwrap_or_default(),
                    e.datos["estado"].as_str().unwrap_or_default(),
                ),
            )
            .map(|_| ())
        })
    })
    .await;
    match applied {
        Ok(Ok(Applied::Applied)) => (StatusCode::OK, "applied".into()),
        Ok(Ok(Applied::Duplicate)) => (StatusCode::OK, "duplicate".into()),
        Ok(Ok(Applied::Stale)) => (StatusCode::OK, "stale".into()),
        // Nothing recorded: pagos delivers it again.
        Ok(Err(InboxError::Db(e))) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Ok(Err(InboxError::Effect(e))) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    let path = args.next().unwrap_or_else(|| "orders.db".into());
    let secret = std::env::var("PAGOS_WEBHOOK_SECRET").map_err(|_| {
        anyhow::anyhow!("set PAGOS_WEBHOOK_SECRET to the endpoint's whsec_… secret")
    })?;
    let mut verifier = Verifier::new(&secret)?;
    if let Ok(previous) = std::env::var("PAGOS_WEBHOOK_PREVIOUS_SECRET") {
        verifier = verifier.also(&previous)?;
    }
    let inbox = Inbox::open(&path)?;
    rusqlite::Connection::open(&path)?.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (payment_id TEXT PRIMARY KEY, estado TEXT NOT NULL);",
    )?;
    let app = axum::Router::new()
        .fallback(axum::routing::post(receive))
        .with_state(Arc::new(Consumer { verifier, inbox }));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("receiving pagos webhooks on http://{addr}/, applying them to {path}");
    axum::serve(listener, app).await?;
    Ok(())
}
