// A token report's details on hover or focus: the target's probability over the checkpoints
// (a small line chart) and the top predictions of the last checkpoint, from #tok-data.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tok-data").textContent);
  function bytes(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  var rows = new Int32Array(bytes(data.rows).buffer);
  var p = bytes(data.p), topIds = new Int32Array(bytes(data.topIds).buffer);
  var topP = bytes(data.topP), nE = data.epochs.length, k = data.top;
  var index = {};
  for (var i = 0; i < rows.length; i++) index[rows[i]] = i;
  var tip = document.getElementById("tok-tip");

  function text(id) {
    var t = data.vocab[String(id)];
    return t === undefined ? "⟨" + id + "⟩" : t;
  }
  function quoted(s) {
    return "“" + s.replace(/\n/g, "⏎") + "”";
  }
  function chart(i) {
    var w = 220, h = 50, pts = [];
    for (var e = 0; e < nE; e++) {
      var x = nE > 1 ? (e / (nE - 1)) * (w - 4) + 2 : w / 2;
      pts.push(x.toFixed(1) + "," + (h - 2 - (p[i * nE + e] / 255) * (h - 4)).toFixed(1));
    }
    return "<svg width='" + w + "' height='" + h + "' role='img' aria-label='target " +
      "probability over checkpoints'><rect width='" + w + "' height='" + h +
      "' fill='#f7f7f7'/><polyline fill='none' stroke='#1f77b4' stroke-width='1.5' " +
      "points='" + pts.join(" ") + "'/></svg>";
  }
  function show(el) {
    var row = Number(el.getAttribute("data-row")), i = index[row];
    if (i === undefined) return;
    tip.textContent = "";
    var head = document.createElement("div");
    head.textContent = "target " + quoted(el.textContent) + " at position " +
      el.getAttribute("data-position") + " — " + el.getAttribute("data-fate");
    tip.appendChild(head);
    var last = p[i * nE + nE - 1] / 255;
    var prob = document.createElement("div");
    prob.textContent = "p(target): " + (p[i * nE] / 255).toFixed(2) + " at checkpoint " +
      data.epochs[0] + " → " + last.toFixed(2) + " at " + data.epochs[nE - 1];
    tip.appendChild(prob);
    var svg = document.createElement("div");
    svg.innerHTML = chart(i);  // built from numbers only
    tip.appendChild(svg);
    var top = document.createElement("div");
    var items = [];
    for (var j = 0; j < k; j++) {
      items.push(quoted(text(topIds[i * k + j])) + " " + (topP[i * k + j] / 255).toFixed(2));
    }
    top.textContent = "last checkpoint's top predictions: " + items.join(", ");
    top.setAttribute("data-testid", "token-top");
    tip.appendChild(top);
    var r = el.getBoundingClientRect();
    tip.style.left = (window.scrollX + r.left) + "px";
    tip.style.top = (window.scrollY + r.bottom + 4) + "px";
    tip.style.display = "block";
  }
  function hide() { tip.style.display = "none"; }
  function token(ev) {
    var el = ev.target;
    return el && el.getAttribute && el.getAttribute("data-testid") === "token" ? el : null;
  }
  document.addEventListener("mouseover", function (ev) { var el = token(ev); if (el) show(el); });
  document.addEventListener("mouseout", function (ev) { if (token(ev)) hide(); });
  document.addEventListener("focusin", function (ev) { var el = token(ev); if (el) show(el); });
  document.addEventListener("focusout", function (ev) { if (token(ev)) hide(); });
})();
