// forgetkit sample explorer: data map, galleries and sample cards. Written for forgetkit;
// no libraries. The data: #fk-data (JSON) and #fk-blob (base64 of zlib-compressed arrays).
(function () {
  "use strict";
  var root = document.getElementById("fk-explorer");
  var api = window.fkExplorer = {ready: false, error: null, firstCardMs: null, firstCardPaintMs: null};
  var D, RUNS = {}, CLASSES, view = "test", filt = {cls: -1, region: -1, box: null};
  var card, cardState = null, mapCanvas, tip, galleryBox, pos = null;
  var REGIONS = ["easy-to-learn", "ambiguous", "hard-to-learn"];
  var TYPES = {uint8: Uint8Array, uint16: Uint16Array, int32: Int32Array, float32: Float32Array};
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];
  var PAGE = 48;

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function classColor(c) {
    return c < PALETTE.length ? PALETTE[c] : "hsl(" + ((c * 137.508) % 360) + ",60%,48%)";
  }
  function cname(c) { return CLASSES[c] === undefined ? "class " + c : CLASSES[c]; }
  function fmt(x, d) { return isFinite(x) ? x.toFixed(d === undefined ? 3 : d) : "–"; }

  async function bytesOf(b64) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);
    var bin = atob(b64), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function inflate(bytes) {
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return await new Response(stream).arrayBuffer();
  }

  async function blob(run) {
    var parts = document.querySelectorAll("script.fk-blob-" + run);
    return inflate(await bytesOf(Array.prototype.map.call(parts, function (e) { return e.textContent; }).join("")));
  }
  function view_(buf, spec) { return new TYPES[spec[2]](buf, spec[0], spec[1]); }

  function setupRun(name, rec, buf) {
    var R = {name: name, rec: rec, n: rec.n, c: {}, idOf: null, indexOf: null};
    for (var k in rec.cols) R.c[k] = view_(buf, rec.cols[k]);
    R.E = rec.traj_epochs.length;
    if (rec.thumbs) { R.thumbs = view_(buf, rec.thumbs); R.th = rec.thumb; }
    if (rec.sharp) {  // larger images for the cards of the galleries' first items
      R.sharp = view_(buf, rec.sharp.data); R.sharpShape = rec.sharp.shape; R.sharpOf = new Map();
      rec.sharp.index.forEach(function (i, k) { R.sharpOf.set(i, k); });
    }
    R.id = function (i) { return rec.ids ? rec.ids[i] : i; };
    R.find = function (id) {
      if (!rec.ids) {
        var i = /^\d+$/.test(id) ? parseInt(id, 10) : -1;
        return i >= 0 && i < R.n ? i : -1;
      }
      if (!R.indexOf) {
        R.indexOf = new Map();
        rec.ids.forEach(function (v, i) { R.indexOf.set(String(v), i); });
      }
      var j = R.indexOf.get(String(id));
      return j === undefined ? -1 : j;
    };
    return R;
  }

  function passes(R, i) {
    var b = filt.box;
    return (filt.cls < 0 || R.c.label[i] === filt.cls) &&
      (filt.region < 0 || R.c.region[i] === filt.region) &&
      (!b || b.run !== R.name || (R.c.variability[i] >= b.v0 && R.c.variability[i] <= b.v1 &&
        R.c.confidence[i] >= b.c0 && R.c.confidence[i] <= b.c1));
  }
  function filtered() { return filt.cls >= 0 || filt.region >= 0 || (filt.box && filt.box.run === view); }

  // ------------------------------------------------------------------ images
  function thumbCanvas(R, i, big) {
    var src = R.thumbs, shape = R.th;
    if (big && R.sharpOf && R.sharpOf.has(i)) { src = R.sharp; shape = R.sharpShape; i = R.sharpOf.get(i); }
    var th = shape[0], tw = shape[1], ch = shape[2], cv = el("canvas");
    cv.width = tw; cv.height = th;
    var ctx = cv.getContext("2d"), img = ctx.createImageData(tw, th), px = th * tw;
    var base = i * px * ch, d = img.data;
    for (var p = 0; p < px; p++) {
      var o = p * 4;
      if (ch === 1) { d[o] = d[o + 1] = d[o + 2] = src[base + p]; }
      else { d[o] = src[base + p * 3]; d[o + 1] = src[base + p * 3 + 1]; d[o + 2] = src[base + p * 3 + 2]; }
      d[o + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    return cv;
  }
  function sampleView(R, i, big) {
    if (R.rec.kind === "images") {
      var cv = thumbCanvas(R, i, big);
      if (big) { cv.className = "fk-img"; cv.setAttribute("data-testid", "sample-image"); }
      return cv;
    }
    if (R.rec.kind === "texts") {
      var t = el("div", {"class": big ? "fk-text" : "fk-snip"}, R.rec.texts[i]);
      if (big) t.setAttribute("data-testid", "sample-text");
      return t;
    }
    return null;
  }

  // ------------------------------------------------------------------ data map
  function layoutMap() {
    var R = RUNS[view], cv = mapCanvas, dpr = window.devicePixelRatio || 1;
    var w = cv.clientWidth || 700, h = cv.clientHeight || 440;
    cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
    var m = {l: 52, r: 12, t: 12, b: 42}, vmax = 0, v = R.c.variability;
    for (var i = 0; i < R.n; i++) if (v[i] > vmax) vmax = v[i];
    vmax = Math.max(0.05, vmax * 1.05);
    var px = new Float32Array(R.n), py = new Float32Array(R.n), cf = R.c.confidence;
    for (i = 0; i < R.n; i++) {
      px[i] = m.l + (v[i] / vmax) * (w - m.l - m.r);
      py[i] = m.t + (1 - cf[i]) * (h - m.t - m.b);
    }
    pos = {run: view, px: px, py: py, w: w, h: h, m: m, vmax: vmax, dpr: dpr};
    buildGrid();
  }
  function buildGrid() {
    var R = RUNS[view], g = new Map(), S = 8;
    for (var i = 0; i < R.n; i++) {
      if (!passes(R, i)) continue;
      var k = Math.floor(pos.px[i] / S) * 4096 + Math.floor(pos.py[i] / S), a = g.get(k);
      if (a) a.push(i); else g.set(k, [i]);
    }
    pos.grid = g; pos.S = S;
  }
  function nearest(x, y) {
    var S = pos.S, best = -1, bd = 49, cx = Math.floor(x / S), cy = Math.floor(y / S);
    for (var a = cx - 1; a <= cx + 1; a++) for (var b = cy - 1; b <= cy + 1; b++) {
      var cell = pos.grid.get(a * 4096 + b);
      if (!cell) continue;
      for (var j = 0; j < cell.length; j++) {
        var i = cell[j], dx = pos.px[i] - x, dy = pos.py[i] - y, d = dx * dx + dy * dy;
        if (d <= bd) { bd = d; best = i; }
      }
    }
    return best;
  }
  function corrColor(t) {  // red (never right) to blue (always right)
    var r = Math.round(214 + (31 - 214) * t), g = Math.round(39 + (119 - 39) * t),
      b = Math.round(40 + (180 - 40) * t);
    return "rgb(" + r + "," + g + "," + b + ")";
  }
  function drawMap() {
    var R = RUNS[view], cv = mapCanvas, ctx = cv.getContext("2d"), p = pos, m = p.m;
    ctx.setTransform(p.dpr, 0, 0, p.dpr, 0, 0);
    ctx.clearRect(0, 0, p.w, p.h);
    ctx.strokeStyle = "#999"; ctx.fillStyle = "#333"; ctx.font = "12px system-ui,sans-serif";
    ctx.beginPath(); ctx.moveTo(m.l, m.t); ctx.lineTo(m.l, p.h - m.b); ctx.lineTo(p.w - m.r, p.h - m.b);
    ctx.stroke();
    ctx.textAlign = "right";
    for (var t = 0; t <= 4; t++) {
      var yy = m.t + (1 - t / 4) * (p.h - m.t - m.b);
      ctx.fillText((t / 4).toFixed(2), m.l - 5, yy + 4);
    }
    ctx.textAlign = "center";
    for (t = 0; t <= 4; t++) {
      var xx = m.l + (t / 4) * (p.w - m.l - m.r);
      ctx.fillText((p.vmax * t / 4).toFixed(2), xx, p.h - m.b + 16);
    }
    ctx.fillText("variability (std of the label's probability over epochs)", (m.l + p.w - m.r) / 2, p.h - 6);
    ctx.save(); ctx.translate(14, (m.t + p.h - m.b) / 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText("confidence (mean probability of the label)", 0, 0); ctx.restore();
    var byClass = colourMode === "class", buckets = [], i, k;
    var size = R.n > 20000 ? 2 : 3, half = size / 2;
    ctx.fillStyle = "#ddd";
    for (i = 0; i < R.n; i++) if (!passes(R, i)) ctx.fillRect(p.px[i] - half, p.py[i] - half, size, size);
    for (i = 0; i < R.n; i++) {
      if (!passes(R, i)) continue;
      k = byClass ? R.c.label[i] : Math.round(R.c.correctness[i] * 10);
      (buckets[k] || (buckets[k] = [])).push(i);
    }
    for (k = 0; k < buckets.length; k++) {
      if (!buckets[k]) continue;
      ctx.fillStyle = byClass ? classColor(k) : corrColor(k / 10);
      var b = buckets[k];
      for (var j = 0; j < b.length; j++) ctx.fillRect(p.px[b[j]] - half, p.py[b[j]] - half, size, size);
    }
    if (cardState && cardState.run === view) {
      var ci = cardState.i;
      ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.arc(p.px[ci], p.py[ci], 7, 0, 2 * Math.PI); ctx.stroke(); ctx.lineWidth = 1;
    }
    drawLegend();
  }
  var colourMode = "correctness";
  function drawLegend() {
    var lg = root.querySelector(".fk-legend");
    lg.textContent = "";
    if (colourMode === "class") {
      CLASSES.forEach(function (n, c) {
        if (c >= 40) return;
        var s = el("span"); var sw = el("i", {"class": "fk-sw"}); sw.style.background = classColor(c);
        s.appendChild(sw); s.appendChild(document.createTextNode(n)); lg.appendChild(s);
      });
    } else {
      [0, 0.5, 1].forEach(function (t) {
        var s = el("span"); var sw = el("i", {"class": "fk-sw"}); sw.style.background = corrColor(t);
        s.appendChild(sw);
        s.appendChild(document.createTextNode(t === 0 ? "never right" : t === 1 ? "right at every epoch" : "right at half the epochs"));
        lg.appendChild(s);
      });
    }
  }
  // a box dragged on the map selects the samples inside it (in data coordinates)
  var drag = null, dragged = false;
  function toData(x, y) {
    var p = pos, m = p.m;
    return [Math.max(0, (x - m.l) / (p.w - m.l - m.r) * p.vmax), 1 - (y - m.t) / (p.h - m.t - m.b)];
  }
  function local(ev) { var r = mapCanvas.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
  function onDown(ev) { if (ev.button === 0) { drag = local(ev); dragged = false; } }
  function onDragMove(ev) {
    if (!drag) return false;
    var q = local(ev);
    if (!dragged && Math.abs(q[0] - drag[0]) + Math.abs(q[1] - drag[1]) < 6) return false;
    dragged = true; tip.hidden = true;
    drawMap();
    var ctx = mapCanvas.getContext("2d");
    ctx.strokeStyle = "#000"; ctx.setLineDash([4, 3]);
    ctx.strokeRect(drag[0], drag[1], q[0] - drag[0], q[1] - drag[1]); ctx.setLineDash([]);
    return true;
  }
  function onUp(ev) {
    if (!drag) return;
    if (dragged) {
      var a = toData(drag[0], drag[1]), b = toData.apply(null, local(ev));
      filt.box = {run: view, v0: Math.min(a[0], b[0]), v1: Math.max(a[0], b[0]),
        c0: Math.min(a[1], b[1]), c1: Math.max(a[1], b[1])};
      root.querySelector(".fk-clearbox").hidden = false;
      refresh();
    }
    drag = null;
  }
  function mapPoint(ev) {
    var r = mapCanvas.getBoundingClientRect();
    return nearest(ev.clientX - r.left, ev.clientY - r.top);
  }
  function onHover(ev) {
    if (onDragMove(ev)) return;
    var i = mapPoint(ev), R = RUNS[view];
    if (i < 0) { tip.hidden = true; mapCanvas.style.cursor = "crosshair"; return; }
    mapCanvas.style.cursor = "pointer";
    tip.textContent = "";
    var v = sampleView(R, i, false);
    if (v) { if (v.tagName === "CANVAS") v.style.width = Math.min(112, v.width * 3) + "px"; tip.appendChild(v); }
    tip.appendChild(el("div", null, view + " sample " + R.id(i)));
    tip.appendChild(el("div", null, "label: " + cname(R.c.label[i]) + " · final: " + cname(R.c.pred[i])));
    var box = mapCanvas.parentNode.getBoundingClientRect(), x = ev.clientX - box.left + 14, y = ev.clientY - box.top + 14;
    if (x > box.width - 200) x -= 230;
    tip.style.left = x + "px"; tip.style.top = y + "px"; tip.hidden = false;
  }

  // ------------------------------------------------------------------ galleries
  function caption(R, key, i) {
    var L = R.c.label[i];
    if (key === "forgotten") {
      var e = R.c.last_right[i];
      return cname(L) + " · last right at epoch " + R.rec.epochs[e] + " · became " + cname(R.c.pred[i]);
    }
    if (key === "suspicious")
      return "given " + cname(L) + " → suggested " + cname(R.c.suggested[i]) + " · score " + fmt(R.c.score[i], 2);
    return cname(L) + " · predicted " + cname(R.c.pred[i]);
  }
  function renderGalleries() {
    var R = RUNS[view];
    galleryBox.textContent = "";
    R.rec.galleries.forEach(function (g) {
      var items = g.items.filter(function (i) { return passes(R, i); });
      var h = el("h3", null, g.title + " — " + items.length + (filtered() ? " match the filters" : "") +
        " (of " + g.total + (g.total > g.items.length ? ", the first " + g.items.length + " kept" : "") + ")");
      galleryBox.appendChild(h);
      var box = el("div", {"class": "fk-gallery", role: "list", "data-gallery": g.key, "aria-label": g.title});
      galleryBox.appendChild(box);
      if (!items.length) { box.appendChild(el("p", {"class": "fk-empty"}, "none")); return; }
      var shown = 0, more = el("button", {"class": "fk-more", type: "button"});
      function page() {
        var end = Math.min(items.length, shown + PAGE);
        for (; shown < end; shown++) box.appendChild(item(R, g.key, items, shown));
        more.textContent = "show more (" + (items.length - shown) + " left)";
        more.hidden = shown >= items.length;
      }
      more.addEventListener("click", page);
      page();
      galleryBox.appendChild(more);
    });
  }
  function item(R, key, items, k) {
    var i = items[k], b = el("button", {"class": "fk-item", type: "button", role: "listitem",
      "data-testid": "gallery-item", "data-run": R.name, "data-sample-id": String(R.id(i))});
    var v = R.rec.kind === "images" ? thumbCanvas(R, i, true) : sampleView(R, i, false);
    if (v) b.appendChild(v);
    b.appendChild(el("span", null, "#" + R.id(i) + " " + caption(R, key, i)));
    b.addEventListener("click", function () { openCard(R.name, i, {items: items, k: k, key: key}); });
    return b;
  }
  function onGalleryKey(ev) {
    var t = ev.target;
    if (!t.classList || !t.classList.contains("fk-item")) return;
    var all = Array.prototype.slice.call(t.parentNode.querySelectorAll(".fk-item")), k = all.indexOf(t);
    var cols = 1;
    while (cols < all.length && all[cols].offsetTop === all[0].offsetTop) cols++;
    var step = {ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, Home: -k, End: all.length - 1 - k}[ev.key];
    if (step === undefined) return;
    ev.preventDefault();
    var j = Math.max(0, Math.min(all.length - 1, k + step));
    all[j].focus();
    if (cardState && !card.hidden) all[j].click();
  }

  // ------------------------------------------------------------------ card
  function row(tb, k, v) {
    var tr = el("tr"); tr.appendChild(el("td", null, k)); tr.appendChild(el("td", null, v)); tb.appendChild(tr);
  }
  function predictedRuns(R, i) {  // "epochs 0–3: Shirt; 4–39: T-shirt/top", with swatches
    var p = el("p", {"class": "fk-runs", "data-testid": "predicted-classes"}, "Predicted: ");
    var E = R.E, tp = R.c.traj_pred, s = 0, first = true;
    for (var e = 1; e <= E; e++) {
      if (e === E || tp[i * E + e] !== tp[i * E + s]) {
        var a = R.rec.traj_epochs[s], b = R.rec.traj_epochs[e - 1], c = tp[i * E + s];
        var sw = el("i", {"class": "fk-sw"}); sw.style.background = classColor(c);
        if (!first) p.appendChild(document.createTextNode("; "));
        p.appendChild(document.createTextNode((a === b ? "epoch " + a : "epochs " + a + "–" + b) + " "));
        p.appendChild(sw);
        p.appendChild(document.createTextNode(cname(c)));
        s = e; first = false;
      }
    }
    return p;
  }
  function drawTraj(cv, R, i) {
    var dpr = window.devicePixelRatio || 1, w = cv.clientWidth || 360, h = cv.clientHeight || 190;
    cv.width = w * dpr; cv.height = h * dpr;
    var ctx = cv.getContext("2d"), E = R.E, m = {l: 34, r: 8, t: 8, b: 50}, pw = w - m.l - m.r, ph = h - m.t - m.b;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = "11px system-ui,sans-serif"; ctx.fillStyle = "#333"; ctx.strokeStyle = "#bbb";
    ctx.strokeRect(m.l, m.t, pw, ph);
    ctx.textAlign = "right";
    ctx.fillText("1", m.l - 4, m.t + 8); ctx.fillText("0", m.l - 4, m.t + ph);
    ctx.fillText("p", m.l - 4, m.t + ph / 2 + 4);
    function X(e) { return m.l + (E > 1 ? e / (E - 1) : 0.5) * pw; }
    ctx.strokeStyle = "#1f5fa8"; ctx.lineWidth = 2; ctx.beginPath();
    for (var e = 0; e < E; e++) {
      var y = m.t + (1 - R.c.traj_p[i * E + e] / 255) * ph;
      if (e) ctx.lineTo(X(e), y); else ctx.moveTo(X(e), y);
    }
    ctx.stroke(); ctx.lineWidth = 1;
    var cw = pw / E, sy = m.t + ph + 6;
    for (e = 0; e < E; e++) {
      var c = R.c.traj_pred[i * E + e];
      ctx.fillStyle = classColor(c);
      ctx.fillRect(m.l + e * cw, sy, Math.max(1, cw - (cw > 3 ? 1 : 0)), 12);
      if (c === R.c.label[i]) { ctx.fillStyle = "#000"; ctx.fillRect(m.l + e * cw, sy + 13, Math.max(1, cw - 1), 2); }
    }
    ctx.fillStyle = "#333"; ctx.textAlign = "left";
    ctx.fillText("epoch " + R.rec.traj_epochs[0], m.l, sy + 28);
    ctx.textAlign = "right"; ctx.fillText("epoch " + R.rec.traj_epochs[E - 1], m.l + pw, sy + 28);
    ctx.textAlign = "left"; ctx.fillText("line: label probability · cells: predicted class (underlined: = label)", 0, sy + 42);
  }
  function openCard(run, i, from) {
    var R = RUNS[run];
    if (!R || i < 0 || i >= R.n) return;
    cardState = {run: run, i: i, from: from || null};
    card.textContent = "";
    card.setAttribute("data-run", run);
    card.setAttribute("data-sample-id", String(R.id(i)));
    var head = el("header"), close = el("button", {type: "button", "aria-label": "close"}, "×");
    head.appendChild(el("h3", {"data-testid": "card-title"}, (run === "train" ? "training" : "test") + " sample " + R.id(i)));
    close.addEventListener("click", closeCard);
    head.appendChild(close); card.appendChild(head);
    var v = sampleView(R, i, true);
    if (v) card.appendChild(v);
    else card.appendChild(el("p", {"class": "fk-empty"}, "No inputs were given for this run (--inputs / --train-inputs)."));
    var tb = el("table"), c = R.c, last = c.last_right[i];
    row(tb, "sample id", String(R.id(i)));
    row(tb, "given label", cname(c.label[i]));
    row(tb, "suggested label", cname(c.suggested[i]) + (c.issue[i] ? " (flagged as a label issue)" : ""));
    row(tb, "label-issue score", fmt(c.score[i], 2) + " (log odds that the label is wrong)");
    row(tb, "final prediction", cname(c.pred[i]) + (c.pred[i] === c.label[i] ? " (right)" : " (wrong)"));
    row(tb, "last right", last < 0 ? "never" : "epoch " + R.rec.epochs[last]);
    row(tb, "forgetting events", String(c.events[i]));
    row(tb, "confidence / variability", fmt(c.confidence[i]) + " / " + fmt(c.variability[i]));
    row(tb, "right at", Math.round(c.correctness[i] * 100) + "% of the epochs");
    row(tb, "data-map region", REGIONS[c.region[i]]);
    tb.setAttribute("data-testid", "card-table");
    card.appendChild(tb);
    var traj = el("canvas", {"class": "fk-traj", "data-testid": "trajectory"});
    card.appendChild(traj);
    card.appendChild(predictedRuns(R, i));
    if (R.E < R.rec.epochs.length) card.appendChild(el("p", {"class": "fk-empty"}, "Trajectory: " + R.E + " of the " + R.rec.epochs.length + " epochs (every " + Math.round(R.rec.epochs.length / R.E) + "th)."));
    if (from) {
      var nav = el("nav"), prev = el("button", {type: "button"}, "← previous"), next = el("button", {type: "button"}, "next →");
      prev.disabled = from.k <= 0; next.disabled = from.k >= from.items.length - 1;
      prev.addEventListener("click", function () { step(-1); });
      next.addEventListener("click", function () { step(1); });
      nav.appendChild(prev); nav.appendChild(el("span", null, (from.k + 1) + " / " + from.items.length)); nav.appendChild(next);
      card.appendChild(nav);
    }
    card.hidden = false;
    drawTraj(traj, R, i);
    var hash = "#" + run + "-" + R.id(i);
    if (location.hash !== hash) setHash(hash);
    root.querySelectorAll(".fk-item[aria-current]").forEach(function (b) { b.removeAttribute("aria-current"); });
    var sel = root.querySelector(".fk-item[data-run='" + run + "'][data-sample-id='" + CSS.escape(String(R.id(i))) + "']");
    if (sel) sel.setAttribute("aria-current", "true");
    if (api.firstCardMs === null) {
      api.firstCardMs = performance.now();
      // the frame that shows it: rAF runs before that paint, the timeout once it is done
      requestAnimationFrame(function () { setTimeout(function () { api.firstCardPaintMs = performance.now(); }, 0); });
    }
    if (run === view) drawMap();
  }
  function step(d) {
    var f = cardState && cardState.from;
    if (!f) return;
    var k = f.k + d;
    if (k < 0 || k >= f.items.length) return;
    openCard(cardState.run, f.items[k], {items: f.items, k: k, key: f.key});
  }
  function closeCard() {
    card.hidden = true; cardState = null;
    setHash("");
    drawMap();
  }
  function setHash(hash) {  // a link to the open card; not where the page cannot (a sandbox)
    try { history.replaceState(null, "", hash || location.pathname + location.search); } catch (e) { /* ignored */ }
  }
  function fromHash() {
    var m = /^#(test|train)-(.+)$/.exec(decodeURIComponent(location.hash));
    if (!m) return;
    var R = RUNS[m[1]], note = root.querySelector(".fk-note");
    if (!R && D.runs[m[1]]) return;  // still loading: opened once it is
    var i = R ? R.find(m[2]) : -1;
    if (i < 0) { note.textContent = "No " + m[1] + " sample with id " + m[2] + " in this report."; note.hidden = false; return; }
    note.hidden = true;
    openCard(m[1], i, null);
  }

  // ------------------------------------------------------------------ page
  function select(label, options, onchange, testid) {
    var l = el("label", null, label + " "), s = el("select", {"data-testid": testid});
    options.forEach(function (o, k) { s.appendChild(el("option", {value: String(k - 1)}, o)); });
    s.addEventListener("change", function () { onchange(parseInt(s.value, 10)); });
    l.appendChild(s); return l;
  }
  function refresh() { buildGrid(); drawMap(); renderGalleries(); }
  function build() {
    root.querySelector(".fk-loading").remove();
    var intro = el("p", null, "Every point of the data map and every gallery item opens its sample card: the input, " +
      "its given and suggested label, and its trajectory over the epochs. Hover a point for a preview; " +
      "in a gallery, the arrow keys move between items and Enter opens one (with a card open, the card follows); " +
      "Escape closes the card. A link ending in #test-45 or #train-123 opens that sample.");
    root.appendChild(intro);
    var note = el("p", {"class": "fk-note", role: "status"}); note.hidden = true; root.appendChild(note);
    var ctl = el("div", {"class": "fk-controls"}), tabs = el("div", {"class": "fk-tabs", role: "tablist"});
    Object.keys(D.runs).forEach(function (r) {
      var b = el("button", {type: "button", role: "tab", "data-run": r, "aria-selected": String(r === view)},
        (r === "test" ? "test run" : "training run") + " (" + D.runs[r].n + ")");
      b.disabled = !RUNS[r];
      b.addEventListener("click", function () {
        view = r;
        tabs.querySelectorAll("button").forEach(function (x) { x.setAttribute("aria-selected", String(x === b)); });
        layoutMap(); drawMap(); renderGalleries();
      });
      tabs.appendChild(b);
    });
    ctl.appendChild(tabs);
    ctl.appendChild(select("class", ["all classes"].concat(CLASSES), function (v) { filt.cls = v; refresh(); }, "class-filter"));
    ctl.appendChild(select("data-map region", ["all regions"].concat(REGIONS), function (v) { filt.region = v; refresh(); }, "region-filter"));
    ctl.appendChild(select("colour", ["share of epochs right", "given class"], function (v) { colourMode = v === 0 ? "class" : "correctness"; drawMap(); }, "colour-mode"));
    var clear = el("button", {type: "button", "class": "fk-clearbox", "data-testid": "clear-box"}, "clear the box");
    clear.hidden = true;
    clear.addEventListener("click", function () { filt.box = null; clear.hidden = true; refresh(); });
    ctl.appendChild(clear);
    root.appendChild(ctl);
    var map = el("div", {"class": "fk-map"});
    mapCanvas = el("canvas", {"data-testid": "data-map", "aria-label": "data map: confidence against variability; click a point to open its sample"});
    tip = el("div", {"class": "fk-tip"}); tip.hidden = true;
    map.appendChild(mapCanvas); map.appendChild(tip); root.appendChild(map);
    root.appendChild(el("div", {"class": "fk-legend"}));
    root.appendChild(el("p", {"class": "fk-maphelp"}, "Data map (Dataset Cartography): each sample's mean probability of its " +
      "label over the epochs against its spread. Easy-to-learn samples sit top left, ambiguous ones to the right, " +
      "hard-to-learn ones (often mislabelled) bottom left. Drag a box on the map to keep only the samples inside it; " +
      "filtered-out samples are grey."));
    galleryBox = el("div", {"class": "fk-galleries"}); root.appendChild(galleryBox);
    card = el("aside", {"class": "fk-card", "data-testid": "sample-card", "aria-label": "sample card"});
    card.hidden = true; root.appendChild(card);
    mapCanvas.addEventListener("mousemove", onHover);
    mapCanvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    mapCanvas.addEventListener("mousedown", onDown);
    window.addEventListener("mouseup", onUp);
    mapCanvas.addEventListener("click", function (ev) {
      if (dragged) { dragged = false; return; }
      var i = mapPoint(ev); if (i >= 0) openCard(view, i, null);
    });
    galleryBox.addEventListener("keydown", onGalleryKey);
    document.addEventListener("keydown", function (ev) {
      if (card.hidden) return;
      if (ev.key === "Escape") { var back = root.querySelector(".fk-item[aria-current]"); closeCard(); if (back) back.focus(); }
      else if (!galleryBox.contains(ev.target) && (ev.key === "ArrowRight" || ev.key === "ArrowLeft") &&
        !/^(INPUT|SELECT|TEXTAREA)$/.test(ev.target.tagName)) { ev.preventDefault(); step(ev.key === "ArrowRight" ? 1 : -1); }
    });
    window.addEventListener("hashchange", fromHash);
    window.addEventListener("resize", function () { layoutMap(); drawMap(); });
    layoutMap(); drawMap(); renderGalleries();
  }

  api.toScreen = function (run, i) {  // client coordinates of a point of the data map
    var r = mapCanvas.getBoundingClientRect();
    return run === pos.run ? [r.left + pos.px[i], r.top + pos.py[i]] : null;
  };
  api.index = function (run, id) { return RUNS[run] ? RUNS[run].find(String(id)) : -1; };
  api.open = function (run, id) { openCard(run, api.index(run, id), null); };

  async function main() {
    try {
      var T = api.timings = {start: performance.now()};
      D = JSON.parse(document.getElementById("fk-data").textContent);
      CLASSES = D.classes;
      RUNS.test = setupRun("test", D.runs.test, await blob("test"));
      T.test = performance.now();
      build();
      T.build = performance.now();
      fromHash();
      T.card = performance.now();
      if (D.runs.train) {
        if (document.readyState === "loading")
          await new Promise(function (ok) { document.addEventListener("DOMContentLoaded", ok); });
        RUNS.train = setupRun("train", D.runs.train, await blob("train"));
        root.querySelector(".fk-tabs button[data-run=train]").disabled = false;
        if (/^#train-/.test(location.hash)) fromHash();
      }
      T.train = performance.now();
      api.ready = true;
      root.setAttribute("data-ready", "true");
    } catch (err) {
      api.error = String(err);
      var p = root.querySelector(".fk-loading") || root.appendChild(el("p"));
      p.textContent = "The sample explorer could not start: " + err +
        " (it needs a browser with DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or newer).";
      throw err;
    }
  }
  main();
})();
