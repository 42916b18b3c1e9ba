(function () {
  function key(td) { return td.dataset.v !== undefined ? td.dataset.v : td.textContent.trim(); }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, i) {
      th.addEventListener("click", function () {
        var dir = th.dataset.dir === "asc" ? "desc" : "asc";
        Array.prototype.forEach.call(ths, function (h) { delete h.dataset.dir; });
        th.dataset.dir = dir;
        var num = th.dataset.t === "n", sign = dir === "asc" ? 1 : -1;
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[i]), y = key(b.cells[i]);
          if (num) {
            if (x === "" || y === "") { return x === y ? 0 : (x === "" ? 1 : -1); }
            return sign * (parseFloat(x) - parseFloat(y));
          }
          return sign * x.localeCompare(y);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  var f = document.getElementById("filter");
  f.addEventListener("input", function () {
    var q = f.value.toLowerCase();
    Array.prototype.forEach.call(document.getElementById("runs").tBodies[0].rows, function (r) {
      r.hidden = q !== "" && r.textContent.toLowerCase().indexOf(q) < 0;
    });
  });
})();
