"""The ``flake`` stage: the Nix flake that packages a forked crate workspace.

``render_flake`` writes a self-contained ``flake.nix`` (no flake-utils) for
``x86_64-linux`` and ``aarch64-linux``:

* ``packages.default``: ``rustPlatform.buildRustPackage`` over the workspace's
  own files (less build outputs, flake files and ``.cargo/config*``, see
  ``_SRC_EXCLUDES``) with ``cargoLock.lockFile = ./Cargo.lock`` (no
  ``cargoHash``), and ``meta`` from Cargo.toml: description, homepage,
  ``mainProgram`` and the license. The SPDX expression is split into ids in
  Python; the flake looks each id up among ``lib.licenses`` by ``spdxId`` and
  falls back to a plain record for ids nixpkgs does not know, so a license
  never fails evaluation.
* ``checks.default``: the same package with ``doCheck = true`` (``cargo test``).
* ``packages.deps``: the crate's dependencies alone (docs/dependency-cache.md),
  built from ``flakebot-deps/``, which :func:`write_flake` writes beside it: the
  crate's ``Cargo.toml`` and ``Cargo.lock`` without its code and under a name of
  no crate (:func:`~flakebot_magic.sandbox.stub.stub_of`), so every tool asking
  for these very dependencies has the same derivation, built once and
  substituted from a team's cache. Its output is the build's ``target`` dir,
  copied into the package's (``preBuild``), so cargo compiles only the crate.
  A crate whose dependencies are not all from the registry has no stub, and
  its package builds them itself.
* Both cap lints at warn for rustc and rustdoc (``RUSTFLAGS``, ``RUSTDOCFLAGS``:
  :data:`~flakebot_magic.stages.build.LINT_CAP`), as flakebot's cargo builds do.
* ``apps.default``: runs ``bin/<main_program>`` of the package.
* ``devShells.default``: ``mkShell`` with cargo, rustc, clippy, rust-analyzer.

Only real nixpkgs APIs are used (``legacyPackages``, ``lib.genAttrs``,
``lib.toLower``, ``lib.licenses``, ``rustPlatform.buildRustPackage``,
``mkShell``); offline, the tests build it against the stand-in in
``tests/nixpkgs`` with ``--override-input nixpkgs path:...``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import FlakeError
from ..host.fsutil import atomic_write, load_toml, read_regular, real_dir
from ..host.literals import nix_string
from ..host.trees import Walk, remove_tree
from ..sandbox.diagnostics import BINARY_NAME
from ..sandbox.layout import DEPS_DIR, NOT_WALKED
from ..sandbox.stub import STUB_MARK, STUB_NAME, Stub, stub_of
from ..untrusted import safe_line
from .build import LINT_CAP

__all__ = [
    "DEFAULT_NIXPKGS_URL",
    "FLAKE_FILE",
    "FLAKE_FORMAT",
    "LOCK_FILE",
    "SYSTEMS",
    "FlakeMeta",
    "check_lock_sources",
    "nix_string",
    "render_flake",
    "spdx_license_ids",
    "write_flake",
]

DEFAULT_NIXPKGS_URL = "github:NixOS/nixpkgs/nixos-24.05"
FLAKE_FILE = "flake.nix"
LOCK_FILE = "flake.lock"
#: bump when render_flake's output changes, so cached nix builds are not reused
FLAKE_FORMAT = 3
SYSTEMS = ("x86_64-linux", "aarch64-linux")

#: top-level workspace entries left out of the package's ``src``: build
#: outputs, git, the flake itself (editing meta must not rebuild), and cargo
#: config files, which point at this machine's registry and would clash with
#: the vendored sources nixpkgs configures
_SRC_EXCLUDES = (
    *NOT_WALKED,
    "result",
    "flake.nix",
    "flake.lock",
    DEPS_DIR,
    ".cargo/config",
    ".cargo/config.toml",
)

_SPDX_OPERATORS = {"AND", "OR"}
# old GNU ids ("GPL-2.0", "GPL-2.0+") -> the current ones nixpkgs uses
_GNU_ID = re.compile(r"^((?:A|L)?GPL-\d\.\d)(\+)?$", re.IGNORECASE)


@dataclass(frozen=True)
class FlakeMeta:
    """What the flake says about the crate, mostly from its Cargo.toml."""

    pname: str
    version: str
    description: str
    license: str  # SPDX expression from Cargo.toml, may be ""
    main_program: str  # the binary name
    homepage: str = ""


def spdx_license_ids(expression: str) -> list[str]:
    """The license ids of an SPDX expression, in order, each once.

    ``"MIT OR Apache-2.0"`` gives ``["MIT", "Apache-2.0"]``. Parentheses and
    ``AND``/``OR`` are dropped (nixpkgs' ``meta.license`` is a plain list);
    ``X WITH Y`` stays one id; Cargo's old ``MIT/Apache-2.0`` form is read as
    ``OR``; deprecated GNU ids become their ``-only``/``-or-later`` forms.
    """
    tokens = re.sub(r"[()/]", " ", expression).split()
    ids: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.upper() in _SPDX_OPERATORS:
            continue
        if token.upper() == "WITH":  # dangling WITH: nothing to attach to
            if ids and i < len(tokens):
                ids[-1] = f"{ids[-1]} WITH {tokens[i]}"
                i += 1
            continue
        match = _GNU_ID.match(token)
        if match:
            token = match.group(1) + ("-or-later" if match.group(2) else "-only")
        if i + 1 < len(tokens) and tokens[i].upper() == "WITH":
            token = f"{token} WITH {tokens[i + 1]}"
            i += 2
        if token not in ids:
            ids.append(token)
    return ids


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _license_nix(expression: str) -> str | None:
    ids = spdx_license_ids(expression)
    if not ids:
        return None
    if len(ids) == 1:
        return f"spdxLicense {nix_string(ids[0])}"
    return "map spdxLicense [ " + " ".join(nix_string(i) for i in ids) + " ]"


def _check(meta: FlakeMeta) -> None:
    for field_name in ("pname", "version", "main_program"):
        if not getattr(meta, field_name).strip():
            raise FlakeError(f"cannot write a flake: {field_name} is empty")
    # the rule deploy applies to every binary: mainProgram lands in a Nix string and a path
    if not BINARY_NAME.fullmatch(meta.main_program):
        raise FlakeError(
            f"cannot write a flake: {meta.main_program[:80]!r} is not a plain binary name "
            "(letters, digits, '_' and '-')"
        )


def _deps_nix(deps: bool) -> tuple[str, str, str]:
    """The dependencies' derivation (let bindings), the package's use of it, and the ``packages.deps`` line."""
    if not deps:
        return "", "", ""
    stub_lib = STUB_NAME.replace("-", "_")
    derivation = f"""
      # The dependencies alone: {DEPS_DIR}/ is this crate's Cargo.toml and Cargo.lock without its code, under
      # a name of no crate (flakebot writes it from them), so every tool asking for these very dependencies
      # has this derivation and builds it once. Its output is the build's target dir.
      deps = pkgs: doCheck:
        pkgs.rustPlatform.buildRustPackage {{
          pname = "{STUB_NAME}";
          version = "0.0.0";
          src = builtins.path {{ path = ./{DEPS_DIR}; name = "{STUB_NAME}-source"; }};
          cargoLock.lockFile = ./{DEPS_DIR}/Cargo.lock;
          inherit doCheck;
          RUSTFLAGS = lintCap;
          RUSTDOCFLAGS = lintCap;
          # the output: the target dir's dependency units, none of the stub's own
          installPhase = ''
            mkdir -p $out
            cp -r target $out/
            find $out/target -depth \\( -name '{STUB_NAME}*' -o -name '{stub_lib}*' -o -name 'lib{stub_lib}*' \\) \\
              -exec rm -rf {{}} +
          '';
        }};
"""
    use = """
          # the dependencies' units from their own derivation: cargo compiles only this crate (the copies
          # get one modification time, so none looks newer than another, nor older than its sources)
          preBuild = ''
            cp -r ${deps pkgs doCheck}/target target
            chmod -R u+w target
            find target -exec touch -h -d "@$(date +%s)" {} +
          '';"""
    return derivation, use, "\n        deps = deps pkgs false;"


def render_flake(meta: FlakeMeta, nixpkgs_url: str = DEFAULT_NIXPKGS_URL, *, deps: bool = False) -> str:
    """The text of ``flake.nix`` for the crate ``meta`` describes (``deps``: with the dependencies' own
    derivation, built from ``flakebot-deps/``)."""
    _check(meta)
    description = _one_line(meta.description) or f"{meta.pname} {meta.version}"
    meta_lines = [f"description = {nix_string(description)};"]
    if meta.homepage.strip():
        meta_lines.append(f"homepage = {nix_string(meta.homepage.strip())};")
    license_nix = _license_nix(meta.license)
    if license_nix:
        meta_lines.append(f"license = {license_nix};")
    meta_lines.append("inherit mainProgram;")
    meta_block = "\n".join(" " * 12 + line for line in meta_lines)
    systems = " ".join(nix_string(s) for s in SYSTEMS)
    excludes = " ".join(nix_string(e) for e in _SRC_EXCLUDES)
    header = _one_line(f"{meta.pname} {meta.version}")
    derivation, use, output = _deps_nix(deps)

    return f"""\
# Generated by flakebot-magic: the Rust crate {header}.
#   nix build    build it (result/bin/{meta.main_program})
#   nix run      run it
#   nix flake check    build it and run its tests
#   nix develop  a shell with cargo, rustc, clippy and rust-analyzer
{{
  description = {nix_string(description)};

  inputs.nixpkgs.url = {nix_string(nixpkgs_url)};

  outputs = {{ self, nixpkgs }}:
    let
      inherit (nixpkgs) lib;
      systems = [ {systems} ];
      forAllSystems = f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${{system}});

      pname = {nix_string(meta.pname)};
      version = {nix_string(meta.version)};
      mainProgram = {nix_string(meta.main_program)};

      # SPDX id -> nixpkgs license; an id nixpkgs lacks becomes a plain record
      # instead of an evaluation error.
      licensesBySpdxId = builtins.listToAttrs (map
        (l: {{ name = lib.toLower l.spdxId; value = l; }})
        (builtins.filter (l: builtins.isAttrs l && l ? spdxId) (builtins.attrValues lib.licenses)));
      spdxLicense = id: licensesBySpdxId.${{lib.toLower id}} or {{
        shortName = id;
        fullName = id;
        spdxId = id;
        free = true;
      }};

      # The workspace's files, less build outputs, the flake itself and cargo
      # config pointing at this machine's registry.
      root = toString ./.;
      excluded = map (name: "${{root}}/${{name}}") [ {excludes} ];
      src = builtins.path {{
        path = ./.;
        name = "${{pname}}-${{version}}-source";
        filter = path: type:
          !(builtins.elem path excluded)
          && !(type == "symlink" && lib.hasPrefix "${{root}}/result" path);
      }};

      # lints never fail the build or the tests (doc tests too) of a published crate on a newer
      # compiler, as flakebot's own builds: rustc and rustdoc cap them at warn
      lintCap = {nix_string(" ".join(LINT_CAP))};
{derivation}
      package = pkgs: doCheck:
        pkgs.rustPlatform.buildRustPackage {{
          inherit pname version src doCheck;
          cargoLock.lockFile = ./Cargo.lock;
          RUSTFLAGS = lintCap;
          RUSTDOCFLAGS = lintCap;{use}
          meta = {{
{meta_block}
          }};
        }};
    in
    {{
      packages = forAllSystems (system: pkgs: {{
        default = package pkgs false;{output}
      }});

      # the same build with `cargo test`
      checks = forAllSystems (system: pkgs: {{
        default = package pkgs true;
      }});

      apps = forAllSystems (system: pkgs: {{
        default = {{
          type = "app";
          program = "${{self.packages.${{system}}.default}}/bin/${{mainProgram}}";
        }};
      }});

      devShells = forAllSystems (system: pkgs: {{
        default = pkgs.mkShell {{
          packages = [ pkgs.cargo pkgs.rustc pkgs.clippy pkgs.rust-analyzer ];
        }};
      }});
    }};
}}
"""


def write_flake(workspace: Path, meta: FlakeMeta, nixpkgs_url: str = DEFAULT_NIXPKGS_URL) -> list[str]:
    """Write ``workspace/flake.nix`` for ``meta``, and ``flakebot-deps/`` (the stub its dependencies' derivation
    builds) when the crate has one; the files to commit (relative: written, or of an old stub removed).

    The flake refers to ``./Cargo.lock``, which the fork stage creates.
    """
    workspace = Path(workspace)
    try:
        deps, files = _write_deps(workspace)
        text = render_flake(meta, nixpkgs_url, deps=deps)
        path = workspace / FLAKE_FILE
        # sandboxed tests ran in this workspace: a flake.nix they replaced with a symlink is replaced, not followed
        atomic_write(path, text, mode=0o644, root=workspace)
    except OSError as exc:
        raise FlakeError(f"cannot write the flake in {workspace}: {exc}", workspace=workspace) from exc
    return [FLAKE_FILE, *sorted(files)]


def check_lock_sources(workspace: Path, lock: bytes | None = None) -> None:
    """Refuse a ``Cargo.lock`` naming a package Nix would fetch on the host while it evaluates the flake.

    Nix reads ``cargoLock.lockFile`` outside its sandbox: a ``git+`` source (``git+file:///...``) is fetched
    there by ``builtins.fetchGit``, on the host, as the user. The crate's lock is untrusted (its tests and the
    model may write it), so every door that has Nix evaluate a workspace's flake (the nix backend's build,
    ``verify``) first checks that its packages are from a registry, or of the workspace itself (no source).
    ``lock``: the lock's bytes at the commit Nix reads (default: the workspace's file)."""
    where = workspace / "Cargo.lock"
    try:
        data = lock if lock is not None else read_regular(where, 64 << 20)[0]
        doc = load_toml(data.decode("utf-8"))
    except FileNotFoundError:
        return  # nothing to fetch: the package's own build says what is missing
    except (OSError, ValueError) as exc:
        raise FlakeError(f"cannot read {where}: {exc}", workspace=workspace) from None
    packages = doc.get("package", [])
    for package in packages if isinstance(packages, list) else ():
        source = package.get("source") if isinstance(package, dict) else None
        if source is not None and not (isinstance(source, str) and source.startswith("registry+")):
            name = package.get("name") if isinstance(package, dict) else None
            raise FlakeError(
                f"Cargo.lock names {safe_line(str(name))!r} from {safe_line(str(source))!r}: Nix would fetch it on "
                "this machine, outside its sandbox, to read the flake. Only registry packages are built or "
                "verified through Nix; build it with --backend cargo, or depend on the registry's release of it.",
                workspace=workspace,
            )


def _write_deps(workspace: Path) -> tuple[bool, list[str]]:
    """``flakebot-deps/`` written afresh from the crate's manifest and lock (what was there of flakebot's removed
    first); whether the flake can build the dependencies alone, and the files written or removed. A directory of
    that name that is not flakebot's (the crate's own, a link) is left as it is, and the flake has no stub."""
    directory = workspace / DEPS_DIR
    old: list[str] = []
    if os.path.lexists(directory):
        try:
            ours = directory.is_dir() and not directory.is_symlink() and _stub_manifest(directory).startswith(STUB_MARK)
        except OSError:
            ours = False
        if not ours:
            return False, []
        old = [
            Path(top, name).relative_to(workspace).as_posix()
            for top, _, names in Walk(directory, max_depth=8)
            for name in names
        ]
        remove_tree(directory)
    stub = stub_of(workspace)
    if not isinstance(stub, Stub):
        return False, old
    for relative, data in stub.files.items():
        real_dir(workspace, (directory / relative).parent)
        atomic_write(directory / relative, data, mode=0o644, root=workspace)
    return True, sorted({*old, *(f"{DEPS_DIR}/{relative}" for relative in stub.files)})


def _stub_manifest(directory: Path) -> str:
    data, _ = read_regular(directory / "Cargo.toml", len(STUB_MARK) + 1)
    return data.decode("utf-8", "replace")
