// Charts of the console, drawn with the vendored uPlot from JSON under /ui/data/.
// data-chart="prices": spot and on-demand prices of a pool and a policy's bid cap (step lines);
// data-chart="gpu-prices": a GPU model's cheapest pool per region and market, per GPU-hour,
//   with a policy's bid caps, and the same figures as tables (#gpu-summary, #gpu-points);
// data-chart="utilization": a job's GPU utilization and memory used per minute, refreshed
//   every data-every ms while the job has not ended.
// Every time axis is in UTC, 24-hour; window.gpuoptCharts has the pure helpers (tested).
"use strict";
(function () {
  function usd(v) { return v == null ? "–" : "$" + v.toFixed(v < 1 ? 4 : 2); }
  function size(el) { return {width: Math.max(el.clientWidth - 16, 280), height: 300}; }
  // Times in UTC, 24-hour, as the rest of the console writes them (uPlot's own are the
  // browser's zone, 12-hour).
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function day(d) { return two(d.getUTCMonth() + 1) + "-" + two(d.getUTCDate()); }
  // The time axis's labels: "14:05" (":30" seconds where ticks are under a minute apart),
  // the day under the first tick and under each tick of a new day; days alone for ticks a
  // day or more apart.
  function utcTicks(splits, step) {
    var shown = null;
    return splits.map(function (t) {
      var d = new Date(t * 1000), which = day(d);
      if (step >= 86400) { return which; }
      var time = two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()) + (step < 60 ? ":" + two(d.getUTCSeconds()) : "");
      var label = which === shown ? time : time + "\n" + which;
      shown = which;
      return label;
    });
  }
  // A time in the legend: "2026-03-14 14:05 UTC".
  function utcStamp(t) { return t == null ? "–" : new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC"; }
  // The time axis's range: the data's, or 10 minutes around it where it spans less (one
  // reading would otherwise stretch the axis over years).
  var MIN_SPAN_S = 600;
  function timeRange(min, max) {
    if (min == null || max == null) { return [min, max]; }
    if (max - min >= MIN_SPAN_S) { return [min, max]; }
    var mid = (min + max) / 2;
    return [mid - MIN_SPAN_S / 2, mid + MIN_SPAN_S / 2];
  }
  // uPlot widens one distinct time by a thousand days itself before asking the range: the
  // data's own times decide then.
  function xRange(xs, min, max) {
    if (xs && xs.length && xs[0] === xs[xs.length - 1]) { return timeRange(xs[0], xs[0]); }
    return timeRange(min, max);
  }
  function timeScale() {
    return {time: true, range: function (u, min, max) { return xRange(u.data[0], min, max); }};
  }
  function timeAxis() {
    // ticks 80 px apart at least: a label with seconds is about 60 px wide
    return {label: "UTC", space: 80, values: function (u, splits, axis, space, step) { return utcTicks(splits, step); }};
  }
  function timeSeries() { return {value: function (u, t) { return utcStamp(t); }}; }
  function utc(ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); }
  window.gpuoptCharts = {utcTicks: utcTicks, utcStamp: utcStamp, timeRange: timeRange, xRange: xRange};
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
      tzDate: utc,
      scales: {x: timeScale()},
      axes: [timeAxis(), {label: "USD per hour", size: 80, values: function (u, vals) { return vals.map(usd); }}],
      series: [
        timeSeries(),
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
  // One colour per region (4.5:1 or more on white), spot solid, on-demand dashed, caps dotted.
  var PALETTE = ["#0a55a3", "#b34700", "#237a3b", "#7b3fa0", "#9c2f58", "#00707a", "#6b5b00", "#4a5360", "#3d4fd1", "#8a3b12"];
  function cell(row, text, head, cls) {
    var c = document.createElement(head ? "th" : "td");
    if (head) { c.scope = head; }
    if (cls) { c.className = cls; }
    c.textContent = text;
    row.appendChild(c);
    return c;
  }
  function stamp(t) { return new Date(t * 1000).toISOString().slice(0, 16).replace("T", " "); }
  function every(s) { return s % 3600 === 0 ? (s / 3600) + " h" : (s / 60) + " min"; }
  async function gpuPrices(el) {
    var d = await load(el.dataset.src);
    if (!d) { return; }
    var colour = {}, n = 0;
    d.series.forEach(function (s) {
      var k = s.provider + " " + s.region;
      if (!(k in colour)) { colour[k] = PALETTE[n++ % PALETTE.length]; }
    });
    function fmt(u, v) { return usd(v); }
    var series = [timeSeries()], data = [d.t];
    d.series.forEach(function (s) {
      series.push({label: s.label, stroke: colour[s.provider + " " + s.region], width: 2, dash: s.market === "spot" ? undefined : [6, 4], paths: stepped(), value: fmt});
      data.push(s.values);
    });
    d.caps.forEach(function (c) {
      var of = c.of == null ? null : d.series[c.of];
      series.push({label: c.label, stroke: of ? colour[of.provider + " " + of.region] : "#b0231a", width: of ? 1.5 : 2, dash: [2, 3], paths: stepped(), value: fmt});
      data.push(c.values);
    });
    el.innerHTML = "";
    if (d.series.length) {
      new uPlot(Object.assign(size(el), {
        tzDate: utc,
        scales: {x: timeScale()},
        axes: [timeAxis(), {label: "USD per GPU-hour", size: 80, values: function (u, vals) { return vals.map(usd); }}],
        series: series
      }), data, el);
    } else {
      el.textContent = "No pool matches: pick another model, count, market or regions.";
    }
    el.dataset.points = String(d.t.length);
    el.dataset.series = String(d.series.length);
    var bucket = document.getElementById("gpu-bucket");
    if (bucket) { bucket.textContent = every(d.summary.bucket_s) + " buckets, " + d.summary.points + " per line, from " + d.summary.pools + " pools"; }
    var body = document.querySelector("#gpu-summary tbody");
    if (body) {
      body.textContent = "";
      d.series.forEach(function (s) {
        var r = document.createElement("tr");
        r.dataset.series = s.provider + " " + s.region + " " + s.market;
        cell(r, s.provider + " " + s.region, "row");
        cell(r, s.market.replace("_", "-"));
        cell(r, usd(s.now), null, "num");
        cell(r, s.now_pool || "–");
        cell(r, usd(s.low), null, "num");
        cell(r, usd(s.high), null, "num");
        cell(r, s.market === "spot" ? usd(s.cap_now) : "–", null, "num");
        body.appendChild(r);
      });
    }
    var points = document.querySelector("#gpu-points table");
    if (points) {
      var head = document.createElement("tr"), rows = document.createDocumentFragment();
      cell(head, "Bucket start", "col");
      d.series.forEach(function (s) { cell(head, s.label, "col", "num"); });
      d.caps.forEach(function (c) { cell(head, c.label, "col", "num"); });
      d.t.forEach(function (t, i) {
        var r = document.createElement("tr");
        cell(r, stamp(t), "row");
        for (var j = 1; j < data.length; j++) { cell(r, usd(data[j][i]), null, "num"); }
        rows.appendChild(r);
      });
      points.tHead.replaceChildren(head);
      points.tBodies[0].replaceChildren(rows);
    }
  }
  async function utilization(el) {
    var plot = null, note = document.getElementById("util-note");
    // the time axis's span in seconds, for the page's readers and tests
    function spanned(u, key) { if (key === "x") { el.dataset.span = String(Math.round(u.scales.x.max - u.scales.x.min)); } }
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
        tzDate: utc,
        scales: {x: timeScale(), y: {range: [0, 100]}},
        axes: [timeAxis(), {label: "%", values: function (u, vals) { return vals.map(function (v) { return v + "%"; }); }}],
        series: [timeSeries(), {label: "utilization", stroke: "#2a8a4a", width: 2, points: {show: true}}, {label: "memory used", stroke: "#0a55a3", width: 2, dash: [6, 4], points: {show: true}}],
        hooks: {setScale: [spanned]}
      }), data, el);
    }
    await draw();
    // an ended job's readings are all there are: no data-every, no polling
    if (el.dataset.every) {
      var timer = setInterval(function () { if (!document.hidden) { draw().catch(function () {}); } }, parseInt(el.dataset.every, 10));
      // the job ended while its page is open (console.js's refreshed fragment says so)
      document.addEventListener("refreshed", function () {
        if (timer !== null && document.querySelector("[data-job-ended]")) { clearInterval(timer); timer = null; draw().catch(function () {}); }
      });
    }
  }
  function init() {
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var run = {prices: prices, "gpu-prices": gpuPrices}[el.dataset.chart] || utilization;
      run(el).then(function () { el.dataset.ready = "1"; }).catch(function (e) { el.textContent = "Could not load the chart: " + e.message; });
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
})();
