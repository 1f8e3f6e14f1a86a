# Claim 2: garble every JSON record in the cache (intents, proofs, store manifests, cards, recipes, attempts) and the registry DB; the next commands give the old result or a clear message, never a traceback, never a lost tool. Run: .venv/bin/python attacks/a24_garbled_json.py
from __future__ import annotations
import json
from damage import call, fb, fresh, tb
from common import verdict

cache, reg = fresh("a24")
garbled = []
payloads = [b"", b"{", b"[1,2]", b'{"format": 1, "id": 5, "name": ["x"]}', b"\xff\xfe\x00garbage", b'"' + b"a" * 10 + b'"', b"1e999999", b'{"a":' * 5000]
for i, p in enumerate(sorted(cache.rglob("*.json"))):
    if "/target/" in str(p) or "/registry/" in str(p):
        continue
    p.write_bytes(payloads[i % len(payloads)]); garbled.append(str(p.relative_to(cache)))
(cache / "intents").mkdir(exist_ok=True)
for j, pl in enumerate(payloads):
    (cache / "intents" / f"t{j}.json").write_bytes(pl)
(cache / "intents" / "echo.json").write_text(json.dumps({"format": 1, "id": "x", "name": "echo", "record": {"name": 5}, "final": 7}))
outs = [fb(cache, "list"), fb(cache, "show", "echo"), fb(cache, "doctor"), fb(cache, "logs", "rev"),
        fb(cache, "build", "-r", str(reg), "--crate", "tinyecho", "--name", "echo", "-q", "echo tool"), fb(cache, "clean")]
c = call(cache, "echo"); c2 = call(cache, "rev")
for o in outs:
    print(o.args[3:6], o.returncode, (o.stdout + o.stderr).strip()[-250:].replace("\n", " | "))
print("echo:", c.stdout.strip(), c.stderr.strip()[-200:]); print("rev:", c2.stdout.strip(), c2.stderr.strip()[-200:])
t = tb(*outs, c, c2)
lost = "I-AM-REV" not in c2.stdout
verdict("A24 garbled JSON records + intents", not t and not lost,
        (f"traceback: {t[-300:]}" if t else "") + (" rev tool lost: " + c2.stderr.strip()[-150:] if lost else "") or f"{len(garbled)} files garbled; no traceback; rev still runs")
