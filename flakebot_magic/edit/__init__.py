"""The ``edit`` stage's loop: a language model edits the workspace; cargo proves each step; code keeps the score.

The package, one job per module:

* :mod:`.protocol`: the seven protocol functions the model may call (schemas, arguments);
* :mod:`.files`: containment and the file functions behind them (capped reads, atomic writes);
* :mod:`.checkrun`: a check run (cargo build, test, clippy in the sandbox), rustc's fixes, commits, reverts;
* :mod:`.ratchet`: the tests in the source, and the best state that must not be lost;
* :mod:`.report`: a check run's report for the model;
* :mod:`.prompt`: the system prompt;
* :mod:`.state`: the recorded sessions of a workspace, and one session's outcome;
* :mod:`.session`: :class:`EditLoop`, the loop itself (budget, stuck detection, finish).
* :mod:`.team`: the session's actors (manager, architect, engineers, judge) and ``--candidates``;
* :mod:`.architect`: the plan; :mod:`.forks`: candidate clones with a warm target dir, adopting the winner;
* :mod:`.judge`: a candidate's structural score; :mod:`.candidates`: a race's records;
* :mod:`.resume`: resuming a session;
* below it, in ``records/`` and ``llm/``: :mod:`~flakebot_magic.records.races` (a journalled race),
  :mod:`~flakebot_magic.records.journal` (the session's record and where a resume starts) and
  :mod:`~flakebot_magic.llm.context` (result caps, compaction).

Requests to the model go through :mod:`flakebot_magic.llm` (caps, retries, the shared budget), never from here.

In this package "tool" means the deployed program; what the model calls are
protocol functions. See ``docs/edit-protocol.md``.
"""

from __future__ import annotations

from .checkrun import CheckRun
from .files import PathRefused, contain
from .protocol import FUNCTION_NAMES, FUNCTION_SCHEMAS
from .ratchet import TestFunction, scan_tests
from .session import EditLoop
from .state import EditOutcome, EditState

__all__ = [
    "FUNCTION_NAMES",
    "FUNCTION_SCHEMAS",
    "CheckRun",
    "EditLoop",
    "EditOutcome",
    "EditState",
    "PathRefused",
    "TestFunction",
    "contain",
    "scan_tests",
]
