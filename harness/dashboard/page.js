// The dashboard's behaviour: draw the figures, sort tables by a header click, filter rows.
"use strict";

function drawFigures() {
  var specs = JSON.parse(document.getElementById("figure-data").textContent);
  var done = 0;
  specs.forEach(function (spec) {
    var el = document.getElementById(spec.id);
    if (!el) { console.error("no element for figure " + spec.id); return; }
    var config = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
    Plotly.newPlot(el, spec.data, spec.layout, config).then(function () {
      el.setAttribute("data-rendered", "1");
      done += 1;
      document.body.setAttribute("data-figures-rendered", String(done));
      // A click on a point opens the record it came from (customdata[0] is its link).
      el.on("plotly_click", function (ev) {
        var p = ev.points && ev.points[0];
        var href = p && p.customdata && p.customdata[0];
        if (typeof href === "string" && href.slice(-5) === ".json") { window.open(href, "_blank"); }
      });
    }, function (err) {
      el.textContent = "This figure failed to draw: " + err;
      console.error("figure " + spec.id + ": " + err);
    });
  });
  document.body.setAttribute("data-figures-total", String(specs.length));
}

function sortValue(cell, numeric) {
  var v = cell ? cell.getAttribute("data-v") : "";
  if (!numeric) { return (v || "").toLowerCase(); }
  var x = parseFloat(v);
  return isNaN(x) ? null : x;
}

function sortTable(table, col, th) {
  var numeric = th.getAttribute("data-kind") === "num";
  var ascending = th.getAttribute("aria-sort") !== "ascending";
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  rows.sort(function (a, b) {
    var x = sortValue(a.cells[col], numeric), y = sortValue(b.cells[col], numeric);
    if (x === y) { return 0; }
    if (x === null || x === "") { return 1; }  // empty cells last either way
    if (y === null || y === "") { return -1; }
    return (x < y ? -1 : 1) * (ascending ? 1 : -1);
  });
  rows.forEach(function (r) { body.appendChild(r); });
}

function setUpSorting() {
  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener("click", function () { sortTable(table, col, th); });
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortTable(table, col, th); }
      });
    });
  });
}

function applyFilters() {
  var wanted = {};
  document.querySelectorAll("#filters select").forEach(function (s) {
    if (s.value) { wanted[s.getAttribute("data-field")] = s.value; }
  });
  var shown = 0, total = 0;
  document.querySelectorAll("table.sortable tbody tr").forEach(function (row) {
    var ok = Object.keys(wanted).every(function (k) { return row.getAttribute("data-" + k) === wanted[k]; });
    row.hidden = !ok;
    if (row.closest(".board-block")) { total += 1; shown += ok ? 1 : 0; }
  });
  document.querySelectorAll(".board-block").forEach(function (block) {
    var visible = block.querySelectorAll("tbody tr:not([hidden])").length;
    var taskOk = !wanted.task || block.getAttribute("data-task") === wanted.task;
    block.hidden = !taskOk;
    block.querySelector(".no-match").hidden = visible > 0;
  });
  var count = document.getElementById("filter-count");
  if (count) { count.textContent = shown + " of " + total + " leaderboard rows shown"; }
}

function setUpFilters() {
  document.querySelectorAll("#filters select").forEach(function (s) { s.addEventListener("change", applyFilters); });
  applyFilters();
}

setUpSorting();
setUpFilters();
drawFigures();
