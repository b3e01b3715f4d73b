#!/usr/bin/env bash
# Air-gapped image build: builds ppfs-party and ppfs-gateway without pulling any image.
#
#   1. base image  : debootstrap a minimal Debian bookworm rootfs (python3 3.11, pip, venv,
#                    the shared libraries a locally built MP-SPDZ links against) from the
#                    Debian mirror, then `tar | docker import` it as ppfs-base:bookworm.
#                    The rootfs tarball is cached; re-runs only re-import it if needed.
#   2. wheelhouse  : `pip wheel` of ppfs's dependencies and build backend, on the host
#                    (cached until pyproject.toml changes).
#   3. images      : services/party/Dockerfile and services/dealer-gateway/Dockerfile
#                    FROM that base (BASE_IMAGE), installing from the wheelhouse only
#                    (pip --no-index) and ppfs from the source in the build context.
#
# Needs: root (debootstrap), debootstrap, docker, a CPython 3.11 on the host for the
# wheelhouse, and either network access to a Debian mirror and PyPI, or a pre-filled cache
# (PPFS_BUILD_CACHE) and wheelhouse (PPFS_WHEELHOUSE) carried in from elsewhere.
#
# Environment (all optional):
#   MPSPDZ_SOURCE      local | none | tarball   (default: local if MPSPDZ_HOME has the
#                      party binaries, else none). `local` copies an already-built MP-SPDZ
#                      from MPSPDZ_HOME (default /opt/mp-spdz); `tarball` downloads the
#                      pinned release inside the build (needs network + MPSPDZ_SHA256).
#   MPSPDZ_SHA256      SHA-256 of the release tarball (tarball mode only)
#   PPFS_IMAGE_TAG     tag of the two images (default: local)
#   PPFS_BASE_IMAGE    name of the imported base (default: ppfs-base:bookworm)
#   PPFS_BUILD_CACHE   rootfs cache (default: ~/.cache/ppfs-offline-build)
#   PPFS_WHEELHOUSE    use this ready wheelhouse instead of running pip on the host
#   DEBIAN_MIRROR      default: http://deb.debian.org/debian
#   PYTHON             host interpreter for `pip wheel` (default: .venv/bin/python)
#   ONLY               base | wheels | images  (run only that step)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

TAG=${PPFS_IMAGE_TAG:-local}
BASE=${PPFS_BASE_IMAGE:-ppfs-base:bookworm}
CACHE=${PPFS_BUILD_CACHE:-$HOME/.cache/ppfs-offline-build}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
STAGE="$ROOT/build/offline"          # inside the build context; build/ is git-ignored
MPSPDZ_HOME=${MPSPDZ_HOME:-/opt/mp-spdz}
MPSPDZ_FILES=(replicated-ring-party.x sy-rep-ring-party.x rep4-ring-party.x libSPDZ.so compile.py Compiler)
if [[ -z "${MPSPDZ_SOURCE:-}" ]]; then
  if [[ -x "$MPSPDZ_HOME/replicated-ring-party.x" ]]; then MPSPDZ_SOURCE=local; else MPSPDZ_SOURCE=none; fi
fi
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
# Runtime packages of the base: Python, and what a locally built MP-SPDZ links against
# (the release tarball's binaries are static and need none of the libraries).
PACKAGES=(python3 python3-venv python3-pip ca-certificates
          libgmpxx4ldbl libsodium23 libssl3 libboost-filesystem1.74.0 libboost-iostreams1.74.0)

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf '[build-images] error: %s\n' "$*" >&2; exit 1; }

# Docker CLI >= 23 uses BuildKit via buildx; without the buildx plugin fall back to the
# classic builder. Both build these Dockerfiles (they use no BuildKit-only syntax).
if ! docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=0; fi

base_key() {
  printf '%s\n' "$SUITE" "$MIRROR" "${PACKAGES[@]}" | sha256sum | cut -c1-16
}

build_base() {
  local key tarball rootfs
  key=$(base_key)
  if [[ "$(docker image inspect -f '{{index .Config.Labels "org.ppfs.base-key"}}' "$BASE" 2>/dev/null)" == "$key" ]]; then
    log "base $BASE is up to date (key $key)"
    return
  fi
  tarball="$CACHE/rootfs-$SUITE-$key.tar"
  if [[ ! -s "$tarball" ]]; then
    command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
    [[ $(id -u) -eq 0 ]] || die "debootstrap needs root"
    rootfs="$CACHE/rootfs-$SUITE-$key"
    rm -rf "$rootfs"; mkdir -p "$rootfs"
    log "debootstrap $SUITE from $MIRROR into $rootfs"
    local include; include=$(IFS=,; echo "${PACKAGES[*]}")
    debootstrap --variant=minbase --include="$include" "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap-$key.log" 2>&1 \
      || die "debootstrap failed; see $CACHE/debootstrap-$key.log"
    # slim it down: no package caches, docs or man pages
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
           "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$rootfs/etc/apt/sources.list"
    "$rootfs/usr/bin/python3" --version >/dev/null 2>&1 || chroot "$rootfs" python3 --version >/dev/null \
      || die "python3 missing in the rootfs"
    tar --numeric-owner -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
  else
    log "using cached rootfs $tarball"
  fi
  log "docker import $tarball as $BASE"
  docker import \
    --change "LABEL org.ppfs.base-key=$key" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8" \
    --change 'CMD ["/bin/bash"]' \
    "$tarball" "$BASE" >/dev/null
}

build_wheels() {
  # Wheels of ppfs's dependencies and of its build backend; ppfs itself is installed from
  # the source in the build context, so editing the source does not touch this layer.
  if [[ -n "${PPFS_WHEELHOUSE:-}" ]]; then
    log "using the wheelhouse $PPFS_WHEELHOUSE"
    rm -rf "$STAGE/wheelhouse"; mkdir -p "$STAGE"; cp -a "$PPFS_WHEELHOUSE" "$STAGE/wheelhouse"
    rm -f "$STAGE"/wheelhouse/ppfs-*.whl
    return
  fi
  local ver; ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ "$ver" == "3.11" ]] || die "the base has Python 3.11; $PYTHON is $ver (set PYTHON)"
  mkdir -p "$STAGE/wheelhouse"
  local stamp="$STAGE/wheelhouse/.deps-key" key reqs
  key=$(sha256sum pyproject.toml | cut -c1-16)
  if [[ "$(cat "$stamp" 2>/dev/null)" == "$key" ]]; then
    log "wheelhouse up to date (pyproject.toml unchanged)"
    return
  fi
  log "wheelhouse: dependencies of ppfs and its build backend (pip wheel)"
  reqs="$STAGE/requirements.txt"
  "$PYTHON" - "$ROOT/pyproject.toml" >"$reqs" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(p["build-system"]["requires"] + p["project"]["dependencies"]))
PY
  rm -f "$STAGE"/wheelhouse/*.whl
  "$PYTHON" -m pip wheel --quiet --wheel-dir "$STAGE/wheelhouse" -r "$reqs"
  echo "$key" >"$stamp"
}

stage_mpspdz() {
  rm -rf "$STAGE/mpspdz"; mkdir -p "$STAGE/mpspdz"
  if [[ "$MPSPDZ_SOURCE" == local ]]; then
    local f
    for f in "${MPSPDZ_FILES[@]}"; do
      [[ -e "$MPSPDZ_HOME/$f" ]] || die "MPSPDZ_SOURCE=local: $MPSPDZ_HOME/$f not found (build MP-SPDZ first or set MPSPDZ_HOME)"
      cp -a "$MPSPDZ_HOME/$f" "$STAGE/mpspdz/"
    done
    find "$STAGE/mpspdz/Compiler" -name __pycache__ -prune -exec rm -rf {} +
    log "staged MP-SPDZ binaries and compiler from $MPSPDZ_HOME"
  fi
}

build_images() {
  docker image inspect "$BASE" >/dev/null 2>&1 || die "base image $BASE missing (run without ONLY)"
  [[ -n "$(ls "$STAGE"/wheelhouse/*.whl 2>/dev/null)" ]] || die "no wheels in $STAGE/wheelhouse (run without ONLY)"
  stage_mpspdz
  local common=(--build-arg "BASE_IMAGE=$BASE" --build-arg "WHEELHOUSE=build/offline/wheelhouse")
  log "building ppfs-party:$TAG (MPSPDZ_SOURCE=$MPSPDZ_SOURCE)"
  docker build --quiet -f services/party/Dockerfile "${common[@]}" \
    --build-arg "MPSPDZ_SOURCE=$MPSPDZ_SOURCE" \
    --build-arg "MPSPDZ_LOCAL_DIR=build/offline/mpspdz" \
    ${MPSPDZ_SHA256:+--build-arg "MPSPDZ_SHA256=$MPSPDZ_SHA256"} \
    -t "ppfs-party:$TAG" . >/dev/null
  log "building ppfs-gateway:$TAG"
  docker build --quiet -f services/dealer-gateway/Dockerfile "${common[@]}" \
    -t "ppfs-gateway:$TAG" . >/dev/null
  rm -rf "$STAGE/mpspdz"   # the MP-SPDZ copy lives in the image only, never in the tree
  log "done: ppfs-party:$TAG ppfs-gateway:$TAG (base $BASE)"
}

mkdir -p "$CACHE"
case "${ONLY:-all}" in
  base) build_base ;;
  wheels) build_wheels ;;
  images) build_images ;;
  all) build_base; build_wheels; build_images ;;
  *) die "ONLY must be base, wheels or images" ;;
esac
