# Claim 2: delete a deployed binary; list/show/load/call say clearly what is wrong and what to do, never a traceback. Run: .venv/bin/python attacks/a21_delete_binary.py
from __future__ import annotations
from damage import call, entry, fb, fresh, tb
from common import verdict

cache, reg = fresh("a21")
(entry(cache, "tinyecho") / "bin" / "tinyecho").unlink()
c = call(cache, "echo"); lst = fb(cache, "list"); show = fb(cache, "show", "echo"); doc = fb(cache, "doctor")
print(c.stderr[-400:]); print(lst.stdout, lst.stderr); print(doc.stdout[-600:], doc.stderr[-300:])
msg = c.stderr.strip().splitlines()[-1] if c.stderr.strip() else c.stdout
clear = c.returncode != 0 and "rebuild" in (c.stderr + doc.stdout + doc.stderr)
verdict("A21 deployed binary deleted", clear and not tb(c, lst, show, doc), tb(c, lst, show, doc) or msg[:200])
