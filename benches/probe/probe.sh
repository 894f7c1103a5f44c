#!/usr/bin/env bash
# The probe: one `tollgate serve` (release build) on a fresh database, the mock provider as its
# own process, `wrk` driving first calls for a few seconds; prints the rate and the CPU time per
# call of the server, the mock and Postgres (all backends of the cluster), read from /proc, and
# the WAL records, full-page images and bytes (pg_stat_wal) and the commits per call.
# Quicker and noisier than the harness; its runs are logged in docs/performance-log.md.
#
# usage: benches/probe/probe.sh [CONNECTIONS] [SECONDS] [spread|hot|replay]
#   spread: first calls of eight consumers, one session each (default)
#   hot:    first calls of one consumer and one session
#   replay: replays of 64 keys of one consumer (the warm-up makes their first calls)
# PROBE_BIN=path runs that binary instead of building this checkout.
# Needs: wrk, psql, bc; Postgres at $PROBE_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres),
# whose backends run as the `postgres` user on this machine. Uses ports 8088 and 9100 and the
# database `tollgate_probe` (dropped and created again); with PROBE_SLOT=N, ports 8088+N and
# 9100+N and the database `tollgate_probe_N`, so that probes of several slots run side by side
# (benches/probe/race.sh). PROBE_BARRIER=dir (with PROBE_PARTIES=n): the measured run starts
# once n probes have each written their slot's file there.
set -euo pipefail
CONNECTIONS=${1:-32}
SECONDS_=${2:-8}
SHAPE=${3:-spread}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ADMIN=${PROBE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
SLOT=${PROBE_SLOT:-}
DB_NAME=tollgate_probe${SLOT:+_$SLOT}
PORT=$((8088 + ${SLOT:-0}))
MOCK_PORT=$((9100 + ${SLOT:-0}))
DB_URL=${ADMIN%/*}/$DB_NAME
WORK=$(mktemp -d)
finish() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB_NAME" 2>/dev/null || true
  rm -rf "$WORK"
}
trap finish EXIT
for tool in wrk psql bc; do
  command -v "$tool" >/dev/null || { echo "probe: $tool is missing" >&2; exit 2; }
done

# PROBE_BIN: a binary built beforehand (for A/B runs of two builds, alternating); otherwise this
# checkout's release build.
if [ -n "${PROBE_BIN:-}" ]; then
  BIN=$PROBE_BIN
else
  cargo build --release -q -p tollgate --manifest-path "$ROOT/Cargo.toml"
  BIN=$ROOT/target/release/tollgate
fi
psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB_NAME" -c "CREATE DATABASE $DB_NAME"
DATABASE_URL=$DB_URL "$BIN" migrate >/dev/null

KEY=tg_probe$(printf '0%.0s' $(seq 1 56))
SHA=$(printf '%s' "$KEY" | sha256sum | cut -d' ' -f1)
sed "s/@SHA@/$SHA/; s/127.0.0.1:8088/127.0.0.1:$PORT/; s/127.0.0.1:9100/127.0.0.1:$MOCK_PORT/" \
  "$HERE/tollgate.toml" > "$WORK/tollgate.toml"
REPLAY_KEYS=0
case "$SHAPE" in
  hot) SPREAD=1 ;;
  replay) SPREAD=1; REPLAY_KEYS=64 ;;
  *) SPREAD=8 ;;
esac
sed "s/@KEY@/$KEY/; s/@SPREAD@/$SPREAD/; s/@REPLAY_KEYS@/$REPLAY_KEYS/" "$HERE/first.lua" \
  > "$WORK/first.lua"

"$BIN" mock-provider --listen 127.0.0.1:$MOCK_PORT >"$WORK/mock.log" 2>&1 &
MOCK=$!
DATABASE_URL=$DB_URL "$BIN" serve --config "$WORK/tollgate.toml" >"$WORK/serve.log" 2>&1 &
SERVER=$!
sleep 1.5
wrk -t1 -c16 -d2s -s "$WORK/first.lua" "http://127.0.0.1:$PORT" >/dev/null
if [ -n "${PROBE_BARRIER:-}" ]; then
  touch "$PROBE_BARRIER/ready.${SLOT:-0}"
  while [ "$(ls "$PROBE_BARRIER" | grep -c '^ready\.')" -lt "${PROBE_PARTIES:-1}" ]; do sleep 0.05; done
fi

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The CPU ticks so far of the `postgres` user's processes that pgrep's arguments select.
backends_cpu() {
  for p in $(pgrep -u postgres "$@"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || true; done |
    awk '{s += $1} END {print s + 0}'
}
# Every backend of the cluster; the backends of the probe's own database (their command line
# names it).
pg_cpu() { backends_cpu postgres; }
own_cpu() { backends_cpu -f " $DB_NAME "; }
idle() { awk '/^cpu /{print $5}' /proc/stat; }
# The cluster's WAL records, full-page images and bytes so far (pg_stat_wal, Postgres 14+).
wal() { psql "$ADMIN" -Atc "SELECT wal_records, wal_fpi, wal_bytes, (SELECT xact_commit FROM pg_stat_database WHERE datname = '$DB_NAME') FROM pg_stat_wal" | tr '|' ' '; }
read -r w0 f0 b0 x0 <<<"$(wal)"
i0=$(idle); s0=$(cpu $SERVER); m0=$(cpu $MOCK); p0=$(pg_cpu); o0=$(own_cpu)
wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_}s" -s "$WORK/first.lua" "http://127.0.0.1:$PORT" > "$WORK/wrk.out"
i1=$(idle); s1=$(cpu $SERVER); m1=$(cpu $MOCK); p1=$(pg_cpu); o1=$(own_cpu)
read -r w1 f1 b1 x1 <<<"$(wal)"
TICK=$(getconf CLK_TCK)
N=$(awk '/requests in/{print $1}' "$WORK/wrk.out")
per_call() { echo "scale=3; ($2 - $1) * 1000 / $TICK / $N" | bc; }
grep -E "Requests/sec|Non-2xx" "$WORK/wrk.out"
echo "shape $SHAPE, c$CONNECTIONS, ${SECONDS_} s, $N calls"
echo "CPU ms per call: server $(per_call "$s0" "$s1"), mock $(per_call "$m0" "$m1"), postgres $(per_call "$p0" "$p1") (its database's backends $(per_call "$o0" "$o1"))"
echo "WAL per call: $(echo "scale=1; ($w1 - $w0) / $N" | bc) records, $(echo "scale=2; ($f1 - $f0) / $N" | bc) full-page images, $(echo "($b1 - $b0) / $N" | bc) bytes (the whole cluster's); commits per call $(echo "scale=3; ($x1 - $x0) / $N" | bc) (the probe's database)"
echo "idle: $(echo "scale=1; ($i1 - $i0) * 100 / ($(nproc) * $TICK * $SECONDS_)" | bc) %"
