# Claim 2 ("fill with a FIFO/device node"): replace ONE record (argv[1]: log|proof|card|manifest|sqlite) with a FIFO; no command may hang or trace back. Run: .venv/bin/python attacks/a23_fifo_records.py manifest
from __future__ import annotations
import os
import sys
from damage import call, entry, fb, fresh, tb
from common import verdict

which = sys.argv[1]
cache, reg = fresh("a23-" + which)
target = {"log": lambda: [cache / "logs" / "echo.log"], "proof": lambda: list((cache / "proofs").glob("*.json")),
          "card": lambda: [cache / "workspaces" / "echo" / ".git" / "flakebot-tool.json"],
          "manifest": lambda: [entry(cache, "tinyecho") / "manifest.json"],
          "sqlite": lambda: [cache / "tools" / "tools.sqlite3"]}[which]()
for p in target:
    p.unlink(); os.mkfifo(p)
cmds = {"log": [("logs", "echo")], "proof": [("build", "-r", str(reg), "--crate", "tinyecho", "--name", "echo2", "-q", "echo tool")],
        "card": [("doctor",), ("show", "echo")], "manifest": [("show", "echo"), ("doctor",)], "sqlite": [("list",), ("doctor",)]}[which]
hung, res = [], []
for args in cmds:
    try:
        res.append(fb(cache, *args, timeout=60))
    except Exception:
        hung.append(args[0])
c = call(cache, "echo", timeout=60) if which in ("manifest", "sqlite") else None
if c is not None and "HUNG" in c.stderr:
    hung.append("load+call")
t = tb(*res, *([c] if c else []))
for r in res:
    print(r.args[3:5], r.returncode, (r.stdout + r.stderr).strip()[-200:].replace("\n", " | "))
verdict(f"A23-{which} FIFO in place of {which}", not hung and not t,
        (f"hung >60s: {hung}" if hung else "") + (f" traceback: {t[-150:]}" if t else "") or "no hang, no traceback")
