//! The merchant's payment request (`POST /v1/pagos`), parsed from JSON into types that are
//! valid by construction. Pure: no I/O. The server parses every request with it, and the
//! client builds its requests with it, so a request the client accepts is one the server
//! accepts.
//!
//! Validation reports every offending field at once, so a merchant fixes a request in one
//! round trip. What a payment needs depends on the configured gateway (`GatewayNeeds`):
//! Stripe and Mercado Pago cannot charge without a `medioPago`, the sandbox never asks.
//! `monto` has a ceiling: the smallest of what JSON clients carry exactly (2^53 − 1), the
//! operator's maximum (`PAGOS_MAX_MONTO`) and the gateway's maximum for the currency, so
//! an amount no client or gateway can carry is refused before anything is stored.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A currency pagos accepts, with its ISO 4217 minor-unit exponent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Currency {
    code: &'static str,
    exponent: u8,
}

/// The currencies the service supports (ISO 4217 code, minor-unit exponent).
pub const CURRENCIES: &[(&str, u8)] = &[
    ("ARS", 2),
    ("BRL", 2),
    ("CLP", 0),
    ("COP", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("MXN", 2),
    ("PEN", 2),
    ("USD", 2),
    ("UYU", 2),
];

impl Currency {
    pub fn parse(code: &str) -> Option<Currency> {
        CURRENCIES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(code, exponent)| Currency { code, exponent })
    }

    pub fn code(self) -> &'static str {
        self.code
    }

    /// Digits after the decimal point in this currency's major unit (COP: 2, CLP: 0).
    pub fn exponent(self) -> u8 {
        self.exponent
    }
}

/// The largest `monto` pagos ever accepts: 2^53 − 1 (JavaScript's
/// `Number.MAX_SAFE_INTEGER`). Above it, JavaScript clients and every JSON reader that
/// keeps numbers as doubles read another number than the one sent, so a merchant's
/// dashboard would show, and a client would resend, an amount that is not the payment's.
pub const MAX_SAFE_AMOUNT: i64 = (1 << 53) - 1;

/// Stripe's maximum `amount` for most currencies: eight digits ("The amount value supports
/// up to eight digits", PaymentIntents API reference; docs.stripe.com/currencies, "Minimum
/// and maximum charge amounts"). For every currency pagos supports, Stripe's unit is the
/// ISO 4217 minor unit that `monto` is written in (`gateway::amount` tests it).
pub const STRIPE_MAX_AMOUNT: i64 = 99_999_999;

/// Stripe's maximum `amount` in COP: ten digits, the one documented exception among the
/// currencies pagos supports (docs.stripe.com/currencies: "10 digits for COP, for a
/// maximum charge of 99,999,999.99 COP"). Stripe documents more for card payments in
/// every currency (12 digits), but pagos cannot tell a saved card from another method
/// before charging, so it holds to what every method takes.
pub const STRIPE_MAX_AMOUNT_COP: i64 = 9_999_999_999;

/// The largest amount pagos sends to Mercado Pago. Mercado Pago documents no maximum for
/// `transaction_amount` (limits are per payment method and per account); this is pagos'
/// own: the amount goes as a decimal number, exact only below 10^15 minor units
/// (`gateway::amount::to_decimal`).
pub const MERCADOPAGO_MAX_AMOUNT: i64 = 999_999_999_999_999;

pub const MAX_CREDIT_ID_LEN: usize = 64;
pub const MAX_DESCRIPTION_LEN: usize = 255;

/// A validated `POST /v1/pagos` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPayment {
    pub credit_id: String,
    /// Positive, in minor units of `currency`.
    pub amount: i64,
    pub currency: Currency,
    pub description: Option<String>,
    /// How the payer pays (`medioPago`): what the configured gateway charges.
    pub payment_method: Option<PaymentMethod>,
}

/// The payer's payment method (`medioPago`), one shape for every gateway; each gateway
/// uses the fields it knows (see `GatewayNeeds`):
///
/// ```json
/// {"id":"pm_1Q0PsIJvEtkwdCNYMSaVuRz6","cliente":"cus_NffrFeUfNV2Hib"}
/// {"id":"visa","token":"ff8080814c11e237014c1ff593b57b4d","cuotas":1,
///  "email":"payer@example.com","documento":{"tipo":"CC","numero":"1020304050"}}
/// ```
///
/// A bare string is the same as `{"id": …}`. Never card data: Stripe's saved methods and
/// Mercado Pago's card tokens stand for a card without being one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentMethod {
    /// Stripe: a saved PaymentMethod (`pm_…`). Mercado Pago: a `payment_method_id`
    /// (`visa`, `master`, `efecty`, `pix`, …).
    pub id: String,
    /// Stripe: the Customer the saved method is attached to (`cus_…`).
    pub customer: Option<String>,
    /// Mercado Pago: the card token made by Mercado Pago's JS SDK (cards only).
    pub token: Option<String>,
    /// Mercado Pago: installments of a card payment (1 when a token comes without it).
    pub installments: Option<u32>,
    /// Mercado Pago: the card issuer (`issuer_id`).
    pub issuer: Option<String>,
    /// Mercado Pago: the payer's e-mail (required by Mercado Pago).
    pub payer_email: Option<String>,
    /// Mercado Pago: the payer's identification document.
    pub document: Option<PayerDocument>,
}

/// A payer's identification document (`{"tipo":"CC","numero":"1020304050"}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayerDocument {
    /// `CC`, `CE`, `NIT` (Colombia), `CPF` (Brazil), `DNI` (Argentina), …
    pub kind: String,
    pub number: String,
}

/// What the configured gateway needs from a payment request beyond the contract's
/// basics: pure data, so the rules can be checked before anything is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewayNeeds {
    /// Sandbox and reference protocol: `medioPago` optional, not sent to the gateway.
    Nothing,
    /// Stripe: `medioPago` required, `id` a saved PaymentMethod `pm_…`, optional `cliente`
    /// (`cus_…`); Mercado Pago's fields are refused.
    Stripe,
    /// Mercado Pago: `medioPago` required with `id` and `email`; `token`, `cuotas`,
    /// `emisor`, `documento` optional (`cuotas` and `emisor` only with a `token`);
    /// `moneda` one Mercado Pago operates in.
    MercadoPago,
}

/// The currencies Mercado Pago operates in (one per country it serves).
pub const MERCADOPAGO_CURRENCIES: &[&str] = &["ARS", "BRL", "CLP", "COP", "MXN", "PEN", "UYU"];

/// One offending field, as listed in a 422 problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    /// The JSON field name, as the merchant sent it.
    pub campo: String,
    /// What is wrong, for a human.
    pub detalle: String,
}

/// What a free-text field says of a NUL in it: PostgreSQL cannot store one in text, so
/// a request holding it would fail at the database, as a 503 to retry, again and again.
pub(crate) const NUL_REFUSED: &str = "must not contain the NUL character (\\u0000)";

fn field_error(campo: &str, detalle: impl Into<String>) -> FieldError {
    FieldError {
        campo: campo.to_owned(),
        detalle: detalle.into(),
    }
}

const KNOWN_FIELDS: [&str; 5] = ["creditoId", "monto", "moneda", "descripcion", "medioPago"];

impl NewPayment {
    /// Parses a JSON body already known to be syntactically valid JSON, with no gateway's
    /// needs (`medioPago` optional) and no ceiling but `MAX_SAFE_AMOUNT`.
    pub fn from_json(body: &Value) -> Result<NewPayment, Vec<FieldError>> {
        NewPayment::from_json_for(body, GatewayNeeds::Nothing, MAX_SAFE_AMOUNT)
    }

    /// Parses a body for a gateway with `needs`, under the operator's ceiling `max_amount`
    /// (`PAGOS_MAX_MONTO`): every offending field at once, the gateway's own requirements
    /// and maximum included.
    pub fn from_json_for(
        body: &Value,
        needs: GatewayNeeds,
        max_amount: i64,
    ) -> Result<NewPayment, Vec<FieldError>> {
        let Some(object) = body.as_object() else {
            return Err(vec![field_error(
                "(cuerpo)",
                "the body must be a JSON object",
            )]);
        };
        let mut errors = Vec::new();
        for name in object.keys() {
            if !KNOWN_FIELDS.contains(&name.as_str()) {
                errors.push(field_error(name, "unknown field"));
            }
        }
        let credit_id = parse_credit_id(object).map_err(|e| errors.push(e)).ok();
        // The currency first (its errors still listed after `monto`'s): the gateway's
        // maximum depends on it.
        let parsed_currency = parse_currency(object);
        let ceiling = Ceiling::of(needs, max_amount, parsed_currency.as_ref().ok().copied());
        let amount = parse_amount(object, &ceiling)
            .map_err(|e| errors.push(e))
            .ok();
        let currency = parsed_currency.map_err(|e| errors.push(e)).ok();
        let description = parse_description(object).map_err(|e| errors.push(e)).ok();
        let payment_method = match object.get("medioPago") {
            None | Some(Value::Null) => Some(None),
            Some(value) => match PaymentMethod::from_json(value) {
                Ok(method) => Some(Some(method)),
                Err(mut found) => {
                    errors.append(&mut found);
                    None
                }
            },
        };
        if let (Some(amount), Some(currency)) = (amount, currency)
            && let Some(why) = needs.amount_precision_error(amount, currency)
        {
            errors.push(field_error("monto", why));
        }
        if let Some(method) = &payment_method {
            errors.extend(needs.check(method.as_ref(), currency));
        }
        match (credit_id, amount, currency, description, payment_method) {
            (
                Some(credit_id),
                Some(amount),
                Some(currency),
                Some(description),
                Some(payment_method),
            ) if errors.is_empty() => Ok(NewPayment {
                credit_id,
                amount,
                currency,
                description,
                payment_method,
            }),
            _ => Err(errors),
        }
    }
}

/// The largest `monto` a request may carry, and why: the lowest of the limits that apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub max: i64,
    /// What a merchant is told when `monto` is above `max`.
    pub why: String,
}

impl Ceiling {
    /// The ceiling for a payment through a gateway with `needs`, under the operator's
    /// `max_amount`, in `currency` (None when `moneda` is invalid: the gateway's maximum
    /// is then unknown, and the other limits still hold).
    pub fn of(needs: GatewayNeeds, max_amount: i64, currency: Option<Currency>) -> Ceiling {
        let mut ceiling = Ceiling {
            max: MAX_SAFE_AMOUNT,
            why: format!(
                "at most {MAX_SAFE_AMOUNT} (2^53 − 1): larger whole numbers are not exact in \
                 JavaScript and other JSON clients"
            ),
        };
        if max_amount < ceiling.max {
            ceiling = Ceiling {
                max: max_amount,
                why: format!("at most {max_amount}: the largest amount this service accepts"),
            };
        }
        if let Some((gateway, max, currency)) =
            currency.and_then(|c| needs.max_amount(c).map(|(g, max)| (g, max, c)))
            && max < ceiling.max
        {
            let code = currency.code();
            ceiling = Ceiling {
                max,
                why: format!(
                    "at most {max} for {code} ({} {code}): the largest amount {gateway} charges in {code}",
                    major_units(max, currency.exponent()),
                ),
            };
        }
        ceiling
    }
}

/// `amount` minor units written in major units: 99999999 (2) → "999999.99".
pub fn major_units(amount: i64, exponent: u8) -> String {
    let digits = amount.unsigned_abs().to_string();
    let exponent = usize::from(exponent);
    let sign = if amount < 0 { "-" } else { "" };
    if exponent == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = exponent + 1);
    let (whole, fraction) = padded.split_at(padded.len() - exponent);
    format!("{sign}{whole}.{fraction}")
}

impl GatewayNeeds {
    /// The gateway's name and its maximum `monto` in `currency`, in minor units (None:
    /// the sandbox and the reference protocol have none of their own).
    pub fn max_amount(self, currency: Currency) -> Option<(&'static str, i64)> {
        match self {
            GatewayNeeds::Nothing => None,
            GatewayNeeds::Stripe if currency.code() == "COP" => {
                Some(("Stripe", STRIPE_MAX_AMOUNT_COP))
            }
            GatewayNeeds::Stripe => Some(("Stripe", STRIPE_MAX_AMOUNT)),
            GatewayNeeds::MercadoPago => {
                Some(("pagos' Mercado Pago adapter", MERCADOPAGO_MAX_AMOUNT))
            }
        }
    }

    /// The gateway's name and the step its amounts in `currency` must be a multiple of, in
    /// minor units, where it takes fewer decimals than the currency has (None: any whole
    /// number of minor units). Mercado Pago takes Colombian pesos only in whole pesos
    /// ("Prices in COP currency must be expressed with integer values"): a `monto` of
    /// 250050 COP (2500.50) would be refused with a 400 once stored and sent, and the
    /// merchant told the payment failed.
    pub fn amount_step(self, currency: Currency) -> Option<(&'static str, i64)> {
        match self {
            GatewayNeeds::MercadoPago if currency.code() == "COP" => Some(("Mercado Pago", 100)),
            _ => None,
        }
    }

    /// Whether some currency's amounts must be a multiple of a step (`amount_step`).
    pub fn steps_amounts(self) -> bool {
        matches!(self, GatewayNeeds::MercadoPago)
    }

    /// What a merchant is told of an `amount` in `currency` this gateway cannot take for
    /// its precision (None: it can).
    pub fn amount_precision_error(self, amount: i64, currency: Currency) -> Option<String> {
        let (gateway, step) = self.amount_step(currency)?;
        (amount % step != 0).then(|| {
            let code = currency.code();
            format!(
                "{gateway} takes {code} in whole units only: a multiple of {step} ({} {code}, not {} {code})",
                major_units(amount - amount % step, currency.exponent()),
                major_units(amount, currency.exponent()),
            )
        })
    }

    /// What is missing or misplaced for this gateway (empty: nothing). `method` is the
    /// parsed `medioPago` (None: absent); `currency` None when `moneda` was invalid.
    pub fn check(
        self,
        method: Option<&PaymentMethod>,
        currency: Option<Currency>,
    ) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let (gateway, example) = match self {
            GatewayNeeds::Nothing => return errors,
            GatewayNeeds::Stripe => (
                "Stripe",
                "a saved PaymentMethod id such as \"pm_1Q0PsIJvEtkwdCNYMSaVuRz6\"",
            ),
            GatewayNeeds::MercadoPago => (
                "Mercado Pago",
                "an object with `id` (payment_method_id such as \"visa\" or \"efecty\") and `email`",
            ),
        };
        let Some(method) = method else {
            errors.push(field_error(
                "medioPago",
                format!("required by the configured gateway ({gateway}): {example}"),
            ));
            return errors;
        };
        let unused = |errors: &mut Vec<FieldError>, present: bool, field: &str| {
            if present {
                errors.push(field_error(
                    &format!("medioPago.{field}"),
                    format!("not used by {gateway}; remove it"),
                ));
            }
        };
        match self {
            GatewayNeeds::Nothing => {}
            GatewayNeeds::Stripe => {
                if !method.id.starts_with("pm_") {
                    errors.push(field_error(
                        "medioPago.id",
                        "a saved Stripe PaymentMethod id, starting with \"pm_\"",
                    ));
                }
                if method
                    .customer
                    .as_deref()
                    .is_some_and(|c| !c.starts_with("cus_"))
                {
                    errors.push(field_error(
                        "medioPago.cliente",
                        "a Stripe Customer id, starting with \"cus_\"",
                    ));
                }
                unused(&mut errors, method.token.is_some(), "token");
                unused(&mut errors, method.installments.is_some(), "cuotas");
                unused(&mut errors, method.issuer.is_some(), "emisor");
                unused(&mut errors, method.payer_email.is_some(), "email");
                unused(&mut errors, method.document.is_some(), "documento");
            }
            GatewayNeeds::MercadoPago => {
                if method.payer_email.is_none() {
                    errors.push(field_error(
                        "medioPago.email",
                        "required by Mercado Pago: the payer's e-mail",
                    ));
                }
                unused(&mut errors, method.customer.is_some(), "cliente");
                if method.token.is_none() {
                    for (present, field) in [
                        (method.installments.is_some(), "cuotas"),
                        (method.issuer.is_some(), "emisor"),
                    ] {
                        if present {
                            errors.push(field_error(
                                &format!("medioPago.{field}"),
                                "only for card payments, with a `token`",
                            ));
                        }
                    }
                }
                if let Some(currency) = currency
                    && !MERCADOPAGO_CURRENCIES.contains(&currency.code())
                {
                    errors.push(field_error(
                        "moneda",
                        format!(
                            "Mercado Pago does not charge in {}; it charges in {}",
                            currency.code(),
                            MERCADOPAGO_CURRENCIES.join(", ")
                        ),
                    ));
                }
            }
        }
        errors
    }
}

const MAX_METHOD_ID_LEN: usize = 255;
const MAX_EMAIL_LEN: usize = 254;
const MAX_INSTALLMENTS: u64 = 48;
const METHOD_FIELDS: [&str; 7] = [
    "id",
    "cliente",
    "token",
    "cuotas",
    "emisor",
    "email",
    "documento",
];

/// An identifier a gateway gave: 1–255 ASCII letters, digits, `_`, `-` or `.`.
fn parse_identifier(
    campo: &str,
    value: Option<&Value>,
    max: usize,
) -> Result<Option<String>, FieldError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s))
            if !s.is_empty()
                && s.len() <= max
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) =>
        {
            Ok(Some(s.clone()))
        }
        Some(Value::String(_)) => Err(field_error(
            campo,
            format!("1–{max} ASCII letters, digits, '_', '-' or '.'"),
        )),
        Some(_) => Err(field_error(campo, "must be a string")),
    }
}

impl PaymentMethod {
    /// Parses `medioPago` (a string id, or an object); every offending field at once.
    pub fn from_json(value: &Value) -> Result<PaymentMethod, Vec<FieldError>> {
        let object = match value {
            Value::String(_) => {
                let id = parse_identifier("medioPago", Some(value), MAX_METHOD_ID_LEN)
                    .map_err(|e| vec![e])?;
                return Ok(PaymentMethod::with_id(id.unwrap_or_default()));
            }
            Value::Object(object) => object,
            _ => {
                return Err(vec![field_error(
                    "medioPago",
                    "must be a payment method id (string) or an object with `id`",
                )]);
            }
        };
        let mut errors = Vec::new();
        for name in object.keys() {
            if !METHOD_FIELDS.contains(&name.as_str()) {
                errors.push(field_error(&format!("medioPago.{name}"), "unknown field"));
            }
        }
        let mut ok =
            |r: Result<Option<String>, FieldError>| r.map_err(|e| errors.push(e)).ok().flatten();
        let id = ok(parse_identifier(
            "medioPago.id",
            object.get("id"),
            MAX_METHOD_ID_LEN,
        ));
        let customer = ok(parse_identifier(
            "medioPago.cliente",
            object.get("cliente"),
            MAX_METHOD_ID_LEN,
        ));
        let token = ok(parse_identifier(
            "medioPago.token",
            object.get("token"),
            MAX_METHOD_ID_LEN,
        ));
        let issuer = ok(parse_identifier(
            "medioPago.emisor",
            object.get("emisor"),
            64,
        ));
        let payer_email = ok(parse_email(object.get("email")));
        if id.is_none() && object.get("id").is_none_or(Value::is_null) {
            errors.push(field_error("medioPago.id", "required"));
        }
        let installments = match object.get("cuotas") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (1..=MAX_INSTALLMENTS).contains(&v) => u32::try_from(v).ok(),
                _ => {
                    errors.push(field_error(
                        "medioPago.cuotas",
                        format!("a whole number between 1 and {MAX_INSTALLMENTS}"),
                    ));
                    None
                }
            },
            Some(_) => {
                errors.push(field_error("medioPago.cuotas", "must be a number"));
                None
            }
        };
        let document = match object.get("documento") {
            None | Some(Value::Null) => None,
            Some(Value::Object(doc)) => {
                let mut doc_errors = Vec::new();
                for name in doc.keys() {
                    if name != "tipo" && name != "numero" {
                        doc_errors.push(field_error(
                            &format!("medioPago.documento.{name}"),
                            "unknown field",
                        ));
                    }
                }
                let kind = parse_identifier("medioPago.documento.tipo", doc.get("tipo"), 20);
                let number = parse_identifier("medioPago.documento.numero", doc.get("numero"), 30);
                match (kind, number) {
                    (Ok(Some(kind)), Ok(Some(number))) if doc_errors.is_empty() => {
                        Some(PayerDocument { kind, number })
                    }
                    (kind, number) => {
                        for (result, field) in [(kind, "tipo"), (number, "numero")] {
                            match result {
                                Err(e) => doc_errors.push(e),
                                Ok(None) => doc_errors.push(field_error(
                                    &format!("medioPago.documento.{field}"),
                                    "required",
                                )),
                                Ok(Some(_)) => {}
                            }
                        }
                        errors.append(&mut doc_errors);
                        None
                    }
                }
            }
            Some(_) => {
                errors.push(field_error(
                    "medioPago.documento",
                    "must be an object with `tipo` and `numero`",
                ));
                None
            }
        };
        match id {
            Some(id) if errors.is_empty() => Ok(PaymentMethod {
                id,
                customer,
                token,
                installments,
                issuer,
                payer_email,
                document,
            }),
            _ => Err(errors),
        }
    }

    pub fn with_id(id: impl Into<String>) -> PaymentMethod {
        PaymentMethod {
            id: id.into(),
            customer: None,
            token: None,
            installments: None,
            issuer: None,
            payer_email: None,
            document: None,
        }
    }

    /// The contract's JSON form (what is stored on the payment and parsed back).
    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("id".into(), Value::String(self.id.clone()));
        let mut put = |name: &str, value: &Option<String>| {
            if let Some(v) = value {
                object.insert(name.into(), Value::String(v.clone()));
            }
        };
        put("cliente", &self.customer);
        put("token", &self.token);
        put("emisor", &self.issuer);
        put("email", &self.payer_email);
        if let Some(n) = self.installments {
            object.insert("cuotas".into(), Value::from(n));
        }
        if let Some(doc) = &self.document {
            let mut d = Map::new();
            d.insert("tipo".into(), Value::String(doc.kind.clone()));
            d.insert("numero".into(), Value::String(doc.number.clone()));
            object.insert("documento".into(), Value::Object(d));
        }
        Value::Object(object)
    }
}

fn parse_email(value: Option<&Value>) -> Result<Option<String>, FieldError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            let well_formed = s.len() <= MAX_EMAIL_LEN
                && s.split_once('@').is_some_and(|(local, domain)| {
                    !local.is_empty() && domain.contains('.') && !domain.contains('@')
                })
                && !s.chars().any(|c| c.is_whitespace() || c.is_control());
            if well_formed {
                Ok(Some(s.clone()))
            } else {
                Err(field_error(
                    "medioPago.email",
                    format!("an e-mail address of at most {MAX_EMAIL_LEN} characters"),
                ))
            }
        }
        Some(_) => Err(field_error("medioPago.email", "must be a string")),
    }
}

fn parse_credit_id(object: &Map<String, Value>) -> Result<String, FieldError> {
    match object.get("creditoId") {
        None | Some(Value::Null) => Err(field_error("creditoId", "required")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(field_error("creditoId", "must not be blank"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_CREDIT_ID_LEN => Err(field_error(
            "creditoId",
            format!("at most {MAX_CREDIT_ID_LEN} characters"),
        )),
        Some(Value::String(s)) if s.chars().any(char::is_control) => Err(field_error(
            "creditoId",
            "must not contain control characters",
        )),
        Some(Value::String(s)) if s.chars().any(invisible) => Err(field_error(
            "creditoId",
            "must not contain invisible or direction-changing characters (zero-width, bidi controls, U+FEFF)",
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(field_error("creditoId", "must be a string")),
    }
}

/// A character that shows nothing, or reorders what is shown around it: a `creditoId`
/// holding one reads, in the console and in on-call's search, as another credit's
/// (`42\u{200B}` shown `42`, `\u{202E}24` shown `42`), while pagos keeps them apart.
/// Unicode's zero-width and bidirectional formatting characters, and the byte order mark.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

fn parse_amount(object: &Map<String, Value>, ceiling: &Ceiling) -> Result<i64, FieldError> {
    let too_large = || field_error("monto", ceiling.why.clone());
    match object.get("monto") {
        None | Some(Value::Null) => Err(field_error("monto", "required")),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(v), _) if v > ceiling.max => Err(too_large()),
            (Some(v), _) if v > 0 => Ok(v),
            (Some(_), _) => Err(field_error("monto", "must be greater than zero")),
            // Beyond i64 (a u64, or an integer serde_json could only read as a double).
            (None, _) if n.is_u64() => Err(too_large()),
            (None, Some(f)) if f.fract() == 0.0 && f > ceiling.max as f64 => Err(too_large()),
            (None, Some(f)) if f <= 0.0 => Err(field_error("monto", "must be greater than zero")),
            // Within the limits, written with a fraction or an exponent (250000.0, 2.5e5).
            (None, Some(f)) if f.fract() == 0.0 => Err(field_error(
                "monto",
                "must be written as a whole number, without a decimal point or exponent (250000, not 250000.0)",
            )),
            (None, _) => Err(field_error(
                "monto",
                "must be a whole number of minor units (no decimals)",
            )),
        },
        Some(other) => Err(field_error("monto", must_be_a_number(other))),
    }
}

/// What a `monto` that is not a number is told: what it is instead (`true` is a boolean,
/// `[1]` an array, `"1"` a string).
pub(crate) fn must_be_a_number(value: &Value) -> String {
    let what = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    format!("must be a number, not {what}")
}

fn parse_currency(object: &Map<String, Value>) -> Result<Currency, FieldError> {
    match object.get("moneda") {
        None | Some(Value::Null) => Err(field_error("moneda", "required")),
        Some(Value::String(s)) => Currency::parse(s).ok_or_else(|| {
            let supported: Vec<&str> = CURRENCIES.iter().map(|(c, _)| *c).collect();
            field_error(
                "moneda",
                format!(
                    "unsupported currency {s:?}; supported: {}",
                    supported.join(", ")
                ),
            )
        }),
        Some(_) => Err(field_error("moneda", "must be an ISO 4217 code string")),
    }
}

fn parse_description(object: &Map<String, Value>) -> Result<Option<String>, FieldError> {
    match object.get("descripcion") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() > MAX_DESCRIPTION_LEN => Err(field_error(
            "descripcion",
            format!("at most {MAX_DESCRIPTION_LEN} characters"),
        )),
        Some(Value::String(s)) if s.contains('\0') => Err(field_error("descripcion", NUL_REFUSED)),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error("descripcion", "must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> Vec<String> {
        match NewPayment::from_json(&body) {
            Ok(_) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.campo).collect(),
        }
    }

    #[test]
    fn a_credit_id_that_would_show_as_another_is_refused() {
        for hidden in [
            "42\u{200B}",
            "\u{202E}24",
            "4\u{2066}2",
            "\u{FEFF}42",
            "4\u{00AD}2",
        ] {
            let body = json!({"creditoId": hidden, "monto": 1, "moneda": "COP"});
            assert_eq!(fields(body), vec!["creditoId"], "{hidden:?}");
        }
        let accented = json!({"creditoId": "crédito-42 ñ", "monto": 1, "moneda": "COP"});
        assert!(NewPayment::from_json(&accented).is_ok());
    }

    #[test]
    fn a_descripcion_holding_nul_is_refused_and_other_control_characters_are_not() {
        let body = |d: &str| json!({"creditoId":"42","monto":1,"moneda":"COP","descripcion":d});
        assert_eq!(fields(body("cuota\u{0}1")), ["descripcion"]);
        assert!(fields(body("cuota 1\ncuota 2\t")).is_empty());
    }

    #[test]
    fn the_contract_example_is_valid() {
        let parsed =
            NewPayment::from_json(&json!({"creditoId":"42","monto":250000,"moneda":"COP"}));
        let payment = parsed.expect("valid");
        assert_eq!(payment.amount, 250000);
        assert_eq!(payment.currency.code(), "COP");
        assert_eq!(payment.currency.exponent(), 2);
        assert_eq!(payment.description, None);
    }

    #[test]
    fn every_bad_field_is_reported_at_once() {
        assert_eq!(
            fields(json!({"creditoId":"","monto":0,"moneda":"XXX","extra":1})),
            vec!["extra", "creditoId", "monto", "moneda"]
        );
    }

    #[test]
    fn amounts_must_be_positive_whole_numbers() {
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!("100"),
            json!(1e300),
            json!(null),
        ] {
            assert_eq!(
                fields(json!({"creditoId":"42","monto":bad,"moneda":"COP"})),
                vec!["monto"],
                "{bad}"
            );
        }
    }

    #[test]
    fn a_monto_that_is_not_a_number_is_told_what_it_is() {
        for (written, what) in [
            (json!("250000"), "must be a number, not a string"),
            (json!(true), "must be a number, not a boolean"),
            (json!([1]), "must be a number, not an array"),
            (json!({"valor": 1}), "must be a number, not an object"),
        ] {
            let why = amount_error(
                GatewayNeeds::Nothing,
                MAX_SAFE_AMOUNT,
                written.clone(),
                "COP",
            )
            .expect("refused");
            assert_eq!(why, what, "{written}");
        }
    }

    #[test]
    fn a_whole_amount_written_with_a_point_or_an_exponent_is_refused_for_its_form_not_its_size() {
        for written in [json!(250000.0), json!(2.5e5), json!(1.0)] {
            let why = amount_error(
                GatewayNeeds::Nothing,
                MAX_SAFE_AMOUNT,
                written.clone(),
                "COP",
            )
            .expect("refused");
            assert!(
                why.contains("without a decimal point or exponent"),
                "{written}: {why}"
            );
        }
    }

    #[test]
    fn a_json_array_is_not_a_payment() {
        assert_eq!(fields(json!([1, 2])), vec!["(cuerpo)"]);
    }

    #[test]
    fn lengths_are_bounded() {
        let long = "x".repeat(65);
        assert_eq!(
            fields(
                json!({"creditoId":long,"monto":1,"moneda":"USD","descripcion":"y".repeat(256)})
            ),
            vec!["creditoId", "descripcion"]
        );
    }

    fn fields_for(needs: GatewayNeeds, body: Value) -> Vec<String> {
        match NewPayment::from_json_for(&body, needs, MAX_SAFE_AMOUNT) {
            Ok(_) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.campo).collect(),
        }
    }

    fn with_method(method: Value) -> Value {
        json!({"creditoId":"42","monto":250000,"moneda":"COP","medioPago":method})
    }

    #[test]
    fn medio_pago_is_optional_where_the_gateway_does_not_charge_one() {
        let plain = json!({"creditoId":"42","monto":250000,"moneda":"COP"});
        assert_eq!(
            fields_for(GatewayNeeds::Nothing, plain.clone()),
            Vec::<String>::new()
        );
        let parsed = NewPayment::from_json(&with_method(json!("pm_1"))).expect("valid");
        assert_eq!(parsed.payment_method, Some(PaymentMethod::with_id("pm_1")));
        assert_eq!(
            fields_for(GatewayNeeds::Stripe, plain.clone()),
            vec!["medioPago"]
        );
        assert_eq!(
            fields_for(GatewayNeeds::MercadoPago, plain),
            vec!["medioPago"]
        );
    }

    #[test]
    fn stripe_takes_a_saved_payment_method_and_its_customer() {
        for ok in [
            json!("pm_1Q0PsIJvEtkwdCNYMSaVuRz6"),
            json!({"id":"pm_1Q0PsIJvEtkwdCNYMSaVuRz6","cliente":"cus_NffrFeUfNV2Hib"}),
        ] {
            assert_eq!(
                fields_for(GatewayNeeds::Stripe, with_method(ok.clone())),
                Vec::<String>::new(),
                "{ok}"
            );
        }
        assert_eq!(
            fields_for(GatewayNeeds::Stripe, with_method(json!("visa"))),
            vec!["medioPago.id"]
        );
        assert_eq!(
            fields_for(
                GatewayNeeds::Stripe,
                with_method(json!({"id":"pm_1","cliente":"x","token":"t","email":"a@b.co"}))
            ),
            vec!["medioPago.cliente", "medioPago.token", "medioPago.email"]
        );
    }

    #[test]
    fn mercadopago_needs_a_method_and_the_payers_email() {
        let card = json!({"id":"visa","token":"ff8080814c11e237014c1ff593b57b4d","cuotas":3,
                          "emisor":"310","email":"payer@example.com",
                          "documento":{"tipo":"CC","numero":"1020304050"}});
        assert_eq!(
            fields_for(GatewayNeeds::MercadoPago, with_method(card.clone())),
            Vec::<String>::new()
        );
        let parsed = NewPayment::from_json_for(
            &with_method(card.clone()),
            GatewayNeeds::MercadoPago,
            MAX_SAFE_AMOUNT,
        )
        .expect("valid")
        .payment_method
        .expect("a method");
        assert_eq!(parsed.installments, Some(3));
        assert_eq!(parsed.to_json(), card, "stored as sent");
        assert_eq!(PaymentMethod::from_json(&parsed.to_json()), Ok(parsed));
        assert_eq!(
            fields_for(
                GatewayNeeds::MercadoPago,
                with_method(json!({"id":"efecty"}))
            ),
            vec!["medioPago.email"]
        );
        assert_eq!(
            fields_for(
                GatewayNeeds::MercadoPago,
                with_method(json!({"id":"efecty","email":"p@example.com","cuotas":2}))
            ),
            vec!["medioPago.cuotas"]
        );
        let usd = json!({"creditoId":"42","monto":100,"moneda":"USD",
                         "medioPago":{"id":"efecty","email":"p@example.com"}});
        assert_eq!(fields_for(GatewayNeeds::MercadoPago, usd), vec!["moneda"]);
    }

    #[test]
    fn a_malformed_medio_pago_reports_each_bad_field() {
        assert_eq!(
            fields(with_method(
                json!({"id":"pm 1","cuotas":0,"email":"nope","documento":{"tipo":"CC"},"pan":"4242"})
            )),
            vec![
                "medioPago.pan",
                "medioPago.id",
                "medioPago.email",
                "medioPago.cuotas",
                "medioPago.documento.numero"
            ]
        );
        assert_eq!(fields(with_method(json!(42))), vec!["medioPago"]);
        assert_eq!(fields(with_method(json!(""))), vec!["medioPago"]);
        assert_eq!(fields(with_method(json!({}))), vec!["medioPago.id"]);
    }

    #[test]
    fn mercado_pago_takes_colombian_pesos_in_whole_pesos_only() {
        let mp = GatewayNeeds::MercadoPago;
        assert_eq!(
            amount_error(mp, MAX_SAFE_AMOUNT, json!(250050), "COP").as_deref(),
            Some(
                "Mercado Pago takes COP in whole units only: a multiple of 100 (2500.00 COP, not 2500.50 COP)"
            )
        );
        assert_eq!(
            amount_error(mp, MAX_SAFE_AMOUNT, json!(250000), "COP"),
            None
        );
        // Other currencies, and other gateways, take every minor unit.
        assert_eq!(
            amount_error(mp, MAX_SAFE_AMOUNT, json!(250050), "BRL"),
            None
        );
        for needs in [GatewayNeeds::Nothing, GatewayNeeds::Stripe] {
            assert_eq!(
                amount_error(needs, MAX_SAFE_AMOUNT, json!(250050), "COP"),
                None
            );
        }
    }

    /// What `monto` is told for `amount` in `moneda` through `needs` under `max_amount`
    /// (None: accepted).
    fn amount_error(
        needs: GatewayNeeds,
        max_amount: i64,
        amount: Value,
        moneda: &str,
    ) -> Option<String> {
        let method = match needs {
            GatewayNeeds::Nothing => Value::Null,
            GatewayNeeds::Stripe => json!("pm_1"),
            GatewayNeeds::MercadoPago => json!({"id":"visa","email":"p@example.com"}),
        };
        let body = json!({"creditoId":"42","monto":amount,"moneda":moneda,"medioPago":method});
        match NewPayment::from_json_for(&body, needs, max_amount) {
            Ok(_) => None,
            Err(errors) => {
                assert_eq!(
                    errors.iter().map(|e| e.campo.as_str()).collect::<Vec<_>>(),
                    vec!["monto"],
                    "{body}"
                );
                Some(errors[0].detalle.clone())
            }
        }
    }

    #[test]
    fn no_amount_above_two_to_the_53_minus_one_is_accepted() {
        assert_eq!(
            amount_error(
                GatewayNeeds::Nothing,
                MAX_SAFE_AMOUNT,
                json!(MAX_SAFE_AMOUNT),
                "CLP"
            ),
            None,
            "2^53 − 1 itself is carried exactly"
        );
        for huge in [
            json!(MAX_SAFE_AMOUNT + 1),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(1e20),
            json!(1e300),
        ] {
            let why = amount_error(GatewayNeeds::Nothing, MAX_SAFE_AMOUNT, huge.clone(), "COP")
                .expect("refused");
            assert!(why.contains("9007199254740991"), "{huge}: {why}");
        }
        assert_eq!(
            fields(json!({"creditoId":"42","monto":i64::MAX,"moneda":"XXX"})),
            vec!["monto", "moneda"],
            "the limit holds without a valid currency"
        );
    }

    #[test]
    fn the_operators_maximum_is_a_ceiling_below_the_universal_one() {
        assert_eq!(
            amount_error(GatewayNeeds::Nothing, 1_000_000, json!(1_000_000), "COP"),
            None
        );
        let why = amount_error(GatewayNeeds::Nothing, 1_000_000, json!(1_000_001), "COP")
            .expect("refused");
        assert!(
            why.contains("1000000") && why.contains("this service"),
            "{why}"
        );
        let why = amount_error(GatewayNeeds::Nothing, 1_000_000, json!(i64::MAX), "COP")
            .expect("refused");
        assert!(
            why.contains("1000000"),
            "the lowest limit is the one named: {why}"
        );
    }

    #[test]
    fn stripe_takes_eight_digits_except_ten_in_cop() {
        for (code, max, major) in [
            ("USD", STRIPE_MAX_AMOUNT, "999999.99 USD"),
            ("EUR", STRIPE_MAX_AMOUNT, "999999.99 EUR"),
            ("CLP", STRIPE_MAX_AMOUNT, "99999999 CLP"),
            ("COP", STRIPE_MAX_AMOUNT_COP, "99999999.99 COP"),
        ] {
            assert_eq!(
                amount_error(GatewayNeeds::Stripe, MAX_SAFE_AMOUNT, json!(max), code),
                None
            );
            let why = amount_error(GatewayNeeds::Stripe, MAX_SAFE_AMOUNT, json!(max + 1), code)
                .expect("refused");
            assert!(
                why.contains(&max.to_string()) && why.contains(major) && why.contains("Stripe"),
                "{why}"
            );
        }
        assert!(
            amount_error(GatewayNeeds::Stripe, 1_000, json!(1_001), "COP")
                .is_some_and(|why| why.contains("this service")),
            "the operator's lower maximum wins"
        );
    }

    #[test]
    fn mercadopago_has_only_the_general_limits_and_what_its_decimals_carry() {
        assert_eq!(
            amount_error(
                GatewayNeeds::MercadoPago,
                MAX_SAFE_AMOUNT,
                json!(STRIPE_MAX_AMOUNT_COP + 1),
                "COP"
            ),
            None,
            "Stripe's maximum is not Mercado Pago's"
        );
        assert_eq!(
            amount_error(
                GatewayNeeds::MercadoPago,
                MAX_SAFE_AMOUNT,
                json!(MERCADOPAGO_MAX_AMOUNT),
                "BRL"
            ),
            None
        );
        assert!(
            amount_error(
                GatewayNeeds::MercadoPago,
                MAX_SAFE_AMOUNT,
                json!(MERCADOPAGO_MAX_AMOUNT + 1),
                "BRL"
            )
            .is_some()
        );
        // That it is exactly what the adapter can write as a decimal is the server's test
        // (`pagos::domain`).
    }

    #[test]
    fn major_units_are_written_without_rounding() {
        assert_eq!(major_units(99_999_999, 2), "999999.99");
        assert_eq!(major_units(5, 2), "0.05");
        assert_eq!(major_units(5000, 0), "5000");
        assert_eq!(major_units(1234, 3), "1.234");
    }
}
