"""Held-out replies, written after the parser's rules were set (the tuning cases are in test_dialects.py).

Each is a reply as a model of that family writes it, with what must come of
it: the calls, ``None`` (no call: the loop asks for calls), or ``REFUSED``
(the model is told which form to use). Forms the parser does not read
(Mistral's newer ``[TOOL_CALLS]name[ARGS]{...}``, DeepSeek's own tokens, a
Python-style call) are listed with the outcome they get, so a change shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from flakebot_magic.edit.protocol import FUNCTION_NAMES
from flakebot_magic.llm.dialects import TextCallRefused, read_calls

REFUSED = "refused"
READ = ("read_file", {"path": "src/lib.rs"})
CHECKS = ("run_checks", {})

HELD_OUT: list[tuple[str, str, bool, Any]] = [
    (
        "qwen2.5-coder, prose first",
        'Let me check the file first.\n\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/lib.rs"}}\n</tool_call>',
        False,
        [READ],
    ),
    (
        "hermes, two blocks",
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/lib.rs"}}\n</tool_call>\n\n'
        '<tool_call>\n{"name": "run_checks", "arguments": {}}\n</tool_call>',
        False,
        [READ, CHECKS],
    ),
    (
        "llama 3.1 python_tag",
        '<|python_tag|>{"name": "read_file", "parameters": {"path": "src/lib.rs"}}<|eom_id|>',
        False,
        [READ],
    ),
    (
        "llama 3.2 typed",
        '{"type": "function", "name": "list_files", "parameters": {"path": "."}}',
        False,
        [("list_files", {"path": "."})],
    ),
    (
        "llama, parameters as a string",
        '{"name": "read_file", "parameters": "{\\"path\\": \\"src/lib.rs\\"}"}',
        False,
        [READ],
    ),
    ("mistral, no space", '[TOOL_CALLS][{"name": "run_checks", "arguments": {}}]', False, [CHECKS]),
    ("mistral v11 form (not read)", '[TOOL_CALLS]read_file[ARGS]{"path": "src/lib.rs"}', False, REFUSED),
    (
        "fenced list of two",
        'I will read and check.\n```json\n[\n  {"name": "read_file", "arguments": {"path": "src/lib.rs"}},\n'
        '  {"name": "run_checks", "arguments": {}}\n]\n```',
        False,
        [READ, CHECKS],
    ),
    ("fence labelled tool_call", '```tool_call\n{"name": "run_checks", "arguments": {}}\n```', False, [CHECKS]),
    (
        "rust code in prose, no call",
        'Here is the plan:\n```rust\nfn main() {\n    let v = vec![1, 2];\n    println!("{:?}", v);\n}\n```',
        False,
        None,
    ),
    ("a function named in prose", "I should call `read_file` on src/lib.rs, then `run_checks`.", False, None),
    ("cargo metadata as JSON", 'The crate is {"name": "tinyhex", "version": "0.1.0"}.', False, None),
    (
        "qwen write_file with code",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "src/main.rs", "content": "fn main() {\\n    println!(\\"{}\\", 1);\\n}\\n"}}\n</tool_call>',
        False,
        [("write_file", {"path": "src/main.rs", "content": 'fn main() {\n    println!("{}", 1);\n}\n'})],
    ),
    (
        "qwen, single quotes and trailing commas",
        "<tool_call>\n{'name': 'read_file', 'arguments': {'path': 'src/lib.rs',},}\n</tool_call>",
        False,
        [READ],
    ),
    (
        "llama function tag with code",
        '<function=write_file>{"path": "src/main.rs", "content": "fn main() {}\\n"}</function>',
        False,
        [("write_file", {"path": "src/main.rs", "content": "fn main() {}\n"})],
    ),
    (
        "llama tag, prose after",
        "<function=run_checks>{}</function>\nLet's see what the compiler says.",
        False,
        [CHECKS],
    ),
    ("qwen never closed", '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/lib.rs"}}', False, REFUSED),
    (
        "'function' key instead of 'name'",
        '<tool_call>{"function": "read_file", "arguments": {"path": "src/lib.rs"}}</tool_call>',
        False,
        REFUSED,
    ),
    (
        "openai-shaped call as text",
        '{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\\"path\\": \\"src/lib.rs\\"}"}}',
        False,
        [READ],
    ),
    ("python-style call (not read)", 'read_file(path="src/lib.rs")', False, None),
    (
        "qwen, a list inside one block",
        '<tool_call>[{"name": "read_file", "arguments": {"path": "src/lib.rs"}}, {"name": "run_checks", "arguments": {}}]</tool_call>',
        False,
        [READ, CHECKS],
    ),
    ("the word function in angle brackets", "The <function> of this crate is hex encoding.", False, None),
    ("empty tool_call", "<tool_call></tool_call>", False, REFUSED),
    ("arguments null", '<tool_call>{"name": "run_checks", "arguments": null}</tool_call>', False, [CHECKS]),
    (
        "arguments string in single quotes",
        '<tool_call>{"name": "read_file", "arguments": "{\'path\': \'src/lib.rs\'}"}</tool_call>',
        False,
        [READ],
    ),
    (
        "deepseek tokens (not read)",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n"
        '{"path": "src/lib.rs"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        False,
        None,
    ),
    (
        "fenced, cut at the limit",
        '```json\n{"name": "write_file", "arguments": {"path": "src/main.rs", "content": "fn',
        True,
        REFUSED,
    ),
    ("prose only, cut at the limit", "I think the next step is to", True, None),
]


@pytest.mark.parametrize(("what", "text", "cut", "expected"), HELD_OUT, ids=[h[0] for h in HELD_OUT])
def test_held_out_replies(what: str, text: str, cut: bool, expected: Any) -> None:
    try:
        found = read_calls(text, FUNCTION_NAMES, truncated=cut)
    except TextCallRefused:
        assert expected == REFUSED
        return
    got = None if found is None else [(c.name, c.arguments) for c in found.calls]
    assert got == expected
