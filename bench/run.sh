#!/usr/bin/env bash
# The toolhost benchmark, one run (see bench/README.md): the in-process V8 floors, the bare Asio
# NDJSON echo server (also through a thread hop and a process hop), then a release toolhostd, all
# measured with the same client; prints the
# table of figures, ratios and targets and writes it to bench/results/<date>-<commit>.md.
# A report, not a test: it exits 0 whether or not the targets are met (non-zero only if a
# measurement could not be taken).
#
#   bench/run.sh [BUILD_DIR]        (default build/release; `make bench` builds and runs it)
#
# Environment: BENCH_DURATION (seconds per throughput phase, default 3), BENCH_SEQUENTIAL (timed
# sequential calls, default 5000), BENCH_ROUNDS (rounds of the warm-call client, each against the
# echo server and then the daemon; the figures are the medians, default 3), BENCH_REVISIONS
# (fresh revisions for the cold-call and RSS phase, default 1000), BENCH_JIT (1: V8 with its JIT,
# in the daemon and the floors alike), BENCH_COMMIT and BENCH_COMMIT_NOTE (below).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-build/release}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
BENCH=$BUILD/bench/toolhost_bench
DAEMON=$BUILD/daemon/toolhostd
CTL=$BUILD/cli/toolhostctl
DURATION=${BENCH_DURATION:-3}
SEQUENTIAL=${BENCH_SEQUENTIAL:-5000}
REVISIONS=${BENCH_REVISIONS:-1000}
ROUNDS=${BENCH_ROUNDS:-3}
INFLIGHT=1,16,64
# V8's JIT in the daemon and in the in-process floors alike: off (--jitless) as the daemon's
# default, on with BENCH_JIT=1.
JIT=false
JIT_FLAG=()
if [[ ${BENCH_JIT:-0} = 1 ]]; then
  JIT=true
  JIT_FLAG=(--jit)
fi

for program in "$BENCH" "$DAEMON" "$CTL"; do
  if [[ ! -x $program ]]; then
    echo "run.sh: $program is missing; build it first:" >&2
    echo "  cmake --preset release && cmake --build --preset release --target toolhost_bench toolhostd toolhostctl" >&2
    exit 1
  fi
done

BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
if [[ $BUILD_TYPE != Release ]]; then
  echo "run.sh: warning: $BUILD is a '${BUILD_TYPE:-unknown}' build; the figures mean something only for Release" >&2
fi

WORK=$(mktemp -d /tmp/thbench.XXXXXX)
FIGURES=$WORK/figures.txt
ECHO_PID=""
HOP_THREAD_PID=""
HOP_PROCESS_PID=""
DAEMON_PID=""

stop() {  # stop PID: SIGTERM, then wait for it
  local pid=$1
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  stop "$ECHO_PID"
  stop "$HOP_THREAD_PID"
  stop "$HOP_PROCESS_PID"
  stop "$DAEMON_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_for_socket() {  # wait_for_socket PATH PID
  for _ in $(seq 200); do
    [[ -S $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || { echo "run.sh: the server exited before listening" >&2; return 1; }
    sleep 0.05
  done
  echo "run.sh: nothing listens on $1" >&2
  return 1
}

figure() { echo "$1 $2" >>"$FIGURES"; }
# CPU time of the whole machine from /proc/stat: "busy steal total" in ticks. Steal is time this
# virtual machine's CPUs were runnable but the host ran something else: a noisy-neighbour gauge.
machine_ticks() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print t-$5-$6, $9, t}' /proc/stat; }
step() { printf '== %s\n' "$*" >&2; }

# --- What this run is -------------------------------------------------------------------------
# BENCH_COMMIT (and BENCH_COMMIT_NOTE) name the tree the binaries were built from when it is not
# this checkout as it stands (e.g. a snapshot of HEAD built elsewhere).
if [[ -n ${BENCH_COMMIT:-} ]]; then
  COMMIT=$BENCH_COMMIT
  DIRTY=${BENCH_COMMIT_NOTE:+ ($BENCH_COMMIT_NOTE)}
else
  COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  DIRTY=""
  [[ -z $(git -C "$ROOT" status --porcelain 2>/dev/null) ]] || DIRTY=" (working tree with uncommitted changes)"
fi
DATE=$(date +%Y-%m-%d)
figure meta.date "$(date '+%Y-%m-%d %H:%M %Z')"
figure meta.commit "$COMMIT$DIRTY"
figure meta.cpu "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
figure meta.nproc "$(nproc)"
figure meta.load_before "$(cut -d' ' -f1-3 /proc/loadavg)"
read -r BUSY_BEFORE STEAL_BEFORE TOTAL_BEFORE < <(machine_ticks)
figure meta.duration_s "$DURATION"
figure meta.revisions "$REVISIONS"
step "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# The same call for both servers: the echo server answers with the params as the result, the
# daemon runs the trivial tool.
PARAMS='{"name":"bench-echo","arguments":{"text":"hello","n":1}}'
CLIENT_ARGS=(--params "$PARAMS" --sequential "$SEQUENTIAL" --inflight "$INFLIGHT" --duration "$DURATION")

# --- In-process V8 floors ---------------------------------------------------------------------
step "in-process V8: isolate create + call (100 kept alive), RSS per isolate (100, 1000), warm call, isolate create + call + dispose"
"$BENCH" v8-floor --kept 100 --warm 0 --cold 0 "${JIT_FLAG[@]}" --prefix v8. >>"$FIGURES"
"$BENCH" v8-floor --isolates "100,$REVISIONS" "${JIT_FLAG[@]}" --prefix v8. >>"$FIGURES"

# --- The transport floor: bare Asio NDJSON echo -----------------------------------------------
"$BENCH" echo-server "$WORK/echo.sock" 2>"$WORK/echo.log" &
ECHO_PID=$!
wait_for_socket "$WORK/echo.sock" "$ECHO_PID"
# The same echo with every line sent through another thread, or another process, and back before
# it is answered: what the hop alone costs a server that runs its calls elsewhere.
"$BENCH" echo-server "$WORK/hop-thread.sock" --hop thread 2>>"$WORK/echo.log" &
HOP_THREAD_PID=$!
wait_for_socket "$WORK/hop-thread.sock" "$HOP_THREAD_PID"
"$BENCH" echo-server "$WORK/hop-process.sock" --hop process 2>>"$WORK/echo.log" &
HOP_PROCESS_PID=$!
wait_for_socket "$WORK/hop-process.sock" "$HOP_PROCESS_PID"

# --- toolhostd (release) ----------------------------------------------------------------------
cat >"$WORK/toolhost.toml" <<EOF
[limits]
max_in_flight = 256

[runtime]
max_retained = 2000
memory_budget_mb = 16384
jit = $JIT
EOF
figure meta.daemon_config "${BUILD_TYPE:-unknown} build, defaults (io_threads 1, workers 2, prewarmed 2, log level info) but max_in_flight 256, max_retained 2000, memory_budget_mb 16384, jit $JIT"
mkdir -p "$WORK/state"
SOCKET=$WORK/d.sock
"$DAEMON" --socket "$SOCKET" --state-dir "$WORK/state" --config "$WORK/toolhost.toml" \
  --log-format text 2>"$WORK/daemon.log" &
DAEMON_PID=$!
wait_for_socket "$SOCKET" "$DAEMON_PID"

step "toolhostd: install + activate the trivial tool"
MANIFEST='{"manifest":{"name":"bench-echo","description":"benchmark: returns its arguments",
  "parameters":{"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"}},"required":["text"]},
  "execution":{"class":"sandboxed-code","runtime":"javascript","source":"export default async (args) => args"}}}'
INSTALLED=$("$CTL" --socket "$SOCKET" --compact call tools.install "$MANIFEST")
REVISION=$(sed -E 's/.*"revision":"([^"]+)".*/\1/' <<<"$INSTALLED")
"$CTL" --socket "$SOCKET" --compact call tools.activate \
  "{\"name\":\"bench-echo\",\"revision\":\"$REVISION\",\"replace\":true}" >/dev/null

# The warm call, against the echo server and then the daemon, ROUNDS times: the machine's noise
# (other virtual machines on the host) moves each figure by 10-20% from one run to the next, and
# it moves the floor and the daemon alike when they are measured close together. The figures
# reported are the medians of the rounds.
# Each round also measures the echo through a thread hop and through a process hop, and the
# daemon's built-in tool `echo` (the same call without a sandbox: the daemon's own share).
NATIVE_ARGS=(--params '{"name":"echo","arguments":{"text":"hello","n":1}}' --sequential "$SEQUENTIAL"
  --inflight "$INFLIGHT" --duration "$DURATION")
for round in $(seq "$ROUNDS"); do
  step "round $round/$ROUNDS: echo server, echo through a thread and a process, toolhostd, toolhostd's built-in echo: sequential, then 1/16/64 in flight for ${DURATION}s each"
  "$BENCH" client "$WORK/echo.sock" "${CLIENT_ARGS[@]}" --server-pid "$ECHO_PID" \
    --prefix "echo.round$round." >>"$WORK/rounds.txt"
  "$BENCH" client "$WORK/hop-thread.sock" "${CLIENT_ARGS[@]}" --server-pid "$HOP_THREAD_PID" \
    --prefix "hopthread.round$round." >>"$WORK/rounds.txt"
  "$BENCH" client "$WORK/hop-process.sock" "${CLIENT_ARGS[@]}" --server-pid "$HOP_PROCESS_PID" \
    --prefix "hopprocess.round$round." >>"$WORK/rounds.txt"
  "$BENCH" client "$SOCKET" "${CLIENT_ARGS[@]}" --server-pid "$DAEMON_PID" \
    --prefix "daemon.round$round." >>"$WORK/rounds.txt"
  "$BENCH" client "$SOCKET" "${NATIVE_ARGS[@]}" --server-pid "$DAEMON_PID" \
    --prefix "native.round$round." >>"$WORK/rounds.txt"
done
stop "$ECHO_PID"
stop "$HOP_THREAD_PID"
stop "$HOP_PROCESS_PID"
ECHO_PID=""
HOP_THREAD_PID=""
HOP_PROCESS_PID=""
# "echo.round2.seq.p50_us 17.3" -> the median of each figure over the rounds, as "echo.seq.p50_us".
awk '{ key = $1; sub(/\.round[0-9]+\./, ".", key); values[key] = values[key] " " $2 }
     END {
       for (key in values) {
         n = split(substr(values[key], 2), v, " ")
         for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) {
           t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
         }
         median = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
         print key, median
       }
     }' "$WORK/rounds.txt" | sort >>"$FIGURES"
figure meta.rounds "$ROUNDS"

step "toolhostd: $REVISIONS fresh revisions: first call of each, RSS after 100 and $REVISIONS"
"$BENCH" cold "$SOCKET" --count "$REVISIONS" --checkpoints "100,$REVISIONS" --server-pid "$DAEMON_PID" \
  --prefix daemon. >>"$FIGURES"
stop "$DAEMON_PID"
DAEMON_PID=""
figure meta.load_after "$(cut -d' ' -f1-3 /proc/loadavg)"
read -r BUSY_AFTER STEAL_AFTER TOTAL_AFTER < <(machine_ticks)
figure meta.steal_pct "$(awk -v s=$((STEAL_AFTER - STEAL_BEFORE)) -v t=$((TOTAL_AFTER - TOTAL_BEFORE)) 'BEGIN{printf "%.1f", t ? 100*s/t : 0}')"
figure meta.busy_pct "$(awk -v b=$((BUSY_AFTER - BUSY_BEFORE)) -v t=$((TOTAL_AFTER - TOTAL_BEFORE)) 'BEGIN{printf "%.1f", t ? 100*b/t : 0}')"
WARNINGS=$(grep -ciE '\b(warn|warning|error|critical)\b' "$WORK/daemon.log" || true)
[[ $WARNINGS = 0 ]] || { echo "run.sh: the daemon logged $WARNINGS warning(s) or error(s):" >&2; head -n 20 "$WORK/daemon.log" >&2; }

# --- The table --------------------------------------------------------------------------------
mkdir -p "$ROOT/bench/results"
RESULT=$ROOT/bench/results/$DATE-$COMMIT.md
echo >&2
"$BENCH" report "$FIGURES" --markdown "$RESULT"
{
  echo
  echo '<details><summary>Raw figures</summary>'
  echo
  echo '```'
  cat "$FIGURES"
  echo '```'
  echo '</details>'
} >>"$RESULT"
echo >&2
echo "written to ${RESULT#"$ROOT"/}" >&2
