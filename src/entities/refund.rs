use sea_orm::entity::prelude::*;

pub use super::idempotency_key::KeyStatus;
pub use pagos_types::RefundState;

/// Whose key a refund was asked for with: the refunds' key space is (merchant, scope, key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum KeyScope {
    /// `POST /v1/pagos/{id}/reembolsos`: the merchant's `Idempotency-Key`.
    #[sea_orm(string_value = "merchant")]
    Merchant,
    /// `POST /admin/pagos/{id}/reembolsos`: on-call's `Idempotency-Key`.
    #[sea_orm(string_value = "admin")]
    Admin,
    /// pagos' own refund of an orphan charge: the key is the payment's id.
    #[sea_orm(string_value = "orphan")]
    Orphan,
}

impl KeyScope {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyScope::Merchant => "merchant",
            KeyScope::Admin => "admin",
            KeyScope::Orphan => "orphan",
        }
    }
}

/// One refund: its saga's row and its idempotency key's, together.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "refunds")]
pub struct Model {
    /// Derived from the merchant, the key's scope, the key and the payment
    /// (`idempotency::derive::derive_refund`): also the `reference` every send carries.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub payment_id: Uuid,
    pub merchant_id: Uuid,
    pub key_scope: KeyScope,
    pub idempotency_key: String,
    /// SHA-256 of method, path and canonical body, hex.
    pub fingerprint: String,
    /// `EN_PROCESO` until the answer is frozen, then `COMPLETADA`.
    pub key_status: KeyStatus,
    pub response_code: Option<i32>,
    /// The frozen answer, byte for byte as first sent.
    pub response_body: Option<String>,
    /// While in the future, a request handler owns the key: duplicates get 409.
    pub lease_until: Option<ChronoDateTimeUtc>,
    /// The provider's id of the charge refunded (the payment's `gatewayRef`, or the orphan
    /// charge found for it).
    pub charge_ref: String,
    /// Minor units of `currency` (the payment's).
    pub amount: i64,
    pub currency: String,
    /// The `motivo`.
    pub reason: Option<String>,
    /// Who asked: `merchant`, `admin` (or an operator's name), `pagos` (compensation).
    pub requested_by: Option<String>,
    pub state: RefundState,
    /// Bumped by every write; writes are fenced on it.
    pub version: i64,
    pub attempts: i32,
    /// Sent on every send of this refund.
    pub gateway_key: String,
    /// The provider's refund id, once an answer gave one.
    pub gateway_ref: Option<String>,
    pub failure_code: Option<String>,
    pub next_attempt_at: ChronoDateTimeUtc,
    /// While in the future, one worker owns the refund: nobody else may send it.
    pub claimed_until: Option<ChronoDateTimeUtc>,
    pub created_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
    /// No longer read or written: a gateway refund event's `sequence` is the provider
    /// refund's, compared in its report (`webhook_refunds.last_sequence`). Older rows keep
    /// the highest one applied to the refund then.
    pub last_event_sequence: Option<i64>,
    /// As a payment's: the last error of a look-up or a send at the provider, and when.
    pub last_error: Option<String>,
    pub last_error_at: Option<ChronoDateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
