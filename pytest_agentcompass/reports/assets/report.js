// The task table: sort, filter, and per-task details, from the JSON embedded in the page.
// Filter and sort state lives in the URL hash (shareable).
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("agentcompass-data").textContent);
  var COLS = DATA.columns, ROWS = DATA.rows, DETAILS = DATA.details;
  var C = {}; COLS.forEach(function (c, i) { C[c] = i; });
  var PAGE = 500, ALL_LIMIT = 2000;
  var body = document.querySelector("#tasks tbody"), shown = document.getElementById("shown");
  var inputs = {
    q: document.getElementById("f-q"), state: document.getElementById("f-state"),
    request: document.getElementById("f-request"), change: document.getElementById("f-change"),
    integrity: document.getElementById("f-integrity")
  };
  var sort = {col: null, dir: 1}, more = document.getElementById("more");
  var observer = new IntersectionObserver(function (entries) {
    if (entries[0].isIntersecting && pos < order.length) append(PAGE);
  }, {rootMargin: "800px"});
  observer.observe(more);

  function esc(v) {
    return String(v == null ? "" : v).replace(/[&<>"]/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c];
    });
  }
  function fmt(col, v) {
    if (v == null) return "";
    if (col === "score") return (+v).toFixed(3).replace(/\.?0+$/, "") || "0";
    if (col === "duration") return (+v).toFixed(2) + " s";
    if (col === "request") return DATA.requests[v].name;
    return v;
  }
  function rowHtml(i) {
    var r = ROWS[i], out = '<tr class="task" data-i="' + i + '">';
    for (var c = 0; c < COLS.length; c++) {
      var col = COLS[c], v = fmt(col, r[c]), cls = "";
      if (col === "state") cls = r[c];
      else if (col === "error") cls = "err";
      else if (col === "change") cls = "change-" + String(r[c]).replace(/ /g, "-");
      else if (col === "integrity" && r[c]) cls = "flagged";
      out += "<td" + (cls ? ' class="' + cls + '"' : "") + (col === "error" ? ' title="' + esc(v) + '"' : "") + ">" + esc(v) + "</td>";
    }
    return out + "</tr>";
  }
  function matches(r) {
    var q = inputs.q.value.toLowerCase();
    if (inputs.state.value && r[C.state] !== inputs.state.value) return false;
    if (inputs.request.value !== "" && String(r[C.request]) !== inputs.request.value) return false;
    if (inputs.change && inputs.change.value && r[C.change] !== inputs.change.value) return false;
    if (inputs.integrity && inputs.integrity.value && !r[C.integrity] !== (inputs.integrity.value === "clean")) return false;
    if (q) {
      var hay = (r[C.task] + " " + (r[C.category] || "") + " " + (r[C.error] || "")).toLowerCase();
      if (hay.indexOf(q) < 0) return false;
    }
    return true;
  }
  // Rows are added lazily: everything up to ALL_LIMIT, otherwise a page at a
  // time as the end of the table scrolls into view, so ten thousand tasks
  // paint at once and sorting or filtering stays quick (docs/performance.md).
  var order = [], pos = 0;
  function afterPaint(fn) { requestAnimationFrame(function () { requestAnimationFrame(fn); }); }
  function append(count) {
    var end = Math.min(order.length, pos + count), html = [];
    for (; pos < end; pos++) html.push(rowHtml(order[pos]));
    body.insertAdjacentHTML("beforeend", html.join(""));
    shown.dataset.rendered = String(pos);
    more.textContent = pos < order.length ? "showing " + pos + " of " + order.length + ": scroll for more" : "";
    if (pos < order.length) { observer.unobserve(more); observer.observe(more); }  // still in view: more
    if (window.agentcompassFirstPaint === undefined) {
      // For docs/performance.md: when the first rows were on screen.
      window.agentcompassFirstPaint = null;
      afterPaint(function () { window.agentcompassFirstPaint = performance.now(); });
    }
  }
  function render() {
    order = [];
    for (var i = 0; i < ROWS.length; i++) if (matches(ROWS[i])) order.push(i);
    if (sort.col !== null) {
      var k = C[sort.col], d = sort.dir;
      order.sort(function (a, b) {
        var x = ROWS[a][k], y = ROWS[b][k];
        if (x == null) return y == null ? a - b : 1;
        if (y == null) return -1;
        return (x < y ? -d : x > y ? d : a - b);
      });
    }
    shown.textContent = order.length + " of " + ROWS.length + " tasks";
    body.innerHTML = "";
    shown.dataset.rendered = "0";
    shown.dataset.matching = String(order.length);
    pos = 0;
    append(order.length <= ALL_LIMIT ? order.length : PAGE);
    writeHash();
  }
  function section(title, html) { return html ? "<h4>" + esc(title) + "</h4>" + html : ""; }
  function pre(text) { return text ? "<pre>" + esc(text) + "</pre>" : ""; }
  function detailHtml(i) {
    var d = DETAILS[i], out = "";
    if (d.omitted) out += "<p>" + esc(d.omitted) + "</p>";
    if (d.detail) out += '<p><a href="' + esc(d.detail) + '">detail record (JSON)</a></p>';
    if (d.integrity && d.integrity.length) out += section("Integrity findings", pre(d.integrity.join("\n")));
    out += section("Output", pre(d.output));
    out += section("Error", pre(d.error));
    out += section("Trace", pre(d.trace));
    if (d.attempts && d.attempts.length) out += section("Attempts", pre(d.attempts.join("\n")));
    if (d.retries && d.retries.length) out += section("Retry history", pre(d.retries.join("\n")));
    if (d.notes && d.notes.length) out += section("Notes", pre(d.notes.join("\n")));
    if (d.artifacts && d.artifacts.length) {
      out += section("Artifacts", "<ul>" + d.artifacts.map(function (a) {
        return "<li>" + (a[1] ? '<a href="' + esc(a[1]) + '">' + esc(a[0]) + "</a>" : esc(a[0])) +
          (a[2] ? ": <code>" + esc(a[2]) + "</code>" : "") + "</li>";
      }).join("") + "</ul>");
    }
    if (d.conversation && d.conversation.length) {
      out += section("Conversation", d.conversation.map(function (m) {
        return '<div class="msg ' + esc(m[0]) + '"><b>' + esc(m[0]) + "</b><pre>" + esc(m[1]) + "</pre></div>";
      }).join(""));
    }
    return '<tr class="detail"><td colspan="' + COLS.length + '"><div class="detail">' + out + "</div></td></tr>";
  }
  body.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr.task");
    if (!tr || ev.target.closest("a")) return;
    var next = tr.nextElementSibling;
    if (next && next.classList.contains("detail")) { next.remove(); return; }
    tr.insertAdjacentHTML("afterend", detailHtml(+tr.dataset.i));
  });
  document.querySelectorAll("#tasks th").forEach(function (th) {
    th.addEventListener("click", function () {
      var col = th.dataset.col;
      sort.dir = sort.col === col ? -sort.dir : (col === "task" || col === "request" ? 1 : -1);
      sort.col = col;
      document.querySelectorAll("#tasks th").forEach(function (h) { h.className = ""; });
      th.className = sort.dir > 0 ? "asc" : "desc";
      render();
    });
  });
  Object.keys(inputs).forEach(function (k) {
    if (inputs[k]) inputs[k].addEventListener("input", render);
  });
  function writeHash() {
    var parts = [];
    Object.keys(inputs).forEach(function (k) {
      if (inputs[k] && inputs[k].value) parts.push(k + "=" + encodeURIComponent(inputs[k].value));
    });
    if (sort.col) parts.push("sort=" + sort.col + "&dir=" + sort.dir);
    var hash = parts.length ? "#" + parts.join("&") : "";
    if (location.hash !== hash) history.replaceState(null, "", hash || location.pathname);
  }
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var p = kv.split("="), v = decodeURIComponent(p[1] || "");
    if (inputs[p[0]]) inputs[p[0]].value = v;
    if (p[0] === "sort" && C[v] !== undefined) sort.col = v;
    if (p[0] === "dir") sort.dir = +v || 1;
  });
  render();
})();
