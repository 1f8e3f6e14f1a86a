# Claim 2 ("make a record point outside the cache"): a pending intents/NAME.json whose `next` names a directory outside the cache; recovery must never delete outside the cache. Run: .venv/bin/python attacks/a22_intent_outside.py
from __future__ import annotations
import json
from damage import fb, fresh, tb, WORK
from common import verdict

cache, reg = fresh("a22")
victim = WORK / "dmg" / "a22" / "victim" / "precious"
victim.mkdir(parents=True); (victim / "thesis.txt").write_text("years of work")
(victim / "echo").mkdir()
card = json.loads((cache / "workspaces" / "echo" / ".git" / "flakebot-tool.json").read_text())
txn = card["txn"]
show = json.loads(fb(cache, "show", "echo", "--json").stdout)
# the record as the registry has it, as an intent holds it
import sqlite3
con = sqlite3.connect(cache / "tools" / "tools.sqlite3")
rows = con.execute("select * from sqlite_master").fetchall()
tables = [r[1] for r in rows if r[0] == "table"]
rec = None
for t in tables:
    for row in con.execute(f"select * from {t}"):
        for v in row:
            if isinstance(v, str) and v.startswith("{") and '"echo"' in v:
                rec = json.loads(v)
con.close()
assert rec is not None, tables
rec.setdefault("extra", {})["txn"] = txn
intent = {"id": txn, "name": "echo", "record": rec, "final": str(cache / "workspaces" / "echo"),
          "next": str(victim / "echo"), "aside": "", "recipe": "", "recipe_data": {}, "pid": 999999, "created": 0.0, "format": 1}
(cache / "intents").mkdir(exist_ok=True)
fmt = None
import flakebot_magic.manage.transaction as T
intent["format"] = T.INTENT_FORMAT
(cache / "intents" / "echo.json").write_text(json.dumps(intent))
lst = fb(cache, "list")
print(lst.stdout, lst.stderr[-500:])
gone = not (victim / "thesis.txt").exists()
verdict("A22 intent naming a directory outside the cache", not gone and not tb(lst),
        f"`flakebot list` deleted {victim} (outside the cache) via intent.next" if gone else (tb(lst) or "outside directory kept"))
