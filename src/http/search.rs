//! The merchant's payment search: `GET /v1/pagos?creditoId=&estado=&desde=&hasta=&limite=&cursor=`,
//! newest first, a page at a time (`siguiente` is the next page's `cursor`).

use super::AppState;
use super::auth::{ApiKeyRefused, Merchant, TooManyFailedAuthentications};
use super::problem::{ApiError, Problem, ProblemType};
use crate::domain::FieldError;
use crate::entities::payment;
use crate::representation::{Pago, pago_with_refunds};
use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::{DateTime, Utc};
use pagos_types::PaymentState;
use sea_orm::sea_query::{Condition, Expr};
use sea_orm::{ColumnTrait, EntityTrait, Order, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(search_payments))
}

/// A page of payments.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListaPagos {
    /// Each as `GET /v1/pagos/{id}` shows it, with `montoReembolsado`.
    pagos: Vec<Pago>,
    /// The `cursor` of the next page; null on the last one.
    siguiente: Option<String>,
}

/// What the query asks for, parsed.
#[derive(Debug, Default)]
struct Search {
    credit_id: Option<String>,
    state: Option<PaymentState>,
    from: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    limit: u64,
    cursor: Option<Uuid>,
}

pub(super) fn invalid(errors: Vec<FieldError>) -> ApiError {
    Problem::new(ProblemType::Validation)
        .detail("Correct the parameters listed in `errores`.")
        .with("errores", errors)
        .into()
}

fn parse(query: &str) -> Result<Search, ApiError> {
    let mut search = Search {
        limit: DEFAULT_LIMIT,
        ..Search::default()
    };
    let mut errors = Vec::new();
    let mut error = |campo: &str, detalle: String| {
        errors.push(FieldError {
            campo: campo.to_owned(),
            detalle,
        })
    };
    let time = |text: &str| DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc));
    // A `+` of an offset that was not escaped reads as a space in a query string.
    let not_a_time = |text: &str, e: chrono::ParseError| match text.contains(' ') {
        true => format!(
            "not an RFC 3339 time: {e} (a `+` in a query string reads as a space: send it as %2B)"
        ),
        false => format!("not an RFC 3339 time: {e}"),
    };
    let mut seen = std::collections::HashSet::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if !seen.insert(name.clone().into_owned()) {
            error(&name, "given more than once".into());
            continue;
        }
        match name.as_ref() {
            // As a payment's `creditoId` is: no control character (PostgreSQL refuses a
            // NUL in text: it would be a 503 to retry for ever).
            "creditoId"
                if !value.is_empty()
                    && value.chars().count() <= 64
                    && !value.chars().any(char::is_control) =>
            {
                search.credit_id = Some(value.into_owned())
            }
            "creditoId" => error("creditoId", "1–64 characters, no control character".into()),
            "estado" => match PaymentState::ALL.iter().find(|s| s.as_str() == value) {
                Some(state) => search.state = Some(*state),
                None => error(
                    "estado",
                    format!(
                        "one of {}",
                        PaymentState::ALL.map(PaymentState::as_str).join(", ")
                    ),
                ),
            },
            "desde" => match time(&value) {
                Ok(t) => search.from = Some(t),
                Err(e) => error("desde", not_a_time(&value, e)),
            },
            "hasta" => match time(&value) {
                Ok(t) => search.until = Some(t),
                Err(e) => error("hasta", not_a_time(&value, e)),
            },
            "limite" => match value.parse::<u64>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => search.limit = n,
                _ => error("limite", format!("a whole number from 1 to {MAX_LIMIT}")),
            },
            "cursor" => match Uuid::parse_str(&value) {
                Ok(id) => search.cursor = Some(id),
                Err(_) => error(
                    "cursor",
                    "not a cursor: use the `siguiente` of a page".into(),
                ),
            },
            other => error(
                other,
                "unknown parameter; known: creditoId, estado, desde, hasta, limite, cursor".into(),
            ),
        }
    }
    if errors.is_empty() {
        Ok(search)
    } else {
        Err(invalid(errors))
    }
}

/// The payments after `last` in a list ordered by creation, then id, in `order`: the
/// page after the one `last` ended (a keyset, so a payment created meanwhile shifts
/// nothing).
pub(super) fn after(last: &payment::Model, order: Order) -> Condition {
    let (created, id) = match order {
        Order::Desc => (
            payment::Column::CreatedAt.lt(last.created_at),
            payment::Column::Id.lt(last.id),
        ),
        _ => (
            payment::Column::CreatedAt.gt(last.created_at),
            payment::Column::Id.gt(last.id),
        ),
    };
    Condition::any().add(created).add(
        Condition::all()
            .add(payment::Column::CreatedAt.eq(last.created_at))
            .add(id),
    )
}

/// The merchant's payments, newest first.
#[utoipa::path(
    get,
    path = "/v1/pagos",
    tag = "pagos",
    security(("api_key" = [])),
    params(
        ("creditoId" = Option<String>, Query, min_length = 1, max_length = 64, description = "Only this credit's payments (1–64 characters)"),
        ("estado" = Option<PaymentState>, Query, description = "Only payments in this state"),
        ("desde" = Option<String>, Query, format = DateTime, description = "Created at or after (RFC 3339)"),
        ("hasta" = Option<String>, Query, format = DateTime, description = "Created before (RFC 3339)"),
        ("limite" = Option<u64>, Query, minimum = 1, maximum = 500, description = "At most this many (1–500, default 50)"),
        ("cursor" = Option<String>, Query, description = "The `siguiente` of the page before"),
    ),
    responses(
        (status = 200, description = "A page of payments, newest first", body = ListaPagos),
        ApiKeyRefused,
        TooManyFailedAuthentications,
        (status = 422, description = "A bad parameter", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn search_payments(
    State(state): State<AppState>,
    Merchant(merchant): Merchant,
    RawQuery(query): RawQuery,
) -> Result<Json<ListaPagos>, ApiError> {
    let search = parse(&query.unwrap_or_default())?;
    // `version >= 0` holds for every payment; written out, it lets the planner use the
    // search's own partial index (migration m20261205_000014), which nothing else can.
    let mut find = payment::Entity::find()
        .filter(payment::Column::MerchantId.eq(merchant))
        .filter(Expr::cust(r#""payments"."version" >= 0"#));
    if let Some(cursor) = search.cursor {
        // The page goes on after the cursor's payment, in the same order.
        let Some(last) = payment::Entity::find_by_id(cursor)
            .filter(payment::Column::MerchantId.eq(merchant))
            .one(&state.db)
            .await?
        else {
            return Err(invalid(vec![FieldError {
                campo: "cursor".into(),
                detalle: "not a cursor: use the `siguiente` of a page".into(),
            }]));
        };
        find = find.filter(after(&last, Order::Desc));
    }
    if let Some(credit) = &search.credit_id {
        find = find.filter(payment::Column::CreditId.eq(credit.clone()));
    }
    if let Some(s) = search.state {
        find = find.filter(payment::Column::State.eq(s));
    }
    if let Some(from) = search.from {
        find = find.filter(payment::Column::CreatedAt.gte(from));
    }
    if let Some(until) = search.until {
        find = find.filter(payment::Column::CreatedAt.lt(until));
    }
    let page = find
        .order_by_desc(payment::Column::CreatedAt)
        .order_by_desc(payment::Column::Id)
        .limit(search.limit)
        .all(&state.db)
        .await?;
    // Each item as `GET /v1/pagos/{id}` shows it, `montoReembolsado` included.
    let (pagos, siguiente) = shown(&state, page, search.limit, pago_with_refunds).await?;
    Ok(Json(ListaPagos { pagos, siguiente }))
}

/// A page of payments as a list shows it: each rendered by `render` with what was refunded
/// of it (the page's refunds in one query, not one per payment), and the `cursor` of the
/// next page when this one is full.
pub(super) async fn shown<T>(
    state: &AppState,
    page: Vec<payment::Model>,
    limit: u64,
    render: impl Fn(&payment::Model, i64) -> T,
) -> Result<(Vec<T>, Option<String>), ApiError> {
    let siguiente = (page.len() as u64 == limit)
        .then(|| page.last().map(|p| p.id.to_string()))
        .flatten();
    let ids: Vec<Uuid> = page.iter().map(|p| p.id).collect();
    let refunded = crate::saga::refund::store::refunded_amounts(&state.db, &ids).await?;
    let shown = page
        .iter()
        .map(|p| render(p, refunded.get(&p.id).copied().unwrap_or(0)))
        .collect();
    Ok((shown, siguiente))
}
