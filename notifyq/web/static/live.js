// Live refresh: every data-refresh-s seconds, fetch this same page and swap in the parts
// marked data-live (by id). The page works without it; a failed fetch marks the page stale
// and the next one tries again. Nothing here evaluates what it fetched: the new parts come
// from DOMParser, whose scripts never run, and the server's CSP allows no inline script.
(function () {
  "use strict";
  var every = Number(document.body.getAttribute("data-refresh-s") || 0);
  if (!every || !window.fetch || !window.DOMParser) return;
  var busy = false;
  function stamp(text, stale) {
    var el = document.getElementById("refreshed");
    if (!el) return;
    el.textContent = text;
    el.className = stale ? "stale" : "muted";
  }
  function tick() {
    if (busy || document.hidden) return;
    var focused = document.activeElement;
    if (focused && focused.form && focused.tagName !== "BUTTON") return; // someone is typing
    busy = true;
    fetch(location.href, {credentials: "same-origin", headers: {"X-Notifyq-Live": "1"}})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (el) {
          if (el.id === "refreshed") return;
          if (el.querySelector("input[type=checkbox]:checked")) return; // a selection is being made
          var next = fresh.getElementById(el.id);
          if (!next) return;
          // What the reader opened (a traceback) stays open across the swap.
          var opened = Array.prototype.map.call(el.querySelectorAll("details[open][id]"), function (d) { return d.id; });
          next = document.importNode(next, true);
          opened.forEach(function (id) {
            var d = next.querySelector("details[id='" + id.replace(/[^A-Za-z0-9_-]/g, "") + "']");
            if (d) d.open = true;
          });
          el.replaceWith(next);
        });
        stamp("updated " + new Date().toLocaleTimeString(), false);
      })
      .catch(function (e) { stamp("not updated: " + e.message, true); })
      .then(function () { busy = false; });
  }
  setInterval(tick, every * 1000);
})();
