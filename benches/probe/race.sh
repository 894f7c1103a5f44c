#!/usr/bin/env bash
# Two builds raced side by side: the probe (probe.sh) of build A in slot 1 and of build B in
# slot 2 at once, each on its own database, ports and wrk, their measured runs started together.
# Both share the machine for the same seconds, so a drift of the machine's speed moves both
# alike, and the CPU each side's server and database backends spend a call is read over the same
# seconds. Their rates stay close to each other: both commit into the one WAL of the cluster, so
# their commits are flushed together. Compare the CPU per call; run it a few times, swapping A
# and B, since the two are not placed on the cores alike.
#
# usage: benches/probe/race.sh BIN_A BIN_B [CONNECTIONS] [SECONDS] [spread|hot|replay]
# Prints each side's rate and CPU per call (the server, the mock, the backends of its own
# database); the WAL line is the whole cluster's, both sides together.
set -euo pipefail
bin_a=${1:?usage: $0 BIN_A BIN_B [CONNECTIONS] [SECONDS] [SHAPE]}
bin_b=${2:?usage: $0 BIN_A BIN_B [CONNECTIONS] [SECONDS] [SHAPE]}
connections=${3:-32}
seconds=${4:-10}
shape=${5:-spread}
here=$(cd "$(dirname "$0")" && pwd)
barrier=$(mktemp -d)
trap 'rm -rf "$barrier"' EXIT
PROBE_BIN=$bin_a PROBE_SLOT=1 PROBE_BARRIER=$barrier PROBE_PARTIES=2 \
  "$here/probe.sh" "$connections" "$seconds" "$shape" >"$barrier/out.a" 2>&1 &
a=$!
PROBE_BIN=$bin_b PROBE_SLOT=2 PROBE_BARRIER=$barrier PROBE_PARTIES=2 \
  "$here/probe.sh" "$connections" "$seconds" "$shape" >"$barrier/out.b" 2>&1 &
b=$!
status=0
wait $a || status=$?
wait $b || status=$?
for side in a b; do
  echo "side $side:"
  grep -E "Requests/sec|Non-2xx|CPU ms|shape" "$barrier/out.$side" | sed 's/^/  /'
done
exit $status
