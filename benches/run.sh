#!/usr/bin/env bash
# pagos against the physical limit, in one command: installs wrk and pgbench from the
# distribution's packages when they are missing, builds pagos in release mode, runs every
# benchmark of docs/benchmarks.md side by side and prints the table (figures are printed,
# never asserted).
#
#   benches/run.sh                      # the whole run, about 30 minutes after the build
#                                       # (7 of them filling a 10-million-payment database)
#   benches/run.sh --duration 5s        # shorter runs; --help lists every flag
#
# PAGOS_BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/postgres) must be
# allowed to create databases; each run makes its own and drops them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "==> installing $* (apt-get)" >&2
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! command -v wrk >/dev/null; then
  install wrk
fi
if ! command -v pgbench >/dev/null; then
  # Debian 12 ships pgbench with the server packages, later releases with the client.
  install postgresql-client || true
  command -v pgbench >/dev/null || install postgresql-contrib
fi

echo "==> building pagos (release)" >&2
cargo build --release --bin pagos
# `cargo bench` rebuilds the binary with the test-only crash points for its own use:
# measure a copy of the plain release build.
mkdir -p target/bench
cp target/release/pagos target/bench/pagos

echo "==> building and running the benchmark driver (benches/figures)" >&2
cargo bench --bench figures -- --pagos target/bench/pagos "$@"
