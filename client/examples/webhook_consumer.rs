//! An endpoint that receives pagos' webhooks and applies each event once: the whole
//! merchant side, with `pagos_client::webhooks`.
//!
//! ```sh
//! PAGOS_WEBHOOK_SECRET=whsec_… cargo run -p pagos-client --example webhook_consumer -- 127.0.0.1:9000 orders.db
//! ```
//!
//! Register `http://127.0.0.1:9000/` as the endpoint (`PAGOS_WEBHOOKS_ALLOW_PRIVATE=true`
//! on the pagos side for a local address). During a secret rotation, set
//! `PAGOS_WEBHOOK_PREVIOUS_SECRET` to the old secret too (empty is unset). A secret that
//! is missing or not one pagos makes stops it at start, with one line naming the
//! variable. Its "effect" is a row in a table
//! of the same SQLite file, by the event's type: `orders` for a payment's events (its last
//! known state), `refunds` for a refund's (the refund, its payment and its state).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use pagos_client::webhooks::{Applied, Inbox, InboxError, Verifier};
use pagos_types::{EventType, Evento};
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
    let applied = tokio::task::spawn_blocking(move || consumer.inbox.apply(&event, effect)).await;
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

/// The merchant's own effect, in the same transaction as the event's id. What `datos`
/// is depends on the type: a payment for `pago.*` (the order's state), a refund for
/// `reembolso.*` (its own `id`, and its payment's in `pagoId`).
fn effect(tx: &rusqlite::Transaction<'_>, e: &Evento) -> rusqlite::Result<()> {
    let text = |field: &str| e.datos[field].as_str().unwrap_or_default().to_owned();
    match e.tipo {
        EventType::PagoCompletado | EventType::PagoFallido | EventType::PagoRevisionManual => tx
            .execute(
                "INSERT INTO orders (payment_id, estado) VALUES (?1, ?2)
                 ON CONFLICT (payment_id) DO UPDATE SET estado = excluded.estado",
                (text("id"), text("estado")),
            )
            .map(|_| ()),
        EventType::ReembolsoCompletado
        | EventType::ReembolsoFallido
        | EventType::ReembolsoRevisionManual => tx
            .execute(
                "INSERT INTO refunds (refund_id, payment_id, monto, estado) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (refund_id) DO UPDATE SET estado = excluded.estado",
                (
                    text("id"),
                    text("pagoId"),
                    e.datos["monto"].as_i64().unwrap_or_default(),
                    text("estado"),
                ),
            )
            .map(|_| ()),
    }
}

/// The effect's tables, beside the inbox's in the SQLite file at `path`.
fn open_tables(path: &str) -> rusqlite::Result<()> {
    rusqlite::Connection::open(path)?.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (payment_id TEXT PRIMARY KEY, estado TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS refunds (refund_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL,
             monto INTEGER NOT NULL, estado TEXT NOT NULL);",
    )
}

/// The verifier of the endpoint's secret (`PAGOS_WEBHOOK_SECRET`) and, during a rotation,
/// the old one (`PAGOS_WEBHOOK_PREVIOUS_SECRET`), read with `var`. An empty variable is an
/// unset one; a missing or malformed secret is refused, naming its variable.
fn verifier(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Verifier> {
    let read = |name: &str| var(name).filter(|value| !value.is_empty());
    let current = read("PAGOS_WEBHOOK_SECRET").ok_or_else(|| {
        anyhow::anyhow!("set PAGOS_WEBHOOK_SECRET to the endpoint's whsec_… secret")
    })?;
    let mut verifier =
        Verifier::new(&current).map_err(|e| anyhow::anyhow!("PAGOS_WEBHOOK_SECRET: {e}"))?;
    if let Some(previous) = read("PAGOS_WEBHOOK_PREVIOUS_SECRET") {
        verifier = verifier
            .also(&previous)
            .map_err(|e| anyhow::anyhow!("PAGOS_WEBHOOK_PREVIOUS_SECRET: {e}"))?;
    }
    Ok(verifier)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    let path = args.next().unwrap_or_else(|| "orders.db".into());
    let verifier = verifier(|name| std::env::var(name).ok())?;
    let inbox = Inbox::open(&path)?;
    open_tables(&path)?;
    let app = axum::Router::new()
        .fallback(axum::routing::post(receive))
        .with_state(Arc::new(Consumer { verifier, inbox }));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("receiving pagos webhooks on http://{addr}/, applying them to {path}");
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    /// An empty or malformed secret would verify nothing or anything: the consumer does
    /// not start, and says which variable to fix. An empty previous secret is no rotation.
    #[test]
    fn a_missing_or_malformed_secret_stops_it_at_start_naming_the_variable() {
        for current in [
            None,
            Some(""),
            Some("whsec_"),
            Some("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ] {
            let vars: Vec<_> = current
                .map(|c| ("PAGOS_WEBHOOK_SECRET", c))
                .into_iter()
                .collect();
            let refused = verifier(env(&vars)).err().expect("refused").to_string();
            assert!(
                refused.contains("PAGOS_WEBHOOK_SECRET"),
                "{current:?}: {refused}"
            );
            assert!(!refused.contains('\n'), "one line: {refused}");
        }
        let refused = verifier(env(&[
            ("PAGOS_WEBHOOK_SECRET", SECRET),
            ("PAGOS_WEBHOOK_PREVIOUS_SECRET", "whsec_"),
        ]))
        .err()
        .expect("refused")
        .to_string();
        assert!(
            refused.contains("PAGOS_WEBHOOK_PREVIOUS_SECRET"),
            "{refused}"
        );

        assert!(
            verifier(env(&[
                ("PAGOS_WEBHOOK_SECRET", SECRET),
                ("PAGOS_WEBHOOK_PREVIOUS_SECRET", ""),
            ]))
            .is_ok(),
            "an empty previous secret is unset"
        );
    }

    fn event(id: &str, tipo: &str, secuencia: u64, datos: serde_json::Value) -> Evento {
        serde_json::from_value(serde_json::json!({
            "id": id, "tipo": tipo, "creadoEn": "2026-12-03T00:00:00.000Z",
            "secuencia": secuencia, "datos": datos,
        }))
        .expect("an event")
    }

    /// A refund's event is about the refund (`datos` is the refund, its `id` the refund's
    /// and `pagoId` its payment's): it is kept as a refund and leaves the order as the
    /// payment's own events left it.
    #[test]
    fn a_refund_event_is_applied_as_a_refund_not_as_a_payment() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("orders.db").display().to_string();
        let inbox = Inbox::open(&path).expect("inbox");
        open_tables(&path).expect("tables");
        let paid = event(
            "evt_1",
            "pago.completado",
            2,
            serde_json::json!({"id": "p-1", "estado": "COMPLETADA", "monto": 5000}),
        );
        let refunded = event(
            "evt_2",
            "reembolso.completado",
            2,
            serde_json::json!({"id": "r-1", "pagoId": "p-1", "monto": 2000, "estado": "COMPLETADO"}),
        );
        for e in [&paid, &refunded] {
            assert_eq!(inbox.apply(e, effect).expect("applied"), Applied::Applied);
        }
        let db = rusqlite::Connection::open(&path).expect("open");
        let orders: Vec<(String, String)> = db
            .prepare("SELECT payment_id, estado FROM orders ORDER BY payment_id")
            .expect("query")
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(orders, [("p-1".to_owned(), "COMPLETADA".to_owned())]);
        let refunds: Vec<(String, String, i64, String)> = db
            .prepare("SELECT refund_id, payment_id, monto, estado FROM refunds")
            .expect("query")
            .query_map([], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(
            refunds,
            [(
                "r-1".to_owned(),
                "p-1".to_owned(),
                2000,
                "COMPLETADO".to_owned()
            )]
        );
    }
}
