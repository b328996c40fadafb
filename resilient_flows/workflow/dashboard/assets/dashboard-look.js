// The dashboard page's look, shared by every section of dashboard.js: its constants (states,
// colors, event markers, Plotly's fonts), how numbers and times read, and the small elements
// built from them. Values from the run become text nodes here (el), or escaped Plotly text
// (plotText), never markup. Loaded before dashboard.js, which takes what it needs from RFLook.
"use strict";

window.RFLook = (() => {
  const STATES = ["planned", "queued", "running", "retrying", "preempted", "failed", "finished", "retired"];
  const FAMILY_COLORS = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  ];
  // Chosen members' curves, dark over the families' light bands, and the best members' when one
  // family is drawn (with several, the best members take their family's color).
  const MEMBER_COLORS = [
    "#1b1f24", "#b3186b", "#0a6e3c", "#6e3b00", "#4b32a8",
    "#00727d", "#a40e0e", "#6b6b00", "#b35900", "#2d5fa6",
  ];
  // One look per kind of event, shared by the timeline and a member's own curve.
  const KIND_STYLE = {
    failed: { symbol: "x", color: "#cf222e" },
    lost: { symbol: "x-thin-open", color: "#82071e" },
    retried: { symbol: "circle-open", color: "#d4760a" },
    preempted: { symbol: "diamond", color: "#a371f7" },
    declined: { symbol: "diamond-open", color: "#8c959f" },
    resumed: { symbol: "triangle-up", color: "#1a7f37" },
    cloned: { symbol: "star", color: "#0969da" },
    forked: { symbol: "star-open", color: "#0969da" },
    clone_requested: { symbol: "star-triangle-up-open", color: "#54aeff" },
    exploited: { symbol: "hexagram", color: "#1b7c83" },
    ondemand: { symbol: "square", color: "#9c755f" },
    draining: { symbol: "hourglass", color: "#57606a" },
    drained: { symbol: "bowtie", color: "#57606a" },
    tuned: { symbol: "diamond-wide", color: "#17becf" },
    warning: { symbol: "triangle-down", color: "#bf8700" },
    branch: { symbol: "star-diamond", color: "#0969da" },
    clone: { symbol: "star-square-open", color: "#54aeff" },
  };
  const FONT = { family: "system-ui, -apple-system, Segoe UI, Roboto, Arial, sans-serif", size: 11, color: "#1f2328" };
  const GRID = "#eef0f3";
  const PLOT_CONFIG = {
    displaylogo: false,
    responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"],
  };

  const SMALL_PLOT = { displayModeBar: false };

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // Plotly reads names, hover texts and tick labels as a little HTML: escape what the run wrote.
  function plotText(value) {
    return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  const collator = new Intl.Collator("en", { numeric: true, sensitivity: "base" });

  function fmtLoss(x) {
    if (!isNum(x)) return "—";
    const a = Math.abs(x);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(2) : x.toPrecision(4);
  }
  const fmtInt = (x) => (isNum(x) ? Math.round(x).toLocaleString("en-US") : "—");
  function fmtRate(x) {
    if (!isNum(x)) return "—";
    return x >= 99.5 ? fmtInt(x) : x.toFixed(x >= 9.95 ? 1 : 2);
  }
  const fmtMs = (x) => (isNum(x) ? (x >= 100 ? fmtInt(x) : x.toPrecision(3)) : "—");
  function fmtValue(x) {
    if (isNum(x)) return Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(4)));
    if (x === null || x === undefined) return "—";
    return typeof x === "object" ? JSON.stringify(x) : String(x);
  }
  const fmtFields = (obj) =>
    obj && typeof obj === "object" && Object.keys(obj).length
      ? Object.entries(obj).map(([k, v]) => `${k}=${fmtValue(v)}`).join(", ")
      : "—";

  function fmtDuration(s) {
    if (!isNum(s)) return "—";
    s = Math.max(0, s);
    if (s < 60) return `${Math.round(s)} s`;
    const pad = (n) => String(n).padStart(2, "0");
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
    const h = Math.floor(m / 60);
    if (h < 24) return `${h}h ${pad(m % 60)}m`;
    return `${Math.floor(h / 24)}d ${pad(h % 24)}h`;
  }
  function fmtBytes(n) {
    if (!isNum(n)) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  }
  const pad2 = (n) => String(n).padStart(2, "0");
  function fmtClock(t) {
    if (!isNum(t)) return "—";
    const d = new Date(t * 1000);
    return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
  }
  function fmtDate(t) {
    if (!isNum(t)) return "—";
    const d = new Date(t * 1000);
    return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${fmtClock(t)}`;
  }
  // A local time as Plotly's date axes take it (they know no time zones).
  function plotTime(t) {
    const d = new Date(t * 1000);
    return `${fmtDate(t)}.${String(d.getMilliseconds()).padStart(3, "0")}`;
  }

  // A family keeps the color it got first, for the page's life.
  const familyColors = new Map();
  function colorOf(family) {
    if (!familyColors.has(family)) familyColors.set(family, FAMILY_COLORS[familyColors.size % FAMILY_COLORS.length]);
    return familyColors.get(family);
  }
  function withAlpha(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  function chip(stateName, text) {
    const known = STATES.includes(stateName) ? stateName : "plain";
    return el("span", `chip ${known}`, text === undefined ? stateName : text);
  }

  function progressBar(done, total) {
    const bar = el("div", "bar");
    const track = el("div", "track");
    const fill = el("div", "fill");
    const fraction = total > 0 ? Math.min(1, done / total) : 0;
    fill.style.width = `${(fraction * 100).toFixed(1)}%`;
    if (fraction >= 1) fill.classList.add("done");
    track.append(fill);
    bar.append(track, el("span", "label", `${Math.floor(fraction * 100)}%`));
    bar.title = `${fmtInt(done)} / ${fmtInt(total)} steps`;
    return bar;
  }

  function smallTable(columns, rows) {
    const table = el("table", "small-table");
    const head = el("tr");
    for (const c of columns) head.append(el("th", c.num ? "num" : "", c.label));
    table.append(el("thead"));
    table.tHead.append(head);
    const body = el("tbody");
    for (const row of rows) {
      const tr = el("tr");
      for (const c of columns) tr.append(el("td", c.num ? "num" : "", c.get(row)));
      body.append(tr);
    }
    table.append(body);
    const wrap = el("div", "scroll");
    wrap.append(table);
    return wrap;
  }

  function facts(dl, pairs) {
    const items = [];
    for (const [label, value, className, title] of pairs) {
      const div = el("div");
      const dd = value instanceof Node ? el("dd") : el("dd", className, value);
      if (value instanceof Node) dd.append(value);
      if (title) dd.title = title;
      div.append(el("dt", "", label), dd);
      items.push(div);
    }
    dl.replaceChildren(...items);
  }

  function plot(div, traces, layout, config) {
    const base = {
      margin: { l: 52, r: 10, t: 8, b: 36 },
      font: FONT,
      paper_bgcolor: "#fff",
      plot_bgcolor: "#fff",
      hovermode: "closest",
      legend: { font: { size: 10 } },
    };
    return Plotly.react(div, traces, { ...base, ...layout }, { ...PLOT_CONFIG, ...config });
  }

  function emptyNote(text) {
    return [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: "#656d76", size: 12 } }];
  }


  // The loss at `step` on a curve (the last point at or before it).
  function lossAt(curve, step) {
    const steps = curve.steps;
    let lo = 0;
    let hi = steps.length - 1;
    if (hi < 0) return null;
    if (step <= steps[0]) return curve.loss[0];
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (steps[mid] <= step) lo = mid;
      else hi = mid - 1;
    }
    return curve.loss[lo];
  }

  function laneOf(entry, blocks) {
    if (entry.block === null || entry.block === undefined) return "run";
    const hosts = blocks[entry.block] || [];
    const shown = hosts.slice(0, 3).join(", ") + (hosts.length > 3 ? `, +${hosts.length - 3}` : "");
    return `block ${entry.block}` + (shown ? ` (${shown})` : "");
  }

  return {
    STATES,
    MEMBER_COLORS,
    KIND_STYLE,
    GRID,
    SMALL_PLOT,
    el,
    plotText,
    isNum,
    collator,
    fmtLoss,
    fmtInt,
    fmtRate,
    fmtMs,
    fmtValue,
    fmtFields,
    fmtDuration,
    fmtBytes,
    fmtClock,
    fmtDate,
    plotTime,
    colorOf,
    withAlpha,
    chip,
    progressBar,
    smallTable,
    facts,
    plot,
    emptyNote,
    lossAt,
    laneOf,
  };
})();
