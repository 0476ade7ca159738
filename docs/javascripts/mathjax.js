// MathJax settings for the formulas that pymdownx.arithmatex (generic mode) leaves in the pages: inline math as
// \( ... \), display math as \[ ... \], each inside an element of class "arithmatex". Only those elements are
// typeset, so a dollar sign or a backslash in prose or code is never read as TeX.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*",
    processHtmlClass: "arithmatex",
  },
};

// Material for MkDocs announces every page it shows on document$ (also when it swaps pages without a reload):
// typeset that page's formulas once MathJax has loaded.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && window.MathJax.typesetPromise) {
      window.MathJax.typesetClear();
      window.MathJax.typesetPromise();
    }
  });
}
