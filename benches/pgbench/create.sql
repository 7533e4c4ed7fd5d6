-- pgbench: the SQL that pagos issues for one created payment on PostgreSQL, statement for
-- statement and commit for commit (captured from PostgreSQL's statement log of `pagos
-- serve`; src/saga/store.rs writes it): the key lookup, then tx1 (register), tx2 (mark
-- sent) and tx3 (settle and freeze the answer), each one statement with data-modifying
-- WITH clauses, committed on its own. Values pagos binds as parameters are parameters
-- or constants here; the ids grow like pagos' UUIDv7 ids do. Run with -M prepared (sqlx
-- prepares every statement) and -D merchant=<uuid> -D run=<n> -D i=0.
\set i :i + 1
SELECT "idempotency_keys"."merchant_id", "idempotency_keys"."key", "idempotency_keys"."fingerprint", "idempotency_keys"."payment_id", "idempotency_keys"."status", "idempotency_keys"."response_code", "idempotency_keys"."response_body", "idempotency_keys"."lease_until", "idempotency_keys"."created_at", "idempotency_keys"."updated_at" FROM "idempotency_keys" WHERE "idempotency_keys"."merchant_id" = :merchant AND "idempotency_keys"."key" = ('pgbench-' || :run || '-' || :client_id || '-' || :i) LIMIT 1;
WITH "registered" AS (
  INSERT INTO "idempotency_keys" ("merchant_id", "key", "fingerprint", "payment_id", "status", "response_code", "response_body", "lease_until", "created_at", "updated_at")
  VALUES (:merchant, ('pgbench-' || :run || '-' || :client_id || '-' || :i), '5cbbb0b87f0ee699a056ebd5f5772f367dca74915b9b928bf5e0ef8459e7585b', (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000000')::uuid, 'EN_PROCESO', NULL, NULL, now() + interval '60 seconds', now(), now())
  ON CONFLICT ("merchant_id", "key") DO NOTHING
  RETURNING "payment_id")
INSERT INTO "payments" ("id", "merchant_id", "idempotency_key", "credit_id", "amount", "currency", "description", "payment_method", "state", "version", "attempts", "gateway_key", "gateway_ref", "decline_code", "next_attempt_at", "created_at", "updated_at")
SELECT "payment_id", :merchant, ('pgbench-' || :run || '-' || :client_id || '-' || :i), '42', 250000, 'COP', NULL, NULL, 'EN_PROCESO', 0, 0, 'pagos-01a236f60f9577c4962685e3f0a57f8c-860bc5c69e5ac057f0a92063de1f273283338f6182c3113a3e159ff2e425c05a', NULL, NULL, now() + interval '60 seconds', now(), now() FROM "registered";
WITH "moved" AS (
  UPDATE "payments" SET "state" = 'ENVIADA', "version" = 1, "attempts" = 1, "gateway_ref" = NULL, "decline_code" = NULL, "next_attempt_at" = now() + interval '60 seconds', "updated_at" = now()
  WHERE "id" = (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000000')::uuid AND "version" = 0
  RETURNING "id"),
"audit" AS (
  INSERT INTO "payment_transitions" ("id", "payment_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000001')::uuid, "id", 'EN_PROCESO', 'ENVIADA', 'request', 'sending to the gateway', now() FROM "moved")
SELECT count(*) AS "moved" FROM "moved";
WITH "moved" AS (
  UPDATE "payments" SET "state" = 'COMPLETADA', "version" = 2, "attempts" = 1, "gateway_ref" = 'ch_0000016b61380144', "decline_code" = NULL, "next_attempt_at" = now() + interval '60 seconds', "updated_at" = now()
  WHERE "id" = (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000000')::uuid AND "version" = 1
  RETURNING "id"),
"audit" AS (
  INSERT INTO "payment_transitions" ("id", "payment_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000002')::uuid, "id", 'ENVIADA', 'COMPLETADA', 'request', 'gateway charged (ch_0000016b61380144)', now() FROM "moved"),
"frozen" AS (
  UPDATE "idempotency_keys" SET "status" = 'COMPLETADA', "response_code" = 201, "response_body" = '{"id":"01a236f6-159e-76b0-ba2c-0271293d146c","creditoId":"42","monto":250000,"moneda":"COP","estado":"COMPLETADA","gatewayRef":"ch_0000016b61380144","creadoEn":"2026-12-02T13:33:46.782Z","actualizadoEn":"2026-12-02T13:33:46.902Z"}', "lease_until" = NULL, "updated_at" = now()
  WHERE "merchant_id" = :merchant AND "key" = ('pgbench-' || :run || '-' || :client_id || '-' || :i) AND "payment_id" = (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000000')::uuid AND "status" = 'EN_PROCESO' AND EXISTS (SELECT 1 FROM "moved"))
SELECT count(*) AS "moved" FROM "moved";
