-- wrk: POST /v1/pagos again and again with one Idempotency-Key whose payment is
-- complete: every request is a replay of the frozen answer. Set PAGOS_BENCH_API_KEY and
-- PAGOS_BENCH_REPLAY_KEY (the key, already used once with this body).

local api_key = os.getenv("PAGOS_BENCH_API_KEY") or "sk_bench"
local key = os.getenv("PAGOS_BENCH_REPLAY_KEY") or "bench-replay"

wrk.method = "POST"
wrk.path = "/v1/pagos"
wrk.body = '{"creditoId":"42","monto":250000,"moneda":"COP"}'
wrk.headers["Authorization"] = "Bearer " .. api_key
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = key

-- Machine-readable summary on stdout, read by the benchmark driver.
function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format("requests=%d\n", summary.requests))
  io.write(string.format("duration_us=%d\n", summary.duration))
  io.write(string.format("non_2xx=%d\n", errors.status))
  io.write(string.format("socket_errors=%d\n", errors.connect + errors.read + errors.write + errors.timeout))
  io.write(string.format("p50_us=%d\n", latency:percentile(50.0)))
  io.write(string.format("p99_us=%d\n", latency:percentile(99.0)))
  io.write(string.format("mean_us=%d\n", latency.mean))
end
