//! The provider of the reconciler figure: the reference protocol's
//! `GET /v1/charges?reference=` answered after a fixed latency with one succeeded charge
//! for that reference. It counts the look-ups and the most it had in flight at once, which
//! shows whether the reconciler kept its concurrency busy.

use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Default)]
pub struct Lookups {
    pub served: AtomicU64,
    pub max_in_flight: AtomicU64,
    in_flight: AtomicU64,
}

struct Provider {
    latency: Duration,
    lookups: Arc<Lookups>,
}

#[derive(Deserialize)]
struct Reference {
    reference: String,
}

async fn charges(State(provider): State<Arc<Provider>>, Query(q): Query<Reference>) -> Json<Value> {
    let lookups = &provider.lookups;
    let now = lookups.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    lookups.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(provider.latency).await;
    lookups.in_flight.fetch_sub(1, Ordering::SeqCst);
    lookups.served.fetch_add(1, Ordering::SeqCst);
    let id = format!("ch_{}", q.reference.replace('-', ""));
    Json(json!({"data": [{
        "id": id, "status": "succeeded", "amount": 250000, "currency": "COP",
        "reference": q.reference, "declineCode": null
    }]}))
}

/// Serves on a free port of 127.0.0.1 until the process ends, on a runtime of its own: the
/// bench's own runtime waits for the `pagos` processes, and a provider sharing its worker
/// threads would answer later than one on another machine would.
pub async fn start(latency: Duration) -> anyhow::Result<(SocketAddr, Arc<Lookups>)> {
    let lookups = Arc::new(Lookups::default());
    let provider = Arc::new(Provider {
        latency,
        lookups: lookups.clone(),
    });
    let router = Router::new()
        .route("/v1/charges", get(charges))
        .with_state(provider);
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("provider")
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                let _ = axum::serve(listener, router).await;
            }
        })
    });
    Ok((addr, lookups))
}
