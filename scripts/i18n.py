"""The Chinese edition of the book (中文版): one source, translation catalogs, one build.

The English sources (book/*.ipynb, book/*.md, exercises/**.ipynb) are the only source. Sphinx's
gettext builder extracts every message of them (notebook markdown cells included), sphinx-intl keeps
one catalog per page in ``locale/zh_CN/LC_MESSAGES/<page>.po``, and a build with
``language = "zh_CN"`` puts the translations in place of the English. Code, identifiers and program
output are not messages: they stay as the notebooks store them (the zh edition shows the same
executed outputs).

Commands (run from the repository root with the venv's Python):

    .venv/bin/python scripts/i18n.py extract   after an English change: regenerate the messages
                                               and update the catalogs (translations are kept; a
                                               changed message becomes "fuzzy", a new one empty)
    .venv/bin/python scripts/i18n.py check     the catalogs are complete, follow the markup rules
                                               and use the glossary's terms (what the tests check);
                                               --fresh also checks that they match the sources
    .venv/bin/python scripts/i18n.py build     the Chinese edition into _build/html/zh/, warnings
                                               as errors (-W -n), after `jupyter-book build .`

How an English change is carried into Chinese: edit the English, run ``extract``, translate the
new or fuzzy entries (remove the ``#, fuzzy`` flag once an entry is right), run ``check``, then
``make book`` (both editions). ``make test`` fails while a message is missing or out of date.

Both builds use jupyter-book's own configuration of Sphinx (``_config.yml``, ``_toc.yml``, the same
theme and options as ``jupyter-book build``), through ``jupyter_book.sphinx.build_sphinx``; the zh
build only adds the settings in ``ZH_OVERRIDES``. No conf.py is written into the repository.

Rules the check enforces (each explained where it is defined below):
* completeness: no entry untranslated or fuzzy, except the docstring messages of book/api.po;
* block markers: a translation must not start a line with what Markdown reads as a list item,
  heading or quote ("1. ", "- ", "# ", "> "). A heading "1. Why ..." translated as "1. 为什么 ..."
  is parsed as a list and silently dropped even under -W; write "1\\. 为什么 ..." (in the .po file,
  ``1\\\\. ``);
* glue roles: a translation writes {glue:}`page.ipynb::key`, not {glue:}`key` (which finds no data);
* glossary: each glossary entry's heading uses the Chinese term of its "**Notes:**" line, and no
  catalog uses a known wrong rendering of a key term (``KEY_TERMS``) or leaves one of a few
  English words in its prose (``ENGLISH_LEFTOVERS``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_CN"
LOCALE = REPO / "locale"
CATALOGS = LOCALE / LANGUAGE / "LC_MESSAGES"
BUILD = REPO / "_build"
EN_HTML = BUILD / "html"
ZH_HTML = EN_HTML / "zh"  # published beside the English edition, at <site>/zh/
ZH_DOCTREES = BUILD / ".doctrees-zh"
PAGES_URL_KEY = "html_baseurl"

# What the zh build changes: the language, where the catalogs are, one catalog per page, and the
# texts jupyter-book's configuration gives in English (site title, search box, canonical address).
ZH_TITLE = "minikv：KV 缓存，跑起来"
ZH_SEARCH_TEXT = "搜索本书……"
# myst-nb's buttons on a collapsed cell ("Show code cell output"); {type} would be the English
# "source" or "outputs", so the Chinese names what is hidden without it.
ZH_CODE_PROMPT_SHOW = "显示单元格内容"
ZH_CODE_PROMPT_HIDE = "隐藏单元格内容"
# Where the zh edition's launch buttons point: the Chinese Colab copies (the English: colab/).
ZH_COLAB_FOLDER = "colab/zh"
# sphinx-togglebutton's hint on a hidden answer ("Click to show"): it picks its words when it is
# loaded, before Sphinx knows the language, so the zh build names them (its own zh-cn catalog's).
ZH_TOGGLE_HINT_SHOW = "点击显示"
ZH_TOGGLE_HINT_HIDE = "点击隐藏"

# -- building with jupyter-book's configuration ------------------------------------------------


def sphinx_run(builder: str, outdir: Path, overrides: dict[str, object], doctrees: Path, strict: bool) -> int:
    """Run Sphinx as `jupyter-book build . [-W -n --keep-going]` does, plus ``overrides``."""
    from jupyter_book.sphinx import build_sphinx

    confoverrides: dict[str, object] = {
        "external_toc_path": (REPO / "_toc.yml").as_posix(),
        "latex_individualpages": False,
        **overrides,
    }
    if strict:
        confoverrides["nitpicky"] = True
    result = build_sphinx(
        REPO,
        outdir,
        noconfig=True,
        path_config=str(REPO / "_config.yml"),
        confoverrides=confoverrides,
        doctreedir=doctrees,
        builder=builder,
        warningiserror=strict,
        keep_going=strict,
        quiet=True,
    )
    if isinstance(result, Exception):
        raise result
    return int(result or 0)


def english_baseurl() -> str:
    import yaml

    config = yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))
    return str(config.get("html", {}).get("baseurl", ""))


def zh_overrides() -> dict[str, object]:
    overrides: dict[str, object] = {
        "language": LANGUAGE,
        "locale_dirs": [str(LOCALE)],
        "gettext_compact": False,
        "html_title": ZH_TITLE,
        # The launch buttons open the Chinese Colab copies (scripts/colab_copy.py writes colab/zh/).
        "html_theme_options": {"search_bar_text": ZH_SEARCH_TEXT, "path_to_docs": ZH_COLAB_FOLDER},
        "nb_code_prompt_show": ZH_CODE_PROMPT_SHOW,
        "nb_code_prompt_hide": ZH_CODE_PROMPT_HIDE,
        "togglebutton_hint": ZH_TOGGLE_HINT_SHOW,
        "togglebutton_hint_hide": ZH_TOGGLE_HINT_HIDE,
    }
    base = english_baseurl()
    if base:
        overrides[PAGES_URL_KEY] = base.rstrip("/") + "/zh/"
    return overrides


def translated_toc(target: Path) -> Path:
    """``_toc.yml`` with its part captions in Chinese, written to ``target``.

    Sphinx translates a toctree's caption only in the page that holds the toctree; the sidebar
    of every page is drawn from sphinx-external-toc's captions, which no catalog reaches. So
    the zh build reads another toc, whose captions come from the root page's catalog.
    """
    import yaml
    from babel.messages.pofile import read_po

    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    with (CATALOGS / f"{toc['root']}.po").open("rb") as handle:
        catalog = read_po(handle)
    for part in toc.get("parts", []):
        message = catalog.get(part["caption"])
        if message is not None and message.string and not message.fuzzy:
            part["caption"] = message.string
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(toc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return target


def build(out: Path = ZH_HTML) -> int:
    """The Chinese edition, warnings as errors (-W -n --keep-going), from the stored notebook outputs."""
    toc = translated_toc(ZH_DOCTREES.parent / ".toc-zh.yml")
    overrides = {**zh_overrides(), "external_toc_path": toc.as_posix()}
    code = sphinx_run("html", out, overrides, ZH_DOCTREES, strict=True)
    if code == 0:
        print(f"i18n: the Chinese edition is in {out.relative_to(REPO) if out.is_relative_to(REPO) else out}/")
    return code


def extract_pot(pot_dir: Path) -> None:
    """The English messages, one .pot per page (gettext_compact off, no source locations)."""
    with tempfile.TemporaryDirectory() as doctrees:
        overrides = {"gettext_compact": False, "gettext_location": False, "gettext_uuid": False}
        code = sphinx_run("gettext", pot_dir, overrides, Path(doctrees), strict=False)
    if code:
        raise SystemExit(f"i18n: the gettext build failed ({code})")


def extract() -> int:
    """Regenerate the messages and update the catalogs, keeping every translation (sphinx-intl)."""
    with tempfile.TemporaryDirectory() as pot_dir:
        extract_pot(Path(pot_dir))
        command = [sys.executable, "-m", "sphinx_intl", "update", "-p", pot_dir, "-l", LANGUAGE,
                   "-d", str(LOCALE), "-w", "0"]  # fmt: skip
        done = subprocess.run(command, cwd=REPO)
    if done.returncode == 0:
        print("i18n: catalogs updated; translate the empty and the fuzzy entries, then run `scripts/i18n.py check`")
    return done.returncode


# -- reading the catalogs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    page: str  # e.g. "book/01_why_manage"
    msgid: str
    msgstr: str
    fuzzy: bool


def catalog_pages(root: Path = CATALOGS) -> list[str]:
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.po"))


def read_catalog(path: Path, page: str) -> list[Entry]:
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        catalog = read_po(f, locale=None)
    entries = []
    for message in catalog:
        if not message.id:  # the header
            continue
        msgid = message.id if isinstance(message.id, str) else message.id[0]
        msgstr = message.string if isinstance(message.string, str) else (message.string or [""])[0]
        entries.append(Entry(page, msgid, msgstr or "", message.fuzzy))
    return entries


def read_catalogs(root: Path = CATALOGS) -> dict[str, list[Entry]]:
    return {page: read_catalog(root / f"{page}.po", page) for page in catalog_pages(root)}


def read_msgids(pot_dir: Path) -> dict[str, set[str]]:
    """The msgids of each page's .pot (or .po) file under ``pot_dir``."""
    found = {}
    for path in sorted([*pot_dir.rglob("*.pot"), *pot_dir.rglob("*.po")]):
        page = path.relative_to(pot_dir).with_suffix("").as_posix()
        found[page] = {entry.msgid for entry in read_catalog(path, page)}
    return found


# -- rule 1: complete (api.po: only api.md's own prose) ----------------------------------------

# book/api.md is a page of autodoc directives: most of api.po's messages are the package's
# docstrings, which stay English (the package's code and docstrings are the package's). Required
# there are only the messages that are a whole heading or paragraph of book/api.md itself (its
# title, headings and intro).
DOCSTRING_PAGE = "book/api"


def squash(text: str) -> str:
    return " ".join(text.split())


def own_prose(source: str) -> set[str]:
    """The headings and paragraphs of a Markdown page, whitespace squashed (directive bodies included)."""
    blocks = set()
    for block in re.split(r"\n\s*\n", source):
        text = squash(block)
        blocks.add(re.sub(r"^#{1,6}\s+", "", text))
    return blocks


def required(entry: Entry, api_source: str | None = None) -> bool:
    if entry.page != DOCSTRING_PAGE:
        return True
    if api_source is None:
        api_source = (REPO / "book" / "api.md").read_text(encoding="utf-8")
    return squash(entry.msgid) in own_prose(api_source)


def missing(catalogs: dict[str, list[Entry]]) -> dict[str, list[str]]:
    """Per page, the required messages that are untranslated or fuzzy."""
    api_source = (REPO / "book" / "api.md").read_text(encoding="utf-8")
    report: dict[str, list[str]] = {}
    for page, entries in catalogs.items():
        for entry in entries:
            if required(entry, api_source) and (entry.fuzzy or not entry.msgstr.strip()):
                kind = "fuzzy" if entry.fuzzy else "untranslated"
                report.setdefault(page, []).append(f"{kind}: {entry.msgid[:100]!r}")
    return report


# -- rule 2: no line of a translation starts a Markdown block ----------------------------------

# Sphinx parses each translation on its own. A translation of a heading or a paragraph that starts
# with "1. " (or "1) ") becomes an ordered list, "- " / "* " / "+ " a bullet list, "# " a heading
# and "> " a quote; Sphinx then throws the translated node away without a warning (a heading
# disappears from the page). In the middle of a message, a bullet, a heading, a quote or "1. "
# interrupts the paragraph the same way. Escape the character: "1\. ", "\- ", "\# ". (The headings
# "1. Why manage the KV cache?" ... are such messages: their English is a heading's inline text.)
FIRST_LINE = re.compile(r"^ {0,3}(\d{1,9}[.)]|[-+*]|#{1,6}|>)(\s|$)")
LATER_LINE = re.compile(r"^ {0,3}(1[.)]|[-+*]|#{1,6}|>)(\s|$)")


def block_marker(text: str) -> str | None:
    """The first line of ``text`` that Markdown would read as a block marker, or None."""
    for i, line in enumerate(text.split("\n")):
        if (FIRST_LINE if i == 0 else LATER_LINE).match(line):
            return line
    return None


def marker_problems(catalogs: dict[str, list[Entry]]) -> list[str]:
    found = []
    for page, entries in catalogs.items():
        for entry in entries:
            # Sphinx keeps the English node when the translation equals the msgid (no re-parse).
            line = block_marker(entry.msgstr) if entry.msgstr and entry.msgstr != entry.msgid else None
            if line is not None:
                found.append(f"{page}: {line[:60]!r} (translation of {entry.msgid[:60]!r}): escape it, e.g. '1\\. '")
    return found


# -- rule 2b: glue roles name their notebook ----------------------------------------------------

# Sphinx parses a translation as a document of its own, where myst-nb's {glue:} roles find no glue
# data ("No key 'x' found in glue data for this document", a warning that fails the -W build). The
# form with the notebook's path, {glue:}`05_radix.ipynb::x`, resolves after parsing and works: a
# translation writes every glue role that way (the English keeps the short form).
GLUE_ROLE = re.compile(r"\{glue(?::\w*)?\}`([^`]*)`")


def glue_problems(catalogs: dict[str, list[Entry]]) -> list[str]:
    found = []
    for page, entries in catalogs.items():
        notebook = page.rsplit("/", 1)[-1] + ".ipynb"
        for entry in entries:
            if not entry.msgstr or entry.msgstr == entry.msgid:
                continue
            for key in GLUE_ROLE.findall(entry.msgstr):
                if "::" not in key:
                    found.append(
                        f"{page}: write {{glue}}`{notebook}::{key}` for {{glue}}`{key}` (in {entry.msgid[:50]!r})"
                    )
    return found


# -- rule 3: the glossary fixes the terms -------------------------------------------------------

GLOSSARY = REPO / "book" / "glossary.md"
CJK = re.compile(r"[\u3400-\u9fff][\u3400-\u9fff·]*")


@dataclass(frozen=True)
class GlossaryEntry:
    terms: tuple[str, ...]  # the English heading lines (the msgids of the entry's headings)
    chinese: tuple[str, ...]  # the Chinese terms of its "**Notes:**" line; the first is the main one
    definition: str


def outside_parentheses(text: str) -> str:
    depth, kept = 0, []
    for ch in text:
        if ch in "(（":
            depth += 1
        elif ch in ")）":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(ch)
    return "".join(kept)


def notes_terms(definition: str) -> tuple[str, ...]:
    """The Chinese terms an entry's "**Notes:** ..." gives (its first sentence).

    The terms written outside parentheses ("**Notes:** 可驱逐 / 受保护." gives both); where there is
    none, the term after "usually" or "the usual Chinese is" ("no term (usually 抢占)"); else none
    (an entry the notes keep in English, such as "KV Cache (kept in English)").
    """
    notes = definition.split("**Notes:**", 1)[1].strip()
    depth, end = 0, len(notes)
    for i, ch in enumerate(notes):
        depth += ch in "(（"
        depth -= ch in ")）"
        if ch == "." and depth <= 0 and (i + 1 == len(notes) or notes[i + 1].isspace()):
            end = i
            break
    first = notes[:end]
    terms = CJK.findall(outside_parentheses(first))
    if not terms:
        usual = re.search(r"(?:usually|the usual Chinese is)\s+([\u3400-\u9fff]+)", first)
        terms = [usual[1]] if usual else []
    return tuple(dict.fromkeys(terms))


def glossary_entries(source: Path = GLOSSARY) -> list[GlossaryEntry]:
    text = source.read_text(encoding="utf-8")
    body = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    entries, terms, lines = [], [], []
    for line in [*body.strip("\n").split("\n"), ""]:
        if line.startswith((" ", "\t")):
            lines.append(line.strip())
        elif terms and lines:
            definition = " ".join(lines)
            entries.append(GlossaryEntry(tuple(terms), notes_terms(definition), definition))
            terms, lines = [], []
        if line.strip() and not line.startswith((" ", "\t")):
            terms.append(line.strip())
    return entries


def glossary_problems(catalogs: dict[str, list[Entry]], source: Path = GLOSSARY) -> list[str]:
    """Each entry's headings carry its main Chinese term; its other terms are in the entry too."""
    page = source.relative_to(REPO).with_suffix("").as_posix() if source.is_relative_to(REPO) else "book/glossary"
    by_id = {entry.msgid: entry.msgstr for entry in catalogs.get(page, [])}
    found = []
    for item in glossary_entries(source):
        if not item.chinese:
            continue
        headings = " ".join(by_id.get(term, "") for term in item.terms)
        if not headings.strip():
            continue  # untranslated: rule 1 reports it
        whole = headings + " " + by_id.get(squash(item.definition), "")
        if item.chinese[0] not in headings:
            name = " / ".join(item.terms)
            found.append(f"{page}: the heading of {name!r} must use {item.chinese[0]!r}: {headings!r}")
        found += [
            f"{page}: the entry {' / '.join(item.terms)!r} must name {term!r}"
            for term in item.chinese[1:]
            if term not in whole
        ]  # fmt: skip
    return found


# Key terms (the glossary's and translators' rules) and renderings that differ from them. A
# catalog that writes one of these variants (more often than its English does) fails: precise
# where a check that the right term appears would fail on a good paraphrase.
KEY_TERMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "evict": ("驱逐", ("逐出", "淘汰", "驱除", "剔除")),
    "lock": ("锁定", ("加锁", "上锁", "锁住")),
    "handle": ("句柄", ("把手", "处理器对象")),
    "slot": ("槽位", ("插槽", "槽口")),
    # (字典树 is not among them: it is the trie, which chapter 5 sets beside the radix tree)
    "radix tree": ("基数树", ("基树", "radix 树", "Radix 树", "基数字典树")),
    "prefix matching": ("前缀匹配", ("前缀命中匹配", "前缀比对")),
    "reference count": ("引用计数", ("引用次数", "参考计数")),
    "page pool": ("页池", ("页面池", "分页池")),
    "logical clock": ("逻辑时钟", ("逻辑时间戳时钟", "逻辑计时器")),
    "preemption": ("抢占", ("抢先", "优先占用")),
    "scheduler": ("调度器", ("调度程序", "排程器")),
    "Feynman challenge": ("费曼挑战", ("费曼问题", "费曼测试", "费恩曼")),
    "leaf": ("叶子节点", ("叶结点", "树叶")),
    "node": ("节点", ("结点",)),
    "split": ("分裂", ("拆分节点", "切分节点")),
    "tensor parallelism": ("张量并行", ("张量平行", "张量并联")),
    # One word per idea across pages (a reader who meets two words looks for two ideas).
    "caller": ("调用者", ("调用方",)),
    "owner (of a slot)": ("所有者", ("主人",)),
    "admit (a request)": ("接纳", ("准入",)),
    "file (a child under its first token)": ("登记", ("归档",)),
    "store kernel": ("写入内核", ("存储内核",)),
}

# English words a translation must not leave in its prose (code spans, links, glosses in
# parentheses and quotations of the notes excepted): each has a Chinese term.
ENGLISH_LEFTOVERS: dict[str, str] = {"key": "键", "value": "值", "block": "块"}


def key_term_problems(catalogs: dict[str, list[Entry]]) -> list[str]:
    found = []
    for page, entries in catalogs.items():
        for entry in entries:
            if not entry.msgstr:
                continue
            for english, (chinese, variants) in KEY_TERMS.items():
                for variant in variants:
                    if entry.msgstr.count(variant) > entry.msgid.count(variant):
                        found.append(f"{page}: {variant!r} for {english!r}: the glossary's term is {chinese!r}")
    return found


def english_leftover_problems(catalogs: dict[str, list[Entry]]) -> list[str]:
    found = []
    for page, entries in catalogs.items():
        if page == "book/api":  # the package's docstrings stay English
            continue
        for entry in entries:
            prose = re.sub(r"`[^`]*`|\]\([^)]*\)|<[^>]*>|（[^）]*）|\([^)]*\)|“[^”]*”", "", entry.msgstr)
            for word, chinese in ENGLISH_LEFTOVERS.items():
                if re.search(rf"(?<![A-Za-z_]){word}s?(?![A-Za-z_])", prose):
                    found.append(f"{page}: English {word!r} left in {entry.msgstr[:60]!r}: write {chinese!r}")
    return found


# -- rule 4: the catalogs match the English sources ---------------------------------------------


def stale(catalog_root: Path, pot_dir: Path) -> dict[str, list[str]]:
    """Per page, what differs between the fresh messages and the catalogs ("+" new, "-" gone)."""
    fresh, kept = read_msgids(pot_dir), read_msgids(catalog_root)
    report: dict[str, list[str]] = {}
    for page in sorted(set(fresh) | set(kept)):
        new, gone = fresh.get(page, set()) - kept.get(page, set()), kept.get(page, set()) - fresh.get(page, set())
        lines = [f"+ {m[:100]!r}" for m in sorted(new)] + [f"- {m[:100]!r}" for m in sorted(gone)]
        if lines:
            report[page] = lines
    return report


def problems(catalogs: dict[str, list[Entry]] | None = None) -> Iterator[tuple[str, list[str]]]:
    """Every rule's findings: (rule, lines)."""
    catalogs = read_catalogs() if catalogs is None else catalogs
    incomplete = missing(catalogs)
    yield (
        "incomplete",
        [f"{page}: {len(lines)} missing\n    " + "\n    ".join(lines) for page, lines in incomplete.items()],
    )
    yield "block markers", marker_problems(catalogs)
    yield "glue roles", glue_problems(catalogs)
    yield "glossary", glossary_problems(catalogs)
    yield "key terms", key_term_problems(catalogs)
    yield "english leftovers", english_leftover_problems(catalogs)


def check(fresh: bool) -> int:
    catalogs = read_catalogs()
    total = sum(len(entries) for entries in catalogs.values())
    needed = sum(required(e) for entries in catalogs.values() for e in entries)
    print(f"i18n: {len(catalogs)} catalogs, {total} messages ({needed} to translate; the rest are api.po docstrings)")
    failed = 0
    for rule, lines in problems(catalogs):
        if lines:
            failed += 1
            print(f"\n== {rule}: {len(lines)}\n" + "\n".join(lines))
    if fresh:
        with tempfile.TemporaryDirectory() as pot_dir:
            extract_pot(Path(pot_dir))
            changes = stale(CATALOGS, Path(pot_dir))
        if changes:
            failed += 1
            print("\n== out of date (run `.venv/bin/python scripts/i18n.py extract`):")
            for page, lines in changes.items():
                print(f"{page}:\n    " + "\n    ".join(lines))
    print("\ni18n: check " + ("failed" if failed else "passed"))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("extract", help="regenerate the messages and update locale/zh_CN (keeps translations)")
    checking = sub.add_parser("check", help="catalogs complete, markup rules, glossary terms")
    checking.add_argument("--fresh", action="store_true", help="also compare with freshly extracted messages")
    building = sub.add_parser("build", help="the Chinese edition into _build/html/zh (warnings are errors)")
    building.add_argument("--out", type=Path, default=ZH_HTML, help="output folder (default: _build/html/zh)")
    building.add_argument("--clean", action="store_true", help="remove the output and its doctrees first")
    args = parser.parse_args(argv)
    if args.command == "extract":
        return extract()
    if args.command == "check":
        return check(args.fresh)
    if args.clean:
        shutil.rmtree(args.out, ignore_errors=True)
        shutil.rmtree(ZH_DOCTREES, ignore_errors=True)
    return build(args.out.resolve())


if __name__ == "__main__":
    sys.exit(main())
