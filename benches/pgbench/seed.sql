-- pgbench: the textbook idempotency-key saga pagos grew from, for one payment: the fixed
-- yardstick beside create.sql (which follows pagos' own SQL). The key and the payment
-- registered in one transaction (INSERT … ON CONFLICT DO NOTHING, then the payment), the
-- payment marked sent before the gateway call, then the payment settled and the answer
-- stored on the key in one transaction: three commits, as pagos makes. Nothing more: no
-- audit rows, no events, no leases, no fencing. Tables: seed-schema.sql. Run with
-- -M prepared and -D run=<n> -D i=0.
\set i :i + 1
BEGIN;
INSERT INTO seed_idempotency_keys (key, request_hash, status)
VALUES ('seed-' || :run || '-' || :client_id || '-' || :i, '5cbbb0b87f0ee699a056ebd5f5772f367dca74915b9b928bf5e0ef8459e7585b', 'EN_PROCESO')
ON CONFLICT (key) DO NOTHING;
INSERT INTO seed_pagos (id, credito_id, monto, moneda, estado)
VALUES (md5('seed-' || :run || '-' || :client_id || '-' || :i)::uuid, '42', 250000, 'COP', 'EN_PROCESO');
COMMIT;
UPDATE seed_pagos SET estado = 'ENVIADA', updated_at = now()
WHERE id = md5('seed-' || :run || '-' || :client_id || '-' || :i)::uuid;
BEGIN;
UPDATE seed_pagos SET estado = 'COMPLETADA', gateway_ref = 'ch_000001c97455a56c', updated_at = now()
WHERE id = md5('seed-' || :run || '-' || :client_id || '-' || :i)::uuid;
UPDATE seed_idempotency_keys SET status = 'COMPLETADA', response_code = 201,
  response_body = '{"id":"093f9b4f-19c3-51ef-96d9-28e7603fea41","creditoId":"42","monto":250000,"moneda":"COP","estado":"COMPLETADA","gatewayRef":"ch_000001c97455a56c"}'
WHERE key = 'seed-' || :run || '-' || :client_id || '-' || :i;
COMMIT;
