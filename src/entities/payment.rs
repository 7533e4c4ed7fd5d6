use sea_orm::entity::prelude::*;

pub use pagos_types::PaymentState;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "payments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub merchant_id: Uuid,
    pub idempotency_key: String,
    pub credit_id: String,
    /// Minor units of `currency`.
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    /// The request's `medioPago` in its contract JSON form (`PaymentMethod::to_json`);
    /// every send of the payment charges it.
    pub payment_method: Option<String>,
    /// Stored as its contract name (`EN_PROCESO`, …), as it always was.
    pub state: PaymentState,
    /// Bumped by every write; writes are fenced on it.
    pub version: i64,
    /// Times pagos sent this payment or asked the provider about it (sends, resends and
    /// reconciler look-ups that rescheduled it).
    pub attempts: i32,
    /// The key sent to the gateway on every send of this payment, derived from the
    /// merchant, the client's key and `generation` (`idempotency::derive`).
    pub gateway_key: String,
    pub gateway_ref: Option<String>,
    pub decline_code: Option<String>,
    /// When the reconciler may look at this payment next.
    pub next_attempt_at: ChronoDateTimeUtc,
    pub created_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
    /// Earlier payments of this merchant with the same client key (0: the first).
    pub generation: i32,
    /// While in the future, one worker owns the payment (a request, a reconciliation
    /// pass, on-call's "reconcile now"): nobody else may send it. None: nobody does.
    pub claimed_until: Option<ChronoDateTimeUtc>,
    /// The last error of a look-up or a send at the provider (at most
    /// `saga::store::LAST_ERROR_CHARS` characters), written with the reschedule after it;
    /// None once the payment is settled, or when no call failed.
    pub last_error: Option<String>,
    /// When `last_error` happened.
    pub last_error_at: Option<ChronoDateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
