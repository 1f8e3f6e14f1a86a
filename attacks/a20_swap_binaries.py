# Claim 2 (README "A damaged store entry is never served"): swap two tools' deployed binaries; loading/calling a tool must never run the other's binary. Run: .venv/bin/python attacks/a20_swap_binaries.py
from __future__ import annotations
import shutil
from damage import call, entry, fb, fresh, tb
from common import verdict

cache, reg = fresh("a20")
e, r = entry(cache, "tinyecho") / "bin" / "tinyecho", entry(cache, "tinyrev") / "bin" / "tinyrev"
tmp = e.with_name("x"); shutil.copy2(e, tmp); shutil.copy2(r, e); shutil.copy2(tmp, r); tmp.unlink()
c = call(cache, "echo"); lst = fb(cache, "list"); show = fb(cache, "show", "echo")
b = fb(cache, "build", "-r", str(reg), "--crate", "tinyecho", "--name", "echo", "echo tool")
c2 = call(cache, "echo")
print("load+call:", c.stdout.strip()[-200:], c.stderr.strip()[-300:]); print("rebuild:", b.returncode, b.stderr[-300:]); print("after:", c2.stdout.strip()[-100:])
ran = "I-AM-REV" in c.stdout + c2.stdout
verdict("A20 swap two tools' binaries", not ran and not tb(c, lst, show, b, c2),
        ("load('echo') ran rev's binary: " + c.stdout.strip()[-60:]) if ran else (tb(c, lst, show, b, c2) or f"refused: {(c.stderr.strip().splitlines() or [''])[-1][:160]}"))
