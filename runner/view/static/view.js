// runner view: live updates over server-sent events. The server sends, for each part of the
// page that changed, its new HTML, rendered and escaped on the server; nothing from a run is
// ever turned into markup here.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var badge = document.getElementById("live");
  if (!main || !window.EventSource) { return; }
  var updates = 0;
  var source = new EventSource(main.getAttribute("data-live"));
  function show(state, text) {
    if (!badge) { return; }
    badge.setAttribute("data-state", state);
    badge.textContent = text;
  }
  source.onopen = function () { show("on", "live"); };
  source.onerror = function () { show("off", "reconnecting…"); };
  source.addEventListener("update", function (event) {
    var parts = JSON.parse(event.data);
    Object.keys(parts).forEach(function (id) {
      if (id === "status") { document.body.setAttribute("data-run-status", parts[id]); return; }
      var el = document.getElementById(id);
      if (el) { el.innerHTML = parts[id]; }
    });
    updates += 1;
    document.body.setAttribute("data-updates", String(updates));
    show("on", "live · updated " + new Date().toLocaleTimeString());
  });
  source.addEventListener("problem", function (event) {
    show("off", "problem: " + JSON.parse(event.data));
  });
})();
