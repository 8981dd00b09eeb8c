#!/usr/bin/env bash
# Alternating A/B runs of two toolhostd builds on the warm path (see bench/README.md): on these
# VMs one figure moves by 10-20% between runs of the same binary, so a difference shows only
# in runs of A and B taken in turn, each with a daemon of its own, and compared by their medians.
# A report, not a test.
#
#   bench/ab.sh BUILD_A BUILD_B [PAIRS]     (PAIRS default 5)
#
# BUILD_* are build directories with daemon/toolhostd and cli/toolhostctl (a release build);
# the client is BUILD_B's bench/toolhost_bench. Environment: AB_DURATION (seconds per
# throughput phase, default 3), AB_SEQUENTIAL (timed sequential calls, default 3000),
# AB_CONFIG_A and AB_CONFIG_B (TOML appended to that side's config, e.g. "[server]
# io_threads = 2" to compare two settings of one build).
#
# Prints each run's figures, then per build the median of: sequential p50 (µs), calls/s and
# server CPU per call (µs) with 64 in flight, and server CPU per call with 1 in flight.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
absolute() { [[ $1 = /* ]] && echo "$1" || echo "$ROOT/$1"; }
A=$(absolute "$1")
B=$(absolute "$2")
PAIRS=${3:-5}
BENCH=$B/bench/toolhost_bench
for program in "$A/daemon/toolhostd" "$A/cli/toolhostctl" "$B/daemon/toolhostd" \
    "$B/cli/toolhostctl" "$BENCH"; do
  [[ -x $program ]] || { echo "ab.sh: $program is missing; build it first" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/thab.XXXXXX)
DAEMON_PID=""
cleanup() {
  [[ -n $DAEMON_PID ]] && { kill -TERM "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT

PARAMS='{"name":"bench-echo","arguments":{"text":"hello","n":1}}'
MANIFEST='{"manifest":{"name":"bench-echo","description":"benchmark: returns its arguments","parameters":{"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"}},"required":["text"]},"execution":{"class":"sandboxed-code","runtime":"javascript","source":"export default async (args) => args"}}}'

# one BUILD LABEL EXTRA_TOML: one daemon, one client run; appends "LABEL seq tput64 cpu64 cpu1".
one() {
  local build=$1 label=$2 extra=$3 dir
  dir=$(mktemp -d "$WORK/run.XXXX")
  mkdir -p "$dir/state"
  printf '[limits]\nmax_in_flight = 256\n%s\n' "$extra" >"$dir/toolhost.toml"
  "$build/daemon/toolhostd" --socket "$dir/d.sock" --state-dir "$dir/state" \
    --config "$dir/toolhost.toml" --log-format text 2>"$dir/daemon.log" &
  DAEMON_PID=$!
  for _ in $(seq 200); do [[ -S $dir/d.sock ]] && break; sleep 0.05; done
  local revision
  revision=$("$build/cli/toolhostctl" --socket "$dir/d.sock" --compact call tools.install "$MANIFEST" |
             sed -E 's/.*"revision":"([^"]+)".*/\1/')
  "$build/cli/toolhostctl" --socket "$dir/d.sock" --compact call tools.activate \
    "{\"name\":\"bench-echo\",\"revision\":\"$revision\",\"replace\":true}" >/dev/null
  "$BENCH" client "$dir/d.sock" --params "$PARAMS" --sequential "${AB_SEQUENTIAL:-3000}" \
    --inflight 1,64 --duration "${AB_DURATION:-3}" --server-pid "$DAEMON_PID" --prefix x. \
    2>/dev/null >"$dir/figures"
  kill -TERM "$DAEMON_PID"
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
  awk -v label="$label" '
    $1 == "x.seq.p50_us" { seq = $2 }
    $1 == "x.tput.64.calls_per_s" { tput = $2 }
    $1 == "x.tput.64.server_cpu_us_per_call" { cpu64 = $2 }
    $1 == "x.tput.1.server_cpu_us_per_call" { cpu1 = $2 }
    END { printf "%s %.1f %.0f %.2f %.1f\n", label, seq, tput, cpu64, cpu1 }' \
    "$dir/figures" | tee -a "$WORK/runs"
}

echo "label seq_p50_us calls_per_s_64 cpu_us_per_call_64 cpu_us_per_call_1"
for _ in $(seq "$PAIRS"); do
  one "$A" A "${AB_CONFIG_A:-}"
  one "$B" B "${AB_CONFIG_B:-}"
done

median() {  # median LABEL COLUMN
  awk -v label="$1" -v column="$2" '$1 == label { print $column }' "$WORK/runs" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo
echo "medians of $PAIRS runs each: A = $A, B = $B"
printf '%-28s %12s %12s\n' "" A B
printf '%-28s %12s %12s\n' "sequential p50, us" "$(median A 2)" "$(median B 2)"
printf '%-28s %12s %12s\n' "64 in flight, calls/s" "$(median A 3)" "$(median B 3)"
printf '%-28s %12s %12s\n' "64 in flight, CPU us/call" "$(median A 4)" "$(median B 4)"
printf '%-28s %12s %12s\n' "1 in flight, CPU us/call" "$(median A 5)" "$(median B 5)"
