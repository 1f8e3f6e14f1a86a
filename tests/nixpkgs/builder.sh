# TEST STAND-IN (not nixpkgs): builder for ./pkgs.nix, run by the host's
# /bin/sh (or bash) as `builder.sh MODE` in Nix's sandbox, which holds the
# host paths that scripts/setup-nix.sh lists in `extra-sandbox-paths`.
# shellcheck shell=sh

REGISTRY=/usr/share/cargo/registry
# where setup-nix.sh binds the host's rustup toolchain inside the sandbox
SANDBOX_RUST=/opt/host-rust/bin
# where a dev shell (outside the sandbox) finds one
HOST_RUST="$SANDBOX_RUST /root/.cargo/bin /usr/local/cargo/bin /usr/bin"

# Find the host's Rust toolchain in the sandbox: the bound rustup toolchain
# (a real toolchain directory, no rustup proxy that could reach for the
# network), else Debian's. Sets RUST_BIN (holds cargo, rustc, ...).
find_rust() {
    for RUST_BIN in $SANDBOX_RUST /usr/bin; do
        [ -x "$RUST_BIN/cargo" ] && [ -x "$RUST_BIN/rustc" ] && return 0
    done
    echo "test stand-in: no Rust toolchain in the build sandbox (looked in $SANDBOX_RUST and /usr/bin):" \
        "run scripts/setup-nix.sh as root, which binds the host's toolchain at ${SANDBOX_RUST%/bin}" >&2
    exit 1
}

build_rust_package() {
    find_rust
    [ -d "$REGISTRY" ] || { echo "test stand-in: no offline registry at $REGISTRY" >&2; exit 1; }
    echo "test stand-in: building with $("$RUST_BIN/rustc" --version) from $RUST_BIN"

    export HOME="$NIX_BUILD_TOP"
    export CARGO_HOME="$NIX_BUILD_TOP/.cargo-home"
    mkdir -p "$CARGO_HOME"
    cat >"$CARGO_HOME/config.toml" <<TOML
[source.crates-io]
replace-with = "offline-registry"

[source.offline-registry]
directory = "$REGISTRY"

[net]
offline = true

[term]
color = "never"
TOML
    export RUSTC="$RUST_BIN/rustc" RUSTDOC="$RUST_BIN/rustdoc"
    export RUSTC_WRAPPER="$rustcWrapper" REMAP_REGISTRY="$REGISTRY"
    export PATH="$RUST_BIN:$PATH"
    export CARGO_BUILD_JOBS="${NIX_BUILD_CORES:-1}"
    [ "$CARGO_BUILD_JOBS" -gt 0 ] 2>/dev/null || export CARGO_BUILD_JOBS=1

    cp -R "$src" "$NIX_BUILD_TOP/source"
    chmod -R u+w "$NIX_BUILD_TOP/source"
    cd "$NIX_BUILD_TOP/source"

    # as nixpkgs' cargoSetupHook: the lock file given must be the one in src
    if ! cmp -s Cargo.lock "$cargoLockFile"; then
        echo "test stand-in: Cargo.lock in src differs from cargoLock.lockFile ($cargoLockFile)" >&2
        exit 1
    fi

    # as nixpkgs' cargoBuildHook: runHook preBuild first
    if [ -n "${preBuild:-}" ]; then eval "$preBuild"; fi
    # shellcheck disable=SC2086 # flag lists are space-separated on purpose
    cargo build --release --frozen $cargoBuildFlags
    if [ -n "$doCheck" ]; then
        # shellcheck disable=SC2086
        cargo test --release --frozen $cargoTestFlags
    fi

    # an installPhase given replaces cargoInstallHook, as in nixpkgs
    if [ -n "${installPhase:-}" ]; then
        eval "$installPhase"
        return 0
    fi
    # as nixpkgs' cargoInstallHook: executables to bin/, libraries to lib/
    mkdir -p "$out/bin"
    find target/release -maxdepth 1 -type f -perm -u+x \
        ! -name '*.so' ! -name '*.so.*' ! -name '*.a' ! -name '*.rlib' ! -name '*.d' \
        -exec cp {} "$out/bin/" \;
    for lib in target/release/*.so target/release/*.a; do
        [ -f "$lib" ] || continue
        mkdir -p "$out/lib"
        cp "$lib" "$out/lib/"
    done
    if [ -z "$(ls "$out/bin")" ]; then rmdir "$out/bin"; fi
}

host_tool() {
    # The wrappers run outside the sandbox too (a dev shell), where the
    # bound toolchain is not: they look for the tool when they run.
    mkdir -p "$out/bin"
    for tool in $tools; do
        printf '#!/bin/sh\n# %s of the host toolchain (test stand-in for nixpkgs)\nfor dir in %s; do\n    if [ -x "$dir/%s" ]; then\n        export RUSTC="${RUSTC:-$dir/rustc}"\n        exec "$dir/%s" "$@"\n    fi\ndone\necho "%s: not installed in the host toolchain (test stand-in for nixpkgs; looked in %s)" >&2\nexit 127\n' \
            "$tool" "$HOST_RUST" "$tool" "$tool" "$tool" "$HOST_RUST" >"$out/bin/$tool"
        chmod +x "$out/bin/$tool"
    done
}

host_binary() {
    mkdir -p "$out/bin"
    for bin in $binaries; do
        ln -s "$bin" "$out/bin/${bin##*/}"
    done
}

rustc_wrapper() {
    cat >"$out" <<'SH'
#!/bin/sh
# RUSTC_WRAPPER of the test stand-in for nixpkgs: map build paths to fixed names.
rustc=$1
shift
exec "$rustc" "$@" \
    "--remap-path-prefix=${NIX_BUILD_TOP:-/nonexistent}=/build" \
    "--remap-path-prefix=${REMAP_REGISTRY:-/usr/share/cargo/registry}=/cargo/registry"
SH
    chmod +x "$out"
}

mk_shell() {
    # as nixpkgs' mkShell: building it just records the environment
    export >"$out"
}

case "$1" in
    build-rust-package) build_rust_package ;;
    host-tool) host_tool ;;
    host-binary) host_binary ;;
    rustc-wrapper) rustc_wrapper ;;
    mk-shell) mk_shell ;;
    *) echo "builder.sh: unknown mode $1" >&2; exit 1 ;;
esac
