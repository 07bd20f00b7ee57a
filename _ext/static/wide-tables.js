// Mark every table that is wider than its column, so the CSS can say that it scrolls (_ext/wide_tables.py).
(() => {
  const hint = document.documentElement.lang.toLowerCase().startsWith("zh")
    ? "表格较宽，可左右滚动 →"
    : "This table is wider than the page: scroll it sideways →";

  function mark() {
    for (const box of document.querySelectorAll(".pst-scrollable-table-container")) {
      const wide = box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("minikv-wide-table", wide);
      box.dataset.scrollHint = hint;
    }
  }

  document.addEventListener("DOMContentLoaded", mark);
  window.addEventListener("load", mark);
  window.addEventListener("resize", mark);
})();
