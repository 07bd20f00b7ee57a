"""The Chinese edition's "Open in Colab" badges open the Chinese Colab copies.

``scripts/colab_copy.py`` writes two copies of every notebook for Colab: ``colab/<page>.ipynb``
(English) and ``colab/zh/<page>.ipynb`` (markdown and code comments in Chinese). The catalogs
translate a badge's text but keep its address, which names the English copy; in the zh build
(``language = "zh_CN"``) this extension points every such link at the Chinese copy instead. The
launch buttons get the same folder from ``scripts/i18n.py`` (``path_to_docs``). The English edition
is left as it is.

Registered in ``_config.yml`` (``sphinx: local_extensions: {zh_colab: _ext}``).
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

ZH_FOLDER = "colab/zh/"
# A Colab link to an English copy: .../github/OWNER/NAME/blob/BRANCH/colab/<page>.ipynb
ENGLISH_COPY = re.compile(
    r"^(?P<start>https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/)colab/(?!zh/)(?P<page>\S+\.ipynb)$"
)


def chinese_copy(url: str) -> str:
    """The Chinese copy's Colab address for a link to an English copy; any other address unchanged."""
    match = ENGLISH_COPY.match(url)
    return f"{match['start']}{ZH_FOLDER}{match['page']}" if match else url


def is_chinese(app: Sphinx) -> bool:
    return str(app.config.language or "en").lower().startswith("zh")


def point_badges_at_chinese_copies(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if not is_chinese(app):
        return
    for reference in doctree.findall(nodes.reference):
        if "refuri" in reference:
            reference["refuri"] = chinese_copy(reference["refuri"])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-resolved", point_badges_at_chinese_copies)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
