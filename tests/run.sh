#!/usr/bin/env bash
# The test command (README, .ci/run): set up what the suite needs on a fresh machine, then run it.
#   bash tests/run.sh               # everything, including the real vLLM end-to-end run on an EPYC host
#   bash tests/run.sh -m "not e2e"  # the fast part
# Idempotent: packages, the project venv and the vLLM host stack are reused when present.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: sshd (the --host tests start a real one), numactl + tcmalloc (the host path), patchelf,
# and for the container path a Docker engine (docker.io) and debootstrap (the test image's rootfs).
# nginx-light: the TLS terminator in front of an exposed fleet's router.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  for pkg in openssh-server numactl libtcmalloc-minimal4 patchelf docker.io debootstrap nginx-light; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    echo "tests/run.sh: installing ${need[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
  fi
fi

# The bundle's venv (.venv): the scripts' runtime deps + the test extra, made by SKILL.md's step 0.
python3 scripts/bootstrap.py --test > /dev/null 2> >(grep -v "^WARNING: Location" >&2) || {
  python3 scripts/bootstrap.py --test --check; exit 1; }

# As the README does: the venv's python3 is the one on PATH, so the docs' `python3 scripts/...` lines
# run the way a user who followed the README runs them.
. .venv/bin/activate

# A Docker engine for the container e2e: reuse one the docker CLI reaches; else, as root, start dockerd
# on a private socket (no iptables/bridge: containers use --network=host) with its data root in the
# cache, so the test image it holds is reused by the next run; stop it when the run ends. overlay2
# first (a container starts without copying the 4 GB image); vfs where overlay2 cannot mount.
# The container tests get it as EPYC_TEST_DOCKER_HOST; the host-path tests never see it.
engine_pid=""
start_dockerd() {  # $1 = storage driver
  dockerd --storage-driver="$1" --iptables=false --ip6tables=false --bridge=none \
    --data-root "$state/data-$1" --exec-root "$run/exec" --pidfile "$run/dockerd.pid" -H "$sock" \
    > "$state/dockerd-$1.log" 2>&1 &
  engine_pid=$!
  for _ in $(seq 60); do
    DOCKER_HOST="$sock" docker info >/dev/null 2>&1 && return 0
    kill -0 "$engine_pid" 2>/dev/null || break
    sleep 1
  done
  kill "$engine_pid" 2>/dev/null || true; wait "$engine_pid" 2>/dev/null || true; engine_pid=""
  return 1
}
if docker info >/dev/null 2>&1; then
  export EPYC_TEST_DOCKER_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}"
elif [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null 2>&1; then
  state="${XDG_CACHE_HOME:-$HOME/.cache}/serving-llms-on-epyc/docker"
  run=/run/serving-llms-on-epyc-docker
  mkdir -p "$state" "$run"
  sock="unix://$run/docker.sock"
  if DOCKER_HOST="$sock" docker info >/dev/null 2>&1 || start_dockerd overlay2 || start_dockerd vfs; then
    export EPYC_TEST_DOCKER_HOST="$sock"
  else
    echo "tests/run.sh: dockerd did not start (see $state/dockerd-*.log): the container e2e will skip" >&2
  fi
fi
stop_engine() {
  if [ -n "$engine_pid" ]; then
    kill "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
  fi
}
trap stop_engine EXIT

# pytest: 0 = all passed; anything else (failures, 5 = no tests collected) fails the run.
# The whole suite (no arguments): the fast part on both cores (pytest-xdist), then, alone, what must not
# share the machine: the real vLLM runs (they take every core and ~12 GB), the sshd tests, and the mutation
# tool (it rewrites scripts/ while its tests run). With arguments: one pytest run of exactly those.
rc=0
if [ "$#" -eq 0 ]; then
  # lint and format first: zero findings (pyproject.toml [tool.ruff])
  python3 -m ruff check scripts tests || rc=$?
  python3 -m ruff format --check scripts tests || rc=$?
  python3 -m pytest -n 4 -m "not e2e and not ssh and not serial" || rc=$?
  python3 -m pytest -m "e2e or ssh or serial" || rc=$?
else
  python3 -m pytest "$@" || rc=$?
fi
exit "$rc"
