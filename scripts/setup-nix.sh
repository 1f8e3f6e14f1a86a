#!/usr/bin/env bash
# Make Nix usable as root on this kind of machine (Debian 12, no network but
# the package registries, no systemd, no nix-daemon).
#
#   - installs Debian's nix-bin if `nix` is missing (apt-get update only if needed);
#   - writes the settings below into /etc/nix/nix.conf, keeping unrelated lines;
#   - creates the store/state directories Nix uses;
#   - checks `nix --version`.
#
# Idempotent and quiet on re-run: it prints only what it changed.
#
# Why each setting:
#   build-users-group =   builds run as root, not as nixbld users: these
#                         cannot read /root/.cargo or /root/.rustup (mode 700),
#                         which the test stand-in for nixpkgs builds with.
#   sandbox = false       the stand-in uses host tools outside /nix/store
#                         (/bin/sh, cargo, /usr/share/cargo/registry); in the
#                         sandbox a builder fails with "executing '/bin/sh':
#                         No such file or directory".
#   substituters =        no binary cache is reachable; otherwise every build
#                         waits for cache.nixos.org to time out.
#   experimental-features   gains nix-command and flakes (others are kept).
#   cores = 2, max-jobs = 1   the machine has 2 cores shared with others
#                         (only when not set already).
#   flake-registry = /etc/nix/flake-registry.json   a local, empty registry,
#                         so nix never tries to download the global one.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-nix.sh: must run as root" >&2
    exit 1
fi

say() { echo "setup-nix: $*"; }

# 1. nix itself
if ! command -v nix >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq nix-bin >/dev/null 2>&1; then
        apt-get update -qq >/dev/null
        apt-get install -y -qq nix-bin >/dev/null
    fi
    say "installed nix-bin"
fi

# 2. /etc/nix/nix.conf
conf_dir=${NIX_CONF_DIR:-/etc/nix}  # as nix itself reads it
conf=$conf_dir/nix.conf
registry=$conf_dir/flake-registry.json
mkdir -p "$conf_dir"
if [ ! -f "$registry" ]; then
    printf '{\n  "flakes": [],\n  "version": 2\n}\n' >"$registry"
    say "wrote $registry"
fi

old=""
[ -f "$conf" ] && old="$(cat "$conf")"
new="$old"

current() {  # the value a key has in $new, or nothing
    printf '%s\n' "$new" | sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*//p" | tail -n 1 | sed 's/[[:space:]]*$//'
}
set_key() {  # unless key $1 is set once to $2 already: drop its lines, append "key = value"
    local line="$1 = $2"
    if [ "$(printf '%s\n' "$new" | grep -Ec "^[[:space:]]*$1[[:space:]]*=")" = 1 ] \
        && [ "$(current "$1")" = "$2" ]; then
        return 0
    fi
    new="$(printf '%s\n' "$new" | grep -Ev "^[[:space:]]*$1[[:space:]]*=" || true)"
    new="$(printf '%s\n%s' "$new" "${line% }")"
}

set_key build-users-group ""
set_key sandbox false
set_key substituters ""
features="$(current experimental-features)"
for f in nix-command flakes; do
    case " $features " in *" $f "*) ;; *) features="${features:+$features }$f" ;; esac
done
set_key experimental-features "$features"
# the machine's 2 cores are shared: one build at a time, unless set otherwise
[ -n "$(current cores)" ] || set_key cores 2
[ -n "$(current max-jobs)" ] || set_key max-jobs 1
set_key flake-registry "$registry"

# Squeeze blank-line runs; write only when something changed.
squeeze() { printf '%s\n' "$1" | sed '/./,$!d' | sed '/^$/N;/^\n$/D'; }
if [ "$(squeeze "$new")" != "$(squeeze "$old")" ]; then
    squeeze "$new" >"$conf.tmp"
    mv "$conf.tmp" "$conf"
    say "updated $conf"
fi

# 3. directories (nix creates most of these lazily as root; do it up front so
#    a first read-only command such as `nix eval` does not fail on them)
for d in /nix/store /nix/var/nix/db /nix/var/nix/gcroots /nix/var/nix/profiles \
         /nix/var/nix/temproots /nix/var/log/nix/drvs; do
    if [ ! -d "$d" ]; then
        mkdir -p "$d"
        say "created $d"
    fi
done

# 4. check
if ! version="$(nix --version 2>&1)"; then
    echo "setup-nix.sh: 'nix --version' failed: $version" >&2
    exit 1
fi
if ! nix show-config 2>/dev/null | grep -q '^experimental-features = .*flakes'; then
    echo "setup-nix.sh: flakes are not enabled after writing $conf" >&2
    exit 1
fi
