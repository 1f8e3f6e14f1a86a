# Claim 2 ("replace directories with symlinks or files"): replace store/ with a symlink to an outside directory holding a fake entry, workspaces/echo with a file, tools/ with a symlink into /etc; next commands: no traceback, nothing outside touched, the outside fake never served. Run: .venv/bin/python attacks/a25_dirs_swapped.py
from __future__ import annotations
import shutil
from damage import call, fb, fresh, tb, WORK
from common import verdict

cache, reg = fresh("a25")
outside = WORK / "dmg" / "a25" / "outside-store"
shutil.copytree(cache / "store", outside, symlinks=True)
# the outside copy's echo binary is replaced by a script: if the store symlink is followed, this runs
for b in outside.glob("*-tinyecho-*/bin/tinyecho"):
    b.write_text("#!/bin/sh\necho OUTSIDE-FAKE\n")
shutil.rmtree(cache / "store"); (cache / "store").symlink_to(outside)
shutil.rmtree(cache / "workspaces" / "rev"); (cache / "workspaces" / "rev").write_text("not a dir")
before = sorted(p.name for p in outside.rglob("*"))
outs = [fb(cache, "list"), fb(cache, "show", "echo"), fb(cache, "doctor"), fb(cache, "clean")]
c = call(cache, "echo")
after = sorted(p.name for p in outside.rglob("*"))
for o in outs:
    print(o.args[3:5], o.returncode, (o.stdout + o.stderr).strip()[-300:].replace("\n", " | "))
print("call:", c.stdout.strip(), c.stderr.strip()[-300:])
t = tb(*outs, c)
served = "OUTSIDE-FAKE" in c.stdout
touched = before != after
verdict("A25 store/ symlinked outside, workspace replaced by file", not t and not served and not touched,
        "; ".join(x for x in [t and "traceback " + t[-200:], served and "served the outside fake binary", touched and "changed the outside dir"] if x) or "moved aside, outside untouched")
