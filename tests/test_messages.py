"""The package's message catalog: every message the code writes has its Chinese form, and tr uses it."""

from __future__ import annotations

import string
import sys
from pathlib import Path

import pytest

import minikv
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.language import catalog, get_language, language, read_po, set_language, tr, translate_message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import messages


def test_every_message_has_its_chinese_form_with_the_same_fields() -> None:
    assert messages.problems() == []


def test_the_catalog_is_what_extract_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "zh_CN.po"
    copy.write_bytes(messages.CATALOG.read_bytes())
    monkeypatch.setattr(messages, "CATALOG", copy)
    messages.extract()
    assert copy.read_bytes() == (messages.PACKAGE / "locale" / "zh_CN.po").read_bytes()


def test_tr_fills_fields_in_the_language_asked_for() -> None:
    msgid = next(iter(catalog("zh")))
    fields = dict.fromkeys(messages.fields_of(msgid), 7)
    assert tr(msgid, lang="en", **fields) == msgid.format(**fields)
    assert tr(msgid, lang="zh", **fields) == catalog("zh")[msgid].format(**fields)
    with language("zh"):
        assert tr(msgid, **fields) == catalog("zh")[msgid].format(**fields)
    assert get_language() == "en"


def test_a_message_without_a_translation_falls_back_to_english() -> None:
    assert tr("no such message {n}", lang="zh", n=3) == "no such message 3"


def test_one_setting_drives_drawings_and_messages() -> None:
    try:
        minikv.set_language("zh")
        assert minikv.viz.get_language() == "zh" and get_language() == "zh"
    finally:
        set_language("en")


def test_a_bad_language_is_refused_by_name_and_changes_nothing() -> None:
    with pytest.raises(ArgumentError, match="lang must be one of"):
        set_language("fr")
    with pytest.raises(ArgumentTypeError, match="lang must be a str"):
        tr("x", lang=1)  # type: ignore[arg-type]
    assert get_language() == "en"


def test_read_po_reads_multiline_entries_and_skips_fuzzy_and_empty_ones() -> None:
    source = '\n'.join([
        'msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=utf-8\\n"', "",
        "#: somewhere.py", 'msgid "a {x}"', 'msgstr "甲 {x}"', "",
        'msgid ""', '"two "', '"lines\\n"', 'msgstr ""', '"两"', '"行\\n"', "",
        "#, fuzzy", 'msgid "old"', 'msgstr "旧"', "",
        'msgid "untranslated"', 'msgstr ""',
    ])  # fmt: skip
    assert read_po(source) == {"a {x}": "甲 {x}", "two lines\n": "两行\n"}


def test_a_message_that_is_not_a_literal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("from minikv.language import tr\nx = 1\ntr(f'n={x}')\n")
    with pytest.raises(messages.NotALiteral, match="plain string literal"):
        list(messages.uses(tmp_path))


def _adjacent_fields(msgid: str) -> bool:
    """Two fields with no text between them (``{slots}{evicted}``): no reader can tell where one ends."""
    parts = list(string.Formatter().parse(msgid))
    return any(
        name and fixed == "" and index > 0 and parts[index - 1][1] for index, (fixed, name, _, _) in enumerate(parts)
    )


def test_translate_message_reads_every_english_message_back_into_chinese() -> None:
    checked = 0
    for msgid, chinese in catalog("zh").items():
        names = messages.fields_of(msgid)
        if not names or _adjacent_fields(msgid):
            continue
        values = {name: 7 + index for index, name in enumerate(sorted(names))}
        english = tr(msgid, lang="en", **values)
        assert translate_message(english) == chinese.format(**values), msgid
        checked += 1
    assert checked > 300
    assert translate_message("no such message 3") is None
    assert translate_message("anything", lang="en") == "anything"
