"""What a sandboxed command can write: the binds its profile names and capped tmpfs, nothing of the kernel's.

The invariant, read from the sandbox's own mount table for every profile: a mount
that is writable is the workspace (build), ``CARGO_HOME`` (fetch), a file the
command was given (``Cargo.lock``), a tmpfs with a size limit no larger than
``Limits.tmp_bytes`` (``/tmp``, ``$HOME``, ``/dev/shm``), a device node, or the
private ``/dev/pts``. Everything else is read-only: bubblewrap's own root and
``/dev`` (tmpfs without a size limit: a writer fills the host's memory) and
``/proc``. Run as root, the sandbox's uid 0 is the host's, and bubblewrap covers
``/proc/sys`` only when the caller could not write there anyway: before this
rule a build script could open ``kernel.core_pattern`` for writing (a ``|program``
there is run by the kernel as root, outside every namespace, at the next crash
anywhere on the machine), and write ``vm.*`` and ``net.*`` settings.

The attack (``test_a_build_script_sets_no_kernel_setting_and_fills_no_uncapped_memory``)
only *opens* the settings for writing; it never writes one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import BUILD, FETCH, FETCH_OFFLINE, Limits, Profile, Sandbox, bubblewrap_works
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.limits import MiB

pytestmark = pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}")

#: the test interpreter, shown read-only in the sandbox that runs the probe
PYTHON = (sys.prefix, sys.base_prefix)
TMP_BYTES = 16 * MiB

#: run inside: every writable mount (point, file system, options) and each kernel file that opens for writing
PROBE = r"""
import json, os, stat
mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    point, options = fields[4].replace("\\040", " "), fields[5].split(",")
    rest = fields[fields.index("-") + 1:]
    if "rw" in options:
        mode = os.stat(point).st_mode
        mounts.append({"point": point, "fs": rest[0], "super": rest[2].split(","), "device": stat.S_ISCHR(mode)})
opened = []
for top, dirs, files in os.walk("/proc", topdown=True):
    dirs[:] = [d for d in dirs if not (top == "/proc" and (d.isdigit() or d in ("self", "thread-self")))]
    for name in files:
        path = os.path.join(top, name)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # opened only: nothing is written
        except OSError:
            continue
        opened.append(path)
created = []
for directory in ("/", "/etc", "/dev", "/usr"):
    try:
        os.close(os.open(os.path.join(directory, "planted"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        created.append(directory)
    except OSError:
        pass
print(json.dumps({"mounts": mounts, "opened": opened, "created": created}))
"""


def _writable(sandbox: Sandbox, profile: Profile, lock: Path) -> dict[str, list]:  # type: ignore[type-arg]
    command = sandbox.command([sys.executable, "-c", PROBE], profile, writable_files=[lock])
    done = ProcessRunner().run(command, cwd=sandbox.workspace, env=sandbox.env(profile=profile), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("profile", [BUILD, FETCH, FETCH_OFFLINE], ids=lambda p: p.name)
def test_nothing_is_writable_but_what_the_profile_names_and_capped_tmpfs(tmp_path: Path, profile: Profile) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    lock = workspace / "Cargo.lock"
    lock.write_text("")
    home = tmp_path / "cargo-home"
    home.mkdir()
    sandbox = Sandbox(workspace, read_only=PYTHON, cargo_home=home, limits=Limits(tmp_bytes=TMP_BYTES))
    seen = _writable(sandbox, profile, lock)
    named = {str(sandbox.workspace)} if profile.workspace else {str(lock.resolve())}
    if profile.cargo_home:
        named.add(str(home.resolve()))
    wrong = []
    for mount in seen["mounts"]:
        point = mount["point"]
        if mount["device"] or point in named or (point == "/dev/pts" and mount["fs"] == "devpts"):
            continue
        sizes = [int(o.split("=", 1)[1].rstrip("k")) * 1024 for o in mount["super"] if o.startswith("size=")]
        if mount["fs"] == "tmpfs" and sizes and sizes[0] <= TMP_BYTES:
            continue
        wrong.append(mount)
    assert not wrong, f"writable mounts the {profile.name} profile does not name, or tmpfs without a cap: {wrong}"
    assert not seen["opened"], f"kernel files a sandboxed command can open for writing: {seen['opened'][:20]}"
    assert not seen["created"], f"directories a sandboxed command can create files in: {seen['created']}"
    # the binds the profile names stay writable (the rule did not simply make everything read-only)
    assert {m["point"] for m in seen["mounts"]} >= named | {"/tmp", "/dev/shm"}


ATTACK_RS = r"""
use std::io::Write;
fn report(what: &str, result: String) {
    println!("cargo:warning=ATTACK {} {}", what, result.replace('\n', " "));
}
fn open_for_writing(path: &str) -> String {
    // opened only, never written: on a machine where this is not refused, nothing changes
    match std::fs::OpenOptions::new().write(true).open(path) { Ok(_) => "OPENED".into(), Err(e) => format!("blocked: {}", e) }
}
fn fill(path: &str) -> String {
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0usize;
    match std::fs::File::create(path) {
        Ok(mut f) => { for _ in 0..64 { if f.write_all(&chunk).is_err() { break; } written += 1; } }
        Err(e) => return format!("blocked: {}", e),
    }
    let _ = std::fs::remove_file(path);
    format!("{} MiB", written)
}
fn main() {
    report("core_pattern", open_for_writing("/proc/sys/kernel/core_pattern"));
    report("swappiness", open_for_writing("/proc/sys/vm/swappiness"));
    report("ip_forward", open_for_writing("/proc/sys/net/ipv4/ip_forward"));
    report("root", fill("/fill"));
    report("etc", fill("/etc/fill"));
    report("dev", fill("/dev/fill"));
    report("shm", fill("/dev/shm/fill"));
}
"""


@pytest.mark.cargo
def test_a_build_script_sets_no_kernel_setting_and_fills_no_uncapped_memory(tmp_path: Path) -> None:
    files = {"src/main.rs": 'fn main() {\n    println!("hostile");\n}\n', "build.rs": ATTACK_RS}
    root = write_registry(tmp_path / "registry", [crate("kernelwriter", files=files)])
    workspace = tmp_path / "kernelwriter"
    subprocess.run(["cp", "-r", str(root / "kernelwriter-0.1.0"), str(workspace)], check=True)
    sandbox = Sandbox(workspace, limits=Limits(tmp_bytes=TMP_BYTES))
    done = Cargo(DirectoryRegistry(root, tmp_path / "index"), ProcessRunner(), sandbox).run(
        "build", cwd=workspace, timeout=300
    )
    assert done.returncode == 0, done.stderr
    attacks = dict(line.split("ATTACK ", 1)[1].split(" ", 1) for line in done.stderr.splitlines() if "ATTACK " in line)
    assert set(attacks) == {"core_pattern", "swappiness", "ip_forward", "root", "etc", "dev", "shm"}, attacks
    for setting in ("core_pattern", "swappiness", "ip_forward"):
        assert attacks[setting].startswith("blocked"), (setting, attacks[setting], os.getuid())
    for place in ("root", "etc", "dev"):
        assert attacks[place].startswith("blocked"), (place, attacks[place])
    # /dev/shm is usable, up to the cap
    assert attacks["shm"].endswith(" MiB") and int(attacks["shm"].split()[0]) <= TMP_BYTES // MiB, attacks["shm"]
