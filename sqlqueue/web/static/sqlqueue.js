// sqlqueue web page: reload the parts marked data-refresh-url (the overview's chart) every
// data-refresh-seconds, in place. No library: the page works offline and without this file.
"use strict";
(function () {
  function refresh(box) {
    var every = Math.max(Number(box.dataset.refreshSeconds) || 10, 0.5) * 1000;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) { return; }
      busy = true;
      fetch(box.dataset.refreshUrl, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) { if (html !== null) { box.innerHTML = html; } })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { busy = false; });
    }, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh-url]").forEach(refresh);
  });
})();
