//! A merchant's webhook endpoint for tests: a real HTTP server (axum) on a free loopback
//! port that records every delivery (path, headers, body, arrival time) and answers as it
//! is told — scripted answers first (410, 429/503 with Retry-After, a 3xx redirect, a
//! status with a body, a hang), otherwise a share of 500s and a share of hangs past the
//! sender's timeout drawn from a seeded generator, otherwise 200.
//!
//! With `consume`, deliveries answered 200 or left hanging go through the merchant's side
//! first, as `pagos_client::webhooks` does it: verified, deduplicated by `webhook-id`,
//! applied once (its SQLite inbox, in memory). A hang applies the event before hanging, the worst case for the sender:
//! the merchant has it, pagos does not know, and the redelivery must be a duplicate.

#![allow(dead_code)] // Each test uses a part of it.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use pagos_client::webhooks::{Applied, Inbox, Verifier};
use pagos_types::Evento;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How the receiver answers one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200 `ok`.
    Ok,
    /// This status with this body.
    Status(u16, String),
    /// 429 or 503 with this `Retry-After` value.
    RetryAfter(u16, String),
    /// A 3xx with this `Location`.
    Redirect(u16, String),
    /// Nothing for this long (then 200).
    Hang(Duration),
    /// Nothing for this long, then this status.
    Late(Duration, u16),
}

/// One delivery as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: DateTime<Utc>,
    pub answer: Answer,
    /// What the example consumer decided (None: it was not asked; Err: refused).
    pub decision: Option<Result<Applied, String>>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

struct Behaviour {
    script: VecDeque<Answer>,
    fail_share: f64,
    hang_share: f64,
    hang_for: Duration,
    rng: StdRng,
    consumer: Option<(Verifier, Inbox)>,
}

#[derive(Default)]
struct Log {
    deliveries: Vec<Recorded>,
    applied: Vec<Evento>,
}

struct Shared {
    behaviour: Mutex<Behaviour>,
    log: Mutex<Log>,
}

pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Receiver {
    /// On 127.0.0.1, a free port.
    pub async fn start() -> Receiver {
        Receiver::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// On `addr` (another loopback address, a chosen port).
    pub async fn start_on(addr: SocketAddr) -> Receiver {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the receiver binds");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            behaviour: Mutex::new(Behaviour {
                script: VecDeque::new(),
                fail_share: 0.0,
                hang_share: 0.0,
                hang_for: Duration::from_secs(30),
                rng: StdRng::seed_from_u64(14),
                consumer: None,
            }),
            log: Mutex::new(Log::default()),
        });
        let app = Router::new()
            .fallback(receive)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            addr,
            shared,
            server,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next deliveries get these answers, in order.
    pub fn answer_next(&self, answers: impl IntoIterator<Item = Answer>) {
        lock(&self.shared.behaviour).script.extend(answers);
    }

    /// Outside the script: this share of deliveries gets a 500 (not applied), this share
    /// is applied and then left hanging for `hang_for`; draws from `seed`.
    pub fn flaky(&self, fail_share: f64, hang_share: f64, hang_for: Duration, seed: u64) {
        let mut b = lock(&self.shared.behaviour);
        b.fail_share = fail_share;
        b.hang_share = hang_share;
        b.hang_for = hang_for;
        b.rng = StdRng::seed_from_u64(seed);
    }

    /// Deliveries go through the example consumer with `verifier` first, and a new inbox.
    pub fn consume(&self, verifier: Verifier) {
        // SQLite's own name for a private database in memory: the receiver's lifetime.
        let inbox = Inbox::open(":memory:").expect("an inbox in memory");
        lock(&self.shared.behaviour).consumer = Some((verifier, inbox));
    }

    pub fn deliveries(&self) -> Vec<Recorded> {
        lock(&self.shared.log).deliveries.clone()
    }

    /// The events the example consumer applied, in order.
    pub fn applied(&self) -> Vec<Evento> {
        lock(&self.shared.log).applied.clone()
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Utc::now();
    let (answer, decision) = {
        let mut behaviour = lock(&shared.behaviour);
        let scripted = behaviour.script.pop_front();
        let answer = scripted.clone().unwrap_or_else(|| {
            let draw: f64 = behaviour.rng.random();
            if draw < behaviour.fail_share {
                Answer::Status(500, "try later".into())
            } else if draw < behaviour.fail_share + behaviour.hang_share {
                Answer::Hang(behaviour.hang_for)
            } else {
                Answer::Ok
            }
        });
        let consumes = scripted.is_none() && matches!(answer, Answer::Ok | Answer::Hang(_));
        let decision = match (&behaviour.consumer, consumes) {
            (Some((verifier, inbox)), true) => Some(match verifier.verify(&headers, &body) {
                Ok(event) => inbox
                    .apply(&event, |_, e| {
                        lock(&shared.log).applied.push(e.clone());
                        Ok::<_, String>(())
                    })
                    .map_err(|failed| failed.to_string()),
                Err(refused) => Err(refused.to_string()),
            }),
            _ => None,
        };
        (answer, decision)
    };
    lock(&shared.log).deliveries.push(Recorded {
        path: uri.path().to_owned(),
        headers,
        body,
        at,
        answer: answer.clone(),
        decision: decision.clone(),
    });
    if let Some(Err(refused)) = decision {
        return (StatusCode::UNAUTHORIZED, refused).into_response();
    }
    let status =
        |code: u16| StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match answer {
        Answer::Ok => (StatusCode::OK, "ok").into_response(),
        Answer::Status(code, body) => (status(code), body).into_response(),
        Answer::RetryAfter(code, value) => {
            (status(code), [("retry-after", value)], "slow down").into_response()
        }
        Answer::Redirect(code, location) => {
            (status(code), [("location", location)], "moved").into_response()
        }
        Answer::Hang(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, "late").into_response()
        }
        Answer::Late(d, code) => {
            tokio::time::sleep(d).await;
            (status(code), "late").into_response()
        }
    }
}
