# TEST STAND-IN (not nixpkgs): builder for the Python and text-file parts of
# ./pkgs.nix, run by the host's /bin/sh as `python.sh MODE` in Nix's
# sandbox (with the host paths scripts/setup-nix.sh binds). (Separate from ./builder.sh so that changing these
# does not change the Rust derivations built with that one.)
# shellcheck shell=sh

# bin/python3 of a `python3.withPackages` stand-in: at RUN time it execs the
# host's Python, the first of $FLAKEBOT_HOST_PYTHON, the active virtualenv,
# and the python3 commands on PATH (outside /nix/store) that can import the
# requested modules; the env's own packages (stand-in buildPythonPackage
# outputs) come first on PYTHONPATH.
python_env() {
    mkdir -p "$out/bin"
    cat >"$out/bin/python3" <<SH
#!/bin/sh
# python3 with packages -- TEST STAND-IN for nixpkgs' python3.withPackages:
# runs the host's Python (see tests/nixpkgs/python.sh).
modules="$modules"
export PYTHONPATH="$sitePackages\${PYTHONPATH:+:\$PYTHONPATH}"
# find_spec, not import: finding is enough, and importing jupyter is slow
check="import sys, importlib.util as u; sys.exit(any(u.find_spec(m) is None for m in '\$modules'.split()))"
first=""
old_ifs=\$IFS; IFS=:
candidates="\${FLAKEBOT_HOST_PYTHON:-}:\${VIRTUAL_ENV:+\$VIRTUAL_ENV/bin/python}"
for dir in \$PATH; do
    case "\$dir" in /nix/store/*) continue ;; esac
    candidates="\$candidates:\$dir/python3"
done
for cand in \$candidates; do
    [ -n "\$cand" ] && [ -x "\$cand" ] || continue
    [ -n "\$first" ] || first=\$cand
    if "\$cand" -c "\$check" 2>/dev/null; then IFS=\$old_ifs; exec "\$cand" "\$@"; fi
done
IFS=\$old_ifs
if [ -n "\$first" ]; then
    echo "python3 (test stand-in): no host python imports all of: \$modules; trying \$first" >&2
    exec "\$first" "\$@"
fi
echo "python3 (test stand-in): no python3 on PATH" >&2
exit 127
SH
    chmod +x "$out/bin/python3"
    ln -s python3 "$out/bin/python"
}

# A stand-in buildPythonPackage: the source's top-level packages copied into
# lib/python3/site-packages, console scripts from pyproject.toml's
# [project.scripts] as wrappers, then the import check with the host python.
python_package() {
    site="$out/lib/python3/site-packages"
    mkdir -p "$site"
    for init in "$src"/*/__init__.py; do
        [ -f "$init" ] || continue
        pkg=$(dirname "$init")
        case "${pkg##*/}" in tests|test|docs|benchmarks) continue ;; esac
        cp -R "$pkg" "$site/"
    done
    chmod -R u+w "$site"
    if [ -f "$src/pyproject.toml" ]; then
        # name = "module:function" lines of the [project.scripts] table
        sed -n '/^\[project\.scripts\]/,/^\[/p' "$src/pyproject.toml" \
            | sed -n 's/^\([A-Za-z0-9_.-]*\) *= *"\([A-Za-z0-9_.]*\):\([A-Za-z0-9_]*\)".*/\1 \2 \3/p' \
            | while read -r name module function; do
                mkdir -p "$out/bin"
                printf '#!/bin/sh\n# %s -- console script of a TEST STAND-IN buildPythonPackage\nexport PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"\nexec "%s" -c "import sys; from %s import %s; sys.exit(%s())" "$@"\n' \
                    "$name" "$site" "$python/bin/python3" "$module" "$function" "$function" >"$out/bin/$name"
                chmod +x "$out/bin/$name"
            done
    fi
    for module in $importsCheck; do
        echo "test stand-in: import check: $module"
        PYTHONPATH="$site" "$python/bin/python3" -c "import $module"
    done
}

write_text() {
    mkdir -p "$(dirname "$out/$destination")"
    printf '%s' "$text" >"$out/$destination"
    if [ -n "$executable" ]; then chmod +x "$out/$destination"; fi
}

case "$1" in
    python-env) python_env ;;
    python-package) python_package ;;
    write-text) write_text ;;
    *) echo "python.sh: unknown mode $1" >&2; exit 1 ;;
esac
