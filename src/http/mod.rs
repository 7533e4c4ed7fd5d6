//! The HTTP surface: one router per room, merged here so the whole API fits on one
//! screen, and the OpenAPI document generated from the same routes.

pub mod admin;
pub mod auth;
pub mod ops;
pub mod payments;
pub mod problem;
pub mod webhooks;

use crate::app::App;
use axum::Router;
use axum::response::IntoResponse;
use std::ops::Deref;
use std::sync::Arc;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

/// The state every handler shares: cheap to clone.
#[derive(Clone)]
pub struct AppState(pub Arc<App>);

impl Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "pagos",
        description = "Payments through external gateways, safe to retry. Every error is application/problem+json (RFC 9457) with a stable `type`."
    ),
    modifiers(&Security),
    components(schemas(crate::domain::FieldError))
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
    let method = request.method().as_str().to_owned();
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

/// The whole API and its OpenAPI document, from the same route list.
pub fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(payments::router())
        .merge(webhooks::router())
        .merge(admin::router())
        .merge(ops::router())
        .split_for_parts()
}

pub fn router(state: AppState) -> Router {
    let (router, openapi) = api();
    let document = openapi.to_json().unwrap_or_default();
    router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let document = document.clone();
                async move { ([("content-type", "application/json")], document).into_response() }
            }),
        )
        // A route layer runs after routing, so the route template is known.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .fallback(|| async {
            problem::Problem::new(problem::Kind::NotFound).detail("No such endpoint.")
        })
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
