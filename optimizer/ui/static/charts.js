// Charts of the console, drawn with the vendored uPlot from JSON under /ui/data/.
// data-chart="prices": spot and on-demand prices of a pool and a policy's bid cap (step lines);
// data-chart="utilization": a job's GPU utilization and memory used per minute, refreshed.
"use strict";
(function () {
  function usd(v) { return v == null ? "–" : "$" + v.toFixed(v < 1 ? 4 : 2); }
  function size(el) { return {width: Math.max(el.clientWidth - 16, 280), height: 300}; }
  async function load(src) {
    var r = await fetch(src, {credentials: "same-origin"});
    if (r.status === 401) { window.location.reload(); return null; }
    if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
    return r.json();
  }
  function stepped() { return uPlot.paths.stepped({align: 1}); }
  async function prices(el) {
    var d = await load(el.dataset.src);
    if (!d) { return; }
    var opts = Object.assign(size(el), {
      scales: {x: {time: true}},
      axes: [{}, {label: "USD per hour", size: 80, values: function (u, vals) { return vals.map(usd); }}],
      series: [
        {},
        {label: "spot", stroke: "#0a55a3", width: 2, paths: stepped(), value: function (u, v) { return usd(v); }},
        {label: "on-demand", stroke: "#4a5360", width: 2, dash: [6, 4], paths: stepped(), value: function (u, v) { return usd(v); }},
        {label: "bid cap", stroke: "#b0231a", width: 2, dash: [2, 3], paths: stepped(), value: function (u, v) { return usd(v); }}
      ]
    });
    el.innerHTML = "";
    new uPlot(opts, [d.t, d.spot, d.on_demand, d.cap], el);
    el.dataset.points = String(d.t.length);
    var s = d.summary;
    document.querySelectorAll("#price-summary [data-k]").forEach(function (cell) {
      var k = cell.dataset.k, v = s[k];
      cell.textContent = k === "points" ? String(v) : usd(v);
    });
  }
  async function utilization(el) {
    var plot = null, note = document.getElementById("util-note");
    async function draw() {
      var d = await load(el.dataset.src);
      if (!d) { return; }
      el.dataset.points = String(d.t.length);
      if (!d.t.length) { if (note) { note.textContent = "No GPU readings yet."; } return; }
      if (note) { note.textContent = d.t.length + " minute(s) of readings" + (d.simulated.some(Boolean) ? ", simulated by the local cloud" : "") + "."; }
      var data = [d.t, d.util, d.memory];
      if (plot) { plot.setData(data); return; }
      el.innerHTML = "";
      plot = new uPlot(Object.assign(size(el), {
        scales: {x: {time: true}, y: {range: [0, 100]}},
        axes: [{}, {label: "%", values: function (u, vals) { return vals.map(function (v) { return v + "%"; }); }}],
        series: [{}, {label: "utilization", stroke: "#2a8a4a", width: 2, points: {show: true}}, {label: "memory used", stroke: "#0a55a3", width: 2, dash: [6, 4], points: {show: true}}]
      }), data, el);
    }
    await draw();
    setInterval(function () { if (!document.hidden) { draw().catch(function () {}); } }, parseInt(el.dataset.every || "3000", 10));
  }
  function init() {
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var run = el.dataset.chart === "prices" ? prices : utilization;
      run(el).then(function () { el.dataset.ready = "1"; }).catch(function (e) { el.textContent = "Could not load the chart: " + e.message; });
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
})();
