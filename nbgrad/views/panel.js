// nbgrad panel renderer: one ES module, no imports, used as the anywidget front end and by the JupyterLab
// extension's MIME renderer. It builds DOM from data only: labels go in through textContent, never markup.
// Its stylesheet is panel.css, which both of them load.

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (value === 0) return "0";
  const abs = Math.abs(value);
  return abs >= 1e4 || abs < 1e-3 ? value.toExponential(3) : value.toPrecision(4);
}

function decode(b64) {
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

function summaryLine(item) {
  const s = item.summary;
  const box = el("div", "nbg-summary");
  const grad = s.grad_fn ? `grad_fn=${s.grad_fn}` : `requires_grad=${s.requires_grad ? "True" : "False"}`;  // Python's
  box.appendChild(el("span", null, `[${s.shape.join(", ")}] ${s.dtype} ${s.device} ${grad}`));
  const table = el("table", "nbg-stats");
  const row = el("tr");
  for (const key of ["min", "max", "mean", "std", "norm"]) {
    row.appendChild(el("td", null, `${key} ${fmt(s[key])}`));
  }
  for (const key of ["nan", "inf"]) {
    const count = s[key] || 0;
    row.appendChild(el("td", count ? "nbg-bad" : null, `${key.toUpperCase()} ${count}`));
  }
  table.appendChild(row);
  box.appendChild(table);
  return box;
}

function drawHeatmap(canvas, hm, slice, palettes, cellW, cellH) {
  const levels = decode(slice.data);
  const rows = hm.rows.length, cols = hm.cols.length;
  canvas.width = cols * cellW;
  canvas.height = rows * cellH;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(canvas.width, canvas.height);
  const colours = hm.signed ? palettes.diverging : palettes.sequential;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const rgb = colours[levels[r * cols + c]];
      for (let dy = 0; dy < cellH; dy++) {
        for (let dx = 0; dx < cellW; dx++) {
          const p = ((r * cellH + dy) * canvas.width + (c * cellW + dx)) * 4;
          image.data[p] = rgb[0]; image.data[p + 1] = rgb[1]; image.data[p + 2] = rgb[2]; image.data[p + 3] = 255;
        }
      }
    }
  }
  ctx.putImageData(image, 0, 0);
  canvas.dataset.sliceKey = slice.key.join(",");
}

function legend(hm, slice, palettes) {
  const box = el("div", "nbg-legend");
  const bar = el("canvas");
  bar.width = 120; bar.height = 10;
  const ctx = bar.getContext("2d");
  const colours = hm.signed ? palettes.diverging : palettes.sequential;
  for (let x = 0; x < 120; x++) {
    const rgb = colours[Math.round((x / 119) * 255)];
    ctx.fillStyle = `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
    ctx.fillRect(x, 0, 1, 10);
  }
  box.append(el("span", null, fmt(slice.lo)), bar, el("span", null, fmt(slice.hi)));
  if (hm.signed) box.appendChild(el("span", "nbg-note", "(0 = white)"));
  return box;
}

function sliderControls(hm, chosen, redraw) {
  const controls = el("div", "nbg-controls");
  hm.sliders.forEach((slider, i) => {
    if (slider.size <= 1) return;
    const label = el("label", null, `axis ${slider.axis}: `);
    const input = el("input", "nbg-slider");
    input.type = "range"; input.min = "0"; input.max = String(slider.indices.length - 1); input.value = "0";
    const shown = el("span", null, String(slider.indices[0]));
    input.addEventListener("input", () => {
      chosen[i] = Number(input.value);
      shown.textContent = String(slider.indices[chosen[i]]);
      redraw();
    });
    label.append(input, shown);
    controls.appendChild(label);
  });
  return controls;
}

function showValueOnHover(canvas, hm, currentSlice, hover) {
  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor(((event.clientX - rect.left) / rect.width) * hm.cols.length);
    const r = Math.floor(((event.clientY - rect.top) / rect.height) * hm.rows.length);
    if (r < 0 || c < 0 || r >= hm.rows.length || c >= hm.cols.length) return;
    const slice = currentSlice();
    const value = slice.lo + (decode(slice.data)[r * hm.cols.length + c] / 255) * (slice.hi - slice.lo);
    const rowName = hm.token_rows ? `token ${JSON.stringify(hm.row_labels[r])}` : `row ${hm.rows[r]}`;
    hover.textContent = `${rowName}, col ${hm.cols[c]}: ≈ ${fmt(value)}`;
  });
}

function withTokenLabels(hm, canvas, cellH) {
  if (!hm.token_rows || cellH < 6) return canvas;
  const wrap = el("div", "nbg-row");
  const labels = el("div", "nbg-token-labels");
  labels.style.display = "flex"; labels.style.flexDirection = "column";
  for (const text of hm.row_labels) {
    const label = el("div", "nbg-token", text);
    label.style.height = `${cellH}px`; label.style.lineHeight = `${cellH}px`;
    label.style.fontSize = `${Math.min(11, cellH)}px`; label.style.whiteSpace = "pre";
    labels.appendChild(label);
  }
  wrap.append(labels, canvas);
  return wrap;
}

function heatmapView(item, palettes) {
  const hm = item.heatmap;
  const box = el("div", "nbg-heatmap");
  const canvas = el("canvas", "nbg-heatmap-canvas");
  const hover = el("div", "nbg-hover", "hover a cell for its value");
  const legendHolder = el("div");
  // Cells are sized per axis: a few long rows (tokens x hidden) stay tall enough to read.
  const cellW = Math.max(2, Math.min(24, Math.floor(480 / Math.max(hm.cols.length, 1))));
  const cellH = Math.max(cellW, Math.min(18, Math.floor(240 / Math.max(hm.rows.length, 1))));
  const chosen = hm.sliders.map(() => 0);
  const byKey = new Map(hm.slices.map((s) => [s.key.join(","), s]));
  let current = hm.slices[0];
  const redraw = () => {
    current = byKey.get(hm.sliders.map((s, i) => s.indices[chosen[i]]).join(",")) || hm.slices[0];
    drawHeatmap(canvas, hm, current, palettes, cellW, cellH);
    legendHolder.replaceChildren(legend(hm, current, palettes));
  };
  showValueOnHover(canvas, hm, () => current, hover);
  box.append(sliderControls(hm, chosen, redraw), withTokenLabels(hm, canvas, cellH), legendHolder, hover);
  if (hm.axes) box.appendChild(el("div", "nbg-note nbg-axes", hm.axes));      // what rows and columns are
  for (const note of hm.notes) box.appendChild(el("div", "nbg-note", note));
  redraw();
  return box;
}

function histogramView(hist) {
  const box = el("div", "nbg-histogram");
  const canvas = el("canvas");
  canvas.width = 240; canvas.height = 60;
  const ctx = canvas.getContext("2d");
  const peak = Math.max(...hist.counts, 1);
  const bar = canvas.width / hist.counts.length;
  ctx.fillStyle = getComputedStyle(document.body).getPropertyValue("--jp-brand-color1").trim() || "#466eb4";  // theme's
  hist.counts.forEach((count, i) => {
    const h = (count / peak) * canvas.height;
    ctx.fillRect(i * bar, canvas.height - h, Math.max(1, bar - 1), h);
  });
  box.appendChild(canvas);
  const axis = el("div", "nbg-legend");
  const what = hist.sampled ? ` histogram of ${hist.sampled} sampled values ` : " histogram ";
  axis.append(el("span", null, fmt(hist.lo)), el("span", "nbg-note", what), el("span", null, fmt(hist.hi)));
  box.append(axis, el("div", "nbg-note nbg-axes", "value → · bar height: count"));
  return box;
}

function topkView(topk) {
  const table = el("table", "nbg-topk");
  const head = el("tr");
  head.appendChild(el("th", null, "position"));
  topk.tokens[0].forEach((_, i) => head.appendChild(el("th", null, `top ${i + 1}`)));
  table.appendChild(head);
  topk.positions.forEach((position, p) => {
    const row = el("tr");
    row.appendChild(el("td", null, position));
    topk.tokens[p].forEach((token, i) => {
      const prob = topk.probs[p][i];    // null where the logits held NaN
      row.appendChild(el("td", null, `${JSON.stringify(token)} ${prob === null ? "–" : `${(prob * 100).toFixed(1)}%`}`));
    });
    table.appendChild(row);
  });
  return table;
}

function stepsView(item, palettes) {
  // One saved name at every generation step: the slider picks the step whose values are shown.
  const input = el("input", "nbg-step-slider"), shown = el("span"), holder = el("div", "nbg-row");
  Object.assign(input, { type: "range", min: "0", max: String(item.steps.length - 1), value: "0" });
  const draw = () => {
    shown.textContent = ` ${input.value} (of 0–${item.steps.length - 1})`;
    const cards = item.steps[Number(input.value)].map((sub) => card(sub, palettes));
    holder.replaceChildren(...(cards.length ? cards : [el("div", "nbg-note", "nothing saved at this step")]));
  };
  input.addEventListener("input", draw);
  const box = el("div", "nbg-step-view"), label = el("label", null, "step ");
  label.append(input, shown); box.append(label, holder);
  draw();
  return box;
}

function card(item, palettes) {
  const box = el("div", "nbg-card");
  box.dataset.name = item.name;
  const head = el("div");
  head.append(el("span", "nbg-name", item.name), el("span", `nbg-kind nbg-${item.kind}`, item.kind));
  if (item.kind === "gradient" && item.partner) head.appendChild(el("span", "nbg-note nbg-of", ` of ${item.partner}`));
  box.appendChild(head);
  if (item.note) box.appendChild(el("div", "nbg-note nbg-warning", item.note));
  if (item.kind === "value" || item.kind === "steps") {
    box.appendChild(item.steps ? stepsView(item, palettes) : el("div", "nbg-summary", item.value));
    if (item.topk) box.appendChild(topkView(item.topk));
    return box;
  }
  if (item.kind === "graph") {  // an SVG picture as an image (never markup in the page); it has its own title
    if (!String(item.image).startsWith("data:image/svg+xml;base64,")) return box;
    const frame = Object.assign(el("div", "nbg-graph"), { style: "overflow-x: auto" });  // scrolls, never shrinks
    frame.appendChild(Object.assign(el("img"), { src: item.image, style: "max-width: none" }));
    head.replaceWith(frame);
    return box;
  }
  box.appendChild(summaryLine(item));
  const row = box.appendChild(el("div", "nbg-row"));
  if (item.heatmap) row.appendChild(heatmapView(item, palettes));
  if (item.histogram) row.appendChild(histogramView(item.histogram));
  if (item.topk) box.appendChild(topkView(item.topk));
  return box;
}

// A gradient joins the tab of the value it flowed into, whichever of the two was saved first.
function groupItems(items) {
  const byName = new Map(items.map((item) => [item.name, item]));
  const head = (item, seen) => {
    const up = item.kind === "gradient" ? byName.get(item.partner) : undefined;
    return up && up !== item && !seen.has(up) ? head(up, seen.add(item)) : item;
  };
  const groups = new Map();
  for (const item of items) {
    const top = head(item, new Set());
    if (!groups.has(top)) groups.set(top, [top]);
    if (item !== top) groups.get(top).push(item);
  }
  return [...groups.values()];
}

// The tabs: with invokes, one per invoke (titled with its input) and one for the whole batch, each
// holding its own values; otherwise one per value with its gradient beside it. The graph tab comes last.
function tabsOf(payload) {
  const tabbed = payload.tabs || [];
  const groups = tabbed.map((tab, index) => ({ label: tab.title, about: tab.about,
    items: payload.items.filter((item) => item.tab === index) }));
  for (const items of groupItems(payload.items.filter((item) => item.tab === undefined))) {
    groups.push({ label: items.map((item) => item.name).join(" + "), items });
  }
  if (payload.graph) groups.push({ label: "graph", items: [{ name: "graph", kind: "graph", image: payload.graph }] });
  return groups;
}

export function renderPanel(root, payload) {
  root.replaceChildren();
  const panel = el("div", "nbgrad-panel");
  if (payload.title) panel.appendChild(el("div", "nbg-title", payload.title));
  for (const note of payload.notes || []) panel.appendChild(el("div", "nbg-note", note));
  const groups = tabsOf(payload);
  const tabs = el("div", "nbg-tabs");
  const body = el("div", "nbg-body");
  const select = (index) => {
    tabs.querySelectorAll(".nbg-tab").forEach((tab, i) => tab.classList.toggle("nbg-active", i === index));
    const row = el("div", "nbg-row");
    for (const item of groups[index].items) row.appendChild(card(item, payload.palettes));
    if (!groups[index].items.length) row.appendChild(el("div", "nbg-note", "nothing saved here"));
    const about = groups[index].about ? [el("div", "nbg-note nbg-about", groups[index].about)] : [];
    body.replaceChildren(...about, row);
  };
  groups.forEach((group, index) => {
    const tab = el("button", "nbg-tab", group.label);
    Object.assign(tab, { type: "button", title: group.about || "" });
    tab.addEventListener("click", () => select(index));
    tabs.appendChild(tab);
  });
  if (groups.length > 1) panel.appendChild(tabs);
  panel.appendChild(body);
  if (groups.length) select(0);
  if (payload.footer) panel.appendChild(el("div", "nbg-footer", payload.footer));   // views/footer.py
  root.appendChild(panel);
}

export default {
  render({ model, el: root }) {
    const draw = () => renderPanel(root, model.get("payload"));
    model.on("change:payload", draw);
    draw();
  },
};
