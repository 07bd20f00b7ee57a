"""Chinese search for the zh edition when jieba is not installed.

Sphinx's Chinese search (``sphinx.search.zh``) cuts Chinese text into words with jieba; without it,
it indexes only the Latin words of a page (identifiers, English terms), so no Chinese query finds
anything. This fallback also indexes every run of 2 to 4 consecutive Chinese characters, so a
query of a term such as 驱逐, 前缀匹配 or 基数树 (or several, separated by spaces) finds its pages.
With jieba installed, Sphinx's own word cutting is used unchanged.

Registered in ``_config.yml`` (``sphinx: local_extensions: {zh_search: _ext}``); it changes nothing
in the English edition.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.search import zh

CHINESE_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
SHORTEST, LONGEST = 2, 4


def chinese_ngrams(text: str) -> list[str]:
    """Every 2- to 4-character piece of each run of Chinese characters in ``text``."""
    grams = []
    for run in CHINESE_RUN.findall(text):
        for size in range(SHORTEST, min(LONGEST, len(run)) + 1):
            grams += [run[i : i + size] for i in range(len(run) - size + 1)]
    return grams


class SearchChineseWithoutJieba(zh.SearchChinese):
    def split(self, input: str) -> list[str]:
        words = super().split(input)
        return words if zh.JIEBA else chinese_ngrams(input) + words


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_search_language(SearchChineseWithoutJieba)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
