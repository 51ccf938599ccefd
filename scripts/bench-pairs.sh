#!/usr/bin/env bash
# Many pairs over two member nodes (issue 16). For each pair count and mode:
# a store process (understudy serve with no pairs: the embedded NATS,
# synchronous writes), site-a and site-b with one member each of N pairs
# (no-op procedures, default rules, site-a preferred), then a steady phase
# with no fault and, with KILL=1, a SIGKILL of site-a. Prints one PAIRS line
# per run on stdout; benchmarks/pairs/doc.go and docs/benchmarks.md say what
# each figure is.
#
#   scripts/bench-pairs.sh                           # PAIRS="300 600", 60 s, no leadership key
#   PAIRS="300 600 1000 10000" MODE=both KILL=1 DURATION=10m scripts/bench-pairs.sh
#   REV=HEAD scripts/bench-pairs.sh                  # a commit instead of the working tree
#   # issue 16's side by side, one run: per-pair at 300 and 600, node at
#   # 300, 600, 1,000 and 10,000 (10 minutes of steady state at 10,000)
#   MODE=both PAIRS="300 600 1000 10000" PER_PAIR_PAIRS="300 600" \
#     DURATIONS="10000=10m" KILL=1 scripts/bench-pairs.sh
#
# PAIRS     pair counts, space-separated (default "300 600")
# MODE      per-pair, node or both: written as `leadership:` into the node
#           files; unset: no key (the binary's default)
# DURATION  steady phase per run, a Go duration (default 60s)
# DURATIONS per pair count, "N=duration ..." overriding DURATION
# PER_PAIR_PAIRS  with MODE=both, the pair counts per-pair leadership runs
#           at (default: every count of PAIRS); node runs at all
# KILL      1: SIGKILL site-a after the steady phase and time the takeovers
# TOPOLOGY  store (default) or embedded (site-a embeds NATS, as issue 16
#           first measured; no KILL then)
# REPLAY    0: skip the replay of every pair's record (the split-brain count)
# JSON      file to append one JSON object per run to
# REV       git revision to build and measure (default: the working tree,
#           labelled worktree@HEAD, +dirty when its non-test Go code or
#           go.mod differs from HEAD's); the harness itself always comes
#           from the working tree
# KEEP      1: keep each run's directory (node files, logs, store)
# PROMOTE   exec (default): each member's promote procedure is one step
#           running `true`, a process started per promotion; none: no
#           promote step, so a takeover costs the survivor no process
# PPROF     1: the member nodes serve Go's profiler (address in each node's log)
# KILL_PROFILE  with PPROF=1 and KILL=1: site-b's CPU profile after the
#           kill is written to KILL_PROFILE.<mode>.<pairs> (the store's to
#           that name with .store appended)
# KILL_PROFILE_FROM, KILL_PROFILE_FOR  the profiles' window: from this long
#           after the kill (default 0s), this long (default 30s); whole
#           seconds, e.g. 4s and 5s for a takeover of 10,000 pairs
# KILL_TRACE    with PPROF=1 and KILL=1: site-b's execution trace from
#           3.5 s to 8.5 s after the kill (the takeover) is written to
#           KILL_TRACE.<mode>.<pairs> (go tool trace)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PAIRS=${PAIRS:-"300 600"}
MODE=${MODE:-}
DURATION=${DURATION:-60s}
DURATIONS=${DURATIONS:-}
PER_PAIR_PAIRS=${PER_PAIR_PAIRS:-}
KILL=${KILL:-0}
TOPOLOGY=${TOPOLOGY:-store}
REPLAY=${REPLAY:-1}
JSON=${JSON:-}
REV=${REV:-}
PROMOTE=${PROMOTE:-exec}
KEEP=${KEEP:-0}

case "$MODE" in
  "") modes=("") ;;
  per-pair | node) modes=("$MODE") ;;
  both) modes=(per-pair node) ;;
  *) echo "MODE must be per-pair, node or both (or unset), not '$MODE'" >&2; exit 2 ;;
esac

tty=0
[ -t 2 ] && tty=1
say() { [ "$tty" = 1 ] && echo "bench-pairs: $*" >&2 || true; }

tmp=$(mktemp -d -t bench-pairs.XXXXXX)
harness_pid=""
cleanup() {
  if [ -n "$harness_pid" ] && kill -0 "$harness_pid" 2>/dev/null; then
    # The harness kills its nodes on SIGTERM (and they die with it anyway).
    kill -TERM "$harness_pid" 2>/dev/null || true
    wait "$harness_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

src=$repo
rev="worktree@$(git rev-parse --short HEAD)"
# The binary measured differs from HEAD's (the harness's own code aside).
git diff --quiet HEAD -- '*.go' go.mod go.sum ':!*_test.go' ':!benchmarks' || rev+="+dirty"
if [ -n "$REV" ]; then
  rev=$(git rev-parse --short "$REV")
  src=$tmp/src
  mkdir -p "$src"
  git archive "$rev" | tar -x -C "$src"
fi
say "building understudy ($rev) and the harness"
mkdir -p "$tmp/bin"
(cd "$src" && go build -tags libvirt_dlopen -o "$tmp/bin/understudy" ./cmd/understudy)
# The harness is a module of its own (the main module's layering test knows
# only DESIGN.md's folders); built here against $src with $src's
# requirements, so that its go.mod never drifts from the repository's.
h=$tmp/harness
mkdir -p "$h"
cp "$repo"/benchmarks/pairs/*.go "$h"/
{
  printf 'module understudy/benchmarks/pairs\n\n'
  grep -m1 '^go ' "$src/go.mod"
  printf '\nrequire understudy v0.0.0-00010101000000-000000000000\n\n'
  awk '/^require \(/{on=1} on{print} on&&/^\)/{on=0; print ""} /^require [^(]/{print}' "$src/go.mod"
  printf 'replace understudy => %s\n' "$src"
} >"$h/go.mod"
cp "$src/go.sum" "$h/go.sum"
(cd "$h" && go build -tags libvirt_dlopen -o "$tmp/bin/bench-pairs" .)

args=(-bin "$tmp/bin/understudy" -rev "$rev" -topology "$TOPOLOGY" -promote "$PROMOTE" -workdir "$tmp")
[ "$KILL" = 1 ] && args+=(-kill)
[ "$REPLAY" = 0 ] && args+=(-replay=false)
[ "$KEEP" = 1 ] && args+=(-keep -workdir /tmp)
[ "${PPROF:-0}" = 1 ] && args+=(-pprof)
[ "$tty" = 1 ] && args+=(-progress)
[ -n "$JSON" ] && args+=(-json-out "$JSON")

lines=()
status=0
for mode in "${modes[@]}"; do
  for n in $PAIRS; do
    if [ "$mode" = per-pair ] && [ -n "$PER_PAIR_PAIRS" ] && ! [[ " $PER_PAIR_PAIRS " == *" $n "* ]]; then
      continue
    fi
    duration=$DURATION
    for d in $DURATIONS; do
      [ "${d%%=*}" = "$n" ] && duration=${d#*=}
    done
    say "run: pairs=$n mode=${mode:-unset} duration=$duration kill=$KILL topology=$TOPOLOGY load=$(cut -d' ' -f1-3 /proc/loadavg)"
    out=$tmp/run.out
    run_args=()
    [ -n "${KILL_PROFILE:-}" ] && run_args+=(-kill-profile "$KILL_PROFILE.${mode:-unset}.$n")
    [ -n "${KILL_PROFILE_FROM:-}" ] && run_args+=(-kill-profile-from "$KILL_PROFILE_FROM")
    [ -n "${KILL_PROFILE_FOR:-}" ] && run_args+=(-kill-profile-for "$KILL_PROFILE_FOR")
    [ -n "${KILL_TRACE:-}" ] && run_args+=(-kill-trace "$KILL_TRACE.${mode:-unset}.$n")
    "$tmp/bin/bench-pairs" "${args[@]}" "${run_args[@]}" -duration "$duration" -pairs "$n" -mode "$mode" >"$out" &
    harness_pid=$!
    rc=0
    wait "$harness_pid" || rc=$?
    harness_pid=""
    cat "$out"
    lines+=("$(grep '^PAIRS ' "$out" || echo "PAIRS mode=${mode:-unset} pairs=$n failed rc=$rc")")
    [ "$rc" = 0 ] || status=$rc
    sleep 5 # let the machine settle between runs
  done
done
if [ "${#lines[@]}" -gt 1 ]; then
  echo "--- summary"
  printf '%s\n' "${lines[@]}"
fi
exit "$status"
