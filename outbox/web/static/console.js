// The dashboard's pages refresh their main part in place: every data-refresh seconds the page
// fetches its own URL with X-Outbox-Fragment: 1 and swaps the answer in. It waits while a form
// field has focus or holds something typed, while the tab is hidden, and while the operator
// has paused it with the header's live toggle (remembered in this browser's localStorage; each
// period it skips is counted in #main's data-skipped). Forms that carry data-confirm ask first.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var state = document.getElementById("refresh-state");
  var seconds = main ? parseFloat(main.getAttribute("data-refresh")) : 0;
  var toggle = document.getElementById("live-toggle");
  var KEY = "outbox.refresh";
  var typed = false;
  var paused = false;
  try { paused = window.localStorage.getItem(KEY) === "paused"; } catch (e) { paused = false; }

  // The message a write left is for this visit: a reload or a bookmark does not repeat it.
  if (/[?&](flash|level)=/.test(window.location.search)) {
    var url = new URL(window.location.href);
    url.searchParams.delete("flash");
    url.searchParams.delete("level");
    window.history.replaceState(null, "", url.toString());
  }

  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  if (!main || !(seconds > 0)) {
    return;
  }
  main.addEventListener("input", function () { typed = true; });

  function showState() {
    main.setAttribute("data-live", paused ? "off" : "on");
    if (!toggle) { return; }
    toggle.hidden = false;
    toggle.textContent = paused ? "paused" : "live";
    toggle.setAttribute("aria-pressed", paused ? "false" : "true");
    toggle.title = paused
      ? "Not refreshing: click to refresh every " + seconds + " s again"
      : "Refreshing every " + seconds + " s: click to pause";
    toggle.className = "live-toggle " + (paused ? "paused" : "live");
  }

  if (toggle) {
    toggle.addEventListener("click", function () {
      paused = !paused;
      try {
        if (paused) { window.localStorage.setItem(KEY, "paused"); }
        else { window.localStorage.removeItem(KEY); }
      } catch (e) { /* not remembered: this page still follows the toggle */ }
      showState();
    });
  }
  showState();

  function busy() {
    var active = document.activeElement;
    var editing = active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
    return typed || editing || document.hidden;
  }

  function swap(html) {
    var open = Array.prototype.map.call(main.querySelectorAll("details[open][id]"), function (d) {
      return d.id;
    });
    main.innerHTML = html;
    open.forEach(function (id) {
      var details = document.getElementById(id);
      if (details) { details.open = true; }
    });
  }

  function refresh() {
    if (paused) {
      main.setAttribute("data-skipped", String((parseInt(main.getAttribute("data-skipped"), 10) || 0) + 1));
      window.setTimeout(refresh, seconds * 1000);
      return;
    }
    if (busy()) {
      window.setTimeout(refresh, seconds * 1000);
      return;
    }
    fetch(window.location.href, {
      headers: { "X-Outbox-Fragment": "1", "Accept": "text/html" },
      credentials: "same-origin",
      cache: "no-store"
    }).then(function (response) {
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      return response.text();
    }).then(function (html) {
      if (!busy() && !paused) { swap(html); }
      if (state) { state.textContent = ""; }
    }).catch(function (error) {
      if (state) { state.textContent = "refresh failed (" + error.message + "): trying again"; }
    }).then(function () {
      window.setTimeout(refresh, seconds * 1000);
    });
  }

  window.setTimeout(refresh, seconds * 1000);
})();
