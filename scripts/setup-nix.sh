#!/usr/bin/env bash
# Make Nix usable as root on this kind of machine (Debian 12, no network but
# the package registries, no systemd, no nix-daemon), with every build in
# Nix's sandbox.
#
#   - installs Debian's nix-bin if `nix` is missing (apt-get update only if needed);
#   - creates the nixbld group and build users nixbld1..10 if nix-bin did not;
#   - writes the settings below into /etc/nix/nix.conf, keeping unrelated lines;
#   - creates the store/state directories Nix uses;
#   - checks `nix --version` and that the sandbox is on.
#
# Idempotent and quiet on re-run: it prints only what it changed.
#
# Why each setting:
#   sandbox = true        every builder runs in private mount, pid, network,
#                         ipc and uts namespaces: it sees only /nix/store inputs,
#                         its build directory and the paths listed below, and
#                         has no network (fixed-output derivations excepted).
#                         Crate code (build.rs, tests) runs there, and crate
#                         code is untrusted: flakebot refuses nix builds when
#                         the sandbox is off.
#   sandbox-fallback = false   if the kernel refuses the namespaces, fail the
#                         build instead of quietly building unsandboxed.
#   build-users-group = nixbld   builders run as the unprivileged nixbld1..N
#                         users, not as root: what is bound into the sandbox
#                         (read-write mounts, owned by root) stays unwritable.
#   extra-sandbox-paths   the host paths the nixpkgs TEST STAND-IN
#                         (tests/nixpkgs) builds with, since it uses host tools
#                         instead of /nix/store packages; real nixpkgs needs none:
#     /bin /lib /lib64? /usr/bin /usr/lib /usr/lib64?   the shell builders run
#                         by (/bin/sh, /bin/bash), coreutils, sed, find, cmp,
#                         python3, the C compiler and linker rustc calls, and
#                         their libraries;
#     /usr/include?       C headers, for build scripts that compile C (cc crate);
#     /etc/alternatives   Debian's cc -> gcc symlinks resolve through it;
#     /usr/share/cargo/registry   Debian's offline crate registry;
#     /opt/host-rust=<sysroot>   the active rustup toolchain (rustc --print
#                         sysroot), which lives under /root (mode 700, and
#                         not to be seen by builders): only the toolchain
#                         directory is bound, at /opt/host-rust inside the
#                         sandbox. Omitted when rustc's sysroot is /usr
#                         (Debian's rustc, already bound).
#                         Not bound: /root, $HOME, /tmp, /run, /etc (the
#                         sandbox has its own minimal /etc and an empty /tmp).
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

# 2. build users: nix-bin's postinst makes them; make them if it did not
if ! getent group nixbld >/dev/null; then
    groupadd --system nixbld
    say "created group nixbld"
fi
for i in $(seq 1 10); do
    user=nixbld$i
    if ! id -u "$user" >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir /var/empty --shell /usr/sbin/nologin \
            --gid nixbld --groups nixbld --comment "Nix build user $i" "$user"
        say "created build user $user"
    fi
    # nix takes its build users from the group's member list, not primary groups
    case ",$(getent group nixbld | cut -d: -f4)," in
        *",$user,"*) ;;
        *) usermod -a -G nixbld "$user"; say "added $user to group nixbld" ;;
    esac
done

# 3. the host's Rust toolchain, for the stand-in's builders (see the header)
rust_sysroot() {  # the active toolchain's directory, asked from / (no rust-toolchain file applies)
    local rustc
    for rustc in "${CARGO_HOME:-${HOME:-/root}/.cargo}/bin/rustc" /usr/local/cargo/bin/rustc "$(command -v rustc || true)"; do
        [ -n "$rustc" ] && [ -x "$rustc" ] || continue
        (cd / && "$rustc" --print sysroot 2>/dev/null) && return 0
    done
    return 1
}
sandbox_paths="/bin /lib /lib64? /usr/bin /usr/lib /usr/lib64? /usr/include? /etc/alternatives /usr/share/cargo/registry"
if sysroot="$(rust_sysroot)" && [ -n "$sysroot" ] && [ "$sysroot" != /usr ]; then
    case "$sysroot" in
        *[[:space:]=]*) echo "setup-nix.sh: cannot bind the Rust toolchain $sysroot (a space or '=' in its path)" >&2; exit 1 ;;
    esac
    sandbox_paths="$sandbox_paths /opt/host-rust=$sysroot"
fi

# 4. /etc/nix/nix.conf
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

# Debian's nix.conf says the sandbox does not work on Debian; it does, with the paths above
new="$(printf '%s\n' "$new" | grep -vxF \
    -e '# So far the sandbox feature does not seem to work on Debian:' \
    -e '# https://github.com/NixOS/nixpkgs/pull/47794#issuecomment-429575989' || true)"
set_key sandbox true
set_key sandbox-fallback false
set_key build-users-group nixbld
set_key extra-sandbox-paths "$sandbox_paths"
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

# 5. directories (nix creates most of these lazily as root; do it up front so
#    a first read-only command such as `nix eval` does not fail on them)
for d in /nix/store /nix/var/nix/db /nix/var/nix/gcroots /nix/var/nix/profiles \
         /nix/var/nix/temproots /nix/var/log/nix/drvs; do
    if [ ! -d "$d" ]; then
        mkdir -p "$d"
        say "created $d"
    fi
done

# 6. check
if ! version="$(nix --version 2>&1)"; then
    echo "setup-nix.sh: 'nix --version' failed: $version" >&2
    exit 1
fi
if ! nix show-config 2>/dev/null | grep -q '^experimental-features = .*flakes'; then
    echo "setup-nix.sh: flakes are not enabled after writing $conf" >&2
    exit 1
fi
if ! nix show-config 2>/dev/null | grep -qx 'sandbox = true'; then
    echo "setup-nix.sh: nix's sandbox is not on after writing $conf" >&2
    exit 1
fi
# a real sandboxed build (a no-op once its output exists): the kernel allows
# nix's namespaces, and the builder sees neither /root nor the host's /etc/nix
check='derivation {
  name = "setup-nix-sandbox-check";
  system = builtins.currentSystem;
  builder = "/bin/sh";
  args = [ "-c" "if [ -e /root ] || [ -e /etc/nix ]; then exit 1; fi; echo sandboxed > $out" ];
}'
if ! out="$(cd / && nix-build --no-out-link -E "$check" 2>&1)"; then
    echo "setup-nix.sh: a build in nix's sandbox failed:" >&2
    printf '%s\n' "$out" | tail -n 20 >&2
    exit 1
fi
