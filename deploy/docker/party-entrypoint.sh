#!/bin/sh
# Party container entrypoint. The share store is the writable state volume; the secret
# folder mounted read-only at $PPFS_SECRETS_DIR (compose secret, or tmpfs fetched from Key
# Vault on a VM) holds the party's certificates (certs/) and registered data owners
# (owners.json), and its keys (keys/) only where they were made for it on one host
# (compose). Link keys/ and certs/ into the state (read, never written, once every key
# exists), take the registered data owners, then run `ppfs "$@"`. A party whose secret
# folder carries no keys/ makes its own in the state volume at its first start, and its key
# request (csr/, public) is what leaves it to be signed (deploy/terraform-azure/README.md).
# Keys the party made itself are never replaced by keys/ in its secret folder (made on
# another machine): it refuses to start instead, naming both.
set -eu
state=${PPFS_STATE_DIR:-/var/lib/ppfs/state}
secrets=${PPFS_SECRETS_DIR:-/run/secrets/ppfs}
mkdir -p "$state"
if [ -d "$secrets/keys" ] && [ -e "$state/keys" ] && [ ! -L "$state/keys" ]; then
  echo "ppfs party: error: $state/keys holds the keys this party made itself; its secret" \
    "folder brings other keys ($secrets/keys), made elsewhere: refusing to replace them." \
    "Take keys/ out of the secret folder (make-secrets.sh --no-party-keys)." >&2
  exit 2
fi
for d in keys certs; do
  if [ -d "$secrets/$d" ]; then
    rm -rf "${state:?}/$d"
    ln -s "$secrets/$d" "$state/$d"
  fi
done
if [ -f "$secrets/owners.json" ]; then
  cp "$secrets/owners.json" "$state/owners.json.tmp"
  mv "$state/owners.json.tmp" "$state/owners.json"
fi
exec /opt/ppfs/bin/ppfs "$@"
