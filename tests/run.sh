#!/usr/bin/env bash
# The test command (README, .ci/run): set up what the suite needs on a fresh machine, then run it.
#   bash tests/run.sh               # everything, including the real vLLM end-to-end run on an EPYC host
#   bash tests/run.sh -m "not e2e"  # the fast part
# Idempotent: packages, the project venv and the vLLM host stack are reused when present.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: sshd (the --host tests start a real one), numactl + tcmalloc (the host path), patchelf.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  for pkg in openssh-server numactl libtcmalloc-minimal4 patchelf; do
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

# pytest: 0 = all passed; anything else (failures, 5 = no tests collected) fails the run.
exec python3 -m pytest "$@"
