-- wrk: POST /v1/pagos with a fresh Idempotency-Key on every request (each one a new
-- payment). Set PAGOS_BENCH_API_KEY and PAGOS_BENCH_RUN (a word unique to the run, so
-- two runs against one database never share a key).

local api_key = os.getenv("PAGOS_BENCH_API_KEY") or "sk_bench"
local run = os.getenv("PAGOS_BENCH_RUN") or tostring(os.time())
local body = '{"creditoId":"42","monto":250000,"moneda":"COP"}'
local next_id = 0

function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
end

local counter = 0
local headers = {
  ["Authorization"] = "Bearer " .. api_key,
  ["Content-Type"] = "application/json",
}

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = string.format("bench-%s-%d-%d", run, thread_id, counter)
  return wrk.format("POST", "/v1/pagos", headers, body)
end

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
