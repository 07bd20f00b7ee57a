"""Chinese search for the zh edition when jieba is not installed.

Sphinx's Chinese search (``sphinx.search.zh``) cuts Chinese text into words with jieba; without it,
it indexes only the Latin words of a page (identifiers, English terms), so no Chinese query finds
anything. This fallback indexes every run of 2 to 4 consecutive Chinese characters, so a query of
a term such as 驱逐, 前缀匹配 or 基数树 finds its pages, and the browser side (``SPLIT_QUERY``)
cuts a longer query such as 完整性检查 into overlapping 4-character pieces, all of which a page
must contain: a phrase search without a dictionary. A page that uses one of the book's terms is
also indexed under the synonyms a reader may type instead (``SYNONYMS``: 淘汰 finds 驱逐).
With jieba installed, Sphinx's own word cutting is used unchanged.

Registered in ``_config.yml`` (``sphinx: local_extensions: {zh_search: _ext}``); it changes nothing
in the English edition.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.search import zh

CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # the ranges, written as both Python and JS read them
CHINESE_RUN = re.compile(f"[{CJK}]+")
CHINESE_OR_NOT = re.compile(f"[{CJK}]+|[^{CJK}]+")
SHORTEST, LONGEST = 2, 4

# The book's term -> words readers also use for it (the glossary's term stays the one the text uses).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "驱逐": ("淘汰", "逐出"),
    "锁定": ("加锁", "上锁"),
    "槽位": ("插槽",),
    "句柄": ("把手",),
    "预填充": ("预填",),
    "抢占": ("抢先",),
}

# splitQuery for searchtools.js: the default split on non-letters, then every Chinese run longer
# than LONGEST becomes its overlapping LONGEST-character pieces (the index holds nothing longer)
# and a lone Chinese character is dropped (the index holds nothing shorter).
SPLIT_QUERY = f"""
var splitQuery = (query) => {{
  const pieces = [];
  for (const term of query.split(/[^\\p{{Letter}}\\p{{Number}}_\\p{{Emoji_Presentation}}]+/gu)) {{
    if (!term) continue;
    for (const run of term.match(/[{CJK}]+|[^{CJK}]+/g)) {{
      if (!/^[{CJK}]+$/.test(run)) {{ pieces.push(run); continue; }}
      if (run.length < {SHORTEST}) continue;
      if (run.length <= {LONGEST}) {{ pieces.push(run); continue; }}
      for (let i = 0; i + {LONGEST} <= run.length; i++) pieces.push(run.slice(i, i + {LONGEST}));
    }}
  }}
  return pieces;
}};
"""


def chinese_ngrams(text: str) -> list[str]:
    """Every 2- to 4-character piece of each run of Chinese characters in ``text``."""
    grams = []
    for run in CHINESE_RUN.findall(text):
        for size in range(SHORTEST, min(LONGEST, len(run)) + 1):
            grams += [run[i : i + size] for i in range(len(run) - size + 1)]
    return grams


def query_pieces(query: str) -> list[str]:
    """What ``SPLIT_QUERY`` makes of a Chinese query (the same rule, for the tests)."""
    pieces = []
    for term in re.split(r"[^\w]+", query):
        for run in re.findall(
            r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+", term
        ):
            if not CHINESE_RUN.fullmatch(run):
                pieces.append(run)
            elif len(run) < SHORTEST:
                continue
            elif len(run) <= LONGEST:
                pieces.append(run)
            else:
                pieces += [run[i : i + LONGEST] for i in range(len(run) - LONGEST + 1)]
    return [p for p in pieces if p]


def synonyms_of(text: str) -> list[str]:
    """The synonyms of every book term that ``text`` uses."""
    return [alias for term, aliases in SYNONYMS.items() if term in text for alias in aliases]


class SearchChineseWithoutJieba(zh.SearchChinese):
    js_splitter_code = SPLIT_QUERY

    def split(self, input: str) -> list[str]:
        words = super().split(input)
        return words if zh.JIEBA else chinese_ngrams(input) + synonyms_of(input) + words


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_search_language(SearchChineseWithoutJieba)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
