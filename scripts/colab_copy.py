"""Write the Colab copy of every notebook of the book: the same code, with markdown Colab can render.

    .venv/bin/python scripts/colab_copy.py           # (re)write colab/<path> for every notebook in _toc.yml
    .venv/bin/python scripts/colab_copy.py --check   # exit 1 if a copy is missing, stale or left over
    .venv/bin/python scripts/colab_copy.py --extract-comments   # update locale/zh_CN/code_comments.po

Colab (and plain Jupyter) show MyST markup raw: a ``{admonition}`` dropdown shows its hint or answer in
full next to the question, and ``{term}``, ``{ref}``, ``{glue:}`` roles and ``(label)=`` targets show as
text. The book keeps MyST (the Chinese edition translates its markdown as it is); Colab opens these
copies, generated from it, as d2l and QuantEcon publish theirs. ``colab/book/05_radix.ipynb`` is the
copy of ``book/05_radix.ipynb``; every Colab badge and the book's launch buttons point at the copies.

The Chinese edition's badges and launch buttons open ``colab/zh/<page>.ipynb``: the same notebook with
its markdown translated from the book's catalogs (``locale/zh_CN/LC_MESSAGES/<page>.po``, the zh
edition's own translations) and its code comments from ``locale/zh_CN/code_comments.po``
(``scripts/colab_zh.py`` does both; ``--extract-comments`` updates the comment catalog after a code
change). A block or comment with no translation is named, makes the script exit 1 (the copy keeps
its English) and fails ``--check``: run ``scripts/i18n.py extract`` and translate, or
``--extract-comments`` and translate the comment, then regenerate. Where ``minikv`` offers
``set_language``, a zh copy's second cell turns its Chinese on: the one setting the drawings, the
exercise checker's reports and the errors a chapter prints all follow.

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

import colab_zh  # noqa: E402
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
# The titles Sphinx's zh_CN translation gives the admonitions that have none of their own.
ZH_ADMONITION_TITLES = {
    "note": "备注", "tip": "小技巧", "hint": "提示", "important": "重要", "warning": "警告", "caution": "小心",
    "attention": "注意", "danger": "危险", "error": "错误", "seealso": "参见",
}  # fmt: skip
LANGUAGES = ("en", colab_zh.LANGUAGE)
ZH_SETUP_ID = "zh-setup"
ZH_SETUP = 'import minikv\n\nminikv.set_language("zh")  # 图示、练习检查报告和错误信息都用中文'


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
    """Turns the MyST of one book into markdown Colab renders; one instance serves every notebook.

    With ``lang="zh"`` it writes the Chinese copies: markdown translated first (``colab_zh``), links
    to the zh edition's pages and to the zh copies; ``self.untranslated`` then lists, per notebook,
    the blocks and comments no catalog translates (the copy keeps their English).
    """

    def __init__(self, root: Path = REPO, lang: str = "en") -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"lang must be one of {LANGUAGES}, not {lang!r}")
        self.root = root
        self.lang = lang
        self.untranslated: dict[str, list[str]] = {}
        self.blocks_translated = 0
        self.comments: dict[str, str] = {}
        if lang == colab_zh.LANGUAGE:
            path = root / colab_zh.COMMENTS.relative_to(REPO)
            self.comments = colab_zh.load_catalog(path) if path.is_file() else {}
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
        edition = "zh/" if self.lang == colab_zh.LANGUAGE else ""  # scripts/i18n.py publishes it there
        return self.site + edition + page + (f"#{anchor}" if anchor else "")

    # -- one notebook -----------------------------------------------------------------------

    def notebook(self, path: str) -> dict:
        """The Colab copy of the notebook at ``path`` (relative to the repository), as JSON data."""
        source = _read(self.root / path)
        glue = glue_values(source)
        zh = self.lang == colab_zh.LANGUAGE
        catalog = colab_zh.page_catalog(path, self.root) if zh else {}
        tally = colab_zh.Tally()
        missing_comments: list[str] = []
        cells = []
        first_markdown, first_code = True, True
        for number, cell in enumerate(source["cells"]):
            where = f"{path}, cell {number}"
            if cell["cell_type"] == "markdown":
                text = _source(cell)
                if zh:
                    text = colab_zh.translate_markdown(text, catalog.get, tally)
                text = self.markdown(text, path, glue, where)
                if first_markdown:
                    text += "\n\n" + self.edition_note(path)
                    first_markdown = False
                new = {"cell_type": "markdown", "metadata": _kept_metadata(cell), "source": _lines(text)}
            elif cell["cell_type"] == "code":
                code = _source(cell)
                if zh:
                    code = colab_zh.translate_code(code, self.comments.get, missing_comments)
                new = {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": _kept_metadata(cell),
                    "outputs": [],
                    "source": _lines(code),
                }
            else:
                new = {"cell_type": cell["cell_type"], "metadata": {}, "source": _lines(_source(cell))}
            if "id" in cell:
                new["id"] = cell["id"]
            cells.append(new)
            if zh and cell["cell_type"] == "code" and first_code:
                first_code = False
                if minikv_speaks_chinese(self.root):  # after the install cell: minikv speaks Chinese
                    cells.append(
                        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                         "source": _lines(ZH_SETUP), "id": ZH_SETUP_ID}
                    )  # fmt: skip
        if zh:
            self.blocks_translated += tally.translated
            lost = [f"block: {m[:100]!r}" for m in tally.missing or []]
            lost += [f"comment: {m[:100]!r}" for m in missing_comments]
            if lost:
                self.untranslated[path] = lost
        metadata: dict = {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "colab": {"provenance": [], **source["metadata"].get("colab", {})},
        }
        if "accelerator" in source["metadata"]:
            metadata["accelerator"] = source["metadata"]["accelerator"]
        return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": source.get("nbformat_minor", 5)}

    def edition_note(self, path: str) -> str:
        """The line under the title: which page of the book this is the copy of."""
        if self.lang == colab_zh.LANGUAGE:
            return f"*本书[这一页]({self.published(path)})的 Colab 版本；提示和答案在你点开之前保持折叠。*"
        return (
            f"*The Colab edition of [this page of the book]({self.published(path)}); "
            "hints and answers stay folded until you click them.*"
        )

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
        default = ZH_ADMONITION_TITLES[name] if self.lang == colab_zh.LANGUAGE and name in ADMONITIONS else ""
        title = arg if name == "admonition" else (arg or default or name.capitalize())
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
            parts[k] = ROLE.sub(lambda m: self.role(m["role"], m["body"], glue, where, path), parts[k])
            parts[k] = LINK.sub(lambda m: f"]({self.link(m['target'], path, where)})", parts[k])
        return "".join(parts)

    def role(self, role: str, body: str, glue: dict[str, str], where: str, path: str = "") -> str:
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
            if "::" in body:  # a translation's form, {glue:}`05_radix.ipynb::key` (see scripts/i18n.py)
                notebook, _, body = body.partition("::")
                if notebook != posixpath.basename(path):
                    raise MarkupError(f"{where}: {{glue}}`{notebook}::...` names another notebook")
            name, _, spec = body.partition(":")
            if name not in glue:
                raise MarkupError(f"{where}: no stored output holds the glued value {name!r}")
            value = glue[name]
            if spec:
                value = format(ast.literal_eval(value), spec)
            return value
        raise MarkupError(f"{where}: no Colab form for the {{{role}}} role")

    def link(self, target: str, path: str, where: str) -> str:
        for page in self.pages:  # a badge that opens a source notebook or its copy opens this language's copy
            opens = (set_repository.colab_url(self.url, page), set_repository.colab_url(self.url, colab_path(page)))
            if target in opens:
                return set_repository.colab_url(self.url, colab_path(page, self.lang))
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return target
        file, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), file))
        if resolved.endswith(".ipynb"):
            if resolved not in self.pages:
                raise MarkupError(f"{where}: the link {target} leads to no notebook of the book")
            copy = set_repository.colab_url(self.url, colab_path(resolved, self.lang))
            return copy + (f"#{anchor}" if anchor else "")
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


def colab_path(path: str, lang: str = "en") -> str:
    """``book/05_radix.ipynb`` -> ``colab/book/05_radix.ipynb``, or ``colab/zh/book/05_radix.ipynb`` in Chinese."""
    return set_repository.colab_copy(path, lang)


def minikv_speaks_chinese(root: Path = REPO) -> bool:
    """Whether ``minikv`` offers ``set_language`` (read from its source: no torch import here)."""
    import ast

    init = root / "minikv" / "__init__.py"
    if not init.is_file():
        return False
    tree = ast.parse(init.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "set_language":
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "set_language" for a in node.names):
            return True
    return False


def dumps(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def copies(root: Path = REPO, untranslated: dict[str, list[str]] | None = None) -> Iterator[tuple[str, str]]:
    """``(copy's path, its text)`` for every notebook of the book, in English then in Chinese.

    ``untranslated`` (when given) receives, per Chinese copy, what no catalog translates.
    """
    for lang in LANGUAGES:
        converter = Converter(root, lang)
        for path in converter.pages:
            yield colab_path(path, lang), dumps(converter.notebook(path))
        if untranslated is not None:
            untranslated.update({colab_path(page, lang): lost for page, lost in converter.untranslated.items()})


def problems(root: Path = REPO) -> list[str]:
    """What ``--check`` reports: missing or stale copies, untranslated blocks, copies of no notebook."""
    found = []
    untranslated: dict[str, list[str]] = {}
    made = dict(copies(root, untranslated))
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
    found += untranslated_report(untranslated)
    pages = {path: _read(root / path) for _title, path in set_repository.notebook_pages(root)}
    found += colab_zh.comment_catalog_problems(pages, root / colab_zh.COMMENTS.relative_to(REPO))
    return found


def untranslated_report(untranslated: dict[str, list[str]]) -> list[str]:
    return [
        f"{path}: {len(lost)} untranslated (a catalog message missing or fuzzy):\n    " + "\n    ".join(lost)
        for path, lost in untranslated.items()
    ]


def extract_comments(root: Path = REPO) -> int:
    """Write ``locale/zh_CN/code_comments.po`` from every notebook's comments, keeping the translations."""
    pages = {path: _read(root / path) for _title, path in set_repository.notebook_pages(root)}
    messages, translated = colab_zh.write_comment_catalog(pages, root / colab_zh.COMMENTS.relative_to(REPO))
    print(f"{colab_zh.COMMENTS.relative_to(REPO)}: {messages} comments, {translated} translated")
    return 0 if messages == translated else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report copies that are missing or stale")
    parser.add_argument(
        "--extract-comments", action="store_true", help="update locale/zh_CN/code_comments.po from the notebooks"
    )
    args = parser.parse_args(argv)
    if args.extract_comments:
        return extract_comments()
    untranslated: dict[str, list[str]] = {}
    try:
        if args.check:
            found = problems()
            for problem in found:
                print(problem)
            if found:
                print("regenerate with: .venv/bin/python scripts/colab_copy.py (translate first what is untranslated)")
                return 1
            print(f"{len(dict(copies()))} Colab copies match their notebooks and translate every block")
            return 0
        made = dict(copies(REPO, untranslated))
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
    print(f"wrote {len(made)} Colab copies under {COLAB_DIR}/ ({COLAB_DIR}/zh/: the Chinese ones)")
    for line in untranslated_report(untranslated):
        print(line, file=sys.stderr)
    return 1 if untranslated else 0


if __name__ == "__main__":
    sys.exit(main())
