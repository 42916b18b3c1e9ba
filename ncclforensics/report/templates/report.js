/* ncclforensics report: draws the charts, copy and save buttons, print layout. No network. */
(function () {
  "use strict";

  // -- plotly.js: the scan's shared copy (a script element above), or the inline gzip unpacked here --
  function loadPlotly() {
    if (window.Plotly) { return Promise.resolve(window.Plotly); }
    var packed = document.getElementById("plotly-gz");
    if (!packed) {
      return Promise.reject(new Error("plotly.js was not found: this report expects the scan's shared copy " +
        "in ../../assets/ next to it (reports written with --self-contained carry their own)"));
    }
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot unpack the charts (DecompressionStream: " +
        "Chrome 80, Firefox 113, Safari 16.4 or newer)"));
    }
    var b64 = packed.textContent.trim();
    var bin = atob(b64);
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(function (source) {
      var s = document.createElement("script");
      s.textContent = source;
      document.head.appendChild(s);
      if (!window.Plotly) { throw new Error("plotly.js did not start"); }
      return window.Plotly;
    });
  }

  function plots() {
    return Array.prototype.slice.call(document.querySelectorAll("div.plot[data-spec]"));
  }

  function say(div, text) {
    div.innerHTML = "";
    var p = document.createElement("p");
    p.className = "chart-msg";
    p.textContent = text;
    div.appendChild(p);
    div.style.height = "auto";
  }

  // -- annotations: never two on top of each other, at any width ------------------------------------
  function boxes(gd) {
    return Array.prototype.map.call(gd.querySelectorAll("g.annotation"), function (g) {
      var t = g.querySelector(".annotation-text-g") || g;
      return { index: +g.getAttribute("data-index"), rect: t.getBoundingClientRect() };
    });
  }

  function overlap(a, b) {
    return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  }

  function declutter(Plotly, gd) {
    var anns = (gd.layout && gd.layout.annotations) || [];
    if (anns.length < 2 || gd._ncfPasses > 12) { return; }
    var bs = boxes(gd);
    bs.sort(function (a, b) { return a.rect.left - b.rect.left; });
    for (var i = 0; i < bs.length; i++) {
      for (var j = i + 1; j < bs.length; j++) {
        var a = bs[i].rect, b = bs[j].rect;
        if (!overlap(a, b)) { continue; }
        var k = bs[j].index, ann = anns[k];
        if (!ann || !ann.showarrow) { continue; }
        var ay = ann.ay === undefined ? -30 : ann.ay;
        var up = (b.bottom - a.top) + 4;  // lift the later one just above the earlier one ...
        var top = gd.getBoundingClientRect().top + gd._fullLayout.margin.t;
        var next = b.top - up < top ? Math.abs(ay) + (a.bottom - b.top) + 4 : ay - up;  // ... or below its point
        gd._ncfPasses = (gd._ncfPasses || 0) + 1;
        var upd = {};
        upd["annotations[" + k + "].ay"] = next;
        Plotly.relayout(gd, upd);
        return;  // plotly_afterplot calls again until nothing overlaps
      }
    }
    gd._ncfPasses = 0;
  }

  // -- heatmap cell text (the rank state strip): as large as fits its cell, hidden when nothing fits --
  var MAX_FONT = 13, MIN_FONT = 7;

  function fitCellText(Plotly, gd) {
    var data = gd._fullData || [];
    for (var i = 0; i < data.length; i++) {
      var tr = data[i];
      if (tr.type !== "heatmap" || !tr.z || !tr.z[0]) { continue; }
      var cell = gd._fullLayout._size.w / tr.z[0].length;
      var orig = gd.data[i];
      if (orig._ncfTemplate === undefined) { orig._ncfTemplate = orig.texttemplate || ""; }
      if (!orig._ncfTemplate) { continue; }
      if (orig._ncfHiddenAt !== undefined) {  // hidden: back when the cells grew enough
        if (cell > orig._ncfHiddenAt * 1.4) {
          delete orig._ncfHiddenAt;
          Plotly.restyle(gd, { texttemplate: orig._ncfTemplate, "textfont.size": MIN_FONT }, [i]);
        }
        continue;
      }
      var texts = gd.querySelectorAll("g.heatmap-label text");
      var widest = 0, size = MAX_FONT;
      Array.prototype.forEach.call(texts, function (t) {
        widest = Math.max(widest, t.getBBox().width);
        size = parseFloat(t.style.fontSize) || size;
      });
      if (!widest) { continue; }
      var fit = Math.min(MAX_FONT, Math.floor(size * (cell - 6) / widest));
      if (fit < MIN_FONT) {
        orig._ncfHiddenAt = cell;
        Plotly.restyle(gd, { texttemplate: "" }, [i]);
      } else if (fit !== Math.round(size)) {
        Plotly.restyle(gd, { "textfont.size": fit }, [i]);
      }
    }
  }

  function draw(Plotly) {
    plots().forEach(function (div) {
      var spec = JSON.parse(document.getElementById(div.dataset.spec).textContent);
      div.innerHTML = "";
      Plotly.newPlot(div, spec.data, spec.layout, spec.config).then(function (gd) {
        gd.on("plotly_afterplot", function () { fitCellText(Plotly, gd); declutter(Plotly, gd); });
        fitCellText(Plotly, gd);
        declutter(Plotly, gd);
        gd.dataset.drawn = "1";
      });
    });
  }

  if (plots().length) {
    loadPlotly().then(draw, function (err) {
      plots().forEach(function (div) { say(div, "The chart could not be drawn: " + err.message + "."); });
    });
  }

  // -- copy and save --------------------------------------------------------------------------------
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

  // -- print: details open, charts as wide as the page ---------------------------------------------
  var opened = [];
  var PRINT_WIDTH = 680;  // A4 less 14 mm margins, at 96 px per inch
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details:not([open]):not(.screen-only)").forEach(function (d) { d.open = true; opened.push(d); });
    if (window.Plotly) {
      plots().forEach(function (gd) { if (gd.dataset.drawn) { window.Plotly.relayout(gd, { width: PRINT_WIDTH }); } });
    }
  });
  window.addEventListener("afterprint", function () {
    opened.forEach(function (d) { d.open = false; });
    opened = [];
    if (window.Plotly) {
      plots().forEach(function (gd) {
        if (gd.dataset.drawn) { window.Plotly.relayout(gd, { width: null, autosize: true }); }
      });
    }
  });
})();
