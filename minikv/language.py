"""The language minikv speaks to a learner: English, or simplified Chinese.

One setting for the whole package. :func:`set_language` chooses the language of
the drawings (their words live in :mod:`minikv.viz.labels`) and of the messages
written for a reader: the exercise checker's reports and the errors a chapter
prints. A Chinese notebook calls ``minikv.set_language("zh")`` once.

Messages are written in English where they are used, gettext style::

    raise ArgumentError(tr("page_size must be at least 1, got {page_size}", page_size=page_size))

The English text, with its ``{named}`` fields, is the message id; :func:`tr`
looks it up in the catalog of the current language (``minikv/locale/zh_CN.po``,
shipped with the package) and fills the fields in. A message with no
translation falls back to English, and a test fails the build when any message
id in the package lacks its Chinese form (``scripts/messages.py check``).
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "CATALOG_FILES",
    "LANGUAGES",
    "catalog",
    "checked_language",
    "get_language",
    "language",
    "set_language",
    "tr",
    "translate_message",
]

LANGUAGES = ("en", "zh")
"""The languages minikv speaks: English (the source) and simplified Chinese."""

CATALOG_FILES = MappingProxyType({"zh": "zh_CN.po"})
"""Language -> the gettext catalog, in the package's ``locale/`` folder, that holds its form of every message.

English needs none. File names, not paths: the folder is wherever minikv is installed.
"""

_LOCALE_FOLDER = Path(__file__).with_name("locale")

_language = "en"


def set_language(lang: str) -> None:
    """Speak ``lang`` from now on: ``"en"`` (the default) or ``"zh"`` (simplified Chinese).

    Drawings, the exercise checker's reports and printed errors all follow it.
    """
    global _language
    _language = checked_language(lang)


def get_language() -> str:
    """The language minikv speaks now (see :func:`set_language`)."""
    return _language


@contextmanager
def language(lang: str) -> Iterator[None]:
    """Speak ``lang`` inside a ``with`` block, then go back to the language before it."""
    before = get_language()
    set_language(lang)
    try:
        yield
    finally:
        set_language(before)


def checked_language(lang: object, name: str = "lang") -> str:
    """``lang`` if it is one of :data:`LANGUAGES`; else an error that names the argument ``name``."""
    from .errors import ArgumentError, ArgumentTypeError  # errors' messages use tr: import late

    if not isinstance(lang, str):
        raise ArgumentTypeError(f"{name} must be a str, got {type(lang).__name__}")
    if lang not in LANGUAGES:
        raise ArgumentError(f"{name} must be one of {LANGUAGES}, got {lang!r}")
    return lang


def tr(msgid: str, /, *, lang: str | None = None, **fields: object) -> str:
    """The message ``msgid`` in ``lang`` (default: :func:`get_language`), its ``{fields}`` filled in.

    ``msgid`` is the English text. Fields are formatted with ``str.format``, so
    ``{ratio:.2f}`` works in both languages; with no fields the text is returned as is.
    """
    lang = _language if lang is None else checked_language(lang)
    template = msgid if lang == "en" else catalog(lang).get(msgid, msgid)
    return template.format(**fields) if fields else template


@cache
def catalog(lang: str) -> Mapping[str, str]:
    """English message id -> its form in ``lang``, read once from :data:`CATALOG_FILES` (empty for English)."""
    name = CATALOG_FILES.get(checked_language(lang))
    path = None if name is None else _LOCALE_FOLDER / name
    if path is None or not path.exists():
        return MappingProxyType({})
    return MappingProxyType(read_po(path.read_text(encoding="utf-8")))


def read_po(source: str) -> dict[str, str]:
    """The translated messages of a gettext ``.po`` file: msgid -> msgstr (fuzzy and empty ones left out).

    A reader of the few constructs our catalogs use (comments, flags, ``msgid`` and
    ``msgstr`` over one or more quoted lines), so that the package needs no
    gettext tooling at run time -- Colab has none.
    """
    messages: dict[str, str] = {}
    entry: dict[str, list[str]] = {}
    field = ""
    fuzzy = False

    def close() -> None:
        nonlocal entry, fuzzy
        msgid, msgstr = "".join(entry.get("msgid", [])), "".join(entry.get("msgstr", []))
        if msgid and msgstr and not fuzzy:
            messages[msgid] = msgstr
        entry, fuzzy = {}, False

    for line in source.splitlines():
        line = line.strip()
        if not line:
            close()
        elif line.startswith("#,"):
            fuzzy = fuzzy or "fuzzy" in line
        elif line.startswith("#"):
            continue
        elif line.startswith(("msgid ", "msgstr ")):
            if line.startswith("msgid ") and "msgstr" in entry:
                close()
            field, _, quoted = line.partition(" ")
            entry[field] = [ast.literal_eval(quoted)]
        elif line.startswith('"'):
            entry[field].append(ast.literal_eval(line))
    close()
    return messages


def translate_message(english: str, lang: str = "zh") -> str | None:
    """A message as :func:`tr` wrote it in English, in ``lang``: None if no message id reads so.

    For text that was stored in English and is shown later in another language (the
    Chinese edition translates the error a drawing's caption quotes, and the checker's
    stored reports). A field whose value is itself a message is translated too; numbers,
    lists and code keep their values. The longest fixed text wins where two message ids
    could match.
    """
    if checked_language(lang) == "en":
        return english
    for pattern, names, msgid in _message_patterns(lang):
        match = pattern.fullmatch(english)
        if match is not None:
            values = {name: _field_value(match.group(name), lang) for name in names}
            return _without_format_specs(catalog(lang)[msgid]).format(**values)
    return None


def _field_value(english: str, lang: str) -> str:
    """A field's value, itself a message where the catalog reads it so (``"{tree}, {count} walks"``)."""
    if not english or english[0].isdigit() or english[0] in "[(-`'\"":
        return english  # numbers, lists, tensors, code and reprs are data
    found = translate_message(english, lang)
    return english if found is None else found


@cache
def _message_patterns(lang: str) -> tuple[tuple[re.Pattern[str], tuple[str, ...], str], ...]:
    """Every message id of ``lang``'s catalog that has fields, as a full-match pattern, the most specific first."""
    found = []
    for msgid in catalog(lang):
        parts = list(string.Formatter().parse(msgid))
        names = tuple(dict.fromkeys(name for _, name, _, _ in parts if name))
        regex, seen = "", set()
        for fixed, name, _, _ in parts:
            regex += re.escape(fixed)
            if name:
                regex += f"(?P={name})" if name in seen else f"(?P<{name}>.+?)"
                seen.add(name)
        literal = sum(len(fixed) for fixed, _, _, _ in parts)
        found.append((literal, re.compile(regex, re.DOTALL), names, msgid))
    found.sort(key=lambda item: -item[0])
    return tuple((pattern, names, msgid) for _, pattern, names, msgid in found)


def _without_format_specs(template: str) -> str:
    """``template`` with ``{ratio:.2f}`` written ``{ratio}``: the values filled in are English text already."""
    return "".join(
        fixed.replace("{", "{{").replace("}", "}}") + ("{" + name + "}" if name is not None else "")
        for fixed, name, _, _ in string.Formatter().parse(template)
    )
