"""A small report document rendered both as Markdown and as HTML, images embedded (base64 PNG).

``trtspec bench`` and ``trtspec plan`` build one :class:`Doc` and write it
twice; each file is self-contained (no side files needed to view it).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

Cell = str | int | float | None


def fmt(v: Cell, digits: int = 1) -> str:
    """A table cell: None as an en dash, floats rounded."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


@dataclass
class _Block:
    kind: str  # h1 h2 p table image pre
    payload: tuple


@dataclass
class Doc:
    title: str
    blocks: list[_Block] = field(default_factory=list)

    def h2(self, text: str) -> Doc:
        self.blocks.append(_Block("h2", (text,)))
        return self

    def p(self, text: str) -> Doc:
        self.blocks.append(_Block("p", (text,)))
        return self

    def pre(self, text: str) -> Doc:
        self.blocks.append(_Block("pre", (text,)))
        return self

    def table(self, headers: list[str], rows: list[list[Cell]], digits: int = 1) -> Doc:
        self.blocks.append(_Block("table", (headers, [[fmt(c, digits) for c in row] for row in rows])))
        return self

    def image(self, alt: str, png: bytes) -> Doc:
        self.blocks.append(_Block("image", (alt, base64.b64encode(png).decode("ascii"))))
        return self

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b.kind == "h2":
                out += [f"## {b.payload[0]}", ""]
            elif b.kind == "p":
                out += [b.payload[0], ""]
            elif b.kind == "pre":
                out += ["```", b.payload[0].rstrip("\n"), "```", ""]
            elif b.kind == "table":
                headers, rows = b.payload
                out.append("| " + " | ".join(_md_cell(h) for h in headers) + " |")
                out.append("|" + "|".join("---" for _ in headers) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
                out.append("")
            elif b.kind == "image":
                alt, data = b.payload
                out += [f"![{alt}](data:image/png;base64,{data})", ""]
        return "\n".join(out)

    def to_html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        for b in self.blocks:
            if b.kind == "h2":
                body.append(f"<h2>{e(b.payload[0])}</h2>")
            elif b.kind == "p":
                body.append(f"<p>{e(b.payload[0])}</p>")
            elif b.kind == "pre":
                body.append(f"<pre>{e(b.payload[0])}</pre>")
            elif b.kind == "table":
                headers, rows = b.payload
                head = "".join(f"<th>{e(h)}</th>" for h in headers)
                trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            elif b.kind == "image":
                alt, data = b.payload
                body.append(f'<figure><img alt="{e(alt)}" src="data:image/png;base64,{data}"><figcaption>{e(alt)}</figcaption></figure>')
        style = (
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
            "pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
        )
        return (
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{e(self.title)}</title><style>{style}</style></head>\n<body>\n"
            + "\n".join(body)
            + "\n</body></html>\n"
        )


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
