#!/usr/bin/env bash
# Prepares this machine for the performance harness (`cargo bench -p tollgate --bench harness`,
# README — Benchmarks): installs what it drives and reads, and sets up the local Postgres
# cluster so that every figure of its table can be measured.
#
# - wrk, the HTTP load generator (Debian `wrk`);
# - pgbench, the machine's own limit (Debian `postgresql-contrib`);
# - perf, for profiles of a run (Debian `linux-perf`);
# - pg_stat_statements in shared_preload_libraries (statements per call);
# - max_connections = 300 (two servers' pools, pgbench's clients and the tests beside them).
#
# The last two restart the cluster, once, and only when they change something. Run as root on
# a machine whose Postgres is Debian's cluster at 127.0.0.1:5432 (trust auth, user postgres).
set -euo pipefail

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v pgbench >/dev/null || missing+=(postgresql-contrib)
command -v perf >/dev/null || missing+=(linux-perf)
if [ ${#missing[@]} -gt 0 ]; then
  echo "+ apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

psql_admin() { psql -h 127.0.0.1 -U postgres -d postgres -Atqc "$1"; }
restart=no
if ! psql_admin "SHOW shared_preload_libraries" | grep -q pg_stat_statements; then
  echo "+ ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
  psql_admin "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
  restart=yes
fi
if [ "$(psql_admin "SHOW max_connections")" -lt 300 ]; then
  echo "+ ALTER SYSTEM SET max_connections = 300"
  psql_admin "ALTER SYSTEM SET max_connections = 300"
  restart=yes
fi
if [ "$restart" = yes ]; then
  version=$(ls /etc/postgresql)
  echo "+ pg_ctlcluster $version main restart"
  pg_ctlcluster --skip-systemctl-redirect "$version" main restart
  for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p 5432 -q && break
    sleep 1
  done
fi
echo "ready: wrk $(wrk --version 2>&1 | head -1 | awk '{print $2}'), $(pgbench --version), \
pg_stat_statements preloaded, max_connections $(psql_admin "SHOW max_connections")"
