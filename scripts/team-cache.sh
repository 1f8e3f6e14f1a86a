#!/usr/bin/env bash
# A team's signed binary cache: a signing key pair and a file:// cache directory (idempotent).
#
#   scripts/team-cache.sh DIR [KEY_NAME]
#
# Makes, once (an existing key is kept):
#   DIR/secret-key   the signing key (`nix key generate-secret`); give it to whoever pushes, and nobody else
#   DIR/public-key   its public half (`nix key convert-secret-to-public`); every teammate trusts it
#   DIR/cache/       a file:// binary cache (nix creates its nix-cache-info on the first push)
# and prints the settings a pusher and a puller need. Any store `nix copy --to` takes (ssh://, s3://, a directory
# served over HTTP) works the same; a file:// cache on a shared file system is the simplest.
# Needs no root (only nix); KEY_NAME defaults to "$(hostname)-flakebot-1".
set -euo pipefail

dir="${1:-}"
[ -n "$dir" ] || { echo "usage: team-cache.sh DIR [KEY_NAME]" >&2; exit 1; }
name="${2:-$(hostname)-flakebot-1}"
command -v nix >/dev/null || { echo "team-cache.sh: nix is not installed (scripts/setup-nix.sh)" >&2; exit 1; }
mkdir -p "$dir/cache"
dir="$(cd "$dir" && pwd)"
nix=(nix --extra-experimental-features nix-command)
if [ ! -s "$dir/secret-key" ]; then
    (umask 077 && "${nix[@]}" key generate-secret --key-name "$name" > "$dir/secret-key.new")
    mv "$dir/secret-key.new" "$dir/secret-key"
fi
"${nix[@]}" key convert-secret-to-public < "$dir/secret-key" > "$dir/public-key"
echo "# who pushes (flakebot push NAME, or --push after every build):"
echo "export FLAKEBOT_PUSH_TO=file://$dir/cache FLAKEBOT_NIX_SECRET_KEY=$dir/secret-key"
echo "# who pulls (flakebot pull NAME --from NOTEBOOK.ipynb):"
echo "export FLAKEBOT_NIX_SUBSTITUTERS=file://$dir/cache FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS='$(cat "$dir/public-key")'"
