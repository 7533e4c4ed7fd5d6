//! The payer's payment method (`medioPago`) on each payment: what Stripe and Mercado Pago
//! charge, kept so that every resend of a payment sends the same request.
//!
//! Nullable: payments made before it, and payments through gateways that take no method,
//! have none. Older binaries ignore the column.

use crate::columns;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::add(manager, "payments", vec![text_null("payment_method")]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::drop(manager, "payments", &["payment_method"]).await
    }
}
