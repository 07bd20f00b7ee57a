// Switching editions keeps the reader's place (_ext/language_switch.py). Both editions are built from
// the same sources and Sphinx names a section after its English title in both, so the link carries
// the id of the section the reader is in and the browser opens the other edition there.
(() => {
  // The reader is "in" the last section that starts above the top fifth of the window.
  function sectionBeingRead() {
    const header = document.querySelector(".bd-header-article");
    const line = (header ? header.getBoundingClientRect().bottom : 0) + window.innerHeight / 5;
    let current = null;
    for (const section of document.querySelectorAll("article.bd-article section[id]")) {
      if (section.getBoundingClientRect().top <= line) current = section;
    }
    return current;
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const link of document.querySelectorAll("a[data-minikv-language-switch]")) {
      link.addEventListener("click", () => {
        const section = window.scrollY > 0 ? sectionBeingRead() : null;
        link.href = link.href.split("#")[0] + (section ? `#${section.id}` : "");
      });
    }
  });
})();
