#!/usr/bin/env bash
# Two revisions through the performance harness's load section, alternated (spec/performance.md —
# The probes): each revision is built once (its `tollgate` binary and its harness), then the
# two run the chosen cases in turn, PAIRS times, the first of each pair swapped every pair, so a
# phase of the machine that is slower for minutes falls on both. Prints every run's rate, server
# + Postgres CPU and commits a call of each case, then the median of each per revision.
#
#   benches/probe/ab.sh REV_A REV_B [CASES] [PAIRS]
#
# CASES: the harness's case families (`TOLLGATE_HARNESS_CASES`, default `one-scope,hot`);
# PAIRS: default 3. `TOLLGATE_HARNESS_CASE_MS` (default here 5000) passes through. The builds go
# to `target/ab` (override with AB_TARGET_DIR); the revisions' sources to worktrees under a
# temporary directory, removed at the end. Needs what the harness needs (`benches/setup.sh`).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 REV_A REV_B [CASES] [PAIRS]" >&2
  exit 2
fi
rev_a=$1
rev_b=$2
cases=${3:-one-scope,hot}
pairs=${4:-3}
root=$(git rev-parse --show-toplevel)
target=${AB_TARGET_DIR:-$root/target/ab}
work=$(mktemp -d /tmp/tollgate-ab.XXXXXX)
cleanup() {
  for side in a b; do
    [ -d "$work/src-$side" ] && git -C "$root" worktree remove --force "$work/src-$side"
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Builds revision $1 as side $2: its server binary and its harness, copied out of the shared
# target directory (the second build reuses what the two revisions share).
build() {
  local rev=$1 side=$2
  git -C "$root" worktree add --detach "$work/src-$side" "$rev" >/dev/null 2>&1
  local harness
  harness=$(cd "$work/src-$side" &&
    CARGO_TARGET_DIR=$target cargo bench -p tollgate --bench harness --no-run \
      --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\/harness-[^"]*\)".*/\1/p' | tail -1)
  if [ -z "$harness" ]; then
    echo "the harness of $rev did not build" >&2
    exit 1
  fi
  cp "$harness" "$work/harness-$side"
  cp "$target/release/tollgate" "$work/tollgate-$side"
  echo "built $rev as $side: $(md5sum <"$work/tollgate-$side" | cut -c1-12)" >&2
}
build "$rev_a" a
build "$rev_b" b

ulimit -n 20000
# One run of side $1: the rows of its cases, as `side case ok/s cpu_ms commits ratio`, the
# ratio being the case's rate over the same run's TPC-B c8.
run() {
  local side=$1
  (cd "$work/src-$side/crates/tollgate" &&
    TOLLGATE_HARNESS_SECTIONS=load TOLLGATE_HARNESS_CASES="$cases" TOLLGATE_HARNESS_ROUNDS=1 \
      TOLLGATE_HARNESS_MANY_IN_FLIGHT=0 \
      TOLLGATE_HARNESS_CASE_MS="${TOLLGATE_HARNESS_CASE_MS:-5000}" \
      TOLLGATE_HARNESS_SERVER_BIN="$work/tollgate-$side" "$work/harness-$side" --bench 2>&1) |
    awk -F'|' -v side="$side" '
      /^\| TPC-B c8 \|/ { gsub(/ /, "", $3); tpcb = $3; print side, "TPC-B-c8", $3, "-", "-", "-" }
      /^\| (first calls|replays)/ && $2 !~ /\// {
        name = $2; gsub(/^ +| +$/, "", name); gsub(/ /, "-", name)
        rate = $3; gsub(/ /, "", rate)
        printf "%s %s %s %.3f %s %.3f\n", side, name, rate, $7 + $8, $9 + 0, tpcb ? rate / tpcb : 0
      }'
}

echo "side case ok/s cpu_ms_a_call commits_a_call over_tpcb_c8" >"$work/runs"
for pair in $(seq 1 "$pairs"); do
  if [ $((pair % 2)) -eq 1 ]; then order="a b"; else order="b a"; fi
  for side in $order; do
    run "$side" | tee -a "$work/runs" | sed "s/^/pair $pair: /"
  done
done

echo
echo "medians over $pairs runs each (a = $rev_a, b = $rev_b):"
echo "| case | a ok/s | b ok/s | b / a | a / TPC-B c8 | b / TPC-B c8 | a CPU ms a call | b CPU ms a call |"
echo "|---|---|---|---|---|---|---|---|"
tail -n +2 "$work/runs" | awk '
  # mawk has no asort: an insertion sort of the few values.
  function median(list,   a, n, i, j, v) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) {
      v = a[i] + 0
      for (j = i - 1; j >= 1 && a[j] + 0 > v; j--) a[j + 1] = a[j]
      a[j + 1] = v
    }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    rate[$2, $1] = rate[$2, $1] " " $3; cpu[$2, $1] = cpu[$2, $1] " " $4
    ratio[$2, $1] = ratio[$2, $1] " " $6; seen[$2] = 1
  }
  END {
    for (c in seen) {
      ra = median(rate[c, "a"]); rb = median(rate[c, "b"])
      pg = c == "TPC-B-c8"
      printf "| %s | %.0f | %.0f | %.3f | %s | %s | %s | %s |\n", c, ra, rb, ra ? rb / ra : 0,
        pg ? "-" : sprintf("%.3f", median(ratio[c, "a"])),
        pg ? "-" : sprintf("%.3f", median(ratio[c, "b"])),
        pg ? "-" : sprintf("%.3f", median(cpu[c, "a"])),
        pg ? "-" : sprintf("%.3f", median(cpu[c, "b"]))
    }
  }' | sort
