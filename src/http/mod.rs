//! The HTTP surface: one router per room, merged here so the whole API fits on one
//! screen, and the OpenAPI document generated from the same routes.
//!
//! Also the doors' limits every request meets (`PAGOS_MAX_IN_FLIGHT`,
//! `PAGOS_REQUEST_TIMEOUT`) and which rooms each door serves (`PAGOS_ADMIN_BIND`). The
//! header timeout is the server's, in `app::serve_doors`. Nothing here touches the
//! database; the only bodies read here are those read before anyone is known (webhooks,
//! the console's login: `unauthenticated`), before they take a slot of the limit.

pub mod actions;
pub mod admin;
pub mod auth;
pub mod console;
pub mod extract;
pub mod ops;
pub mod payments;
pub mod problem;
pub mod provider_check;
pub mod refund_resolution;
pub mod refunds;
pub mod webhooks;
// Webhooks to merchants: their endpoints and their events.
pub mod endpoints;
pub mod events;
pub mod search;

use crate::config::Settings;
use crate::gateway::Gateway;
use crate::idempotency::cache::ReplayCache;
use crate::metrics::{LimitLabel, MeteredMercadoPago, MeteredStripe, Metrics};
use crate::saga::SagaDeps;
use crate::saga::reconcile::Reconciler;
use auth::Authenticator;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use problem::ProblemResponse;
use sea_orm::DatabaseConnection;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tower::limit::GlobalConcurrencyLimitLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, PartialSchema};
use utoipa_axum::router::OpenApiRouter;

/// Everything a request handler shares. Defined here, by the HTTP surface that uses it,
/// and built by the composition root (`app::build`).
pub struct Shared {
    pub db: DatabaseConnection,
    /// The configured gateway, metered.
    pub gateway: Arc<dyn Gateway>,
    pub settings: Settings,
    /// The API-key cache and the limit on failed authentications.
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    /// With `PAGOS_GATEWAY=mercadopago`: the client notifications ask for a payment's
    /// state, built once (its connections are reused) and metered.
    pub mercadopago: Option<MeteredMercadoPago>,
    /// With `PAGOS_GATEWAY=stripe`: the client a dispute event asks for its PaymentIntent
    /// (a Dispute names no pagos payment), built once and metered.
    pub stripe: Option<MeteredStripe>,
    /// `PAGOS_MAX_IN_FLIGHT` slots, shared by every door of the process.
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Slots of the requests whose body is read before anyone is known (`unauthenticated`):
    /// a quarter of `PAGOS_MAX_IN_FLIGHT`, at least one.
    pub unauthenticated: Arc<tokio::sync::Semaphore>,
    /// On-call's "reconcile now" and a client retry that finds its payment due.
    pub reconciler: Reconciler,
    /// Frozen answers kept in memory (`PAGOS_REPLAY_CACHE_MIB`).
    pub replay_cache: ReplayCache,
    /// Every saga (or reconciliation) a request started in a task of its own: `serve`
    /// waits for them on shutdown, up to `PAGOS_SHUTDOWN_GRACE`.
    pub tasks: tokio_util::task::TaskTracker,
    /// The console's sessions (in this process's memory).
    pub console: console::Sessions,
    /// True once `serve` was told to stop: a reconciliation pass on-call started through
    /// the admin API or the console then claims nothing more, as the periodic one.
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// True from the first SIGTERM or Ctrl-C: `/readyz` answers 503, so that a load
    /// balancer sends new requests elsewhere while this process still serves them
    /// (`PAGOS_DRAIN_DELAY`).
    pub draining: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    /// What a payment's saga needs.
    pub fn saga_deps(&self) -> SagaDeps {
        self.reconciler.saga.clone()
    }
}

/// The state every handler shares: cheap to clone.
#[derive(Clone)]
pub struct AppState(pub Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "pagos",
        description = "Payments through external gateways, safe to retry. Every error is application/problem+json (RFC 9457) with a stable `type`. A path asked with a method it does not serve answers 405 `method-not-allowed` with `Allow` (the reusable response `MethodNotAllowed`)."
    ),
    modifiers(&Security),
    components(
        schemas(crate::domain::FieldError, webhooks::Acuse),
        responses(problem::MethodNotAllowed)
    )
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer =
            || SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        components.add_security_scheme("api_key", bearer());
        components.add_security_scheme("admin_token", bearer());
    }
}

/// Counts every answer by route template (never the raw path: ids would explode the
/// label set) and status.
async fn count_responses(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    state
        .metrics
        .http_responses
        .get_or_create(&crate::metrics::RouteLabel {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// `RouteLabel::method` of `method`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

/// Paths served only on the admin door when `PAGOS_ADMIN_BIND` is set, whatever room
/// serves them (`/consola` is the operators' console).
pub const ADMIN_PREFIXES: [&str; 3] = ["/admin", "/consola", "/metrics"];

/// Served on both doors, so a probe of either address tells whether the process lives.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// Which door a router serves. The door of a path is decided by its prefix alone, so a
/// room adding an `/admin/…` route cannot put it on the merchants' door by mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Door {
    /// `PAGOS_ADMIN_BIND` unset: everything on `PAGOS_BIND`.
    Only,
    /// `PAGOS_BIND` beside an admin door: merchants and gateways.
    Public,
    /// `PAGOS_ADMIN_BIND`: on-call and the metrics scraper.
    Admin,
}

impl Door {
    fn serves(self, path: &str) -> bool {
        let admin_only = ADMIN_PREFIXES.iter().any(|prefix| {
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        });
        match self {
            Door::Only => true,
            Door::Public => !admin_only,
            Door::Admin => admin_only || PROBES.contains(&path),
        }
    }
}

/// The rooms that count against `PAGOS_MAX_IN_FLIGHT` and are cut at
/// `PAGOS_REQUEST_TIMEOUT`: everything that may wait on the database or a gateway.
fn limited_rooms() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(payments::router())
        .merge(webhooks::router())
        .merge(admin::router())
        .merge(actions::router())
        .merge(ops::readiness())
        .merge(refunds::router())
        .merge(refund_resolution::router())
        .merge(endpoints::router())
        .merge(events::router())
        .merge(search::router())
}

/// The rooms that answer from memory and so are never refused: a liveness probe that
/// failed under load would get a healthy process killed, and metrics matter most then.
fn light_rooms() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(ops::liveness())
        .merge(ops::metrics_route())
}

/// The whole API and its OpenAPI document, from the same route list.
pub fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let mut limited = limited_rooms();
    declare_limits(limited.get_openapi_mut());
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(limited)
        .merge(light_rooms())
        .split_for_parts()
}

/// The 503s every limited route may answer (`refused`, and `ApiError::Internal` of any
/// handler), folded into the 503 each operation of `openapi` declares of its own, or
/// declared where it has none, each with `Retry-After`. Done here rather than in each
/// operation's annotation: the doors put the limits on every route of `limited_rooms`, so
/// the document says so of exactly those.
fn declare_limits(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, header::HeaderBuilder};
    for (path, item) in openapi.paths.paths.iter_mut() {
        // As `refused` tells them apart: on-call's request cut at the timeout gets no
        // Retry-After (asking again before reading what it did runs it twice).
        let on_call = Door::Admin.serves(path);
        let timeout = if on_call {
            "`request-timeout`: cut at `PAGOS_REQUEST_TIMEOUT`, what it started goes on; read what it did before asking again (no Retry-After)"
        } else {
            "`request-timeout`: cut at `PAGOS_REQUEST_TIMEOUT`, what it started goes on; retry (with the same Idempotency-Key where there is one) after Retry-After"
        };
        let limits = format!(
            "`overloaded`: `PAGOS_MAX_IN_FLIGHT` requests were in progress, this one was not started and nothing was stored; retry after Retry-After. {timeout}. `service-unavailable`: the database failed; retry after Retry-After"
        );
        let retry_after = if on_call {
            "Seconds to wait before retrying; absent on `request-timeout`"
        } else {
            "Seconds to wait before retrying"
        };
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let responses = &mut operation.responses.responses;
            match responses.get_mut("503") {
                Some(RefOr::T(own)) => {
                    own.description = format!(
                        "{}. Also, as on every route under the doors' limits: {limits}",
                        own.description.trim_end_matches('.')
                    );
                    own.headers.entry("Retry-After".into()).or_insert_with(|| {
                        RefOr::T(
                            HeaderBuilder::new()
                                .schema(Some(u64::schema()))
                                .description(Some(retry_after))
                                .build(),
                        )
                    });
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    let declared = ResponseBuilder::new()
                        .description(format!(
                            "Refused or cut by the doors' limits, or the database failed: {limits}"
                        ))
                        .content(
                            problem::PROBLEM_JSON,
                            ContentBuilder::new()
                                .schema(Some(Ref::from_schema_name("Problem")))
                                .build(),
                        )
                        .header(
                            "Retry-After",
                            HeaderBuilder::new()
                                .schema(Some(u64::schema()))
                                .description(Some(retry_after))
                                .build(),
                        )
                        .build();
                    responses.insert("503".into(), RefOr::T(declared));
                }
            }
        }
    }
}

/// The whole surface on one door (`PAGOS_ADMIN_BIND` unset).
pub fn router(state: AppState) -> Router {
    door(Door::Only, state)
}

/// The public door and the admin door, for `PAGOS_ADMIN_BIND`: `/admin/*`, `/consola/*`
/// and `/metrics` only on the second, and the first answers them 404.
pub fn doors(state: AppState) -> (Router, Router) {
    (door(Door::Public, state.clone()), door(Door::Admin, state))
}

fn door(door: Door, state: AppState) -> Router {
    let (limited, _) = limited_rooms().split_for_parts();
    let limited = limited.merge(console::router());
    let (light, _) = light_rooms().split_for_parts();
    let (_, openapi) = api();
    let document = openapi.to_json().unwrap_or_default();
    let light = light.route(
        "/openapi.json",
        axum::routing::get(move || {
            let document = document.clone();
            async move { ([("content-type", "application/json")], document).into_response() }
        }),
    );
    let metrics = state.metrics.clone();
    let cut_after = state.settings.request_timeout;
    let limits = tower::ServiceBuilder::new()
        .layer(HandleErrorLayer::new(
            move |method: Method, uri: Uri, err: tower::BoxError| {
                let metrics = metrics.clone();
                async move { refused(&metrics, cut_after, &method, &uri, &err) }
            },
        ))
        // Shed rather than queue: a request waiting for a slot holds its connection and
        // its client's patience, and the queue would grow without bound.
        .load_shed()
        // One semaphore for every door and route of the process.
        .layer(GlobalConcurrencyLimitLayer::with_semaphore(
            state.in_flight.clone(),
        ))
        // Inside the limit, so a request cut frees its slot. The work a handler spawned
        // (a payment's saga, a reconciliation pass) is a task of its own and goes on.
        .timeout(cut_after);
    let router = limited
        .route_layer(limits)
        // Outside the limits: a body sent slowly is read before it takes a slot.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            unauthenticated,
        ))
        .merge(light)
        // A route layer runs after routing, so the route template is known; outside the
        // limits, so their 503s are counted too.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .fallback(|| async { no_such_endpoint().into_response() })
        // Last, so it reaches every route: axum's own 405 has an empty body. Axum still
        // sets `Allow` (the methods the path serves) on the answer.
        .method_not_allowed_fallback(|| async { method_not_allowed().into_response() });
    // One door serves every path: no check to make on each request.
    let router = if door == Door::Only {
        router
    } else {
        router.layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                if door.serves(request.uri().path()) {
                    next.run(request).await
                } else {
                    no_such_endpoint().into_response()
                }
            },
        ))
    };
    router
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            close_when_draining,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// From the first signal on (`PAGOS_DRAIN_DELAY`), every answer says `Connection: close`:
/// a client that keeps connections to this process (a load balancer's pool, a connection
/// kube-proxy tracks) opens its next one, which the balancer sends elsewhere, instead of
/// sending requests here until the listener closes and resets it.
async fn close_when_draining(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut response: Response,
) -> Response {
    if *state.draining.borrow() {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

fn method_not_allowed() -> problem::Problem {
    problem::Problem::new(problem::ProblemType::MethodNotAllowed)
        .detail("This path does not take this method; `Allow` lists those it takes.")
}

fn no_such_endpoint() -> problem::Problem {
    problem::Problem::new(problem::ProblemType::NotFound).detail("No such endpoint.")
}

/// Whether a request's body is read before anyone is known: the gateways' webhooks (the
/// signature is over the body) and the console's login form.
fn read_before_auth(method: &Method, path: &str) -> bool {
    *method == Method::POST && (path.starts_with("/v1/webhooks/") || path == "/consola/login")
}

/// The most a body read before anyone is known may be (the largest such route's limit;
/// each route still holds its own).
const UNAUTHENTICATED_BODY_LIMIT: usize = webhooks::MAX_EVENT_BODY;

/// Requests whose body is read before anyone is known (`read_before_auth`): anyone can
/// send them, and one sent a byte at a time would hold a `PAGOS_MAX_IN_FLIGHT` slot until
/// `PAGOS_REQUEST_TIMEOUT`, so a few hundred slow clients could stop every payment. Their
/// body is read whole first, within `PAGOS_HEADER_TIMEOUT` (a 408 problem past it), in
/// slots of their own held only while it is read (`Shared::unauthenticated`: past them,
/// `503 overloaded` at once, which a gateway retries); then, read, the request lets its
/// slot go and takes one of the limit like any other.
async fn unauthenticated(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !read_before_auth(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let Ok(slot) = state.unauthenticated.clone().try_acquire_owned() else {
        state
            .metrics
            .http_limited
            .get_or_create(&LimitLabel {
                limit: "unauthenticated",
            })
            .inc();
        return problem::Problem::new(problem::ProblemType::Overloaded)
            .detail("Too many bodies of webhooks or console logins are being received at once. This one was not read and nothing was stored: send it again after the time in Retry-After.")
            .retry_after(1)
            .into_response();
    };
    let (parts, body) = request.into_parts();
    let within = state.settings.header_timeout;
    let read = tokio::time::timeout(
        within,
        axum::body::to_bytes(body, UNAUTHENTICATED_BODY_LIMIT + 1),
    )
    .await;
    let bytes = match read {
        Ok(Ok(bytes)) if bytes.len() <= UNAUTHENTICATED_BODY_LIMIT => bytes,
        Ok(Ok(_)) => {
            return problem::Problem::new(problem::ProblemType::BodyTooLarge)
                .detail(format!(
                    "The body is over this endpoint's limit ({UNAUTHENTICATED_BODY_LIMIT} bytes)."
                ))
                .into_response();
        }
        Ok(Err(err))
            if std::error::Error::source(&err)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>()) =>
        {
            return problem::Problem::new(problem::ProblemType::BodyTooLarge)
                .detail(format!(
                    "The body is over this endpoint's limit ({UNAUTHENTICATED_BODY_LIMIT} bytes)."
                ))
                .into_response();
        }
        Ok(Err(_)) => {
            return problem::Problem::new(problem::ProblemType::MalformedJson)
                .detail("The body could not be read.")
                .into_response();
        }
        Err(_) => {
            state
                .metrics
                .http_limited
                .get_or_create(&LimitLabel {
                    limit: "body_timeout",
                })
                .inc();
            return problem::Problem::new(problem::ProblemType::BodyTimeout)
                .detail(format!(
                    "The body was not received within {}: nothing was read or stored. Send it again, whole.",
                    humantime::format_duration(within)
                ))
                .into_response();
        }
    };
    // Read: the slot was for the read only (a handler waiting on a gateway or the
    // database is what the limit itself is for).
    drop(slot);
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

/// What a door answers when one of its limits stops a request. Written here rather than
/// taken from tower-http's timeout layer, whose answer is an empty 408: every pagos error
/// is problem+json with a stable type, and a 503 + Retry-After tells clients to retry.
fn refused(
    metrics: &Metrics,
    cut_after: Duration,
    method: &Method,
    uri: &Uri,
    err: &tower::BoxError,
) -> Response {
    let limited = |limit| {
        metrics
            .http_limited
            .get_or_create(&LimitLabel { limit })
            .inc()
    };
    if err.is::<tower::load_shed::error::Overloaded>() {
        limited("max_in_flight");
        // One line per shed request would flood the logs exactly under overload: the
        // counter pagos_http_limited_total tells it.
        tracing::debug!(%method, path = uri.path(), "request shed: PAGOS_MAX_IN_FLIGHT requests in progress");
        return problem::Problem::new(problem::ProblemType::Overloaded)
            .detail("Too many requests are in progress. This one was not started and nothing was stored: retry it, with the same Idempotency-Key, after the time in Retry-After.")
            .retry_after(1)
            .into_response();
    }
    if err.is::<tower::timeout::error::Elapsed>() {
        limited("request_timeout");
        tracing::warn!(%method, path = uri.path(), "request cut at PAGOS_REQUEST_TIMEOUT; work it started goes on");
        if Door::Admin.serves(uri.path()) {
            // On-call's: no key to retry with, and the work is not lost. Asking again
            // before reading what it did would run a second pass, or be refused.
            return problem::Problem::new(problem::ProblemType::RequestTimeout)
                .detail(format!(
                    "The request took longer than {} and was answered before its end. What it started goes on in the background: a reconciliation pass finishes and logs its report (\"reconciliation pass done\"); a resolution, once written, shows on the payment. Read the payment (GET /admin/pagos/{{id}}) before asking again.",
                    humantime::format_duration(cut_after)
                ))
                .into_response();
        }
        return problem::Problem::new(problem::ProblemType::RequestTimeout)
            .detail(format!(
                "The request took longer than {} and was answered before its end. A payment it started goes on: retry with the same Idempotency-Key to get its outcome.",
                humantime::format_duration(cut_after)
            ))
            .retry_after(1)
            .into_response();
    }
    problem::ApiError::Internal(anyhow::anyhow!("a door's limits failed: {err}")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_served_on_the_door_its_prefix_names() {
        let cases = [
            ("/admin/pagos", false, true),
            ("/admin/cargos-huerfanos", false, true),
            ("/admin", false, true),
            ("/consola", false, true),
            ("/consola/pagos/1", false, true),
            ("/metrics", false, true),
            ("/v1/pagos", true, false),
            ("/v1/webhooks/stripe", true, false),
            ("/openapi.json", true, false),
            ("/administrador", true, false),
            ("/metricsx", true, false),
            ("/healthz", true, true),
            ("/readyz", true, true),
        ];
        for (path, public, admin) in cases {
            assert_eq!(
                Door::Public.serves(path),
                public,
                "{path} on the public door"
            );
            assert_eq!(Door::Admin.serves(path), admin, "{path} on the admin door");
            assert!(Door::Only.serves(path), "{path} with one door");
        }
    }
}
