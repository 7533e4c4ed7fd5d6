//! Stripe on wiremock creating every PaymentIntent it is asked for, succeeded: the
//! fixture, made about the payment that asked (its id, amount, currency and reference).

use serde_json::{Value, json};
use wiremock::{Request, Respond, ResponseTemplate};

pub struct StripeSucceeds;

impl Respond for StripeSucceeds {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let form: std::collections::HashMap<String, String> =
            url::form_urlencoded::parse(&request.body)
                .into_owned()
                .collect();
        let mut intent: Value = serde_json::from_str(include_str!(
            "../../fixtures/stripe/payment_intent_succeeded.json"
        ))
        .expect("fixture");
        let reference = form
            .get("metadata[pagos_reference]")
            .cloned()
            .unwrap_or_default();
        let id: String = reference.replace('-', "").chars().take(24).collect();
        let amount = form.get("amount").and_then(|a| a.parse::<i64>().ok());
        intent["id"] = json!(format!("pi_{id}"));
        intent["amount"] = json!(amount);
        intent["amount_received"] = json!(amount);
        intent["currency"] = json!(form.get("currency"));
        intent["metadata"]["pagos_reference"] = json!(reference);
        ResponseTemplate::new(200).set_body_json(intent)
    }
}
