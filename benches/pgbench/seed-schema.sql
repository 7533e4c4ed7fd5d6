-- The tables of the textbook idempotency-key algorithm pagos grew from: its
-- idempotency_keys table (key, request hash, status, stored answer), and the least a
-- payment needs beside it. Created in the benchmark's database, next to pagos' own tables, for
-- benches/pgbench/seed.sql. Fixed: this schema and that script do not follow pagos.
CREATE TABLE IF NOT EXISTS seed_idempotency_keys (
  key           text PRIMARY KEY,
  request_hash  text NOT NULL,
  status        text NOT NULL,
  response_code int,
  response_body jsonb,
  created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS seed_pagos (
  id          uuid PRIMARY KEY,
  credito_id  text NOT NULL,
  monto       bigint NOT NULL,
  moneda      text NOT NULL,
  estado      text NOT NULL,
  gateway_ref text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now()
);
