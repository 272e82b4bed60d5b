// The dashboard's pages refresh their main part in place: every data-refresh seconds the page
// fetches its own URL with X-Outbox-Fragment: 1 and swaps the answer in. It waits while a form
// field has focus or holds something typed, and while the tab is hidden. Forms that carry
// data-confirm ask first.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var state = document.getElementById("refresh-state");
  var seconds = main ? parseFloat(main.getAttribute("data-refresh")) : 0;
  var typed = false;

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
      if (!busy()) { swap(html); }
      if (state) { state.textContent = ""; }
    }).catch(function (error) {
      if (state) { state.textContent = "refresh failed (" + error.message + "): trying again"; }
    }).then(function () {
      window.setTimeout(refresh, seconds * 1000);
    });
  }

  window.setTimeout(refresh, seconds * 1000);
})();
