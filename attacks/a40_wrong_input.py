# Claim 4 (README "Errors"): weird tool names, control characters and odd option values are a clear error, never a traceback, via the CLI and the magic. Run: .venv/bin/python attacks/a40_wrong_input.py
from __future__ import annotations
import subprocess
from common import PY, WORK, fb, registry, verdict

cache = WORK / "a40" / "cache"
reg = registry("a40", ["tinyecho"])
R = ["-r", str(reg), "--crate", "tinyecho"]
cases = [
    ("name ..", ["build", *R, "--name", "..", "x"]), ("name ../../x", ["build", *R, "--name", "../../x", "x"]),
    ("name newline", ["build", *R, "--name", "a\nb", "x"]), ("name ESC", ["build", *R, "--name", "a\x1b]0;T\x07", "x"]),
    ("name -rf", ["build", *R, "--name=-rf", "x"]), ("name 300 chars", ["build", *R, "--name", "a" * 300, "x"]),
    ("name unicode", ["build", *R, "--name", "n\u202eame", "x"]), ("name empty", ["build", *R, "--name", "", "x"]),
    ("request ctrl", ["build", *R, "--name", "ok1", "\x01\x1b[2J\x07req"]),
    ("max-iterations -5", ["build", *R, "--max-iterations", "-5", "x"]), ("max-iterations abc", ["build", *R, "--max-iterations", "abc", "x"]),
    ("token-budget 1e400", ["build", *R, "--token-budget", "1e400", "x"]), ("max-cost nan", ["build", *R, "--max-cost", "nan", "x"]),
    ("max-cost -inf", ["build", *R, "--max-cost", "-inf", "x"]), ("candidates 0", ["build", *R, "--candidates", "0", "x"]),
    ("candidates 99999", ["build", *R, "--candidates", "99999", "--model", "m", "--base-url", "http://127.0.0.1:9", "x"]),
    ("max-jobs -1", ["build", *R, "--backend", "nix", "--max-jobs", "-1", "x"]),
    ("registry /dev/zero", ["build", "-r", "/dev/zero", "--crate", "tinyecho", "x"]), ("registry FIFO-less nonexist", ["build", "-r", "/nonexistent\n", "x"]),
    ("base-url garbage", ["build", "--model", "m", "--base-url", "ht!tp://\x01", "--name", "ok2", "x"]),
    ("show ../x", ["show", "../x"]), ("logs ESC", ["logs", "\x1b[2Jx"]), ("cargo name ..", ["cargo", "..", "test"]),
    ("pull from nonexist", ["pull", "echo", "--from", "/nonexistent.ipynb"]), ("pull from /dev/zero", ["pull", "echo", "--from", "/etc/passwd"]),
    ("steer huge", ["steer", "x", "A" * 100000]), ("cache-dir is a file", ["--cache-dir", "/etc/passwd", "list"]),
]
bad = []
for label, args in cases:
    if args[0] == "--cache-dir":
        args = ["list", "--cache-dir", "/etc/passwd"]
    try:
        r = fb(cache, *args, timeout=120)
    except subprocess.TimeoutExpired:
        bad.append(f"{label}: hung"); continue
    out = r.stdout + r.stderr
    last = (out.strip().splitlines() or [""])[-1][:140]
    esc = any(ch in out for ch in "\x1b\x07\x00")
    print(f"{label:28} rc={r.returncode} {'TRACEBACK ' if 'Traceback' in out else ''}{'RAW-ESC ' if esc else ''}{last!r}")
    if "Traceback" in out or esc:
        bad.append(label)
# the magic: a cell with control characters and odd options, in a real IPython shell
code = f"""
import os; os.environ['FLAKEBOT_CACHE_DIR']={str(cache)!r}
from IPython.core.interactiveshell import InteractiveShell
sh = InteractiveShell.instance(); sh.run_line_magic('load_ext', 'flakebot_magic')
for line, cell in [('--name "a b" --crate tinyecho -r {reg}', 'x'), ('--name ok3 --crate tinyecho -r {reg}', '\\x00\\x1b]52;c;QQ==\\x07'),
                   ('--max-iterations=-1 --crate tinyecho -r {reg}', 'x'), ('--name ok4 --candidates 1e9 --crate tinyecho', 'x'),
                   ('--name "\\u202e" --crate tinyecho -r {reg}', 'x'), ('--unknown-flag', 'x'), ('"unclosed', 'x')]:
    r = sh.run_cell('%%flakebot ' + line + chr(10) + cell)
    print('CELL-ERR:', type(r.error_in_exec).__name__ if r.error_in_exec else None)
"""
m = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300, errors="replace")
mout = m.stdout + m.stderr
print("magic:", mout[-800:].encode("unicode_escape").decode()[:800])
if "Traceback" in mout or "\x1b]52" in mout:
    bad.append("magic traceback")
verdict("A40 wrong input (names, control chars, odd options)", not bad, "; ".join(bad) or f"{len(cases)} CLI cases + 7 magic cases: clear errors")
