//! Operations endpoints and the OpenAPI document.

use crate::helpers::{Backend, Spawn, has_line};
use crate::on_both_databases;

on_both_databases!(
    health_and_readiness_answer,
    the_openapi_document_requires_the_idempotency_key
);

async fn health_and_readiness_answer(backend: Backend) {
    let app = crate::helpers::started_sandbox(backend, &["--metrics-refresh", "100ms"]).await;
    for path in ["/healthz", "/readyz"] {
        let answer = app.get(path).await;
        assert_eq!(answer.status(), 200, "{path}");
    }
    app.db.clone().close().await.expect("close pool");
    let answer = app.get("/readyz").await;
    assert_eq!(
        answer.status(),
        503,
        "readyz reports a database it cannot reach"
    );
    // The gauges are read in the background: the next refresh finds the database gone,
    // and then no stale gauge is shown.
    app.scrape_until("the database down and no stale gauges", |metrics| {
        has_line(metrics, "pagos_database_up 0") && !metrics.contains("pagos_payments{")
    })
    .await;
}

async fn the_openapi_document_requires_the_idempotency_key(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1"))
    );
    let post = &doc["paths"]["/v1/pagos"]["post"];
    let key = crate::helpers::header_parameter(post, "Idempotency-Key", "POST /v1/pagos");
    assert_eq!(key["required"], true);
    crate::helpers::assert_responses(post, &["201", "202", "402", "409", "422"], "POST /v1/pagos");
    assert!(doc["paths"]["/v1/pagos/{id}"]["get"].is_object());
}
