// sqlqueue web page: keep the parts of a page marked data-refresh (or data-refresh-url, the
// overview's chart) current, in place, every data-refresh-seconds of the header's toggle. A part
// marked data-refresh is read from the page's own URL and swapped for the element of the same
// id; the operator pauses and resumes all of it with the toggle (remembered in this browser).
// A part someone is using — a field focused, typed into or ticked — waits for the next tick.
// No library: the page works offline, and without this file everything but refresh works.
"use strict";
(function () {
  var PAUSED = "sqlqueue-refresh-paused";

  function isPaused() {
    try { return window.localStorage.getItem(PAUSED) === "1"; } catch (e) { return false; }
  }

  function setPaused(paused) {
    try {
      if (paused) { window.localStorage.setItem(PAUSED, "1"); }
      else { window.localStorage.removeItem(PAUSED); }
    } catch (e) { /* storage refused: the toggle still works on this page */ }
  }

  function inUse(box) {
    var active = document.activeElement;
    if (active && active !== document.body && box.contains(active)) { return true; }
    return Array.prototype.some.call(box.querySelectorAll("input, select, textarea"), function (field) {
      if (field.type === "checkbox" || field.type === "radio") { return field.checked !== field.defaultChecked; }
      if (field.type === "hidden" || field.tagName === "SELECT") { return false; }
      return field.value !== field.defaultValue;
    });
  }

  function swap(box, html) {
    if (box.dataset.refreshUrl) { box.innerHTML = html; return; }
    var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(box.id);
    if (fresh) { box.innerHTML = fresh.innerHTML; }
  }

  function start(boxes, every, paused) {
    var busy = false;
    setInterval(function () {
      if (busy || paused() || document.hidden) { return; }
      var waiting = boxes.filter(function (box) { return !inUse(box); });
      if (!waiting.length) { return; }
      busy = true;
      var urls = {};
      waiting.forEach(function (box) {
        var url = box.dataset.refreshUrl || window.location.href;
        (urls[url] = urls[url] || []).push(box);
      });
      Promise.all(Object.keys(urls).map(function (url) {
        return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
          .then(function (response) { return response.ok ? response.text() : null; })
          .then(function (html) {
            if (html === null || paused()) { return; }
            urls[url].forEach(function (box) { if (!inUse(box)) { swap(box, html); } });
          })
          .catch(function () { /* the next tick tries again */ });
      })).finally(function () { busy = false; });
    }, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var boxes = Array.prototype.slice.call(document.querySelectorAll("[data-refresh], [data-refresh-url]"));
    var toggle = document.getElementById("refresh-toggle");
    if (!boxes.length || !toggle) { return; }
    var paused = isPaused();
    function show() {
      toggle.textContent = paused ? "Resume refresh" : "Pause refresh";
      toggle.setAttribute("aria-pressed", paused ? "true" : "false");
      toggle.classList.toggle("paused", paused);
    }
    toggle.hidden = false;
    show();
    toggle.addEventListener("click", function () {
      paused = !paused;
      setPaused(paused);
      show();
    });
    var every = Math.max(Number(toggle.dataset.refreshSeconds) || 5, 0.5) * 1000;
    start(boxes, every, function () { return paused; });
  });
})();
