#!/bin/sh
# Party container entrypoint. The party's keys and certificates are a read-only secret
# folder mounted at $PPFS_SECRETS_DIR (compose secret, or tmpfs fetched from Key Vault on
# a VM); the share store is the writable state volume. Link the former into the latter
# (keys/ and certs/ are read, never written, once every key exists), take the registered
# data owners from the secret folder, then run `ppfs "$@"`.
set -eu
state=${PPFS_STATE_DIR:-/var/lib/ppfs/state}
secrets=${PPFS_SECRETS_DIR:-/run/secrets/ppfs}
if [ -d "$secrets/keys" ]; then
  mkdir -p "$state"
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
fi
exec /opt/ppfs/bin/ppfs "$@"
