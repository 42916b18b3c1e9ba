/* ncclforensics report: copy and save buttons, print expands details. No network, no libraries. */
(function () {
  "use strict";

  function textOf(id) {
    var el = document.getElementById(id);
    return el ? el.textContent : "";
  }

  function flash(btn, label) {
    var old = btn.textContent;
    btn.textContent = label;
    btn.classList.add("done");
    setTimeout(function () { btn.textContent = old; btn.classList.remove("done"); }, 1500);
  }

  // A report opened from a file:// attachment may have no async clipboard: fall back to a textarea.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).then(function () { return true; }, function () {
        return legacyCopy(text);
      });
    }
    return Promise.resolve(legacyCopy(text));
  }

  function legacyCopy(text) {
    var ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.position = "fixed";
    ta.style.opacity = "0";
    document.body.appendChild(ta);
    ta.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(ta);
    return ok;
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("button[data-copy], button[data-download]");
    if (!btn) { return; }
    if (btn.dataset.copy) {
      copyText(textOf(btn.dataset.copy)).then(function (ok) { flash(btn, ok ? "Copied" : "Select and copy"); });
      return;
    }
    var text = textOf(btn.dataset.download);
    var type = /\.json$/.test(btn.dataset.filename) ? "application/json" : "text/plain";
    var url = URL.createObjectURL(new Blob([text], { type: type }));
    var a = document.createElement("a");
    a.href = url;
    a.download = btn.dataset.filename || "download.txt";
    document.body.appendChild(a);
    a.click();
    document.body.removeChild(a);
    setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
    flash(btn, "Saved");
  });

  var opened = [];
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details:not([open]):not(.screen-only)").forEach(function (d) { d.open = true; opened.push(d); });
  });
  window.addEventListener("afterprint", function () {
    opened.forEach(function (d) { d.open = false; });
    opened = [];
  });
})();
