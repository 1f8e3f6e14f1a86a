"""Each dependency unit's writers confined to that unit's own files (Landlock), for the stub builds of the unit cache.

Run by the sandbox's own ``/usr/bin/python3 -I -S`` as a script (stdlib only: the package is not importable
there), in two roles:

* **rustc wrapper** (cargo's ``RUSTC_WRAPPER``: ``unit_wrapper.py RUSTC ARGS...``). A compile names its unit
  by ``--crate-name N`` and ``-C extra-filename=E``; rustc (and every proc macro it loads, and the linker it
  runs) writes into a private directory ``P`` instead of ``--out-dir X`` (``deps/`` is shared by every unit),
  restricted by Landlock to write nothing but ``P``. When rustc announces its metadata (cargo's pipelining)
  the ``.rmeta`` is copied into ``X``; when it exits, the unit's own files (``lib?N E(.ext)?``, regular, one
  link each: nothing else) are moved into ``X``. A build script's executable is replaced by a launcher that
  runs it through the second role.
* **build-script launcher** (``unit_wrapper.py --build-script REAL ARGS...``): the build script runs
  restricted to its ``OUT_DIR`` and a private ``TMPDIR``.

So no unit's writers (its build script, the proc macros its rustc loads) can write another unit's files, and
no writer can write ``/tmp``, ``/dev/shm`` or the target dir's shared directories. Landlock also stops a
confined process from tracing or signalling a process outside its own domain (``ptrace``, ``/proc/PID/mem``,
``/proc/PID/fd``; and from ABI 6 signals and abstract unix sockets). Invoked with ``FLAKEBOT_UNIT_CONFINE=1``
by ``flakebot_magic.stages.deps``; when Landlock cannot be applied it fails (exit 125), never runs unconfined.
A rustc started by a confined build script (``FLAKEBOT_UNIT_NESTED``) runs as asked: it is confined already.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

#: x86_64 and aarch64 share the generic numbers
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH = 1
_VERSION = 1 << 0
_PR_SET_NO_NEW_PRIVS = 38
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14
#: what a confined process may not do outside the paths it is given, by the Landlock ABI that has it
_WRITES = {
    1: (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12),
    2: 1 << 13,  # refer: link or rename across directories
    3: 1 << 14,  # truncate
}
#: abstract unix sockets and signals outside the domain (ABI 6)
_SCOPES = (1 << 0) | (1 << 1)
#: the exit status when confinement is asked for and cannot be had
NO_CONFINEMENT = 125
#: the marker a launcher carries (the cache's seal recognises it)
LAUNCHER_MARK = "# flakebot unit launcher"


class _Ruleset(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(version), 0)


def confine(writable_dirs: list[str], writable_files: list[str]) -> None:
    """Restrict this process (and all it starts) to write only under ``writable_dirs`` and the files given.

    Raises ``OSError`` when Landlock is missing or refuses.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    handled = 0
    for version, rights in _WRITES.items():
        if abi >= version:
            handled |= rights
    attr = _Ruleset(handled, 0, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        file_rights = handled & (_WRITE_FILE | _TRUNCATE)
        for path, rights in [*((d, handled) for d in writable_dirs), *((f, file_rights) for f in writable_files)]:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, fd)
                if (
                    libc.syscall(
                        _ADD_RULE,
                        ctypes.c_int(ruleset),
                        ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    )
                    < 0
                ):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _shared_files() -> list[str]:
    """Files every confined process may write: ``/dev/null``, and cargo's jobserver when it is a named FIFO."""
    files = ["/dev/null"]
    for flags in (os.environ.get("CARGO_MAKEFLAGS", ""), os.environ.get("MAKEFLAGS", "")):
        for fifo in re.findall(r"--jobserver-auth=fifo:(\S+)", flags):
            if os.path.exists(fifo):
                files.append(fifo)
    return files


def _confined_child(writable: list[str], tmp: str) -> None:
    """In the child, before ``exec``: a private ``TMPDIR``, then Landlock (exit 125 if it cannot be had)."""
    os.environ["TMPDIR"] = tmp
    try:
        confine(writable, _shared_files())
    except OSError as exc:
        sys.stderr.write(f"flakebot: cannot confine a dependency's build step ({exc}); refusing to run it unconfined\n")
        sys.stderr.flush()
        os._exit(NO_CONFINEMENT)


def _option(args: list[str], name: str) -> tuple[int, str] | None:
    """Where the option ``name`` is in ``args`` and its value (``--name V`` or ``--name=V``)."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return i, args[i + 1]
        if arg.startswith(name + "="):
            return i, arg[len(name) + 1 :]
    return None


def _codegen(args: list[str], key: str) -> str:
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "-C" and i + 1 < len(args) else (arg[2:] if arg.startswith("-C") else "")
        if value.startswith(key + "="):
            return value[len(key) + 1 :]
    return ""


def _launcher(real: str, wrapper: str) -> str:
    """A build script's launcher: runs the real executable (beside it) through this wrapper, confined."""
    quoted = wrapper.replace("'", "'\\''")
    name = os.path.basename(real).replace("'", "")
    return (
        f"#!/bin/sh\n{LAUNCHER_MARK}: the build script {name} runs confined to its OUT_DIR\n"
        f'real="$(dirname "$0")/{name}"\n'
        f"if [ -r '{quoted}' ]; then exec /usr/bin/python3 -I -S '{quoted}' --build-script \"$real\" \"$@\"; fi\n"
        'if [ -n "$FLAKEBOT_UNIT_CONFINE" ]; then echo "flakebot: the unit wrapper is missing" >&2; exit 125; fi\n'
        'exec "$real" "$@"\n'
    )


def run_rustc(argv: list[str]) -> int:
    """The rustc wrapper role: see the module's docstring."""
    rustc, args = argv[0], argv[1:]
    out = _option(args, "--out-dir")
    if os.environ.get("FLAKEBOT_UNIT_NESTED") or out is None:
        os.execvp(rustc, [rustc, *args])  # confined already, or no compile (cargo's `--print` questions)
    index, out_dir = out
    crate = (_option(args, "--crate-name") or (0, ""))[1]
    extra = _codegen(args, "extra-filename")
    if not re.fullmatch(r"[A-Za-z0-9_]+", crate) or not re.fullmatch(r"-?[0-9a-f]*", extra):
        sys.stderr.write(f"flakebot: unexpected unit name {crate!r}{extra!r}\n")
        return NO_CONFINEMENT
    out_dir = os.path.abspath(out_dir)
    private = tempfile.mkdtemp(prefix=".flakebot-unit-", dir=os.path.dirname(out_dir))
    tmp = os.path.join(private, ".tmp")
    os.mkdir(tmp)
    moved = list(args)
    moved[index : index + (2 if args[index] == "--out-dir" else 1)] = ["--out-dir", private]
    own = re.compile(rf"(lib)?{re.escape(crate)}{re.escape(extra)}(\.[A-Za-z0-9_.]+)?")
    try:
        child = subprocess.Popen(
            [rustc, *moved], stderr=subprocess.PIPE, preexec_fn=lambda: _confined_child([private], tmp)
        )
        assert child.stderr is not None
        for raw in child.stderr:
            sys.stderr.buffer.write(_announced(raw, private, out_dir, own))
            sys.stderr.buffer.flush()
        status = child.wait()
        if status == 0:
            _move_outputs(private, out_dir, own, build_script=crate.startswith("build_script_") and extra != "")
        return status
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _announced(raw: bytes, private: str, out_dir: str, own: re.Pattern[str]) -> bytes:
    """A line of rustc's stderr as cargo must see it: an artifact it announces (the ``.rmeta`` cargo pipelines
    on) is copied into the real out-dir first, and named there."""
    if not raw.startswith(b"{") or b'"artifact"' not in raw:
        return raw
    try:
        message = json.loads(raw)
        path = message["artifact"]
    except (ValueError, KeyError, TypeError):
        return raw
    if not isinstance(path, str) or os.path.dirname(path) != private or not own.fullmatch(os.path.basename(path)):
        return raw
    target = os.path.join(out_dir, os.path.basename(path))
    _copy_own(path, target)
    message["artifact"] = target
    return json.dumps(message).encode() + b"\n"


def _copy_own(source: str, target: str) -> None:
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_nlink == 1):
            raise OSError(f"{source} is not a regular file of its own")
        tmp = f"{target}.flakebot-tmp"
        with open(tmp, "wb") as sink, os.fdopen(os.dup(fd), "rb") as src:
            shutil.copyfileobj(src, sink)
        os.chmod(tmp, stat.S_IMODE(info.st_mode))
        os.replace(tmp, target)
    finally:
        os.close(fd)


def _move_outputs(private: str, out_dir: str, own: re.Pattern[str], *, build_script: bool) -> None:
    """The unit's own files from ``private`` into ``out_dir`` (anything else rustc or a proc macro left is
    dropped); a build script's executable becomes its launcher."""
    for entry in os.scandir(private):
        if entry.name == ".tmp":
            continue
        info = entry.stat(follow_symlinks=False)
        if not own.fullmatch(entry.name) or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            sys.stderr.write(f"flakebot: dropped {entry.name!r}, which is not one of this unit's own files\n")
            continue
        target = os.path.join(out_dir, entry.name)
        if build_script and "." not in entry.name and info.st_mode & 0o111:
            os.replace(entry.path, target + ".real")
            tmp = target + ".flakebot-tmp"
            with open(tmp, "w", encoding="utf-8") as launcher:
                launcher.write(_launcher(target + ".real", os.path.abspath(__file__)))
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        else:
            os.replace(entry.path, target)


def run_build_script(real: str, args: list[str]) -> int:
    """The launcher role: the build script ``real`` runs confined to its ``OUT_DIR`` and a private ``TMPDIR``."""
    out_dir = os.environ.get("OUT_DIR", "")
    if not out_dir or not os.path.isdir(out_dir):
        sys.stderr.write("flakebot: a build script without an OUT_DIR\n")
        return NO_CONFINEMENT
    tmp = tempfile.mkdtemp(prefix=".flakebot-tmp-", dir=os.path.dirname(os.path.abspath(out_dir)))
    os.environ["FLAKEBOT_UNIT_NESTED"] = "1"
    try:
        return subprocess.call([real, *args], preexec_fn=lambda: _confined_child([out_dir, tmp], tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        print(landlock_abi())
        return 0
    if argv[:1] == ["--build-script"] and len(argv) >= 2:
        return run_build_script(argv[1], argv[2:])
    if not argv:
        sys.stderr.write("usage: unit_wrapper.py RUSTC ARGS... | --build-script REAL ARGS...\n")
        return 2
    return run_rustc(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
