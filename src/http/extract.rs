//! Extractors and rejections that never answer axum's plain text: a request pagos cannot
//! read gets the contract's problem+json (or, for the console, its own page), like every
//! other refusal. Handlers take these, or axum's own wrapped in a `Result`, never a bare
//! `Path`, `Query`, `Json` or `Bytes`, whose rejections are plain text.
//!
//! A JSON body that is not the merchant's payment or refund (webhook endpoints, their
//! reactivation, on-call's reconciliation and resolutions) is read by [`json_object`] and
//! its [`Fields`], as `POST /v1/pagos` reads its own: 415 for a body that does not say it
//! is JSON, 400 for one that is not JSON, 422 `validation-failed` listing in `errores`
//! every field at fault (a body that is not an object, `(cuerpo)`; a member written
//! twice; an unknown member; one missing or of another type; what the handler's own rules
//! refuse), never serde's reading of a struct, which takes a JSON array for one.
//!
//! Nothing here reads the database or knows a route.

use super::problem::{ApiError, Problem, ProblemType};
use crate::domain::FieldError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use pagos_types::body::Read;
use serde_json::{Map, Value};
use std::convert::Infallible;
use uuid::Uuid;

/// The `{id}` of a route, as text. A segment that is not UTF-8 once percent-decoded
/// (`/v1/pagos/%FF`) reads as "", which is no id: the handler answers it as any id it does
/// not know (its own 404), where axum's `Path` would answer a plain-text 400.
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Infallible> {
        let id = Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| id)
            .unwrap_or_default();
        Ok(PathId(id))
    }
}

/// The limit of a body read whole as raw bytes (`bytes`) where a room sets no limit of its
/// own: axum's default, 2 MiB, stated here (each such room sets it as its
/// `DefaultBodyLimit`) so the 413 its OpenAPI operations list (`problem::RawBodyTooLarge`)
/// is the limit the router enforces, whatever a later axum's default.
pub const RAW_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// A body read whole: over the route's limit (axum's default where no `DefaultBodyLimit`
/// says otherwise) a 413 problem, a body that could not be read (the client went away)
/// a 400 problem.
pub fn bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(ProblemType::BodyTooLarge)
                .detail("The body is over this endpoint's limit.")
                .into()
        } else {
            Problem::new(ProblemType::MalformedJson)
                .detail("The body could not be read.")
                .into()
        }
    })
}

/// What a body of nothing (or only white space) is: refused as any body that is not JSON,
/// or `{}` where the whole body is optional (`…/reactivar`, `/admin/reconciliaciones`),
/// whatever its content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenEmpty {
    Refused,
    Object,
}

/// A 422 `validation-failed` listing `errors`, as `POST /v1/pagos` answers one.
pub fn validation_failed(errors: Vec<FieldError>) -> ApiError {
    Problem::new(ProblemType::Validation)
        .detail("Correct the fields listed in `errores` and send the request again; nothing was stored.")
        .with("errores", errors)
        .into()
}

/// One field at fault, as `errores` lists it.
pub fn field_error(campo: &str, detalle: impl Into<String>) -> FieldError {
    FieldError {
        campo: campo.to_owned(),
        detalle: detalle.into(),
    }
}

/// Whether a `Content-Type` says JSON, as axum's `Json` reads it: `application/json` or
/// `application/…+json`, parameters aside.
fn says_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"))
}

/// A body read whole (`bytes`) as a JSON object: 413 over the route's limit, 415 for a
/// content type that is not JSON (missing included), 400 for what is not JSON (in the
/// parser's words, as `POST /v1/pagos` says it), 422 listing `(cuerpo)` for JSON that is
/// not an object. Its members are then read with [`Fields`], which lists every fault at
/// once.
pub fn json_object(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    empty: WhenEmpty,
) -> Result<Fields, ApiError> {
    let body = bytes(body)?;
    if empty == WhenEmpty::Object && body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Fields::new(Map::new(), Vec::new()));
    }
    if !says_json(headers) {
        return Err(Problem::new(ProblemType::UnsupportedMediaType)
            .detail("Send the body as `Content-Type: application/json`.")
            .into());
    }
    let not_json = |reason: &dyn std::fmt::Display| -> ApiError {
        Problem::new(ProblemType::MalformedJson)
            .detail(format!("The body is not valid JSON: {reason}."))
            .into()
    };
    let text = std::str::from_utf8(&body).map_err(|e| not_json(&e))?;
    // A member written twice is refused with the fields (`pagos_types::body`).
    let Read { value, mut refused } = pagos_types::body::read(text).map_err(|e| not_json(&e))?;
    match value {
        Value::Object(members) => Ok(Fields::new(members, refused)),
        _ => {
            refused.push(field_error("(cuerpo)", "the body must be a JSON object"));
            Err(validation_failed(refused))
        }
    }
}

/// What on-call's resolution of a payment or of a refund says, read from its body the one
/// way both read it: `estado` and `motivo` required, `gatewayRef` and `contraProveedor`
/// optional, and `reembolsar` only where `with_refund` (a payment's: refund what was
/// charged; elsewhere it is an unknown field). Every fault at once, as [`json_object`].
pub struct Resolution {
    pub estado: String,
    pub motivo: String,
    pub gateway_ref: Option<String>,
    pub contra_proveedor: Option<String>,
    /// Absent or null: false.
    pub reembolsar: bool,
}

/// The `estado` of a payment's resolution, as the OpenAPI document lists it
/// (documentation only: the resolution checks the text it reads).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(dead_code)]
pub enum EstadoResolucion {
    Completada,
    Fallida,
}

/// The `estado` of a refund's resolution, as the OpenAPI document lists it
/// (documentation only, as `EstadoResolucion`).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(dead_code)]
pub enum EstadoResolucionReembolso {
    Completado,
    Fallido,
}

/// Reads a resolution's body (see [`Resolution`]).
pub fn resolution(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    with_refund: bool,
) -> Result<Resolution, ApiError> {
    let mut fields = json_object(headers, body, WhenEmpty::Refused)?;
    let estado = fields.required::<String>("estado");
    let motivo = fields.required::<String>("motivo");
    let gateway_ref = fields.optional::<String>("gatewayRef");
    let reembolsar = with_refund && fields.optional::<bool>("reembolsar").unwrap_or(false);
    let contra_proveedor = fields.optional::<String>("contraProveedor");
    let (estado, motivo) = fields.finish(estado.zip(motivo))?;
    Ok(Resolution {
        estado,
        motivo,
        gateway_ref,
        contra_proveedor,
        reembolsar,
    })
}

/// A value a body's member may hold, and what it must be when it holds another.
pub trait Member: Sized {
    /// How a 422 says what the member must be.
    const MUST_BE: &'static str;
    fn read(value: &Value) -> Option<Self>;
}

impl Member for String {
    const MUST_BE: &'static str = "must be a string";
    fn read(value: &Value) -> Option<Self> {
        value.as_str().map(str::to_owned)
    }
}

impl Member for bool {
    const MUST_BE: &'static str = "must be true or false";
    fn read(value: &Value) -> Option<Self> {
        value.as_bool()
    }
}

impl Member for Uuid {
    const MUST_BE: &'static str = "must be an id (a UUID string)";
    fn read(value: &Value) -> Option<Self> {
        value.as_str().and_then(|s| Uuid::parse_str(s).ok())
    }
}

impl Member for Vec<String> {
    const MUST_BE: &'static str = "must be an array of strings";
    fn read(value: &Value) -> Option<Self> {
        value
            .as_array()?
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect()
    }
}

/// The members of a JSON object body, read one by one: each fault is noted and the body
/// refused once, with every fault listed (`finish`). Members not read are unknown.
#[derive(Debug)]
pub struct Fields {
    members: Map<String, Value>,
    read: Vec<&'static str>,
    /// Members written twice (`pagos_types::body`), listed first.
    repeated: Vec<FieldError>,
    errors: Vec<FieldError>,
}

impl Fields {
    fn new(members: Map<String, Value>, repeated: Vec<FieldError>) -> Self {
        Fields {
            members,
            read: Vec::new(),
            repeated,
            errors: Vec::new(),
        }
    }

    /// `name`, absent or null: None; of another type: noted, None.
    pub fn optional<T: Member>(&mut self, name: &'static str) -> Option<T> {
        self.read.push(name);
        match self.members.get(name) {
            None | Some(Value::Null) => None,
            Some(value) => {
                let read = T::read(value);
                if read.is_none() {
                    self.refuse(name, T::MUST_BE);
                }
                read
            }
        }
    }

    /// `name`, absent: None; null or of another type: noted, None (where null must not
    /// pass for absent: one member leaves the request's scope to another).
    pub fn optional_not_null<T: Member>(&mut self, name: &'static str) -> Option<T> {
        if self.members.get(name).is_some_and(Value::is_null) {
            self.read.push(name);
            self.refuse(
                name,
                format!("{}, or left out (null is not read as left out)", T::MUST_BE),
            );
            return None;
        }
        self.optional(name)
    }

    /// `name`, which must be there: absent or null is noted as `required`.
    pub fn required<T: Member>(&mut self, name: &'static str) -> Option<T> {
        let present = self.members.get(name).is_some_and(|v| !v.is_null());
        let read = self.optional(name);
        if !present {
            self.refuse(name, "required");
        }
        read
    }

    /// Notes a fault of the handler's own rules (a URL it refuses, an unknown event type).
    pub fn refuse(&mut self, campo: &str, detalle: impl Into<String>) {
        self.errors.push(field_error(campo, detalle));
    }

    /// What the body asks (`asked`, None only where a fault was noted), or a 422 listing
    /// every fault: members written twice, unknown members, then the rest as noted.
    pub fn finish<T>(self, asked: Option<T>) -> Result<T, ApiError> {
        let mut errors = self.repeated;
        for name in self.members.keys() {
            if !self.read.contains(&name.as_str()) {
                errors.push(field_error(name, "unknown field"));
            }
        }
        errors.extend(self.errors);
        match asked {
            Some(asked) if errors.is_empty() => Ok(asked),
            _ => Err(validation_failed(errors)),
        }
    }
}
