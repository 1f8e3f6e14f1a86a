"""Text from data written into generated source: the one escaper per language (issue 33, class A).

A name a checkout, a registry or a model gives becomes part of a file flakebot generates: a placeholder
binary's Rust (``eval/polyglot.py``), a flake (``stages/flake.py``), a manifest (tomlkit writes TOML strings
itself; ``json.dumps`` is a valid TOML basic string too). Pasted unescaped, a quote in it ends the literal and
the rest is code (red team 33: a polyglot exercise's ``[package] name`` reached a ``println!``). Each language's
literal is made here, and nowhere else; what is a path component is checked by the field's validator
(``registry.base.check_crate_field``, ``host.names.check_tool_name``, ``sandbox.diagnostics.BINARY_NAME``).
"""

from __future__ import annotations

__all__ = ["nix_string", "rust_string"]


def rust_string(value: str) -> str:
    r"""``value`` as a Rust string literal that also passes through ``format!``'s braces (``println!("{}")``).

    Every character but printable ASCII is a ``\u{...}`` escape; ``"`` and ``\`` are escaped, and ``{``/``}``
    doubled, so the literal is safe as a format string too.

    >>> rust_string('a"b{c}\n')
    '"a\\"b{{c}}\\u{a}"'
    """
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "{}":
            out.append(ch * 2)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    return '"' + "".join(out) + '"'


def nix_string(value: str) -> str:
    """``value`` as a Nix double-quoted string literal.

    Escapes ``\\``, ``"``, ``${`` (which would start an interpolation) and
    newline, carriage return and tab. NUL cannot occur in a Nix string.
    """
    if "\0" in value:
        raise ValueError("a Nix string cannot contain NUL")
    out = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "$" and value.startswith("${", i):
            out.append("\\$")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
        i += 1
    return '"' + "".join(out) + '"'
