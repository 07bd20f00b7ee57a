"""Write the Colab copy of every notebook of the book: the same code, with markdown Colab can render.

    .venv/bin/python scripts/colab_copy.py           # (re)write colab/<path> for every notebook in _toc.yml
    .venv/bin/python scripts/colab_copy.py --check   # exit 1 if a copy is missing, stale or left over

Colab (and plain Jupyter) show MyST markup raw: a ``{admonition}`` dropdown shows its hint or answer in
full next to the question, and ``{term}``, ``{ref}``, ``{glue:}`` roles and ``(label)=`` targets show as
text. The book keeps MyST (the Chinese edition translates its markdown as it is); Colab opens these
copies, generated from it, as d2l and QuantEcon publish theirs. ``colab/book/05_radix.ipynb`` is the
copy of ``book/05_radix.ipynb``; every Colab badge and the book's launch buttons point at the copies.

What changes, in markdown cells only (code cells are the same, the copies carry no outputs):

* a dropdown (``:class: dropdown``) becomes ``<details><summary>title</summary> ... </details>``,
  which Colab, Jupyter and GitHub show collapsed; any other admonition (``{note}``, ``{tip}``,
  ``{warning}``, ...) becomes a block quote with its title in bold;
* ``{term}`text <entry>``` becomes a link to the entry on the published glossary page, and
  ``{ref}`text <label>``` a link to the label on its published page;
* ``{glue:}`name``` and ``{glue:text}`name:format``` become the value the source notebook's stored
  output holds for ``name`` (nbval checks those outputs, so the value is the one a run prints);
* ``(label)=`` target lines are dropped; relative links to a notebook lead to its Colab copy, to a
  markdown page (``glossary.md``) to the published page.

Markup it does not know stops the script with the file and cell, so nothing raw reaches a reader
(``tests/test_colab_copy.py`` also scans every copy for MyST). The notebook metadata ``accelerator``
and ``colab`` (a GPU runtime for chapter 3b and exercise 3) are carried over: Colab reads them.
"""

from __future__ import annotations

import argparse
import ast
import json
import posixpath
import re
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import set_repository  # noqa: E402

COLAB_DIR = set_repository.colab_copy("").rstrip("/")
"""The copies live in ``colab/``, in the same layout as the sources (``colab/exercises/solved/...``)."""

DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)$")
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
CODE_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")
LABEL = re.compile(r"^\((?P<label>[\w.-]+)\)=[ \t]*$")
ROLE = re.compile(r"\{(?P<role>[a-z][\w:-]*)\}`(?P<body>[^`]+)`")
TITLED = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
ADMONITIONS = {
    "note", "tip", "hint", "important", "warning", "caution", "attention", "danger", "error", "seealso",
}  # fmt: skip


class MarkupError(Exception):
    """Markup this script cannot convert (the message names the file and the cell)."""


def make_id(text: str) -> str:
    """Sphinx's anchor for a glossary term (``sphinx.util.nodes._make_id``): ``KV cache`` -> ``KV-cache``."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^a-zA-Z0-9._]+", "-", " ".join(text.split()))
    return re.sub(r"^[-0-9._]+|-+$", "", text)


def glossary_terms(root: Path = REPO) -> dict[str, str]:
    """``{lower-case term: term as written}`` for every entry of ``book/glossary.md``'s glossary."""
    text = (root / "book" / "glossary.md").read_text(encoding="utf-8")
    block = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    return {line.strip().lower(): line.strip() for line in block.splitlines() if line.strip() and line[0] != " "}


class Converter:
    """Turns the MyST of one book into markdown Colab renders; one instance serves every notebook."""

    def __init__(self, root: Path = REPO) -> None:
        self.root = root
        self.url = set_repository.read_repository(root)
        self.site = set_repository.pages_url(self.url)
        self.pages = [path for _title, path in set_repository.notebook_pages(root)]
        self.terms = glossary_terms(root)
        self.labels = self._labels()

    def _labels(self) -> dict[str, str]:
        """``{label: page path}`` for every ``(label)=`` target of the notebooks and of ``book/*.md``."""
        found: dict[str, str] = {}
        for path in self.pages:
            for cell in _read(self.root / path)["cells"]:
                if cell["cell_type"] == "markdown":
                    for line in _source(cell).splitlines():
                        if match := LABEL.match(line):
                            found[match["label"]] = path
        for page in sorted((self.root / "book").glob("*.md")):
            for line in page.read_text(encoding="utf-8").splitlines():
                if match := LABEL.match(line):
                    found[match["label"]] = page.relative_to(self.root).as_posix()
        return found

    def published(self, path: str, anchor: str = "") -> str:
        """The published page of a book file: ``book/glossary.md`` -> ``https://.../book/glossary.html``."""
        page = posixpath.splitext(path)[0] + ".html"
        return self.site + page + (f"#{anchor}" if anchor else "")

    # -- one notebook -----------------------------------------------------------------------

    def notebook(self, path: str) -> dict:
        """The Colab copy of the notebook at ``path`` (relative to the repository), as JSON data."""
        source = _read(self.root / path)
        glue = glue_values(source)
        cells = []
        first_markdown = True
        for number, cell in enumerate(source["cells"]):
            where = f"{path}, cell {number}"
            if cell["cell_type"] == "markdown":
                text = self.markdown(_source(cell), path, glue, where)
                if first_markdown:
                    text += (
                        f"\n\n*The Colab edition of [this page of the book]({self.published(path)}); "
                        "hints and answers stay folded until you click them.*"
                    )
                    first_markdown = False
                new = {"cell_type": "markdown", "metadata": _kept_metadata(cell), "source": _lines(text)}
            elif cell["cell_type"] == "code":
                new = {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": _kept_metadata(cell),
                    "outputs": [],
                    "source": _lines(_source(cell)),
                }
            else:
                new = {"cell_type": cell["cell_type"], "metadata": {}, "source": _lines(_source(cell))}
            if "id" in cell:
                new["id"] = cell["id"]
            cells.append(new)
        metadata: dict = {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "colab": {"provenance": [], **source["metadata"].get("colab", {})},
        }
        if "accelerator" in source["metadata"]:
            metadata["accelerator"] = source["metadata"]["accelerator"]
        return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": source.get("nbformat_minor", 5)}

    def markdown(self, text: str, path: str, glue: dict[str, str], where: str) -> str:
        return self.inline("\n".join(self.blocks(text.split("\n"), where)), path, glue, where)

    def blocks(self, lines: list[str], where: str) -> list[str]:
        """Directives to HTML and block quotes, label lines dropped; code blocks left alone."""
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            directive = DIRECTIVE.match(line)
            code = CODE_FENCE.match(line)
            if directive:
                fence, name, arg = directive["fence"], directive["name"], directive["arg"].strip()
                i += 1
                options = {}
                while i < len(lines) and (option := OPTION.match(lines[i])):
                    options[option["key"]] = option["value"].strip()
                    i += 1
                body: list[str] = []
                closing = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
                while i < len(lines) and not closing.match(lines[i]):
                    body.append(lines[i])
                    i += 1
                if i == len(lines):
                    raise MarkupError(f"{where}: the {{{name}}} directive is never closed")
                i += 1
                out.extend(self.directive(name, arg, options, self.blocks(body, where), where))
            elif code:
                closing = re.compile(rf"^{re.escape(code['fence'][0])}{{{len(code['fence'])},}}[ \t]*$")
                out.append(line)
                i += 1
                while i < len(lines):
                    out.append(lines[i])
                    i += 1
                    if closing.match(out[-1]):
                        break
            elif LABEL.match(line):
                i += 1
                if not out or not out[-1].strip():  # no double blank line where the label was
                    while i < len(lines) and not lines[i].strip():
                        i += 1
            else:
                out.append(line)
                i += 1
        return out

    def directive(self, name: str, arg: str, options: dict[str, str], body: list[str], where: str) -> list[str]:
        if name != "admonition" and name not in ADMONITIONS:
            raise MarkupError(f"{where}: no Colab form for the {{{name}}} directive")
        title = arg if name == "admonition" else (arg or name.capitalize())
        if name == "admonition" and not title:
            raise MarkupError(f"{where}: an {{admonition}} without a title")
        unknown = set(options) - {"class", "name"}
        if unknown:
            raise MarkupError(f"{where}: no Colab form for the options {sorted(unknown)} of {{{name}}}")
        while body and not body[0].strip():
            body = body[1:]
        while body and not body[-1].strip():
            body = body[:-1]
        if "dropdown" in options.get("class", "").split():
            return ["<details>", f"<summary>{inline_html(title)}</summary>", "", *body, "", "</details>"]
        return [f"> **{title}**", ">", *[f"> {line}" if line.strip() else ">" for line in body]]

    def inline(self, text: str, path: str, glue: dict[str, str], where: str) -> str:
        """Roles to links or values, relative links to the copies and the published pages."""
        parts = re.split(r"(^(?:`{3,}|~{3,})[^\n]*\n.*?^(?:`{3,}|~{3,})[ \t]*$)", text, flags=re.M | re.S)
        for k in range(0, len(parts), 2):  # the odd parts are code blocks
            parts[k] = ROLE.sub(lambda m: self.role(m["role"], m["body"], glue, where), parts[k])
            parts[k] = LINK.sub(lambda m: f"]({self.link(m['target'], path, where)})", parts[k])
        return "".join(parts)

    def role(self, role: str, body: str, glue: dict[str, str], where: str) -> str:
        titled = TITLED.match(body)
        text, target = (titled["text"], titled["target"]) if titled else (body, body)
        if role == "term":
            entry = self.terms.get(" ".join(target.split()).lower())
            if entry is None:
                raise MarkupError(f"{where}: {{term}}`{body}` names no entry of book/glossary.md")
            return f"[{text}]({self.published('book/glossary.md', 'term-' + make_id(entry))})"
        if role == "ref":
            if not titled:
                raise MarkupError(f"{where}: {{ref}}`{body}` needs its own text here (`text <label>`)")
            if target not in self.labels:
                raise MarkupError(f"{where}: {{ref}}`{body}` names no (label)= of the notebooks")
            return f"[{text}]({self.published(self.labels[target], target)})"
        if role in ("glue", "glue:", "glue:text", "glue:any"):
            name, _, spec = body.partition(":")
            if name not in glue:
                raise MarkupError(f"{where}: no stored output holds the glued value {name!r}")
            value = glue[name]
            if spec:
                value = format(ast.literal_eval(value), spec)
            return value
        raise MarkupError(f"{where}: no Colab form for the {{{role}}} role")

    def link(self, target: str, path: str, where: str) -> str:
        for page in self.pages:  # a badge that opens a source notebook on Colab opens its copy
            if target == set_repository.colab_url(self.url, page):
                return set_repository.colab_url(self.url, colab_path(page))
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return target
        file, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), file))
        if resolved.endswith(".ipynb"):
            if resolved not in self.pages:
                raise MarkupError(f"{where}: the link {target} leads to no notebook of the book")
            return set_repository.colab_url(self.url, colab_path(resolved)) + (f"#{anchor}" if anchor else "")
        if resolved.endswith(".md") and (self.root / resolved).is_file():
            return self.published(resolved, anchor)
        if (self.root / resolved).exists():
            return f"{self.url}/blob/{set_repository.BRANCH}/{resolved}" + (f"#{anchor}" if anchor else "")
        raise MarkupError(f"{where}: the link {target} leads nowhere")


def inline_html(text: str) -> str:
    """A title's markdown as HTML (a ``<summary>`` holds HTML): escapes, `code` and **bold**."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def glue_values(notebook: dict) -> dict[str, str]:
    """``{name: text/plain}`` of every value glued in the notebook's stored outputs."""
    found = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            scrap = output.get("metadata", {}).get("scrapbook")
            if scrap:
                data = output.get("data", {})
                found[scrap["name"]] = data.get(scrap.get("mime_prefix", "") + "text/plain", data.get("text/plain", ""))
    return found


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _kept_metadata(cell: dict) -> dict:
    tags = cell.get("metadata", {}).get("tags")
    return {"tags": list(tags)} if tags else {}


def colab_path(path: str) -> str:
    """``book/05_radix.ipynb`` -> ``colab/book/05_radix.ipynb`` (set_repository.py links there too)."""
    return set_repository.colab_copy(path)


def dumps(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def copies(root: Path = REPO) -> Iterator[tuple[str, str]]:
    """``(copy's path, its text)`` for every notebook of the book."""
    converter = Converter(root)
    for path in converter.pages:
        yield colab_path(path), dumps(converter.notebook(path))


def problems(root: Path = REPO) -> list[str]:
    """What ``--check`` reports: missing or stale copies, and copies of notebooks that left the book."""
    found = []
    made = dict(copies(root))
    for path, text in made.items():
        stored = root / path
        if not stored.is_file():
            found.append(f"{path} is missing")
        elif stored.read_text(encoding="utf-8") != text:
            found.append(f"{path} differs from what its source makes")
    for stored in sorted((root / COLAB_DIR).rglob("*.ipynb")):
        relative = stored.relative_to(root).as_posix()
        if relative not in made and ".ipynb_checkpoints" not in relative:
            found.append(f"{relative} is the copy of no notebook of the book")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report copies that are missing or stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            found = problems()
            for problem in found:
                print(problem)
            if found:
                print("regenerate with: .venv/bin/python scripts/colab_copy.py")
                return 1
            print(f"{len(dict(copies()))} Colab copies match their notebooks")
            return 0
        made = dict(copies())
    except MarkupError as error:
        print(f"colab_copy: {error}", file=sys.stderr)
        return 1
    for path, text in made.items():
        (REPO / path).parent.mkdir(parents=True, exist_ok=True)
        if not (REPO / path).is_file() or (REPO / path).read_text(encoding="utf-8") != text:
            (REPO / path).write_text(text, encoding="utf-8")
    for stored in sorted((REPO / COLAB_DIR).rglob("*.ipynb")):
        if stored.relative_to(REPO).as_posix() not in made:
            stored.unlink()
    print(f"wrote {len(made)} Colab copies under {COLAB_DIR}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
