#!/usr/bin/env bash
# The batch functions alone (spec/performance.md — The probes): pgbench drives
# `tollgate_claim_batch` with CALLS calls (the parameters of `db_only.sql`'s call, a fresh key
# each), then `tollgate_settle_batch` with the settlements of the calls it claimed, one
# transaction each, with no application. Each pgbench client keeps its own consumer and chain
# group, so no two batches wait for each other's locks: what is measured is the database's
# work for a batch. Two builds are compared on two databases, each migrated by its own binary,
# alternating round by round; printed per run are the rate (batch pairs a second) and, from
# pg_stat_statements (when the extension can be created), the mean execution time of the claim
# batch and of the settlement batch statements.
#
# usage: benches/probe/db_batches.sh BIN_A [BIN_B] [SECONDS] [ROUNDS] [CLIENTS] [CALLS]
# BIN_A, BIN_B: `tollgate` binaries (`migrate` applies each one's functions); defaults 8 s,
# 3 rounds, 2 clients, 16 calls a batch. Needs pgbench, psql and python3. Postgres at
# $PROBE_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres; TLS off unless
# PGSSLMODE says otherwise); uses the databases `tollgate_batches_a` and `tollgate_batches_b`
# (dropped and created again). DB_BATCHES_SQL_B=file applies that SQL to side b after its
# migration.
set -euo pipefail
bin_a=${1:?usage: $0 BIN_A [BIN_B] [SECONDS] [ROUNDS] [CLIENTS] [CALLS]}
bin_b=${2:-}
seconds=${3:-8}
rounds=${4:-3}
clients=${5:-2}
calls=${6:-16}
here=$(cd "$(dirname "$0")" && pwd)
admin=${PROBE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
base=${admin%/*}
url() { echo "$base/$1"; }
export PGOPTIONS="-c client_min_messages=warning"
# pgbench and psql without TLS unless asked (the server's connections have none).
export PGSSLMODE=${PGSSLMODE:-disable}
for tool in pgbench psql python3; do
  command -v "$tool" >/dev/null || { echo "db_batches: $tool is missing" >&2; exit 2; }
done
work=$(mktemp -d /tmp/tollgate-batches.XXXXXX)
sides="a"
[ -n "$bin_b" ] && sides="a b"
finish() {
  for side in $sides; do
    psql "$admin" -qc "DROP DATABASE IF EXISTS tollgate_batches_$side" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap finish EXIT

# The script: db_only.sql's claim and settlement as one batch each of :calls calls.
python3 - "$here/db_only.sql" "$work/batches.sql" "$calls" <<'PY'
import sys
src, out, calls = sys.argv[1], sys.argv[2], sys.argv[3]
lines = open(src).read().splitlines()
claim = next(l for l in lines if "tollgate_claim(" in l)
settle = next(l for l in lines if "tollgate_settle(" in l)
def own(line, place):
    # Each client's consumer and session, and a chain of its group (client id mod 8).
    return (line.replace("('team-' || :c)", "('team-' || :client_id)")
            .replace("('s' || :c)", "('s' || :client_id)")
            .replace(":chain::smallint", f"((:client_id % 8) * 8 + {place} % 8)::smallint"))
head = "SELECT id AS eid FROM tollgate_claim(gen_random_uuid(), "
assert claim.startswith(head) and claim.endswith(") \\gset")
claim = own(claim, "i").replace("('db-' || :n)", "('db-' || :n || '-' || i)")
claim = ("SELECT array_agg(CASE WHEN b.call_state = 'row' THEN (b.call_row).id END "
         "ORDER BY b.call_index) AS ids FROM tollgate_claim_batch(ARRAY(SELECT ROW("
         "gen_random_uuid(), " + claim[len(head):-len(") \\gset")]
         + ")::tollgate_claim_call FROM generate_series(1, :calls) AS i ORDER BY i), 1) b \\gset")
head = "SELECT id FROM tollgate_settle(:eid::uuid, "
assert settle.startswith(head) and settle.endswith(");")
settle = own(settle, "u.i")
settle = ("SELECT count(*) FROM tollgate_settle_batch(ARRAY(SELECT ROW(u.id, "
          + settle[len(head):-2] + ")::tollgate_settle_call "
          "FROM unnest(':ids'::uuid[]) WITH ORDINALITY AS u(id, i) WHERE u.id IS NOT NULL "
          "ORDER BY u.i), 1) b WHERE b.call_state = 'row';")
open(out, "w").write(
    f"\\set n random(1, 1000000000000)\n\\set calls {calls}\n{claim}\n{settle}\n")
PY

for side in $sides; do
  bin=$bin_a
  [ "$side" = b ] && bin=$bin_b
  psql "$admin" -qc "DROP DATABASE IF EXISTS tollgate_batches_$side" \
    -c "CREATE DATABASE tollgate_batches_$side"
  DATABASE_URL=$(url "tollgate_batches_$side") "$bin" migrate >/dev/null
  psql "$(url "tollgate_batches_$side")" -qv ON_ERROR_STOP=1 -f "$here/db_config.sql" >/dev/null
  # DB_BATCHES_SQL_B: a file of SQL applied to side b after its migration (a schema variant
  # tried at the database alone before it becomes a migration).
  if [ "$side" = b ] && [ -n "${DB_BATCHES_SQL_B:-}" ]; then
    psql "$(url "tollgate_batches_$side")" -qv ON_ERROR_STOP=1 -f "$DB_BATCHES_SQL_B" >/dev/null
  fi
  psql "$(url "tollgate_batches_$side")" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    2>/dev/null || true
  # The scope's audit heads exist before the runs: a scope's first append goes call by call.
  pgbench -n -c"$clients" -j"$clients" -t1 -f "$work/batches.sql" \
    "$(url "tollgate_batches_$side")" >/dev/null 2>&1
done

# One run on side $1: `side batches/s claim_ms settle_ms`.
run() {
  local side=$1 db
  db=$(url "tollgate_batches_$side")
  psql "$db" -qAtc "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || true
  local tps
  tps=$(pgbench -n -c"$clients" -j"$clients" -T"$seconds" -f "$work/batches.sql" "$db" 2>&1 |
    awk '/^tps/ { print $3 }')
  local means
  means=$(psql "$db" -qAtF' ' -c "SELECT
      round((sum(s.total_exec_time) FILTER (WHERE s.query LIKE '%tollgate_claim_batch(%')
        / sum(s.calls) FILTER (WHERE s.query LIKE '%tollgate_claim_batch(%'))::numeric, 3),
      round((sum(s.total_exec_time) FILTER (WHERE s.query LIKE '%tollgate_settle_batch(%')
        / sum(s.calls) FILTER (WHERE s.query LIKE '%tollgate_settle_batch(%'))::numeric, 3)
    FROM pg_stat_statements s
    WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND s.toplevel" 2>/dev/null || echo "- -")
  echo "$side $tps ${means:-- -}"
}

echo "side batch_pairs/s claim_batch_ms settle_batch_ms (calls a batch: $calls, clients: $clients)"
for round in $(seq 1 "$rounds"); do
  order=$sides
  if [ -n "$bin_b" ] && [ $((round % 2)) -eq 0 ]; then order="b a"; fi
  for side in $order; do
    run "$side" | sed "s/^/round $round: /"
  done
done
