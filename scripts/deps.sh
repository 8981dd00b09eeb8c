#!/usr/bin/env bash
# Installs what toolhost needs to build and test on Debian 12. Idempotent, and quick when
# everything is already present. V8 comes from Debian's libnode108/libnode-dev; where apt refuses
# them (a NodeSource `nodejs` is installed), both are downloaded and unpacked into .deps/ instead.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix="$root/.deps"

packages=(
  build-essential cmake ninja-build pkg-config
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libssl-dev liblmdb-dev lmdb-utils libspdlog-dev libfmt-dev catch2 libcli11-dev libtomlplusplus-dev
  libsystemd-dev systemd libseccomp-dev libmimalloc-dev
  libuv1 libicu72 libc-ares2 libbrotli1 libnghttp2-14 zlib1g
  socat python3 openssl util-linux
)

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_ apt-get update -qq || true
  sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Unpack a Debian package (and nothing it depends on) into the local prefix.
unpack() {
  local pkg=$1 stamp="$prefix/.stamp-$1"
  [ -f "$stamp" ] && return 0
  mkdir -p "$prefix/download"
  (cd "$prefix/download" && rm -f "${pkg}"_*.deb && chmod 777 . && apt-get download -qq "$pkg" 2>&1 | grep -v "unsandboxed as root" || true)
  dpkg -x "$prefix/download/${pkg}"_*.deb "$prefix"
  touch "$stamp"
}

# V8: prefer the system packages; fall back to a local unpack when apt cannot install them.
if [ ! -f /usr/include/node/v8.h ] || [ ! -e /usr/lib/x86_64-linux-gnu/libnode.so ]; then
  if ! dpkg-query -W -f='${Status}' libnode-dev 2>/dev/null | grep -q 'install ok installed'; then
    if ! sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        libnode-dev >/dev/null 2>&1; then
      unpack libnode108
      unpack libnode-dev
      # libnode-dev's libnode.so points at the versioned library by an absolute-free name; make
      # sure the link exists in the local prefix.
      lib="$prefix/usr/lib/x86_64-linux-gnu"
      if [ ! -e "$lib/libnode.so" ]; then ln -sf libnode.so.108 "$lib/libnode.so"; fi
    fi
  fi
fi

# valijson is header-only; its Debian package pulls in adapters' libraries we do not use.
if [ ! -f /usr/include/valijson/validator.hpp ]; then
  unpack libvalijson-dev
fi

exit 0
