//! Gateway webhooks: `POST /v1/webhooks/http`. (Being written.)

use super::AppState;
use utoipa_axum::router::OpenApiRouter;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
}
