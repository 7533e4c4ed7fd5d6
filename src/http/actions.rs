//! On-call's actions, recorded with who asked (contract section 8), and
//! `GET /admin/acciones`, where they are read back: those that move nothing by their own
//! hand — "reconcile now" of a payment or a refund, a pass run by hand, a webhook endpoint
//! reactivated — and those that move money or settle a state — a payment or a refund
//! under review resolved by hand, a refund asked by on-call.
//!
//! `audited` is the one way such an action runs, from the admin API and the console: its
//! row is written before the work (an action that cannot be recorded is refused, 503, and
//! nothing is done) and completed with what came of it, in the work's own task, so a
//! caller that hangs up still leaves the outcome. A refusal (a 409, a 422, a provider that
//! cannot be asked) completes the row too, saying it was refused and why: who tried what
//! is what an auditor asks. Never runs an action unrecorded. The row itself is the
//! store's (`operators::actions`), which `pagos reconcile --once` writes the same way.

use super::AppState;
use super::auth::{Admin, AdminTokenRefused, TooManyFailedAuthentications};
use super::problem::{ApiError, Problem, ProblemType};
use crate::domain::FieldError;
use crate::operators::actions::{self, Action, Filter, Row};
use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::SecondsFormat;
use futures::FutureExt;
use serde::Serialize;
use std::panic::AssertUnwindSafe;
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_actions))
}

/// What on-call asks: the action, what it acts on, and in words what was asked.
pub struct Asked {
    pub action: Action,
    /// The payment, refund or endpoint; None for a pass.
    pub target: Option<Uuid>,
    /// What was asked, for the row (`reconcile payment now`, what to deliver again…).
    pub what: String,
}

/// At most this many characters of what on-call wrote (a `motivo`, a `contraProveedor`)
/// go into a row's words of what was asked: the request's own rules check the rest.
pub const SAID_CHARS: usize = 1000;

/// What on-call wrote, trimmed, for a row's words of what was asked: cut at `SAID_CHARS`
/// (`…` says so), a NUL written as `�` (PostgreSQL cannot store it: the row, written
/// before the request's own rules refuse it, would fail, and the request with it).
pub fn said(text: &str) -> String {
    let text = text.trim();
    let said = match text.char_indices().nth(SAID_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    };
    if said.contains('\0') {
        said.replace('\0', "\u{FFFD}")
    } else {
        said
    }
}

/// Runs `work` as `who` asked it, recorded: the row is written first (a failed write is a
/// 503 and `work` never starts), then `work` runs in a task of its own and the row is
/// completed with `outcome` of what it returned, or with its error (`in_words`: a
/// refusal's, or a failure's).
pub async fn audited<T, E, F>(
    state: &AppState,
    who: &Admin,
    asked: Asked,
    work: F,
    outcome: fn(&T) -> String,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError>,
    F: Future<Output = Result<T, E>> + Send + 'static,
{
    who.may_act()?;
    let Asked {
        action,
        target,
        what,
    } = asked;
    let row = actions::begin(&state.db, &who.name, action, target, &what)
        .await
        .map_err(|err| {
            tracing::error!(error = %err, operator = %who.name, action = action.as_str(), "on-call's action refused: its audit row could not be written");
            ApiError::from(
                Problem::new(ProblemType::Unavailable)
                    .detail("The audit trail could not record who asked for this, so nothing was done. Try again.")
                    .retry_after(1),
            )
        })?;
    let db = state.db.clone();
    state
        .tasks
        .spawn(
            async move {
                // A panic is an end too: the row says so, and the caller gets a 503.
                let result = match AssertUnwindSafe(work).catch_unwind().await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(ApiError::Internal(anyhow::anyhow!(
                        "on-call's {} stopped with a panic",
                        action.as_str()
                    ))),
                };
                let came_of_it = match &result {
                    Ok(done) => outcome(done),
                    Err(err) => in_words(err),
                };
                if let Err(err) = actions::finish(&db, row, &what, &came_of_it).await {
                    tracing::error!(error = %err, action_id = %row, "on-call's action is over, but its audit row could not be completed");
                }
                result
            }
            .in_current_span(),
        )
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
}

/// An error as the audit row says it: a problem is a refusal (`refused (409
/// provider-disagrees): …`, its status, its type and its words), anything else a failure
/// (`failed: …`).
fn in_words(err: &ApiError) -> String {
    match err {
        ApiError::Problem(problem) => actions::refused(
            problem.status,
            problem.slug(),
            problem.detail.as_deref().unwrap_or(&problem.title),
        ),
        ApiError::Internal(err) => actions::failed(format!("{err:#}")),
    }
}

/// One action of on-call.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccionOperador {
    pub id: Uuid,
    /// When it was asked (RFC 3339).
    #[schema(format = DateTime)]
    pub en: String,
    /// Who asked: the operator's name, `admin` for the break-glass token.
    pub operador: String,
    /// `reconcile_payment`, `reconcile_refund`, `reconcile_pass`, `reactivate_endpoint`,
    /// `resolve_payment`, `resolve_refund` or `refund_payment`.
    pub accion: String,
    /// The payment, refund or endpoint acted on: the payment for a resolution of it and
    /// for a refund on-call asked, the refund for a resolution of a refund; null for a pass.
    pub objetivo: Option<Uuid>,
    /// What was asked and, once over, what came of it (the report's counts, the state
    /// the resolution or the refund left; `refused (<status> <type>): …` when pagos
    /// refused it, `failed: …` when it failed).
    pub detalle: String,
    /// When it was over (RFC 3339); null while it runs, or when the process stopped
    /// before it ended.
    #[schema(format = DateTime)]
    pub terminada_en: Option<String>,
}

impl From<Row> for AccionOperador {
    fn from(row: Row) -> Self {
        let at = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
        AccionOperador {
            id: row.id,
            en: at(row.at),
            operador: row.operator,
            accion: row.action.clone(),
            objetivo: row.target,
            detalle: row.detail,
            terminada_en: row.finished_at.map(at),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaAcciones {
    /// Newest first.
    pub acciones: Vec<AccionOperador>,
}

/// The query, parsed: every parameter once, none unknown.
fn parse(query: &str) -> Result<(Filter, u64), ApiError> {
    let mut filter = Filter::default();
    let mut limit = None;
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let mut error = |detalle: String| {
            errors.push(FieldError {
                campo: name.clone().into_owned(),
                detalle,
            })
        };
        if !seen.insert(name.clone().into_owned()) {
            error("given more than once".into());
            continue;
        }
        match name.as_ref() {
            "limite" => match value.parse::<u64>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => limit = Some(n),
                _ => error(format!("a whole number from 1 to {MAX_LIMIT}")),
            },
            "operador" => match value.trim() {
                name if !name.is_empty()
                    && name.chars().count() <= crate::operators::MAX_NAME_CHARS
                    && !name.chars().any(char::is_control) =>
                {
                    filter.operator = Some(name.to_owned())
                }
                _ => error(format!(
                    "an operator's name (1–{} characters), or admin",
                    crate::operators::MAX_NAME_CHARS
                )),
            },
            "objetivo" => match Uuid::parse_str(value.trim()) {
                Ok(id) => filter.target = Some(id),
                Err(_) => error("the id (uuid) of a payment, refund or endpoint".into()),
            },
            _ => error("unknown parameter; known: limite, operador, objetivo".into()),
        }
    }
    if errors.is_empty() {
        Ok((filter, limit.unwrap_or(DEFAULT_LIMIT)))
    } else {
        Err(super::search::invalid(errors))
    }
}

/// On-call's actions, newest first: who asked a reconciliation, a reactivation, a
/// resolution or a refund, when, and what came of it (a refusal too).
#[utoipa::path(
    get,
    path = "/admin/acciones",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("limite" = Option<u64>, Query, minimum = 1, maximum = 500, description = "At most this many (1–500, default 50)"),
        ("operador" = Option<String>, Query, description = "Only this operator's (`admin`: the break-glass token's)"),
        ("objetivo" = Option<Uuid>, Query, description = "Only those on this payment, refund or endpoint"),
    ),
    responses(
        (status = 200, description = "Actions, newest first", body = ListaAcciones),
        AdminTokenRefused,
        TooManyFailedAuthentications,
        (status = 422, description = "A bad, repeated or unknown parameter (`errores` names it)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_actions(
    State(state): State<AppState>,
    _admin: Admin,
    RawQuery(query): RawQuery,
) -> Result<Json<ListaAcciones>, ApiError> {
    let (filter, limit) = parse(&query.unwrap_or_default())?;
    let rows = actions::list(&state.db, &filter, limit).await?;
    Ok(Json(ListaAcciones {
        acciones: rows.into_iter().map(AccionOperador::from).collect(),
    }))
}
