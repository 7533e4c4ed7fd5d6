//! The merchant's event list (`GET /v1/eventos`, in the order the writes' transactions
//! began) never tells a payment's `montoReembolsado` smaller than the completed refunds
//! listed before it, when a refund completes while the payment moves (a contradicting
//! gateway event, on-call's resolution). Real `pagos serve` processes, each holding one
//! writer inside its window (`PAGOS_PAUSE_AT`) while the other writes.

use crate::helpers::{API_KEY, Backend, json, keyed_read, payment_body, timestamped_signature};
use crate::on_both_databases;
use crate::process::{Serve, serving};
use crate::refunds::FakeRefunds;
use serde_json::{Value, json};
use std::time::Duration;

on_both_databases!(
    a_refund_completing_while_its_payment_moves_is_never_listed_above_a_smaller_refunded_amount,
);

const SECRET: &str = "whsec_event_order";

type World = crate::process::World<FakeRefunds>;

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn keyed(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        keyed_read(&self.http, &format!("{}{path}", self.url), key, body).await
    }

    /// A reference-protocol gateway event, signed.
    fn event(&self, id: &str, kind: &str, sequence: i64, data: Value) -> reqwest::RequestBuilder {
        let body = serde_json::to_vec(&json!({
            "id": id, "type": kind, "sequence": sequence, "data": data,
        }))
        .expect("JSON");
        let signature = timestamped_signature(SECRET, chrono::Utc::now().timestamp(), &body);
        self.http
            .post(format!("{}/v1/webhooks/http", self.url))
            .header("Content-Type", "application/json")
            .header("Gateway-Signature", signature)
            .body(body)
    }

    /// A COMPLETADA payment (`key`) with a refund of 50000 the provider holds pending: the
    /// payment's id and charge, and the refund's id and the provider's refund.
    async fn refund_pending(&self, world: &World, key: &str) -> [String; 4] {
        world.fake.refunding("succeeded");
        let (status, pago) = self.keyed("/v1/pagos", key, &payment_body()).await;
        assert_eq!(status, 201, "{pago}");
        let id = pago["id"].as_str().expect("id").to_owned();
        let charge = pago["gatewayRef"].as_str().expect("charge").to_owned();
        world.fake.refunding("pending");
        let (status, reembolso) = self
            .keyed(
                &format!("/v1/pagos/{id}/reembolsos"),
                &format!("{key}-refund"),
                &json!({"monto": 50000}),
            )
            .await;
        assert_eq!(status, 202, "{reembolso}");
        let refund = reembolso["id"].as_str().expect("id").to_owned();
        let made = world
            .fake
            .made()
            .last()
            .cloned()
            .expect("a provider refund");
        let provider_refund = made["id"].as_str().expect("id").to_owned();
        [id, charge, refund, provider_refund]
    }

    fn charge_declined(&self, id: &str, payment: &str, charge: &str) -> reqwest::RequestBuilder {
        let data = json!({"id": charge, "status": "declined", "amount": 250000, "currency": "COP",
                          "reference": payment, "declineCode": "charged_back"});
        self.event(id, "charge.updated", 2, data)
    }

    fn refund_succeeded(
        &self,
        id: &str,
        refund: &str,
        provider_refund: &str,
        charge: &str,
    ) -> reqwest::RequestBuilder {
        let data = json!({"id": provider_refund, "status": "succeeded", "charge": charge,
                          "amount": 50000, "currency": "COP", "reference": refund});
        self.event(id, "refund.updated", 2, data)
    }

    /// The merchant's events, in their list's order.
    async fn events(&self) -> Vec<Value> {
        let page = self
            .http
            .get(format!("{}/v1/eventos?limite=100", self.url))
            .bearer_auth(API_KEY)
            .send()
            .await
            .expect("answered");
        assert_eq!(page.status(), 200);
        json(page).await["eventos"]
            .as_array()
            .cloned()
            .expect("eventos")
    }
}

async fn delivered(request: reqwest::RequestBuilder) -> tokio::task::JoinHandle<u16> {
    tokio::spawn(async move { request.send().await.expect("answered").status().as_u16() })
}

/// Before, a payment event summed its refunds before its write without holding anything a
/// completing refund waits for: a refund whose transaction began first and committed after
/// the sum was listed above a `pago.*` event that left it out (its `montoReembolsado` 0
/// after a `reembolso.completado` of 50000): a merchant taking the payment's figure from
/// its last event recorded nothing given back.
async fn a_refund_completing_while_its_payment_moves_is_never_listed_above_a_smaller_refunded_amount(
    backend: Backend,
) {
    let world = World::unmounted(backend, FakeRefunds::default()).await;
    crate::helpers::FakeGateway::charging("succeeded")
        .mount(&world.gateway)
        .await;
    world.fake.mount_refunds(&world.gateway).await;
    let uri = world.gateway.uri();
    let args = serving(
        &world.database.url,
        &uri,
        &[
            "--webhook-secret",
            SECRET,
            "--reconcile-every",
            "1h",
            "--admin-token",
            crate::helpers::ADMIN_TOKEN,
        ],
    );
    let server = Serve::start(
        &args,
        &[(
            "PAGOS_PAUSE_AT",
            "refund_event_recorded:1500,after_refunded_sum:1500",
        )],
    )
    .await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };

    // A gateway event contradicting the payment's charge (to REVISION_MANUAL) while the
    // refund's event, which began first, waits inside its transaction.
    let [payment, charge, refund, provider_refund] = client.refund_pending(&world, "k-1").await;
    let refunded =
        delivered(client.refund_succeeded("evt_re_1", &refund, &provider_refund, &charge)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let contradicted = delivered(client.charge_declined("evt_ch_1", &payment, &charge)).await;
    assert_eq!(refunded.await.expect("joined"), 200, "{}", server.logs());
    assert_eq!(
        contradicted.await.expect("joined"),
        200,
        "{}",
        server.logs()
    );

    // On-call's resolution, which sums first and waits, while the refund's event comes.
    let [payment, charge, refund, provider_refund] = client.refund_pending(&world, "k-2").await;
    let declined = client
        .charge_declined("evt_ch_2", &payment, &charge)
        .send()
        .await
        .expect("sent");
    assert_eq!(declined.status(), 200);
    let resolution = client
        .http
        .post(format!("{}/admin/pagos/{payment}/resolucion", server.url))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(
            &json!({"estado": "COMPLETADA", "motivo": "the dispute was won",
                      "contraProveedor": "the dashboard shows the charge kept"}),
        );
    let resolved = delivered(resolution).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let refunded =
        delivered(client.refund_succeeded("evt_re_2", &refund, &provider_refund, &charge)).await;
    assert_eq!(resolved.await.expect("joined"), 200, "{}", server.logs());
    assert_eq!(refunded.await.expect("joined"), 200, "{}", server.logs());

    let events = client.events().await;
    let mut completed: std::collections::HashMap<String, i64> = Default::default();
    let mut told = 0;
    for event in &events {
        let tipo = event["tipo"].as_str().expect("tipo");
        let datos = &event["datos"];
        if tipo == "reembolso.completado" {
            let of = datos["pagoId"].as_str().expect("pagoId").to_owned();
            *completed.entry(of).or_default() += datos["monto"].as_i64().expect("monto");
        } else if tipo.starts_with("pago.") {
            let of = datos["id"].as_str().expect("id");
            let before = completed.get(of).copied().unwrap_or(0);
            let said = datos["montoReembolsado"]
                .as_i64()
                .expect("montoReembolsado");
            assert!(
                said >= before,
                "{tipo} of {of} says montoReembolsado {said} below the {before} completed before it: {events:#?}"
            );
            told += 1;
        }
    }
    assert_eq!(
        completed.values().sum::<i64>(),
        100_000,
        "both refunds listed: {events:#?}"
    );
    assert!(told >= 4, "the payments' events: {events:#?}");
}
