#!/usr/bin/env bash
# Runs `understudy demo --postgres --json` RUNS times per rules profile and
# prints first_write_ms (power cut of the primary's site -> first commit
# accepted by the new primary) and lost_writes for each run, with the median
# and maximum. Needs root (PostgreSQL runs as the postgres user) and the
# postgresql-15 package (scripts/install-test-deps.sh installs it).
#
#   scripts/bench-postgres-demo.sh            # 5 runs per profile
#   RUNS=15 scripts/bench-postgres-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
make -s build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The 250 ms profile: fence_grace covers the PostgreSQL fence (400 ms);
# failover_timeout is the safety inequality's minimum, rounded up.
cat > "$tmp/fast.yaml" <<'YAML'
pair: demo
primary: site-a
replica: site-b
heartbeat_timeout: 250ms
failure_threshold: 2
success_threshold: 2
failover_timeout: 1200ms
fence_grace: 450ms
YAML
for profile in defaults fast; do
  args=()
  [ "$profile" = fast ] && args=(--pair-config "$tmp/fast.yaml")
  vals=()
  for i in $(seq "$RUNS"); do
    out=$(./bin/understudy demo --postgres --json --kill-after 6s "${args[@]}" 2>/dev/null)
    fw=$(printf '%s\n' "$out" | awk -F': ' '/"first_write_ms"/ {gsub(/,/,"",$2); print $2}')
    lost=$(printf '%s\n' "$out" | awk -F': ' '/"lost_writes"/ {gsub(/,/,"",$2); print $2}')
    echo "$profile run $i: first_write_ms=$fw lost_writes=$lost"
    vals+=("$fw")
  done
  printf '%s\n' "${vals[@]}" | sort -n | awk -v p="$profile" '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%s: median first_write_ms %.0f, max %.0f over %d runs\n", p, m, a[NR], NR}'
done
