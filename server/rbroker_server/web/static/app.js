// rbroker web view: live refresh of the page's figures and the history charts.
// No inline script anywhere (the Content-Security-Policy forbids it); everything the
// server renders is already escaped, so refreshed fragments are inserted as they come.
(function () {
  "use strict";

  function clock(d) {
    return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  // A refresh waits for its answer up to WAIT_MS (the server finishes a render it started
  // anyway, so giving up early only wastes it); the next one starts `delay` after the
  // last one ended, never two at once. A failed or slow refresh (longer than half the
  // period) doubles the delay, up to MAX_MS; a quick success brings it back to the period.
  // The figures shown are always the last ones received, with a note saying how old.
  var WAIT_MS = 60000;
  var MAX_MS = 30000;

  function liveRefresh(main) {
    var url = main.dataset.refreshUrl;
    var period = parseInt(main.dataset.refreshMs, 10) || 5000;
    var live = document.getElementById("live");
    var banner = document.getElementById("unreachable");
    var slowNote = document.getElementById("slow");
    var lastUpdate = document.getElementById("last-update");
    var lastOk = new Date();
    var etag = null;
    var delay = period;

    function secs(ms) { return Math.round(ms / 100) / 10 + " s"; }

    function backOff() { delay = Math.min(MAX_MS, Math.max(period, delay * 2)); }

    function unreachable(why) {
      backOff();
      lastUpdate.textContent = clock(lastOk) + " (" + why + "; next try in " + secs(delay) + ")";
      if (banner.hidden) banner.hidden = false;
      slowNote.hidden = true;
      document.body.classList.add("unreachable");
      main.dataset.refreshDelayMs = String(delay);
    }

    function received(tookMs) {
      lastOk = new Date();
      banner.hidden = true;
      document.body.classList.remove("unreachable");
      if (tookMs > period / 2) {
        backOff();
        slowNote.textContent = "Refreshes are slow (the last took " + secs(tookMs) +
          "): the figures are from " + clock(lastOk) + "; the next refresh is in " + secs(delay) + ".";
        slowNote.hidden = false;
      } else {
        delay = period;
        slowNote.hidden = true;
      }
      main.dataset.refreshDelayMs = String(delay);
    }

    function asOfNow() {  // a 304: the figures are unchanged up to now
      var t = document.getElementById("as-of");
      if (!t) return;
      var now = new Date();
      t.setAttribute("datetime", now.toISOString());
      t.textContent = now.toISOString().slice(11, 19) + " UTC";
    }

    function refresh() {
      if (document.hidden) { setTimeout(refresh, period); return; }  // nobody looking
      var started = Date.now();
      var ctl = new AbortController();
      var timer = setTimeout(function () { ctl.abort(); }, WAIT_MS);
      var headers = { "Accept": "text/html" };
      if (etag) headers["If-None-Match"] = etag;
      fetch(url, { credentials: "same-origin", cache: "no-store", signal: ctl.signal, headers: headers })
        .then(function (r) {
          if (r.status === 401) {
            window.location.assign(main.dataset.signinUrl);
            return null;
          }
          if (r.status === 304) return "";
          if (!r.ok) throw new Error("HTTP " + r.status);
          etag = r.headers.get("ETag");
          return r.text();
        })
        .then(function (html) {
          if (html === null) return;
          if (html === "") {
            asOfNow();
          } else {
            var focused = document.activeElement && document.activeElement.id;
            live.innerHTML = html;
            if (focused) {
              var again = document.getElementById(focused);
              if (again) again.focus();
            }
          }
          received(Date.now() - started);
        })
        .catch(function (err) {
          unreachable(err && err.name === "AbortError" ? "no answer in " + secs(WAIT_MS)
                                                        : String(err && err.message || err));
        })
        .finally(function () {
          clearTimeout(timer);
          setTimeout(refresh, delay);
        });
    }

    setTimeout(refresh, period);
  }

  // ---- charts (computer page) -------------------------------------------------------
  var SERIES = [
    ["leased_in_use_mib", "in use by leases", "#2f6fdb"],
    ["outstanding_mib", "granted, not yet in use", "#7f9ccd"],
    ["other_in_use_mib", "in use by others", "#e08a2c"],
    ["available_mib", "available", "#3aa55d"],
    ["total_mib", "total", "#555b63"]
  ];
  var DASH = { outstanding_mib: [6, 3], total_mib: [2, 3] };

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v) {
    return v === null || v === undefined ? "?" : Math.round(v).toLocaleString();
  }

  function table(caption, heads, rows) {
    var details = el("details", { "class": "chart-table" });
    details.appendChild(el("summary", {}, "Table: " + caption));
    var t = el("table", { "class": "data" });
    t.appendChild(el("caption", {}, caption));
    var tr = el("tr");
    heads.forEach(function (h) { tr.appendChild(el("th", { scope: "col" }, h)); });
    t.appendChild(el("thead")).appendChild(tr);
    var body = t.appendChild(el("tbody"));
    rows.slice(-60).reverse().forEach(function (r) {
      var row = el("tr");
      r.forEach(function (c) { row.appendChild(el("td", {}, c)); });
      body.appendChild(row);
    });
    details.appendChild(t);
    return details;
  }

  function chart(box, title, xs, series, unit) {
    var fig = el("figure", { "class": "chart" });
    fig.appendChild(el("figcaption", {}, title));
    var plot = el("div", { role: "img", "aria-label": title + " over time; the table below has the figures" });
    fig.appendChild(plot);
    box.appendChild(fig);
    var width = Math.min(900, Math.max(320, box.clientWidth - 8));
    /* global uPlot */
    new uPlot({
      width: width, height: 220,
      scales: { x: { time: true } },
      axes: [{}, { label: unit, size: 70 }],
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.colour, width: 2, dash: s.dash, spanGaps: false };
      }))
    }, [xs].concat(series.map(function (s) { return s.values; })), plot);
    return fig;
  }

  function drawCharts(box, history) {
    box.textContent = "";
    var pts = history.points;
    if (!pts.length) {
      box.appendChild(el("p", { "class": "muted" }, "No history yet: the first point is written with the first report."));
      return;
    }
    var xs = pts.map(function (p) { return Date.parse(p.at) / 1000; });
    var times = pts.map(function (p) { return new Date(p.at).toLocaleString(); });
    var uuids = [];
    pts.forEach(function (p) { p.gpus.forEach(function (g) { if (uuids.indexOf(g.uuid) < 0) uuids.push(g.uuid); }); });
    uuids.forEach(function (uuid) {
      var series = SERIES.map(function (s) {
        return { label: s[1] + " (MiB)", colour: s[2], dash: DASH[s[0]], values: pts.map(function (p) {
          var g = p.gpus.filter(function (x) { return x.uuid === uuid; })[0];
          return g && g[s[0]] !== null && g[s[0]] !== undefined ? g[s[0]] : null;
        }) };
      });
      var idx = pts.map(function (p) { var g = p.gpus.filter(function (x) { return x.uuid === uuid; })[0]; return g ? g.index : null; })
        .filter(function (i) { return i !== null; }).pop();
      var title = "GPU " + idx + " (" + uuid.slice(0, 12) + "…) capacity";
      var fig = chart(box, title, xs, series, "MiB");
      fig.appendChild(table(title, ["time"].concat(SERIES.map(function (s) { return s[1] + " MiB"; })),
        pts.map(function (p, i) { return [times[i]].concat(series.map(function (s) { return fmt(s.values[i]); })); })));
    });
    var jobIds = [], purposes = {};
    pts.forEach(function (p) { (p.jobs || []).forEach(function (j) {
      if (jobIds.indexOf(j.job_id) < 0) jobIds.push(j.job_id);
      if (j.purpose) purposes[j.job_id] = j.purpose;
    }); });
    if (jobIds.length) {
      var palette = ["#2f6fdb", "#3aa55d", "#e08a2c", "#8e44ad", "#d0453a", "#555b63"];
      var series = jobIds.map(function (id, k) {
        return { label: (purposes[id] ? purposes[id] + " (" + id.slice(0, 8) + ")" : "job " + id.slice(0, 8)) + " items done", colour: palette[k % palette.length], values: pts.map(function (p) {
          var j = (p.jobs || []).filter(function (x) { return x.job_id === id; })[0];
          return j ? j.completed_items + j.failed_items : null;
        }) };
      });
      var fig = chart(box, "Job progress (items done)", xs, series, "items");
      fig.appendChild(table("Job progress (items done)", ["time"].concat(series.map(function (s) { return s.label; })),
        pts.map(function (p, i) { return [times[i]].concat(series.map(function (s) { return fmt(s.values[i]); })); })));
    }
  }

  function charts(box) {
    function load() {
      fetch(box.dataset.historyUrl, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (h) { if (window.uPlot) drawCharts(box, h); })
        .catch(function () { /* the banner of the live refresh tells the story */ });
    }
    load();
    setInterval(load, 60000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var main = document.getElementById("main");
    if (main && main.dataset.refreshUrl) liveRefresh(main);
    var box = document.getElementById("charts");
    if (box) charts(box);
  });
})();
