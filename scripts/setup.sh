#!/usr/bin/env bash
# Installs the Debian 12 packages kvrouter needs, only those missing (idempotent; a no-op in about
# a second when everything is present). Runs as root, or through sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libxxhash-dev libjson-c-dev check
  libluajit2-5.1-dev libevent-dev
  libzmq3-dev libmsgpack-dev
  zlib1g-dev
  libnats-dev nats-server
  python3 python3-xxhash
  curl wrk
)
# Extra packages for optional jobs: KVR_SETUP_EXTRA="clang libclang-rt-14-dev valgrind"
# (scripts/test.sh sets it for its valgrind and fuzz flavours)
if [ -n "${KVR_SETUP_EXTRA:-}" ]; then
  read -r -a extra <<<"$KVR_SETUP_EXTRA"
  PACKAGES+=("${extra[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
