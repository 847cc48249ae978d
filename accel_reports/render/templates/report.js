(function () {
  "use strict";
  // Sorting: click a header of a table.sortable; numbers sort as numbers (data-v wins over text).
  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) { return ""; }
    var raw = cell.hasAttribute("data-v") ? cell.getAttribute("data-v") : cell.textContent.trim();
    var number = parseFloat(raw.replace(/[%,×]/g, ""));
    return (raw !== "" && !isNaN(number) && /^[-+]?[0-9.]/.test(raw)) ? number : raw.toLowerCase();
  }
  function sortTable(table, index, th) {
    var body = table.tBodies[0];
    if (!body) { return; }
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      if (typeof x === "number" && typeof y !== "number") { return -1; }
      if (typeof y === "number" && typeof x !== "number") { return 1; }
      var order = x < y ? -1 : (x > y ? 1 : 0);
      return ascending ? order : -order;
    });
    var fragment = document.createDocumentFragment();
    rows.forEach(function (row) { fragment.appendChild(row); });
    body.appendChild(fragment);
    Array.prototype.forEach.call(table.querySelectorAll("th[aria-sort]"), function (other) { other.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    var head = table.tHead;
    if (!head) { return; }
    var cells = head.rows[head.rows.length - 1].cells;
    Array.prototype.forEach.call(cells, function (th, index) {
      th.classList.add("sort");
      th.title = th.title || "sort";
      th.addEventListener("click", function () { sortTable(table, index, th); });
    });
  });

  // Filtering: an input.filter[data-table] hides rows whose text does not contain every word.
  function applyFilter(input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    if (!table || !table.tBodies[0]) { return; }
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var onlyBox = input.getAttribute("data-only") ? document.getElementById(input.getAttribute("data-only")) : null;
    var only = onlyBox && onlyBox.checked;
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var text = (row.getAttribute("data-k") || row.textContent).toLowerCase();
      var visible = words.every(function (w) { return text.indexOf(w) >= 0; }) && (!only || row.classList.contains("hf"));
      row.hidden = !visible;
      if (visible) { shown += 1; }
    });
    var counter = document.getElementById(input.getAttribute("data-table") + "-count");
    if (counter) { counter.textContent = shown + " shown"; }
  }
  Array.prototype.forEach.call(document.querySelectorAll("input.filter"), function (input) {
    input.addEventListener("input", function () { applyFilter(input); });
    var onlyId = input.getAttribute("data-only");
    var box = onlyId ? document.getElementById(onlyId) : null;
    if (box) { box.addEventListener("change", function () { applyFilter(input); }); }
  });

  // Drill-down: a link to #fN opens that failure's details.
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id ? document.getElementById(id) : null;
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView({block: "start"});
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();

  document.body.setAttribute("data-report-ready", "1");
}());
