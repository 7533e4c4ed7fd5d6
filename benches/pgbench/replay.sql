-- pgbench: what pagos asks PostgreSQL for one replay: the point select of the key row
-- (the stored answer comes back with it). Run with -M prepared and
-- -D merchant=<uuid> -D key=<the replayed Idempotency-Key>.
SELECT "idempotency_keys"."merchant_id", "idempotency_keys"."key", "idempotency_keys"."fingerprint", "idempotency_keys"."payment_id", "idempotency_keys"."status", "idempotency_keys"."response_code", "idempotency_keys"."response_body", "idempotency_keys"."lease_until", "idempotency_keys"."created_at", "idempotency_keys"."updated_at" FROM "idempotency_keys" WHERE "idempotency_keys"."merchant_id" = :merchant AND "idempotency_keys"."key" = :key LIMIT 1;
