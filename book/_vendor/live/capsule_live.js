/* The book's live capsule widget (capsule_lib.viz.live): draw a digit, run the exported encoder and decoder
 * (capsule_lib.export) with ONNX Runtime Web (wasm, one thread), draw what they return. No arithmetic of the
 * model is done here: the graphs compute the capsules, their lengths, the couplings and the reconstruction.
 * Loaded only when the reader presses "Start the live model"; everything comes from the book's own _static/. */
(function () {
  "use strict";
  var SIDE = 28, PEN = 196, SLIDER = 0.3;

  function loadScript(src) {
    return new Promise(function (ok, fail) {
      if (window.ort) return ok();
      var s = document.createElement("script");
      s.src = src; s.onload = ok; s.onerror = function () { fail(new Error("could not load " + src)); };
      document.head.appendChild(s);
    });
  }

  function make(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function style() {
    if (document.getElementById("capsule-live-style")) return;
    var s = make("style", "", document.head);
    s.id = "capsule-live-style";
    s.textContent = [
      ".capsule-live{border:1px solid #ccc;border-radius:6px;padding:8px;margin:8px 0;font-size:13px;max-width:100%}",
      ".cl-row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;margin:6px 0}",
      ".cl-pen{border:1px solid #888;touch-action:none;cursor:crosshair;background:#000}",
      ".cl-px{image-rendering:pixelated;border:1px solid #888;background:#000}",
      ".cl-bars{display:grid;grid-template-columns:1.2em 120px 3.6em;gap:2px 6px;align-items:center}",
      ".cl-bar{height:12px;background:#eee;cursor:pointer}.cl-bar>div{height:100%;background:#7a9cc6}",
      ".cl-bar.cl-win>div{background:#d9822b}.cl-bar.cl-chosen{outline:2px solid #333}",
      ".cl-sliders{display:grid;grid-template-columns:repeat(4,minmax(130px,1fr));gap:2px 10px}",
      ".cl-sliders label{display:flex;gap:4px;align-items:center;font-family:monospace;font-size:11px}",
      ".cl-sliders input{width:80px}.cl-picks button{padding:0;margin-right:4px;border:1px solid #888}",
      ".cl-caption{font-size:12px;color:#444;margin:2px 0}"
    ].join("\n");
  }

  function Widget(el, root, ort) {
    this.el = el; this.root = root; this.ort = ort;
    this.model = el.dataset.model;
    this.grid = el.dataset.grid ? el.dataset.grid.split(",").map(Number) : null;
    this.picks = JSON.parse(el.dataset.images || "[]");
    this.state = {
      ready: false, input: new Float32Array(SIDE * SIDE), lengths: null, poses: null, couplings: null,
      couplingDims: null, cls: -1, chosen: null, offsets: new Float32Array(16), recon: null,
      timings: { encoder: [], decoder: [] }, runs: { encoder: 0, decoder: 0 }
    };
    el.capsuleLive = this.state;
    this.busy = { encoder: false, decoder: false };
    this.pending = { encoder: false, decoder: false };
  }

  Widget.prototype.build = function () {
    var el = this.el, self = this;
    var top = make("div", "cl-row", el);
    var left = make("div", "", top);
    make("div", "cl-caption", left, "draw a digit");
    this.pen = make("canvas", "cl-pen", left);
    this.pen.width = PEN; this.pen.height = PEN;
    var tools = make("div", "cl-picks", left);
    make("button", "cl-clear", tools, "clear").addEventListener("click", function () { self.clear(); });
    this.picks.forEach(function (p, i) {
      var b = make("button", "cl-pick", tools);
      b.title = "test image of a " + p.label;
      var c = make("canvas", "cl-px", b);
      c.width = SIDE; c.height = SIDE; c.style.width = "28px"; c.style.height = "28px";
      self.paint(c, self.pickPixels(i));
      b.addEventListener("click", function () { self.pick(i); });
    });
    var mid = make("div", "", top);
    this.pred = make("div", "cl-caption cl-pred", mid, "class: -");
    this.bars = make("div", "cl-bars", mid);
    this.barEls = [];
    for (var k = 0; k < 10; k++) {
      make("span", "", this.bars, String(k));
      var bar = make("div", "cl-bar", this.bars);
      bar.dataset.k = k;
      make("div", "", bar).style.width = "0%";
      bar.addEventListener("click", function (e) { self.choose(Number(e.currentTarget.dataset.k)); });
      var v = make("span", "cl-len", this.bars, "-");
      this.barEls.push({ bar: bar, value: v });
    }
    make("div", "cl-caption", mid, "capsule lengths (click a class to decode its capsule)");
    var right = make("div", "", top);
    make("div", "cl-caption", right, "reconstruction");
    this.recon = make("canvas", "cl-px cl-recon", right);
    this.recon.width = SIDE; this.recon.height = SIDE;
    this.recon.style.width = "112px"; this.recon.style.height = "112px";
    make("div", "cl-caption", el, this.grid
      ? "couplings toward the chosen class per routing iteration: 32 primary types, each on its 6x6 grid " +
        "(dark 0, yellow 1)"
      : "self-attention couplings: 16 primary capsules (rows) to classes 0-9 (columns), the chosen class " +
        "outlined (dark 0, yellow 1)");
    this.routing = make("div", "cl-row cl-routing", el);
    var sl = make("div", "cl-caption", el, "the chosen class capsule's 16 dimensions (offsets added to its pose) ");
    make("button", "cl-reset", sl, "reset").addEventListener("click", function () { self.reset(); });
    this.sliders = make("div", "cl-sliders", el);
    this.sliderEls = [];
    for (var d = 0; d < 16; d++) {
      var lab = make("label", "", this.sliders);
      make("span", "", lab, "d" + (d + 1 < 10 ? "0" : "") + (d + 1));
      var r = make("input", "cl-dim", lab);
      r.type = "range"; r.min = -SLIDER; r.max = SLIDER; r.step = 0.01; r.value = 0; r.dataset.d = d;
      var out = make("span", "", lab, "+0.00");
      r.addEventListener("input", function (e) { self.slide(Number(e.target.dataset.d), Number(e.target.value)); });
      this.sliderEls.push({ input: r, out: out });
    }
    this.penEvents();
  };

  Widget.prototype.pickPixels = function (i) {
    var raw = atob(this.picks[i].pixels), x = new Float32Array(SIDE * SIDE);
    for (var j = 0; j < x.length; j++) x[j] = raw.charCodeAt(j) / 255;
    return x;
  };

  Widget.prototype.paint = function (canvas, x) {
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(SIDE, SIDE);
    for (var j = 0; j < SIDE * SIDE; j++) {
      var v = Math.round(255 * Math.min(1, Math.max(0, x[j])));
      img.data[4 * j] = img.data[4 * j + 1] = img.data[4 * j + 2] = v; img.data[4 * j + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  };

  Widget.prototype.penEvents = function () {
    var self = this, pen = this.pen, ctx = pen.getContext("2d"), down = false, last = null;
    ctx.fillStyle = "#000"; ctx.fillRect(0, 0, PEN, PEN);
    function at(e) {
      var r = pen.getBoundingClientRect();
      return [(e.clientX - r.left) * PEN / r.width, (e.clientY - r.top) * PEN / r.height];
    }
    pen.addEventListener("pointerdown", function (e) {
      down = true; last = at(e); pen.setPointerCapture(e.pointerId); self.stroke(last, last);
    });
    pen.addEventListener("pointermove", function (e) {
      if (!down) return;
      var p = at(e); self.stroke(last, p); last = p; self.fromPen(false);
    });
    var up = function () { if (down) { down = false; self.fromPen(true); } };
    pen.addEventListener("pointerup", up);
    pen.addEventListener("pointercancel", up);
  };

  Widget.prototype.stroke = function (a, b) {
    var ctx = this.pen.getContext("2d");
    ctx.strokeStyle = "#fff"; ctx.lineWidth = 15; ctx.lineCap = "round"; ctx.lineJoin = "round";
    ctx.beginPath(); ctx.moveTo(a[0], a[1]); ctx.lineTo(b[0], b[1]); ctx.stroke();
  };

  /* MNIST's framing of a drawing: the ink's bounding box scaled to 20 px, its centre of mass at the centre. */
  Widget.prototype.fromPen = function (finished) {
    if (finished) this.strokeEnd = performance.now();
    var data = this.pen.getContext("2d").getImageData(0, 0, PEN, PEN).data;
    var x0 = PEN, y0 = PEN, x1 = -1, y1 = -1, m = 0, mx = 0, my = 0;
    for (var y = 0; y < PEN; y++) for (var x = 0; x < PEN; x++) {
      var v = data[4 * (y * PEN + x)];
      if (v > 0) {
        m += v; mx += v * x; my += v * y;
        if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y;
      }
    }
    var input = new Float32Array(SIDE * SIDE);
    if (m > 0) {
      var s = 20 / Math.max(x1 - x0 + 1, y1 - y0 + 1), small = document.createElement("canvas");
      small.width = SIDE; small.height = SIDE;
      var c = small.getContext("2d");
      c.fillStyle = "#000"; c.fillRect(0, 0, SIDE, SIDE);
      c.imageSmoothingEnabled = true; c.imageSmoothingQuality = "high";
      c.setTransform(s, 0, 0, s, SIDE / 2 - s * (mx / m + 0.5), SIDE / 2 - s * (my / m + 0.5));
      c.drawImage(this.pen, 0, 0);
      var px = c.getImageData(0, 0, SIDE, SIDE).data;
      for (var j = 0; j < SIDE * SIDE; j++) input[j] = px[4 * j] / 255;
    }
    if (finished) this.finishedInput = input;
    this.run(input, finished);
  };

  Widget.prototype.clear = function () {
    var ctx = this.pen.getContext("2d");
    ctx.setTransform(1, 0, 0, 1, 0, 0); ctx.fillStyle = "#000"; ctx.fillRect(0, 0, PEN, PEN);
    this.run(new Float32Array(SIDE * SIDE), true);
  };

  Widget.prototype.pick = function (i) {
    var x = this.pickPixels(i), tmp = document.createElement("canvas");
    tmp.width = SIDE; tmp.height = SIDE; this.paint(tmp, x);
    var ctx = this.pen.getContext("2d");
    ctx.imageSmoothingEnabled = false; ctx.drawImage(tmp, 0, 0, PEN, PEN);
    this.run(x, true);
  };

  /* The encoder on the latest input; a drawing that moves on while it runs is run once it is free. */
  Widget.prototype.run = function (input, finished) {
    this.state.input = input; this.state.finished = finished;
    if (this.busy.encoder) { this.pending.encoder = true; return; }
    var self = this, t0 = performance.now();
    this.busy.encoder = true;
    var feed = { image: new this.ort.Tensor("float32", input, [1, 1, SIDE, SIDE]) };
    this.encoder.run(feed).then(function (out) {
      var ms = performance.now() - t0, st = self.state;
      st.timings.encoder.push(ms); st.runs.encoder++;
      st.lengths = out.lengths.data; st.poses = out.poses.data;
      st.couplings = out.couplings.data; st.couplingDims = out.couplings.dims;
      st.encodedInput = input;
      var best = 0;
      for (var k = 1; k < 10; k++) if (st.lengths[k] > st.lengths[best]) best = k;
      st.cls = best;
      self.showCapsules(); self.showRouting(); self.decode();
      if (input === self.finishedInput) {  // a finished stroke's capsules are on the page: how long it took
        st.timings.stroke = (st.timings.stroke || []).concat([performance.now() - self.strokeEnd]);
        self.finishedInput = null;
      }
    }).catch(function (e) { self.fail(e); }).finally(function () {
      self.busy.encoder = false;
      if (self.pending.encoder) { self.pending.encoder = false; self.run(self.state.input, self.state.finished); }
    });
  };

  Widget.prototype.target = function () { return this.state.chosen === null ? this.state.cls : this.state.chosen; };

  Widget.prototype.showCapsules = function () {
    var st = this.state, k0 = this.target();
    for (var k = 0; k < 10; k++) {
      var b = this.barEls[k], len = st.lengths[k];
      b.bar.firstChild.style.width = (100 * Math.min(1, len)).toFixed(1) + "%";
      b.bar.className = "cl-bar" + (k === st.cls ? " cl-win" : "") + (k === k0 ? " cl-chosen" : "");
      b.value.textContent = len.toFixed(3);
      b.value.dataset.length = String(len);
    }
    this.pred.textContent = "class: " + st.cls + " (length " + st.lengths[st.cls].toFixed(3) + ")";
    this.pred.dataset.cls = String(st.cls);
  };

  function viridis(t) {
    var c = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    t = Math.min(1, Math.max(0, t)) * 4;
    var i = Math.min(3, Math.floor(t)), f = t - i, a = c[i], b = c[i + 1];
    return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])];
  }

  /* Each iteration's couplings, as the chapter's routing view: toward the chosen class, one 6x6 map per primary
   * type in a mosaic (CapsNet), or the whole primary x class matrix (Efficient-CapsNet); viridis on [0, 1]. */
  Widget.prototype.showRouting = function () {
    var st = this.state, dims = st.couplingDims, T = dims[1], I = dims[2], K = dims[3], k0 = this.target();
    this.routing.textContent = "";
    for (var t = 0; t < T; t++) {
      var box = make("div", "", this.routing);
      make("div", "cl-caption", box, "iteration " + (t + 1));
      var c = make("canvas", "cl-px cl-coupling", box), w, h, img, ctx, base = t * I * K;
      if (this.grid) {
        var n = this.grid[0], gh = this.grid[1], gw = this.grid[2], cols = 8, rows = Math.ceil(n / cols);
        w = cols * (gw + 1) - 1; h = rows * (gh + 1) - 1;
        c.width = w; c.height = h; ctx = c.getContext("2d"); img = ctx.createImageData(w, h);
        for (var q = 0; q < img.data.length; q += 4) { img.data[q] = img.data[q + 1] = img.data[q + 2] = 255; img.data[q + 3] = 255; }
        for (var i = 0; i < I; i++) {
          var type = Math.floor(i / (gh * gw)), y = Math.floor((i % (gh * gw)) / gw), x = i % gw;
          var px = (type % cols) * (gw + 1) + x, py = Math.floor(type / cols) * (gh + 1) + y, o = 4 * (py * w + px);
          var rgb = viridis(st.couplings[base + i * K + k0]);
          img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2];
        }
        c.style.width = 3 * w + "px"; c.style.height = 3 * h + "px";
      } else {
        w = K; h = I; c.width = w; c.height = h; ctx = c.getContext("2d"); img = ctx.createImageData(w, h);
        for (var r = 0; r < I; r++) for (var k = 0; k < K; k++) {
          var rgb2 = viridis(st.couplings[base + r * K + k]), o2 = 4 * (r * K + k);
          img.data[o2] = rgb2[0]; img.data[o2 + 1] = rgb2[1]; img.data[o2 + 2] = rgb2[2]; img.data[o2 + 3] = 255;
        }
        c.style.width = 12 * w + "px"; c.style.height = 12 * h + "px";
        c.style.outline = "none";
        c.style.background = "#000";
        box.style.position = "relative";
        var mark = make("div", "", box);
        mark.style.cssText = "position:absolute;border:2px solid #d9822b;width:10px;height:" + 12 * h + "px;left:" +
          (12 * k0 + 1) + "px;bottom:1px;pointer-events:none";
      }
      ctx.putImageData(img, 0, 0);
    }
  };

  Widget.prototype.choose = function (k) {
    this.state.chosen = this.state.chosen === k ? null : k;
    if (!this.state.lengths) return;
    this.showCapsules(); this.showRouting(); this.decode();
  };

  Widget.prototype.slide = function (d, v) {
    this.state.offsets[d] = v;
    this.sliderEls[d].out.textContent = (v >= 0 ? "+" : "") + v.toFixed(2);
    this.decode();
  };

  Widget.prototype.reset = function () {
    for (var d = 0; d < 16; d++) { this.state.offsets[d] = 0; this.sliderEls[d].input.value = 0; this.sliderEls[d].out.textContent = "+0.00"; }
    this.decode();
  };

  /* The decoder on the chosen class capsule's pose plus the sliders' offsets. */
  Widget.prototype.decode = function () {
    var st = this.state;
    if (!st.poses) return;
    if (this.busy.decoder) { this.pending.decoder = true; return; }
    var self = this, k = this.target(), pose = new Float32Array(16);
    for (var d = 0; d < 16; d++) pose[d] = st.poses[k * 16 + d] + st.offsets[d];
    var feed = {
      pose: new this.ort.Tensor("float32", pose, [1, 16]),
      label: new this.ort.Tensor("int64", BigInt64Array.from([BigInt(k)]), [1])
    };
    var t0 = performance.now();
    this.busy.decoder = true;
    this.decoder.run(feed).then(function (out) {
      st.recon = out.image.data; st.decodedPose = pose; st.decodedClass = k;
      self.paint(self.recon, st.recon);
      st.timings.decoder.push(performance.now() - t0); st.runs.decoder++;
    }).catch(function (e) { self.fail(e); }).finally(function () {
      self.busy.decoder = false;
      if (self.pending.decoder) { self.pending.decoder = false; self.decode(); }
    });
  };

  Widget.prototype.fail = function (e) {
    this.state.error = String(e && e.message || e);
    make("div", "cl-caption", this.el, "the live model failed: " + this.state.error);
  };

  window.CapsuleLive = {
    start: function (el, root) {
      style();
      var t0 = performance.now();
      var btn = el.querySelector(".cl-start"), note = el.querySelector(".cl-note");
      return loadScript(root + "onnxruntime-web/ort.wasm.min.js").then(function () {
        var ort = window.ort;
        ort.env.wasm.numThreads = 1;
        ort.env.wasm.proxy = false;
        ort.env.wasm.wasmPaths = new URL(root + "onnxruntime-web/", location.href).href;  // not relative to ort's own URL
        var w = new Widget(el, root, ort), opts = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
        var base = root + "live_models/" + w.model;
        return ort.InferenceSession.create(base + ".encoder.onnx", opts).then(function (enc) {
          w.encoder = enc;
          return ort.InferenceSession.create(base + ".decoder.onnx", opts);
        }).then(function (dec) {
          w.decoder = dec;
          btn.remove(); note.textContent = "";
          w.build();
          w.state.ready = true; w.state.startMs = performance.now() - t0;
          if (w.picks.length) w.pick(0);
          return w;
        });
      }).catch(function (e) {
        btn.textContent = "the live model could not start";
        note.textContent = String(e && e.message || e);
        el.capsuleLive = { ready: false, error: String(e && e.message || e) };
      });
    }
  };
})();
