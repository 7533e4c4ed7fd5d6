-- pgbench: the SQL that pagos issues for one created payment on PostgreSQL, statement for
-- statement and commit for commit (captured from PostgreSQL's statement log of `pagos
-- serve`, log_statement = 'all'; src/saga/store.rs writes it): tx1 (register the key and
-- the payment, answering with the key's row had it been taken), tx2 (mark sent, with its
-- audit row) and tx3 (settle, audit, freeze the answer, write the `pago.completado` event
-- and queue it for the fan-out), each one statement with data-modifying WITH clauses,
-- committed on its own. Values pagos binds as parameters are parameters or constants here. The payment id
-- is a hash, as pagos derives it from the merchant, the key and its generation (so it
-- lands anywhere in the primary key); the audit and event ids grow like pagos' UUIDv7
-- ids do. Run with -M prepared (sqlx prepares every statement) and -D merchant=<uuid>
-- -D run=<n> -D i=0.
\set i :i + 1
WITH "registered" AS (
  INSERT INTO "idempotency_keys" ("merchant_id", "key", "fingerprint", "payment_id", "status", "response_code", "response_body", "lease_until", "created_at", "updated_at")
  SELECT :merchant, ('pgbench-' || :run || '-' || :client_id || '-' || :i), '5cbbb0b87f0ee699a056ebd5f5772f367dca74915b9b928bf5e0ef8459e7585b', md5('pgbench-' || :run || '-' || :client_id || '-' || :i)::uuid, 'EN_PROCESO', NULL, NULL, now() + interval '60 seconds', now(), now() WHERE NOT EXISTS (
    SELECT 1 FROM "payments"
    WHERE "merchant_id" = :merchant AND "idempotency_key" = ('pgbench-' || :run || '-' || :client_id || '-' || :i) AND "generation" >= 0)
  ON CONFLICT ("merchant_id", "key") DO NOTHING
  RETURNING "payment_id"),
"paid" AS (
  INSERT INTO "payments" ("id", "merchant_id", "idempotency_key", "credit_id", "amount", "currency", "description", "payment_method", "state", "version", "attempts", "gateway_key", "gateway_ref", "decline_code", "next_attempt_at", "created_at", "updated_at", "generation", "claimed_until")
  SELECT "payment_id", :merchant, ('pgbench-' || :run || '-' || :client_id || '-' || :i), '42', 250000, 'COP', NULL, NULL, 'EN_PROCESO', 0, 0, 'pagos-01a23c5ede84747b89c2d57278c9e1f9-860bc5c69e5ac057f0a92063de1f273283338f6182c3113a3e159ff2e425c05a', NULL, NULL, now() + interval '60 seconds', now(), now(), 0, now() + interval '60 seconds' FROM "registered"
  RETURNING "id")
SELECT (SELECT count(*) FROM "paid") AS "registered_payments", "k"."merchant_id", "k"."key", "k"."fingerprint", "k"."payment_id", "k"."status", "k"."response_code", "k"."response_body", "k"."lease_until", "k"."created_at", "k"."updated_at"
FROM (VALUES (1)) AS "one" ("one")
LEFT JOIN "idempotency_keys" AS "k" ON "k"."merchant_id" = :merchant AND "k"."key" = ('pgbench-' || :run || '-' || :client_id || '-' || :i);
WITH "moved" AS (
  UPDATE "payments" SET "state" = 'ENVIADA', "version" = 1, "attempts" = 1, "gateway_ref" = NULL, "decline_code" = NULL, "next_attempt_at" = now() + interval '60 seconds', "updated_at" = now(), "claimed_until" = now() + interval '60 seconds', "payment_method" = NULL
  WHERE "id" = md5('pgbench-' || :run || '-' || :client_id || '-' || :i)::uuid AND "version" = 0
  RETURNING "id"),
"audit" AS (
  INSERT INTO "payment_transitions" ("id", "payment_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000001')::uuid, "id", 'EN_PROCESO', 'ENVIADA', 'request', 'sending to the gateway', now() FROM "moved")
SELECT count(*) AS "moved" FROM "moved";
WITH "moved" AS (
  UPDATE "payments" SET "state" = 'COMPLETADA', "version" = 2, "attempts" = 1, "gateway_ref" = 'ch_000001c97455a56c', "decline_code" = NULL, "next_attempt_at" = now() + interval '60 seconds', "updated_at" = now(), "claimed_until" = NULL, "payment_method" = NULL
  WHERE "id" = md5('pgbench-' || :run || '-' || :client_id || '-' || :i)::uuid AND "version" = 1
  RETURNING "id"),
"audit" AS (
  INSERT INTO "payment_transitions" ("id", "payment_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT (lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000002')::uuid, "id", 'ENVIADA', 'COMPLETADA', 'request', 'gateway charged (ch_000001c97455a56c)', now() FROM "moved"),
"frozen" AS (
  UPDATE "idempotency_keys" SET "status" = 'COMPLETADA', "response_code" = 201, "response_body" = '{"id":"093f9b4f-19c3-51ef-96d9-28e7603fea41","creditoId":"42","monto":250000,"moneda":"COP","estado":"COMPLETADA","gatewayRef":"ch_000001c97455a56c","montoReembolsado":0,"creadoEn":"2026-12-03T14:46:23.298Z","actualizadoEn":"2026-12-03T14:46:23.309Z"}', "lease_until" = NULL, "updated_at" = now()
  WHERE "merchant_id" = :merchant AND "key" = ('pgbench-' || :run || '-' || :client_id || '-' || :i) AND "payment_id" = md5('pgbench-' || :run || '-' || :client_id || '-' || :i)::uuid AND "status" = 'EN_PROCESO' AND EXISTS (SELECT 1 FROM "moved")),
"told" AS (
  INSERT INTO "events" ("id", "merchant_id", "event_type", "subject_id", "sequence", "body", "created_at")
  SELECT 'evt_' || replace((lpad(to_hex(:i::bigint), 12, '0') || lpad(to_hex(:run::int), 4, '0') || lpad(to_hex(:client_id::int), 4, '0') || '700080000003')::uuid::text, '-', ''), :merchant, 'pago.completado', "id", 2, '{"id":"evt_01a23c5eeb4d7794b477f7e37f2d0eef","tipo":"pago.completado","creadoEn":"2026-12-03T14:46:23.309Z","secuencia":2,"datos":{"id":"093f9b4f-19c3-51ef-96d9-28e7603fea41","creditoId":"42","monto":250000,"moneda":"COP","estado":"COMPLETADA","gatewayRef":"ch_000001c97455a56c","montoReembolsado":0,"creadoEn":"2026-12-03T14:46:23.298Z","actualizadoEn":"2026-12-03T14:46:23.309Z"}}', now() FROM "moved"
  RETURNING "id"),
"queued" AS (
  INSERT INTO "events_to_fan_out" ("event_id")
  SELECT "id" FROM "told")
SELECT count(*) AS "moved" FROM "moved";
