#!/usr/bin/env bash
# The database-only ceiling of a first call: pgbench drives tollgate's own transactions for a
# call outside a root (the `tollgate_claim` and `tollgate_settle` functions, one commit each,
# as the server sends them since H-30) with no application at all, alternating with pgbench
# TPC-B on the same server, so the ratio says what share of TPC-B the transaction design itself
# allows before any HTTP, runner or provider work (spec/performance.md, "Where the rest goes").
#
# The call's parameters in db_only.sql were taken from a real first call of the probe (the
# binding snapshot, the audit rows' hash input, the evidence); each transaction uses a fresh key
# and one of eight consumers and 64 audit chains. When a migration changes either
# function's parameters, take them again (log_statement = all, one probe call).
#
# usage: benches/probe/db_only.sh [SECONDS] [ROUNDS] [CLIENTS]
# Needs: pgbench, psql, bc. Postgres at $PROBE_ADMIN_URL (default
# postgres://postgres@127.0.0.1:5432/postgres). Uses the databases `tollgate_db_only` and
# `tollgate_db_only_tpcb` (dropped and created again).
set -euo pipefail
SECONDS_=${1:-6}
ROUNDS=${2:-3}
CLIENTS=${3:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ADMIN=${PROBE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
export PGOPTIONS="-c client_min_messages=warning"
BASE=${ADMIN%/*}
finish() {
  psql "$ADMIN" -qc "DROP DATABASE IF EXISTS tollgate_db_only" \
    -c "DROP DATABASE IF EXISTS tollgate_db_only_tpcb" 2>/dev/null || true
}
trap finish EXIT
for tool in pgbench psql bc; do
  command -v "$tool" >/dev/null || { echo "db_only: $tool is missing" >&2; exit 2; }
done

cargo build --release -q -p tollgate --manifest-path "$ROOT/Cargo.toml"
psql "$ADMIN" -qc "DROP DATABASE IF EXISTS tollgate_db_only" -c "CREATE DATABASE tollgate_db_only" \
  -c "DROP DATABASE IF EXISTS tollgate_db_only_tpcb" -c "CREATE DATABASE tollgate_db_only_tpcb"
DATABASE_URL=$BASE/tollgate_db_only "$ROOT/target/release/tollgate" migrate >/dev/null
psql "$BASE/tollgate_db_only" -qv ON_ERROR_STOP=1 -f "$HERE/db_config.sql" >/dev/null
pgbench -q -i -s 8 "$BASE/tollgate_db_only_tpcb" >/dev/null 2>&1

rate() { awk '/^tps/{print int($3)}'; }
calls_sum=0
tpcb_sum=0
for round in $(seq 1 "$ROUNDS"); do
  tpcb=$(pgbench -n -c"$CLIENTS" -j2 -T"$SECONDS_" "$BASE/tollgate_db_only_tpcb" 2>&1 | rate)
  calls=$(pgbench -n -M prepared -c"$CLIENTS" -j2 -T"$SECONDS_" -f "$HERE/db_only.sql" \
    "$BASE/tollgate_db_only" 2>&1 | rate)
  echo "round $round: TPC-B c$CLIENTS $tpcb TPS, first-call transactions (claim + settle) $calls/s"
  tpcb_sum=$((tpcb_sum + tpcb))
  calls_sum=$((calls_sum + calls))
done
echo "first-call transactions / TPC-B: $(echo "scale=3; $calls_sum / $tpcb_sum" | bc)"
