"""A TEST HOOK: named crash points in every step that changes a tool on disk, and in the start of a child, where a
test can SIGKILL the process.

SQLite proves its crash safety by killing itself at every step of a commit
and checking the database afterwards; flakebot does the same for a tool's
store entry, workspace and record. Each step that changes what is on disk is
followed by ``crash_point("name")``. With ``FLAKEBOT_CRASH_AT=name`` in the
environment (read once, when this module is imported) the process sends
itself ``SIGKILL`` right there: no ``finally``, no ``atexit``, as a power cut
or the OOM killer would. ``name#2`` kills at the second time the point is
passed (a point inside a loop). Unset, a crash point costs one comparison.

:data:`POINTS` lists every point, in the order a run passes them, with what
has just happened there. ``tests/manage/test_transaction.py`` kills a real build at
each one, and ``tests/host/test_crashpoints.py`` checks (by reading the code) that every step that writes,
renames or removes in the functions named in :data:`WATCHED` is followed by
a point, so a new step without one fails the tests.

The ``spawn.`` points are in the start of a call's child
(:func:`flakebot_magic.host.process.spawn`), before and after the guard is told
of it: ``tests/security/test_process_trees.py`` kills a parent at each and
checks that nothing of the child outlives it.

This is not a user setting: it only ever makes flakebot die.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["ENV", "POINTS", "WATCHED", "crash_point"]

#: the environment variable that names the point to die at
ENV = "FLAKEBOT_CRASH_AT"

#: every crash point: name -> what has just happened when the process passes it
POINTS: dict[str, str] = {
    # stages/fork.py: reusing the tool's workspace, or forking a new one
    "fork.unlocked": "lock files a killed git left in the reused workspace were removed",
    "fork.copied": "a --continue copy of the workspace was made beside it",
    "fork.local_edits": "local edits in the reused workspace were committed",
    "fork.made": "the new workspace's directory was made",
    "fork.fetched": "the published source was copied into the new workspace",
    "fork.init": "the new workspace's git repository was made",
    "fork.published": "the published source was committed",
    "fork.tagged": "the published commit was tagged",
    "fork.branched": "the flakebot branch was made",
    "fork.satisfiable": "dependencies the registry lacks were dropped and committed",
    "fork.locked": "Cargo.lock was settled and committed",
    "fork.saved": "the workspace's state file was written (the fork is whole)",
    # stages/deploy.py: the store entry
    "deploy.staging": "the staging directory of the new store entry was made",
    "deploy.filled": "the staging entry holds the binaries",
    "deploy.manifest": "the staging entry's manifest was written",
    "deploy.synced": "the staging entry was fsync-ed",
    "deploy.swapped": "the staging entry was swapped in as the store entry",
    "deploy.done": "the replaced store entry was removed",
    # manage/transaction.py: store entry, workspace and record become the new tool together
    "txn.intent": "the intent record was written and fsync-ed",
    "txn.card": "the tool card was written into the new workspace",
    "txn.swapped": "the new workspace was swapped in; the replaced one is where the new one was",
    "txn.record": "the inventory record was saved (the transaction's commit point)",
    "txn.named": "the tool was named (its commit, its workspace) in its store entry's manifest",
    "txn.aside": "the replaced workspace was moved to .old/ (a --continue copy's stays for the next step)",
    "txn.recipe": "the recipe was written",
    "txn.attempt": "what was left of the attempt under .next/ was removed",
    "txn.done": "the intent record was removed",
    "txn.intent_aside": "an intent that could not be read (or a directory in its place) was set aside in damaged/",
    "txn.intent_unlinked": "a symlink in place of an intent was removed (its target left alone)",
    # host/locks.py, host/git.py: a file of flakebot's that is no regular file (a directory, a symlink) set aside
    "lock.aside": "what stood in place of a tool's lock file was set aside",
    "git.config_aside": "what stood in place of a workspace's .git/config was set aside",
    # manage/doctor.py: the doctor's repairs
    "doctor.lock_aside": "what stood in place of a tool's lock file was set aside (by the doctor)",
    "doctor.entry_aside": "a damaged store entry was set aside (.damaged-ENTRY-N)",
    "doctor.modes": "a store entry's modes were made readable and runnable by its owner again",
    "doctor.replaced": "the rebuilt tool inventory was put in place (the damaged one kept aside)",
    "doctor.card_aside": "what stood in place of a workspace's tool card was set aside",
    "doctor.special_removed": "a FIFO, socket, device or symlink under a workspace's .git was removed",
    "doctor.head": "a workspace's HEAD, removed as no file, was written again at the recorded commit",
    "doctor.card": "a tool card was written again from its record",
    "doctor.unlocked": "the lock files a killed git left in a tool's workspace were removed",
    # backends/nix_cache.py: a push to a team's cache, the proof last
    "push.derivation": "the tool's derivation (and its closure) was pushed, signed (or there was none to push)",
    "push.tool": "the tool's store path was pushed, signed",
    "push.proof": "the proof's store path was pushed, signed: the push is whole",
    # records/proofs.py: a passing cargo test kept by what it proved
    "proof.proven": "the tests passed; their proof is not written yet",
    "proof.recorded": "the proof's record was written in one step (temporary file, fsync, rename)",
    # manage/cleanup.py
    "clean.renamed": "a path clean removes was renamed aside (it is gone for every reader)",
    "clean.removed": "a path clean removes was removed",
    # host/process.py: a call's child is started, waiting at its gate
    "spawn.started": "a call's child was started; the guard does not know it yet",
    "spawn.guarded": "the guard was told of the child's group; the child still waits at its gate",
    # host/process.py: a CLI call's child started by posix_spawn, no gate: it carries the guard's mark
    "call.started": "a CLI call's child was started and runs; the guard knows its mark, not its group yet",
}

#: the functions whose every change on disk must be followed by a crash point (module -> function names)
WATCHED: dict[str, tuple[str, ...]] = {
    "stages/fork.py": ("fork",),
    "stages/deploy.py": ("write_entry",),
    "manage/transaction.py": ("install", "_forward", "_set_aside"),
    "manage/cleanup.py": ("_discard",),
    "records/proofs.py": ("record",),
    "manage/doctor.py": ("_layout", "rebuild", "_store", "_tool"),
    "host/locks.py": ("_open",),
    "host/git.py": ("_set_aside_config",),
    "backends/nix_cache.py": ("push_tool",),
}

_TARGET = os.environ.get(ENV) or None
_counts: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here (``SIGKILL``) when ``$FLAKEBOT_CRASH_AT`` names this point; otherwise do nothing."""
    if _TARGET is None:
        return
    _arrive(name)


def _arrive(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}: add it to crashpoints.POINTS")
    target, _, nth = (_TARGET or "").partition("#")
    if target != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        count = _counts[name]
    if count >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
