#!/usr/bin/env bash
# Installs the system packages the test suite needs, idempotently. A fresh
# machine has only Go and gcc; everything else is brought in here.
set -euo pipefail

need=()
# (populated as capabilities need them: libvirt0, postgresql, ...)
# chromium: the replay HTML timeline is checked in a real headless browser
# (cmd/understudy replay tests); the test fails, never skips, without it.
need+=(chromium)
# libvirt0: the vm/network kinds and the libvirt fence drivers are tested
# against libvirt's built-in test:///default driver (dlopen'ed at run time).
need+=(libvirt0)
# podman, runc, busybox-static: the container kind runs real containers from
# an image imported from a busybox-static rootfs (no registry needed); runc
# because crun cannot run on hybrid-cgroup machines (docs/agents.md).
need+=(podman runc busybox-static)
# iptables, iproute2: the partition suite (partition/) builds three sites as
# network namespaces on a bridge (ip netns, veth) and cuts, delays and drops
# their links with iptables inside them (docs/partitions.md). Delay and loss
# use sch_netem where the kernel has it, else NFQUEUE (no package needed).
need+=(iptables iproute2)
# postgresql-15: the postgres workload (capabilities/postgres) and the pairs
# built on it are tested against real PostgreSQL 15 servers the tests start
# themselves (initdb, pg_basebackup, pg_rewind); the package's own cluster
# is not used. Its postgres OS user runs them.
need+=(postgresql-15)

missing=()
for pkg in "${need[@]:-}"; do
  [ -z "$pkg" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # One retry: an install can fail on a transient fetch or a temporary
  # directory removed under it; a second failure is real and stops here.
  for attempt in 1 2; do
    if $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
      break
    fi
    [ "$attempt" -eq 2 ] && { echo "install-test-deps: could not install: ${missing[*]}" >&2; exit 1; }
    sleep 5
  done
fi
# Go modules (including the pinned staticcheck tool) come from go.mod.
go mod download
