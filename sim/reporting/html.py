"""Self-contained HTML pages holding altair charts, readable offline from a file.

Why: reports are opened from disk, often on machines without internet access; the Vega,
Vega-Lite and Vega-Embed libraries are inlined once per page (vl-convert's bundle, kept on disk:
sim/reporting/vega_bundle.py), and each chart is embedded as its Vega-Lite JSON spec.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field

import altair as alt

from sim.reporting.vega_bundle import vega_bundle_js
from sim.files.text import shown, shown_data


CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { background: #e3f4e1; font-weight: 600; }
.chart { margin: 1em 0; width: 100%; } .note { color: #555; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; }
"""


_NUMBER = re.compile(r"^[-+]?[\d,.]+(%| ms| s)?( \[[-+\d,. ]+\]| - [\d,.]+)?$|^[<>]=? ?[\d,.]+.*$")
PAGE_CHART_WIDTH = 880   # px: the page's 1,200 px less margins and a legend, for charts that cannot use "container"


# what may not appear as such in a <script> block: "</script" ends it, "<!--" (with "<script")
# makes the HTML parser look for two closing tags and swallow the page after it
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_UNSAFE_RE = re.compile("[<>&\u2028\u2029]")


def script_json(value) -> str:
    """``value`` as JSON (ASCII) to put inside a <script> block: every string ``shown`` (no lone
    surrogate) and ``<``, ``>``, ``&`` as \\u escapes, which can only occur inside JSON strings,
    where they mean the same character. The one way every page embeds data (issue 38: a grid or
    trace named ``<!--<script>`` drew one chart of seven and hid most of the page's text)."""
    text = json.dumps(shown_data(value), separators=(",", ":"))
    return _SCRIPT_UNSAFE_RE.sub(lambda m: _SCRIPT_UNSAFE[m.group()], text)


def _numeric(v) -> bool:
    """A number, "-" (no value), or a number with a unit or an interval: right-aligned."""
    if isinstance(v, (int, float)):
        return True
    text = str(v).strip()
    return text in ("-", "") or bool(_NUMBER.match(text))


def _cls(num: bool, best: bool = False) -> str:
    names = [n for n, on in (("num", num), ("best", best)) if on]
    return f' class="{" ".join(names)}"' if names else ""


@dataclass
class Page:
    """A report page: HTML fragments and charts, in order."""

    title: str
    parts: list[str] = field(default_factory=list)
    specs: dict[str, dict] = field(default_factory=dict)

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{c}>{html.escape(text)}</p>")

    def raw(self, fragment: str) -> None:
        self.parts.append(fragment)

    def preformatted(self, text: str) -> None:
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def table(self, header: list[str], rows: list[list], best: set[tuple[int, int]] = frozenset()) -> None:
        """``best`` holds (row, column) cells to highlight. Columns of numbers are right-aligned,
        text columns left-aligned."""
        num = [j > 0 and all(_numeric(row[j]) for row in rows if j < len(row)) for j in range(len(header))]
        out = ["<table><tr>" + "".join(f"<th{_cls(num[j])}>{html.escape(str(h))}</th>"
                                       for j, h in enumerate(header)) + "</tr>"]
        for i, row in enumerate(rows):
            cells = []
            for j, v in enumerate(row):
                cls = _cls(j < len(num) and num[j], (i, j) in best)
                cells.append(f"<td{cls}>{html.escape(str(v))}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append("".join(out) + "</table>")

    def chart(self, chart: alt.TopLevelMixin) -> None:
        cid = f"chart{len(self.specs)}"
        spec = chart.to_dict()
        # labels never overlap or touch: drop the ones that would (every axis, nominal ones too)
        axis = spec.setdefault("config", {}).setdefault("axis", {})
        axis.setdefault("labelOverlap", True)
        axis.setdefault("labelSeparation", 6)
        self.specs[cid] = spec
        self.parts.append(f'<div class="chart" id="{cid}"></div>')

    def render(self) -> str:
        body = "\n".join(self.parts)
        return shown(
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>\n"
            f"<h1>{html.escape(self.title)}</h1>\n{body}\n"
            f"<script type=\"module\">{vega_bundle_js()}</script>\n"
            "<script type=\"module\">\n"
            f"const specs = {script_json(self.specs)};\n"
            "for (const [id, spec] of Object.entries(specs)) {\n"
            "  window.vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false})"
            ".catch(e => console.error(id, e));\n}\n"
            "</script></body></html>\n"
        )

    def write(self, path) -> None:
        """The page, UTF-8: every text in it passed through ``shown`` (render), so a file or
        scenario name that holds an undecodable byte or a lone surrogate cannot stop the write."""
        from sim.files.atomic import write_text

        write_text(path, self.render())
