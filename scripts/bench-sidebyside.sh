#!/usr/bin/env bash
# The side-by-side benchmark, understudy vs Patroni 3.0.2 (pgsuite's
# BenchmarkSideBySide): two fresh PostgreSQL 15 servers per system on
# loopback, the same writer (a counter committed every ~10 ms through
# target_session_attrs=read-write), the same kill (-9 of the manager —
# `understudy serve` or `patroni` — and of the postmaster's group, at a
# random phase), KILLS kills per profile alternating sites; prints the
# table (kill -> first commit on the survivor: median, min, max; lost
# acknowledged commits; Patroni/understudy ratios). Installs what it needs
# (idempotent): PostgreSQL 15, Patroni, etcd. Needs root. About 30 minutes
# at 15 kills; keep the machine otherwise idle.
#
#   scripts/bench-sidebyside.sh                 # 15 kills per profile
#   KILLS=3 scripts/bench-sidebyside.sh         # a quick look
#   PROFILES='patroni-fast$' scripts/bench-sidebyside.sh
#   LOG=/tmp/sbs.log scripts/bench-sidebyside.sh   # keep the full output
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-15}
PROFILES=${PROFILES:-.}

need=(postgresql-15 patroni etcd-server)
missing=()
for pkg in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  for attempt in 1 2; do
    if $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
      break
    fi
    [ "$attempt" -eq 2 ] && { echo "bench-sidebyside: could not install: ${missing[*]}" >&2; exit 1; }
    sleep 5
  done
fi
# The packages' own services (the distribution's etcd on 2379, a Patroni
# reading /etc/patroni) play no part: the benchmark starts its own. Where
# an init system started them on install, stop them (and keep them off).
for svc in patroni etcd; do
  if [ -d /run/systemd/system ]; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  elif [ -x "/etc/init.d/$svc" ] && "/etc/init.d/$svc" status >/dev/null 2>&1; then
    "/etc/init.d/$svc" stop || true
  fi
done
go mod download

log=${LOG:-$(mktemp /tmp/bench-sidebyside.XXXXXX.log)}
echo "bench-sidebyside: $KILLS kills per profile; full output in $log" >&2
set +e
UNDERSTUDY_SIDEBYSIDE=1 UNDERSTUDY_SIDEBYSIDE_KILLS=$KILLS \
  go test -tags libvirt_dlopen -run '^$' -bench "^BenchmarkSideBySide\$/$PROFILES" -benchtime 1x -count 1 -timeout 180m -v ./pgsuite 2>&1 |
  tee "$log" | grep --line-buffered -E '^SIDEBYSIDE (kill|profile)|^--- FAIL|FAIL|sidebyside_test.go'
rc=${PIPESTATUS[0]}
set -e
echo
sed -n '/^SIDEBYSIDE-TABLE-BEGIN$/,/^SIDEBYSIDE-TABLE-END$/p' "$log" | sed '1d;$d'
exit "$rc"
