"""The dashboard's templates: shipped as package data, and no untrusted value reaches the page unescaped.

Rendered without a server (:func:`render_dashboard` is what the handler
calls); ``tests/server/test_handlers.py`` serves the page from a real
``jupyter server``. The property: whatever strings a tool's record, its
provenance, its log or the page's own fields hold, the page has exactly the
elements and attributes the templates write, its two scripts are the
templates' own, its JSON reads back the (made-safe) data, and no control,
escape or bidi character is left.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from hostile_text import FORBIDDEN, MARKUP, PAYLOAD

from flakebot_magic.records.inventory import ToolRecord
from flakebot_magic.server.dashboard import TEMPLATES, DashboardRow, render_dashboard, templates
from flakebot_magic.untrusted import safe_data, safe_text

#: what an attacker writes into every field: markup, a quote that would end an attribute, a template
#: expression, a script end, ANSI and OSC escapes, bidi controls (and the shared payload of every family)
HOSTILE = (
    "</script><script>alert(1)</script>",
    "\"onerror=alert(2) x='",
    "' onmouseover='alert(3)",
    "{{ 7777 * 3 }}{% if true %}JINJA-RAN{% endif %}",
    "\x1b[31mred\x1b[0m\x1b]0;title\x07\x1b]52;c;Y29weQ==\x07",
    "<img src=x onerror=alert(4)><!-- -->&amp;",
    PAYLOAD,
)

#: the elements and attributes the templates write, and nothing else may appear
ELEMENTS = {
    "html", "head", "meta", "title", "style", "body", "h1", "p", "code", "table", "thead", "tbody", "tr",
    "th", "td", "b", "a", "button", "span", "div", "details", "summary", "pre", "script", "dl", "dt", "dd",
}  # fmt: skip
ATTRIBUTES = {"charset", "name", "content", "class", "data-name", "data-status", "colspan", "href", "title",
              "type", "id", "disabled"}  # fmt: skip


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False if tag == "script" else self._in_script

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"a comment reached the page: {data!r}")


def _tool(hostile: str, kind: str) -> dict[str, Any]:
    """A tool in the API's shape with ``hostile`` in every string field (and in its provenance)."""
    fields = {k: v for k, v in ToolRecord.stand_in(hostile).public_json().items()}
    tool: dict[str, Any] = {k: hostile if isinstance(v, str) else v for k, v in fields.items()}
    tool.update(
        kind=kind,
        status=hostile,
        started=1.0,
        provenance={"crate": hostile, hostile: [hostile]},
        links={"self": hostile, "proxy": f"/flakebot/proxy/{hostile}/"},
        usage=hostile,
        example=hostile,
        reads_stdin=None,
        lock_hash=hostile,
        extra={hostile: hostile},
    )
    return tool


def _render(hostile: str) -> str:
    tools = [_tool(hostile, "http"), _tool(hostile, "cli"), _tool(hostile, hostile)]
    shown = safe_data(tools)  # what the handler shows: the API's made-safe data
    rows = [DashboardRow(tool, log=hostile, started=hostile, open="/x" + hostile, entry=hostile) for tool in shown]
    rows[1] = DashboardRow(shown[1], log=hostile, started="")
    return render_dashboard(shown, rows, counted=hostile, registry=hostile, api=hostile, xsrf=hostile, version=hostile)


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_no_hostile_string_survives_unescaped_in_any_field(hostile: str) -> None:
    text = _render(hostile)
    page = _Page()
    page.feed(text)
    page.close()
    # the structure is the templates': no element, attribute or handler the data brought
    assert {tag for tag, _ in page.tags} <= ELEMENTS
    assert {name for _, attrs in page.tags for name, _ in attrs} <= ATTRIBUTES
    assert [tag for tag, _ in page.tags].count("script") == 2 and text.count("</script>") == 2
    # every character shown is safe to show, on the page and in its data; no template ran what the data held
    assert not FORBIDDEN & set(text), sorted(f"U+{ord(c):04X}" for c in FORBIDDEN & set(text))
    assert "23331" not in text and text.count("JINJA-RAN") == text.count("{% if true %}JINJA-RAN{% endif %}")
    for markup in (*MARKUP, "<img", "<!--", '"onerror', "'onerror", "' onmouseover"):
        outside = text.split("<script type='application/json'", 1)[0]
        assert markup not in outside, markup
    # the page's data is the made-safe data itself, whole
    data, code = page.scripts
    assert json.loads(data) == safe_data([_tool(hostile, k) for k in ("http", "cli", hostile)])
    assert code.startswith("const API = ") and json.loads(code.split("\n", 1)[0][12:].rstrip(";")) == safe_text(hostile)
    # and the shown text holds the made-safe strings (escaped, not dropped)
    assert safe_text(hostile).strip() in "".join(page.text)


def test_a_stop_button_carries_the_name_as_data_never_as_code() -> None:
    text = _render("x')+alert(1)+('")
    assert "onclick" not in text and "stopTool(this, " not in text.split("<script>", 1)[0]
    assert re.search(r"<button class='stop' data-name='x&#39;\)\+alert\(1\)\+\(&#39;' disabled>Stop</button>", text)


def test_every_template_ships_as_package_data_and_renders() -> None:
    """The templates are read through importlib.resources (as from an installed wheel): every file of the
    templates directory is a template the environment lists, and the page includes every one."""
    shipped = {
        p.name for p in importlib.resources.files("flakebot_magic.server").joinpath(TEMPLATES).iterdir() if p.is_file()
    }
    assert shipped == {"dashboard.html", "dashboard.css", "dashboard.js"}
    assert set(templates().list_templates()) == shipped
    page = render_dashboard([], [], counted="0 tools", registry="/r", api="/api", xsrf="t")
    assert "No tools yet" in page
    assert "border-collapse:collapse" in page and "async function refresh()" in page  # the css and the js included


def test_a_missing_value_is_an_error_not_an_empty_string() -> None:
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        templates().get_template("dashboard.html").render(shown=[], rows=[])


def _fields(text: str, name: str) -> list[tuple[str, str]]:
    """The (dt, dd) pairs of tool ``name``'s provenance list, as the page shows them (entities decoded)."""

    class _List(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.pairs: list[list[str]] = []
            self.inside: str | None = None
            self.mine = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "tr":
                self.mine = ("data-name", name) in attrs and ("class", "tool-details") in attrs
            if self.mine and tag in ("dt", "dd"):
                self.inside = tag
                if tag == "dt":
                    self.pairs.append(["", ""])

        def handle_endtag(self, tag: str) -> None:
            self.inside = None if tag in ("dt", "dd") else self.inside

        def handle_data(self, data: str) -> None:
            if self.inside is not None:
                self.pairs[-1][0 if self.inside == "dt" else 1] += data

    parser = _List()
    parser.feed(text)
    parser.close()
    return [(dt, dd) for dt, dd in parser.pairs]


def test_provenance_is_a_definition_list_of_the_fields_that_have_a_value() -> None:
    tool = _tool("md", "cli")
    tool["provenance"] = {
        "crate": "pulldown-cmark",
        "version": "0.9.2",
        "flake_lock": "",
        "model": None,
        "nar_hash": "  ",
        "binaries": ["md", "md-cli"],
        "choice": {"by": "search", "reason": "the best match", "note": ""},
        "iterations": 0,
        "request": "Render Markdown.\nAs HTML.",
    }
    failed = _tool("hex2", "cli")
    failed.update(provenance={}, request="hex-encode stdin", workspace="", log_path="/cache/logs/hex2.failed.log")
    shown = safe_data([tool, failed])
    page = render_dashboard(
        shown, [DashboardRow(t, log="", started="") for t in shown], counted="2", registry="/r", api="/a", xsrf="t"
    )
    assert _fields(page, "md") == [
        ("crate", "pulldown-cmark"),
        ("version", "0.9.2"),
        ("binaries", "md, md-cli"),
        ("choice", "by: search; reason: the best match"),
        ("iterations", "0"),
        ("request", "Render Markdown.\nAs HTML."),
    ]
    # a build that made no tool: what it was, where its log is; no empty workspace, and no JSON anywhere
    assert _fields(page, "hex2") == [("request", "hex-encode stdin"), ("log_path", "/cache/logs/hex2.failed.log")]
    outside = page.split("<script type='application/json'", 1)[0]
    assert '"crate":' not in outside and '": ""' not in outside and "null" not in outside


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_provenance_field_and_value_are_escaped_text(hostile: str) -> None:
    shown = safe_text(hostile).strip()
    # the page's three tools are all named ``hostile``: each lists its field "crate" and its field ``hostile``
    assert _fields(_render(hostile), safe_data(hostile)) == [("crate", shown), (shown, shown)] * 3


def test_a_narrow_window_keeps_the_status_column() -> None:
    """Issue 37: at 500 px the status column was off the screen. Under 640 px the columns one can do without go
    (each tool's provenance still lists them); name, crate, status and the buttons stay."""
    css = importlib.resources.files("flakebot_magic.server").joinpath("templates/dashboard.css").read_text()
    assert re.search(r"@media \(max-width:640px\)\{\.more\{display:none\}\}", css)
    shown = safe_data([_tool("md", "cli")])
    page = render_dashboard(
        shown, [DashboardRow(t, log="", started="") for t in shown], counted="1", registry="/r", api="/a", xsrf="t"
    )
    head = page[page.index("<thead>") : page.index("</thead>")]
    kept = re.findall(r"<th>([^<]*)</th>", head)
    assert kept[:3] == ["name", "crate@version", "status"]
    row = page[page.index("<tr class='tool'") : page.index("</tr>", page.index("<tr class='tool'"))]
    assert "class='status'" in row and row.count("class='more'") == 4
