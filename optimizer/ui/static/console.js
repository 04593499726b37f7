// The console's live parts: an element with data-refresh="URL" data-every="MS" has its
// content replaced by a fresh fragment from URL every MS milliseconds (the overview, a job's
// state, timeline and attempts); a <pre data-logs="URL"> follows a job's output the same way,
// until the job's fragment says it ended.
// A 401 means the session ended: the page reloads, which leads to the sign-in form.
"use strict";
(function () {
  function poll(el, every, apply) {
    var busy = false;
    async function tick() {
      if (busy || document.hidden) { return; }
      busy = true;
      try {
        var r = await fetch(el.dataset.refresh || el.dataset.logs, {credentials: "same-origin", headers: {"Accept": "text/html"}});
        if (r.status === 401) { window.location.reload(); return; }
        if (r.ok) { apply(await r.text()); el.dispatchEvent(new CustomEvent("refreshed", {bubbles: true})); }
      } catch (e) { /* the next tick tries again */ } finally { busy = false; }
    }
    var timer = setInterval(tick, every);
    return function stop() { clearInterval(timer); return tick(); };
  }
  function init() {
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      var every = parseInt(el.dataset.every || "3000", 10);
      poll(el, every, function (text) { if (el.innerHTML !== text) { el.innerHTML = text; } });
    });
    var following = [];
    document.querySelectorAll("pre[data-logs]").forEach(function (el) {
      var every = parseInt(el.dataset.every || "2000", 10);
      following.push(poll(el, every, function (text) {
        var atEnd = el.scrollHeight - el.scrollTop - el.clientHeight < 30;
        if (el.textContent !== text) { el.textContent = text; if (atEnd) { el.scrollTop = el.scrollHeight; } }
      }));
      el.scrollTop = el.scrollHeight;
    });
    // a job that ends while its page is open (its fragment comes back with data-job-ended):
    // its output is fetched once more and no longer followed, and its heading says so
    document.addEventListener("refreshed", function () {
      if (!following.length || !document.querySelector("[data-job-ended]")) { return; }
      following.forEach(function (stop) { stop(); });
      following = [];
      document.querySelectorAll("[data-ended-title]").forEach(function (h) { h.textContent = h.dataset.endedTitle; });
    });
    // delegated: a refreshed fragment brings new forms
    document.addEventListener("submit", function (ev) {
      var form = ev.target;
      if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) { ev.preventDefault(); }
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
})();
