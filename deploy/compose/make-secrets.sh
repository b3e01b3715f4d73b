#!/usr/bin/env bash
# Generate the per-party secret folders the compose files mount (see make_secrets.py):
#
#   deploy/compose/make-secrets.sh [--parties 3|4] [--out DIR] [--gateway-url URL]
#
# DIR defaults to ./.ppfs/compose-secrets (git- and docker-ignored).
#
# Runs inside the party image (PPFS_PARTY_IMAGE, default ppfs-party:local) so each
# party's keys match the engines the image offers; the party and gateway folders are
# handed to the images' user (uid 10001), ca/ and clients/ to you.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${PPFS_PARTY_IMAGE:-ppfs-party:local}
OUT=./.ppfs/compose-secrets   # .ppfs/ is git- and docker-ignored
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
docker run --rm --user 0:0 --network none \
  -v "$OUT:/out" \
  -v "$ROOT/deploy/compose/make_secrets.py:/opt/make_secrets.py:ro" \
  --entrypoint /opt/ppfs/bin/python "$IMAGE" \
  /opt/make_secrets.py --out /out --host-out "$OUT" --owner-uid "$(id -u)" "${args[@]}"
