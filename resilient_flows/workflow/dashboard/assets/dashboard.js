// The resilient-flows dashboard page: one run's families, members, curves, faults, checkpoints
// and lineage. Served live it polls `api/run?since=GENERATION` and fetches `api/member/NAME` for
// the members the user chooses; written as a report it reads everything from the `rf-data`
// element and fetches nothing.
//
// Every value from the run (member names, errors, overrides, host names) is untrusted: it reaches
// the page as text nodes (textContent) and reaches Plotly escaped (plotText), never as markup.
// After each full draw of a document the body carries `data-rendered="GENERATION"`; once its
// tables (header, families, members, lineage) are drawn, before the plots, `data-tables`.
"use strict";

(() => {
  const POLL_MS = 2000;
  const ANSWER_MS = 15000; // a request the server has not answered by then has failed
  const ROWS_PER_PAGE = 100;
  const MAX_CURVES = 30; // chosen members drawn over the bands
  const LARGE_TREE = 40; // lineage trees with more nodes start collapsed
  const SAVES_SHOWN = 1500; // points of the stall plot; more are thinned evenly
  const LEGEND_CURVES = 12; // members' curves named in the legend; more are named on hover only
  const { STATES, MEMBER_COLORS, KIND_STYLE, GRID, SMALL_PLOT, el, plotText, isNum, collator, fmtLoss, fmtInt,
    fmtRate, fmtMs, fmtValue, fmtFields, fmtDuration, fmtBytes, fmtClock, fmtDate, plotTime, colorOf, withAlpha, chip,
    progressBar, smallTable, facts, plot, emptyNote, lossAt,
    laneOf } = window.RFLook;

  const $ = (id) => document.getElementById(id);
  const embedded = $("rf-data");
  // Plotly's bundle takes the longest to load: the tables are drawn from the first document
  // while it does, the plots once it has.
  const plotlyReady = new Promise((resolve, reject) => {
    if (window.Plotly) resolve();
    $("plotly-js").addEventListener("load", () => resolve());
    $("plotly-js").addEventListener("error", () => reject(new Error("assets/plotly.min.js did not load")));
  });
  const report = embedded ? JSON.parse(embedded.textContent) : null;

  const ui = {
    doc: null,
    received: 0, // Date.now() when the document arrived
    byName: new Map(),
    lineage: new Map(),
    sort: { key: "name", dir: 1 },
    filters: { state: "", family: "", name: "" },
    page: 0,
    chosen: new Set(),
    focus: null,
    details: new Map(), // name -> {generation, data}
    loading: new Set(),
    drawn: {}, // section -> signature of what it shows
    lineageOpen: new Map(),
    curveFamily: "",
    logY: true,
    connected: null,
    observing: false,
  };

  // Whether `value` differs from what `section` shows (which from now on it does).
  function changed(section, value) {
    const signature = JSON.stringify(value);
    if (ui.drawn[section] === signature) return false;
    ui.drawn[section] = signature;
    return true;
  }

  // ------------------------------------------------------------------ header

  function lastActivity(doc) {
    if (isNum(doc.run.last_event)) return doc.run.last_event;
    let last = doc.run.started;
    for (const e of doc.timeline) if (isNum(e.time) && !(e.time <= last)) last = e.time;
    for (const s of doc.saves) if (isNum(s.time) && !(s.time <= last)) last = s.time;
    return last;
  }

  // Who holds the run, in words that never deny members whose heartbeats are fresh.
  function runnerText(r) {
    const who = `${r.pid}@${r.host}`;
    const beating = r.beating.length;
    const still = beating ? `; ${beating} member${beating > 1 ? "s" : ""} still training` : "";
    if (r.state === "holding") return `runner ${who}`;
    if (r.state === "gone") return `runner ${who} gone${still || "; resume to continue"}`;
    return `no runner${r.state === "ended" ? " (ended)" : ""}${still}`;
  }

  function renderHeader() {
    const doc = ui.doc;
    const run = doc.run;
    $("run-name").textContent = run.name;
    document.title = `${run.name} · resilient-flows`;
    const runner = el("span", "", runnerText(run.runner));
    const held = run.runner.state === "holding";
    const training = held || run.runner.beating.length > 0;
    runner.style.color = held ? "var(--ok)" : run.runner.state === "gone" ? "var(--warn)" : "var(--muted)";
    const now = report ? doc.written : doc.written + (Date.now() - ui.received) / 1000;
    const end = training ? now : lastActivity(doc);
    const pairs = [
      ["site", run.site],
      ["run dir", run.run_dir, "mono", run.run_dir],
      ["", runner],
      ["started", fmtDate(run.started)],
      ["elapsed", isNum(run.started) && isNum(end) ? fmtDuration(end - run.started) : "—"],
    ];
    if (report) pairs.push(["", `report written at ${fmtDate(doc.written)}`]);
    else pairs.push(["updated", `${fmtClock(doc.written)} (${fmtDuration((Date.now() - ui.received) / 1000)} ago)`]);
    facts($("run-facts"), pairs);
  }

  function setLive(mode, text) {
    const live = $("live");
    live.className = `live ${mode}`;
    $("live-text").textContent = text;
  }

  function renderDamage() {
    const damage = ui.doc.damage || [];
    const box = $("damage");
    if (!changed("damage", damage)) return;
    box.hidden = damage.length === 0;
    if (!damage.length) return;
    const list = el("ul");
    for (const d of damage.slice(0, 8)) {
      const lines = d.lines || [];
      const what = d.problem
        ? d.problem
        : `${lines.length} damaged line${lines.length === 1 ? "" : "s"}` +
          (lines.length ? ` (line ${lines[0].line}: ${lines[0].problem})` : "");
      list.append(el("li", "", `${d.file}: ${what}`));
    }
    if (damage.length > 8) list.append(el("li", "", `… and ${damage.length - 8} more files`));
    box.replaceChildren(el("strong", "", `Damaged files in the run directory (passed over): ${damage.length}`), list);
  }

  // ------------------------------------------------------------------ families

  function renderFamilies() {
    const rows = ui.doc.families.map((f) => {
      const tr = el("tr");
      const name = el("td");
      const swatch = el("span", "swatch");
      swatch.style.background = colorOf(f.family);
      name.append(swatch, document.createTextNode(f.family));
      const states = el("td");
      for (const s of STATES) if (f.states[s]) states.append(chip(s, `${s} ${f.states[s]}`));
      const progress = el("td");
      progress.append(progressBar(f.steps_done, f.steps_total));
      tr.append(
        name,
        el("td", "num", fmtInt(f.members)),
        states,
        progress,
        el("td", "num", fmtLoss(f.best_loss)),
        el("td", "num", fmtLoss(f.median_loss)),
        el("td", "num", fmtInt(f.failures)),
        el("td", "num", fmtRate(f.steps_per_s)),
        el("td", "num", fmtDuration(f.eta_s)),
      );
      return tr;
    });
    $("families-table").tBodies[0].replaceChildren(...rows);
  }

  // ------------------------------------------------------------------ member table

  const stateRank = (s) => (STATES.includes(s) ? STATES.indexOf(s) : STATES.length);
  const COLUMNS = [
    { key: "name", label: "member", get: (m) => m.name, text: true, cls: "name" },
    { key: "family", label: "family", get: (m) => m.family, text: true },
    { key: "state", label: "state", get: (m) => stateRank(m.state) },
    { key: "progress", label: "progress", get: (m) => (m.steps > 0 ? m.steps_done / m.steps : null) },
    { key: "loss", label: "loss", get: (m) => m.loss, fmt: fmtLoss, num: true },
    { key: "attempts", label: "attempts", get: (m) => m.attempts, fmt: fmtInt, num: true },
    { key: "retries", label: "retries", get: (m) => m.retries, fmt: fmtInt, num: true },
    { key: "failures", label: "failures", get: (m) => m.failures, fmt: fmtInt, num: true },
    { key: "preemptions", label: "preempt.", get: (m) => m.preemptions, fmt: fmtInt, num: true },
    { key: "node", label: "ckpt node", get: (m) => m.checkpoint.node, fmt: fmtValue, num: true },
    { key: "shared", label: "ckpt shared", get: (m) => m.checkpoint.shared, fmt: fmtValue, num: true },
    { key: "stall", label: "stall p50 ms", get: (m) => m.stall_ms_median, fmt: fmtMs, num: true },
    { key: "rate", label: "steps/s", get: (m) => m.steps_per_s, fmt: fmtRate, num: true },
    { key: "error", label: "last error", get: (m) => m.error, text: true, cls: "error" },
  ];
  const COLUMN = Object.fromEntries(COLUMNS.map((c) => [c.key, c]));

  function buildTableHead() {
    const row = $("members-table").tHead.rows[0];
    for (const c of COLUMNS) {
      const th = el("th", c.num ? "num" : "", c.label);
      th.dataset.key = c.key;
      th.title = `sort by ${c.label}`;
      row.append(th);
    }
  }

  const absent = (x) => x === null || x === undefined;

  function visibleMembers() {
    const { state, family, name } = ui.filters;
    const needle = name.toLowerCase();
    const rows = ui.doc.members.filter(
      (m) =>
        (!state || m.state === state) &&
        (!family || m.family === family) &&
        (!needle || m.name.toLowerCase().includes(needle)),
    );
    const get = COLUMN[ui.sort.key].get;
    const dir = ui.sort.dir;
    const text = COLUMN[ui.sort.key].text;
    const keyed = rows.map((m) => [get(m), m]);
    // members without a value last whichever the direction; ties in name order
    keyed.sort(([a, m], [b, n]) => {
      if (absent(a) || absent(b)) return absent(a) - absent(b) || collator.compare(m.name, n.name);
      return dir * (text ? collator.compare(a, b) : a - b) || collator.compare(m.name, n.name);
    });
    return keyed.map((k) => k[1]);
  }

  function memberCell(column, m) {
    const td = el("td", [column.cls, column.num ? "num" : ""].filter(Boolean).join(" "));
    if (column.key === "state") td.append(chip(m.state));
    else if (column.key === "progress") td.append(progressBar(m.steps_done, m.steps));
    else if (column.text) {
      const value = column.get(m);
      td.textContent = absent(value) ? "" : value;
      if (value) td.title = value;
    } else td.textContent = column.fmt(column.get(m));
    if (column.key === "shared" && isNum(m.checkpoint.node) && !(m.checkpoint.shared >= m.checkpoint.node)) {
      td.style.color = "var(--warn)";
      td.title = "the shared tier lags the node-local one";
    }
    return td;
  }

  function renderTable() {
    const rows = visibleMembers();
    const pages = Math.max(1, Math.ceil(rows.length / ROWS_PER_PAGE));
    ui.page = Math.min(ui.page, pages - 1);
    const first = ui.page * ROWS_PER_PAGE;
    const shown = rows.slice(first, first + ROWS_PER_PAGE);
    const body = shown.map((m) => {
      const tr = el("tr");
      tr.dataset.name = m.name;
      if (ui.chosen.has(m.name)) tr.classList.add("chosen");
      if (ui.focus === m.name) tr.classList.add("focus");
      for (const c of COLUMNS) tr.append(memberCell(c, m));
      return tr;
    });
    $("members-table").tBodies[0].replaceChildren(...body);
    for (const th of $("members-table").tHead.rows[0].cells) {
      th.classList.toggle("sorted", th.dataset.key === ui.sort.key);
      th.classList.toggle("desc", th.dataset.key === ui.sort.key && ui.sort.dir < 0);
    }
    const total = ui.doc.members.length;
    const range = rows.length ? `${fmtInt(first + 1)}–${fmtInt(first + shown.length)} of ${fmtInt(rows.length)}` : "no member";
    $("page-info").textContent = rows.length === total ? range : `${range} (filtered from ${fmtInt(total)})`;
    $("page-prev").disabled = ui.page === 0;
    $("page-next").disabled = ui.page >= pages - 1;
    $("chosen-note").textContent = ui.chosen.size ? `${ui.chosen.size} chosen` : "click rows to choose members";
    $("clear-chosen").hidden = ui.chosen.size === 0;
  }

  function setOptions(select, values, counts) {
    const current = select.value;
    const options = [el("option", "", "all")];
    options[0].value = "";
    const listed = current && !values.includes(current) ? [...values, current] : values;
    for (const v of listed) {
      const option = el("option", "", counts ? `${v} (${counts[v] || 0})` : v);
      option.value = v;
      options.push(option);
    }
    select.replaceChildren(...options);
    select.value = current;
  }

  function renderFilterOptions() {
    const counts = {};
    for (const m of ui.doc.members) counts[m.state] = (counts[m.state] || 0) + 1;
    const families = ui.doc.families.map((f) => f.family);
    if (changed("filter-options", [counts, families])) {
      const states = Object.keys(counts).sort((a, b) => stateRank(a) - stateRank(b));
      setOptions($("filter-state"), states, counts);
      setOptions($("filter-family"), families, null);
      const select = $("curve-family");
      const current = select.value;
      const options = [el("option", "", "all families")];
      options[0].value = "";
      for (const f of families) {
        const option = el("option", "", f);
        option.value = f;
        options.push(option);
      }
      select.replaceChildren(...options);
      select.value = families.includes(current) ? current : "";
      ui.curveFamily = select.value;
    }
  }

  function toggleChosen(name) {
    if (ui.chosen.has(name)) {
      ui.chosen.delete(name);
      if (ui.focus === name) ui.focus = [...ui.chosen].pop() || null;
    } else {
      ui.chosen.add(name);
      ui.focus = name;
      ensureDetails(name);
    }
    renderTable();
    redrawMembers();
  }

  function focusMember(name) {
    if (!ui.byName.has(name)) return;
    ui.chosen.add(name);
    ui.focus = name;
    ensureDetails(name);
    renderTable();
    redrawMembers();
  }

  // ------------------------------------------------------------------ member details

  function detailsOf(name) {
    if (report) return report.members[name] || null;
    const held = ui.details.get(name);
    return held ? held.data : null;
  }

  // Fetch a member's details unless those of this generation are held or on their way.
  function ensureDetails(name) {
    if (report || ui.loading.has(name)) return;
    const held = ui.details.get(name);
    const generation = ui.doc ? ui.doc.generation : null;
    if (held && held.generation === generation) return;
    ui.loading.add(name);
    const options = { cache: "no-store", credentials: "same-origin", signal: AbortSignal.timeout(ANSWER_MS) };
    fetch(`api/member/${encodeURIComponent(name)}`, options)
      .then((response) => (response.ok ? response.json() : null))
      .then((data) => {
        if (data) ui.details.set(name, { generation, data });
      })
      .catch(() => {}) // the poll reports a server that is gone
      .finally(() => {
        ui.loading.delete(name);
        redrawMembers();
      });
  }

  function chosenForCurves() {
    return [...ui.chosen].slice(0, MAX_CURVES);
  }

  function refreshDetails() {
    for (const name of chosenForCurves()) ensureDetails(name);
    if (ui.focus) ensureDetails(ui.focus);
    for (const name of ui.details.keys()) if (!ui.chosen.has(name) && name !== ui.focus) ui.details.delete(name);
  }

  function redrawMembers() {
    if (ui.doc && window.Plotly) {
      drawCurves();
      renderDetail();
    }
  }

  // ------------------------------------------------------------------ loss curves

  function drawCurves() {
    const doc = ui.doc;
    const family = ui.curveFamily;
    const families = doc.families.map((f) => f.family).filter((f) => !family || f === family);
    const members = [];
    let note;
    if (ui.chosen.size) {
      for (const name of chosenForCurves()) {
        const row = ui.byName.get(name);
        const details = detailsOf(name);
        if (row && details && (!family || row.family === family)) members.push([name, row.family, details.curve]);
      }
      note = ui.chosen.size > MAX_CURVES ? `the first ${MAX_CURVES} of ${ui.chosen.size} chosen` : "chosen members";
    } else {
      for (const f of families) {
        for (const name of doc.highlighted[f] || []) {
          if (doc.curves[name]) members.push([name, f, doc.curves[name]]);
        }
      }
      note = "median and 10–90% band per family, its best members over it; click rows to choose others";
    }
    const bands = families.map((f) => [f, doc.bands[f] || null]);
    if (!changed("curves", [bands, members, ui.logY])) return null;
    $("curve-note").textContent = note;
    // the bands under the members' curves, the medians over them
    const traces = [];
    const medians = [];
    for (const [f, band] of bands) {
      if (!band) continue;
      const color = colorOf(f);
      const inside = band.steps.map((_, i) => i).filter((i) => isNum(band.p10[i]) && isNum(band.p90[i]));
      const back = [...inside].reverse();
      traces.push({
        x: [...inside.map((i) => band.steps[i]), ...back.map((i) => band.steps[i])],
        y: [...inside.map((i) => band.p90[i]), ...back.map((i) => band.p10[i])],
        mode: "lines",
        line: { width: 0, color },
        fill: "toself",
        fillcolor: withAlpha(color, 0.16),
        legendgroup: f,
        hoverinfo: "skip",
        showlegend: false,
        name: plotText(`${f} 10–90%`),
      });
      medians.push({
        x: band.steps,
        y: band.p50,
        mode: "lines",
        legendgroup: f,
        legendrank: 1,
        line: { width: 2.5, color },
        name: plotText(`${f} median (${band.count})`),
        hovertemplate: "%{fullData.name}<br>step %{x}<br>loss %{y:.4g}<extra></extra>",
      });
    }
    members.forEach(([name, f, curve], i) => {
      const color = bands.length > 1 && !ui.chosen.size ? colorOf(f) : MEMBER_COLORS[i % MEMBER_COLORS.length];
      traces.push({
        x: curve.steps,
        y: curve.loss,
        mode: "lines",
        line: { width: ui.chosen.size ? 1.6 : 1.2, color },
        name: plotText(name),
        showlegend: members.length <= LEGEND_CURVES,
        hovertemplate: "%{fullData.name}<br>step %{x}<br>loss %{y:.4g}<extra></extra>",
      });
    });
    traces.push(...medians);
    return plot($("curves-plot"), traces, {
      uirevision: `${family}|${ui.logY}`,
      margin: { l: 52, r: 10, t: 28, b: 36 },
      xaxis: { title: { text: "step" }, gridcolor: GRID, zeroline: false },
      yaxis: { title: { text: "loss" }, ...lossAxis(traces) },
      annotations: traces.length ? [] : emptyNote("no loss logged yet"),
    });
  }

  function lossAxis(traces) {
    const axis = { type: ui.logY ? "log" : "linear", gridcolor: GRID, zeroline: false };
    if (!ui.logY) return axis;
    let low = Infinity;
    let high = 0;
    for (const t of traces) {
      for (const y of t.y) {
        if (isNum(y) && y > 0) {
          low = Math.min(low, y);
          high = Math.max(high, y);
        }
      }
    }
    // over several decades only the decades are labelled, as powers of ten; within a few, 1-2-5
    if (high / low > 100) return { ...axis, minorloglabels: "none", exponentformat: "power" };
    return { ...axis, dtick: "D2", tickformat: ".2~g" };
  }

  function memberMarks(name, details) {
    const marks = details.markers.map((m) => ({ kind: m.kind, step: m.step, text: `${m.kind}: ${m.text}` }));
    const own = ui.lineage.get(name);
    if (own && own.parent && isNum(own.step)) {
      marks.push({
        kind: "branch",
        step: own.step,
        text: `branched from ${own.parent} at step ${own.step}` + (own.transport ? ` via ${own.transport}` : ""),
      });
    }
    for (const child of details.children) {
      const entry = ui.lineage.get(child);
      if (entry && isNum(entry.step)) marks.push({ kind: "clone", step: entry.step, text: `clone ${child} branched here` });
    }
    return marks;
  }

  function renderDetail() {
    const name = ui.focus;
    const row = name ? ui.byName.get(name) : null;
    const details = name ? detailsOf(name) : null;
    if (!changed("detail", [name, row, details, name && ui.lineage.get(name), ui.logY])) return;
    $("detail-empty").hidden = Boolean(row);
    $("detail-body").hidden = !row;
    const title = $("detail-title");
    if (!row) {
      title.replaceChildren();
      return;
    }
    title.replaceChildren(el("span", "name", row.name), chip(row.state));
    const own = ui.lineage.get(name);
    const parent = row.parent ? el("button", "linklike", row.parent) : "none";
    if (row.parent) parent.addEventListener("click", () => focusMember(row.parent));
    const pairs = [
      ["family", row.family],
      ["progress", `${fmtInt(row.steps_done)} / ${fmtInt(row.steps)}`],
      ["loss", fmtLoss(row.loss)],
      ["host", row.host ? `${row.host}${row.block !== null ? ` (block ${row.block})` : ""}` : "—"],
      ["attempts", `${row.attempts} (retries ${row.retries}, failures ${row.failures}, preemptions ${row.preemptions})`],
      ["checkpoint", `node ${fmtValue(row.checkpoint.node)}, shared ${fmtValue(row.checkpoint.shared)}`],
      ["parent", parent],
    ];
    if (own && own.parent) pairs.push(["overrides", fmtFields(own.overrides)]);
    if (row.error) pairs.push(["last error", row.error, "", row.error]);
    facts($("detail-facts"), pairs);
    if (!details) {
      $("detail-attempts").replaceChildren(el("div", "empty", "loading…"));
      $("detail-shared").replaceChildren();
      $("detail-children").replaceChildren();
      $("detail-saves-note").textContent = "";
      Plotly.purge($("detail-plot"));
      Plotly.purge($("detail-saves"));
      return;
    }
    drawDetailCurve(name, row, details);
    renderDetailTables(details);
  }

  function drawDetailCurve(name, row, details) {
    const curve = details.curve;
    const traces = [
      {
        x: curve.steps,
        y: curve.loss,
        mode: "lines",
        line: { width: 1.4, color: colorOf(row.family) },
        name: "loss",
        hovertemplate: "step %{x}<br>loss %{y:.4g}<extra></extra>",
      },
    ];
    const groups = new Map();
    for (const mark of memberMarks(name, details)) {
      if (!isNum(mark.step)) continue;
      if (!groups.has(mark.kind)) groups.set(mark.kind, []);
      groups.get(mark.kind).push(mark);
    }
    for (const [kind, marks] of groups) {
      const style = KIND_STYLE[kind] || { symbol: "circle", color: "#57606a" };
      traces.push({
        x: marks.map((m) => m.step),
        y: marks.map((m) => lossAt(curve, m.step)),
        mode: "markers",
        name: kind,
        marker: { symbol: style.symbol, color: style.color, size: 10, line: { width: 1.5, color: style.color } },
        hovertext: marks.map((m) => plotText(m.text)),
        hovertemplate: "%{hovertext}<br>step %{x}<extra></extra>",
      });
    }
    plot($("detail-plot"), traces, {
      uirevision: `${name}|${ui.logY}`,
      margin: { l: 48, r: 8, t: groups.size ? 24 : 6, b: 32 },
      showlegend: groups.size > 0,
      legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom", font: { size: 10 } },
      xaxis: { title: { text: "step" }, gridcolor: GRID, zeroline: false },
      yaxis: lossAxis(traces),
      annotations: curve.steps.length ? [] : emptyNote("no loss logged yet"),
    },
    SMALL_PLOT,
    );
    const saves = details.saves;
    const stalls = saves.filter((s) => isNum(s.stall_ms)).map((s) => s.stall_ms).sort((a, b) => a - b);
    const median = stalls.length ? stalls[Math.floor(stalls.length / 2)] : null;
    $("detail-saves-note").textContent = saves.length
      ? `${saves.length} saves, median stall ${fmtMs(median)} ms, last at step ${saves[saves.length - 1].step}`
      : "none";
    plot(
      $("detail-saves"),
      [
        {
          x: saves.map((s) => s.step),
          y: saves.map((s) => s.stall_ms),
          type: "bar",
          marker: { color: "#8c959f" },
          hovertemplate: "step %{x}<br>stall %{y} ms<extra></extra>",
        },
      ],
      {
        uirevision: name,
        margin: { l: 48, r: 8, t: 4, b: 26 },
        showlegend: false,
        xaxis: { gridcolor: GRID, zeroline: false },
        yaxis: { title: { text: "stall ms" }, gridcolor: GRID, zeroline: false, rangemode: "tozero" },
        annotations: saves.length ? [] : emptyNote("no checkpoint saved"),
      },
      SMALL_PLOT,
    );
  }

  function renderDetailTables(details) {
    const unlisted = report ? "not kept in the report (serve the run to see it)" : "none";
    $("detail-attempts").replaceChildren(
      details.attempts.length
        ? smallTable(
            [
              { label: "#", get: (a) => a.attempt, num: true },
              { label: "steps", get: (a) => `${fmtValue(a.first_step)}–${fmtValue(a.last_step)}` },
              { label: "started", get: (a) => fmtClock(a.first_time) },
              {
                label: "ran",
                get: (a) => (isNum(a.first_time) && isNum(a.last_time) ? fmtDuration(a.last_time - a.first_time) : "—"),
              },
            ],
            details.attempts,
          )
        : el("div", "empty", "none"),
    );
    $("detail-shared").replaceChildren(
      details.shared.length
        ? smallTable(
            [
              { label: "step", get: (c) => fmtValue(c.step), num: true },
              { label: "size", get: (c) => fmtBytes(c.bytes), num: true },
              { label: "committed", get: (c) => fmtClock(c.created) },
              { label: "", get: (c) => (c.valid ? "ok" : c.problem || "invalid") },
            ],
            details.shared,
          )
        : el("div", "empty", unlisted),
    );
    const children = el("div", "children");
    for (const child of details.children) {
      const button = el("button", "linklike", child);
      button.addEventListener("click", () => focusMember(child));
      children.append(button);
    }
    $("detail-children").replaceChildren(details.children.length ? children : el("div", "empty", "none"));
  }

  // ------------------------------------------------------------------ timeline and saves

  // The plots below the fold are drawn when they come near the window, and drawn again for a new
  // document only while there: a live page of many members spends nothing on what is not seen.
  const inView = new Set();
  const observer = new IntersectionObserver(
    (entries) => {
      for (const entry of entries) {
        if (entry.isIntersecting) inView.add(entry.target.id);
        else inView.delete(entry.target.id);
      }
      if (ui.doc && window.Plotly) {
        drawTimeline();
        drawSaves();
      }
    },
    { rootMargin: "200px" },
  );

  function drawTimeline() {
    const doc = ui.doc;
    if (!inView.has("timeline-plot")) return null;
    if (!changed("timeline", [doc.timeline.length, doc.timeline[doc.timeline.length - 1], doc.blocks])) return null;
    const lanes = new Map(); // label -> block (null for the run)
    const kinds = new Map();
    for (const e of doc.timeline) {
      if (!isNum(e.time)) continue;
      const lane = plotText(laneOf(e, doc.blocks));
      lanes.set(lane, e.block === undefined ? null : e.block);
      if (!kinds.has(e.kind)) kinds.set(e.kind, []);
      kinds.get(e.kind).push([e, lane]);
    }
    const order = [...lanes.entries()].sort((a, b) => {
      if (a[1] === null || b[1] === null) return a[1] === null ? (b[1] === null ? 0 : -1) : 1;
      return collator.compare(String(a[1]), String(b[1]));
    });
    const traces = [...kinds.entries()].map(([kind, items]) => {
      const style = KIND_STYLE[kind] || { symbol: "circle", color: "#57606a" };
      return {
        x: items.map(([e]) => plotTime(e.time)),
        y: items.map(([, lane]) => lane),
        type: "scatter",
        mode: "markers",
        name: plotText(kind),
        marker: { symbol: style.symbol, color: style.color, size: 9, line: { width: 1.5, color: style.color } },
        hovertext: items.map(([e]) => plotText(`${e.member || "run"}: ${e.text}`)),
        hovertemplate: "%{hovertext}<br>%{x}<extra>%{fullData.name}</extra>",
      };
    });
    const height = Math.max(170, Math.min(560, 90 + 24 * lanes.size));
    const div = $("timeline-plot");
    div.style.height = `${height}px`;
    $("timeline-note").textContent = doc.timeline.length
      ? `${fmtInt(doc.timeline.length)} events in ${lanes.size} lane${lanes.size === 1 ? "" : "s"}`
      : "";
    return plot(div, traces, {
      uirevision: "timeline",
      margin: { l: 10, r: 10, t: 28, b: 30 },
      xaxis: { type: "date", gridcolor: GRID, zeroline: false },
      yaxis: {
        type: "category",
        categoryorder: "array",
        categoryarray: order.map((o) => o[0]),
        automargin: true,
        gridcolor: GRID,
      },
      legend: { font: { size: 10 }, itemsizing: "constant" },
      annotations: traces.length ? [] : emptyNote("no failures, retries, preemptions or clones yet"),
    });
  }

  function drawSaves() {
    const saves = ui.doc.saves;
    if (!inView.has("saves-plot")) return null;
    if (!changed("saves", [saves.length, saves[saves.length - 1]])) return null;
    const timed = saves.filter((s) => isNum(s.time) && isNum(s.stall_ms));
    const stride = Math.max(1, Math.ceil(timed.length / SAVES_SHOWN));
    const shown = stride > 1 ? timed.filter((_, i) => i % stride === 0) : timed;
    $("saves-note").textContent = timed.length
      ? `${fmtInt(timed.length)} newest saves` + (stride > 1 ? `, every ${stride}th shown` : "")
      : "";
    return plot(
      $("saves-plot"),
      [
        {
          x: shown.map((s) => plotTime(s.time)),
          y: shown.map((s) => s.stall_ms),
          type: "scatter",
          mode: "markers",
          marker: { size: 4, color: "#4e79a7", opacity: 0.6 },
          hovertext: shown.map((s) => plotText(s.member)),
          hovertemplate: "%{hovertext}<br>%{x}<br>stall %{y} ms<extra></extra>",
        },
      ],
      {
        uirevision: "saves",
        margin: { l: 52, r: 10, t: 26, b: 36 },
        showlegend: false,
        xaxis: { type: "date", gridcolor: GRID, zeroline: false },
        yaxis: { title: { text: "stall (ms)" }, gridcolor: GRID, zeroline: false, rangemode: "tozero" },
        annotations: shown.length ? [] : emptyNote("no checkpoint saved yet"),
      },
    );
  }

  // ------------------------------------------------------------------ lineage, tuning, decisions

  function renderLineage() {
    const entries = ui.doc.lineage;
    const children = new Map();
    for (const e of entries) {
      if (!e.parent) continue;
      if (!children.has(e.parent)) children.set(e.parent, []);
      children.get(e.parent).push(e);
    }
    const nodes = entries.filter((e) => e.parent || children.has(e.name));
    const tree = $("lineage-tree");
    if (!nodes.length) {
      tree.replaceChildren(el("div", "empty", "no clones: none in this run"));
      $("lineage-note").textContent = "";
      return;
    }
    const roots = nodes.filter((e) => !e.parent || !ui.lineage.has(e.parent));
    const collapsed = nodes.length > LARGE_TREE;
    $("lineage-note").textContent =
      `${nodes.length} members in ${roots.length} tree${roots.length === 1 ? "" : "s"}` + (collapsed ? ", collapsed" : "");
    const list = el("ul");
    for (const root of roots) list.append(treeItem(root, children, collapsed));
    tree.replaceChildren(list);
  }

  function treeItem(entry, children, collapsed) {
    const li = el("li");
    const label = el("span");
    const name = el("button", "linklike", entry.name);
    name.addEventListener("click", (event) => {
      event.preventDefault(); // a click on the name chooses the member, not folds the tree
      focusMember(entry.name);
    });
    label.append(name);
    const kids = children.get(entry.name) || [];
    const how = [];
    if (entry.parent && isNum(entry.step)) how.push(`at step ${entry.step}`);
    if (entry.parent && entry.transport) how.push(`via ${entry.transport}`);
    if (entry.parent && Object.keys(entry.overrides || {}).length) how.push(fmtFields(entry.overrides));
    if (kids.length) how.push(`${kids.length} clone${kids.length === 1 ? "" : "s"}`);
    if (how.length) label.append(" ", el("span", "how", how.join(" · ")));
    if (!kids.length) {
      li.className = "leaf";
      li.append(label);
      return li;
    }
    const details = el("details");
    const summary = el("summary");
    summary.append(label);
    details.append(summary);
    const fill = () => {
      if (details.childElementCount > 1) return;
      const list = el("ul");
      for (const kid of kids) list.append(treeItem(kid, children, collapsed));
      details.append(list);
    };
    const open = ui.lineageOpen.has(entry.name) ? ui.lineageOpen.get(entry.name) : !collapsed;
    if (open) {
      fill();
      details.open = true;
    }
    details.addEventListener("toggle", () => {
      ui.lineageOpen.set(entry.name, details.open);
      if (details.open) fill();
    });
    li.append(details);
    return li;
  }

  function renderTuned() {
    const tuned = ui.doc.tuned;
    $("tuned-table").replaceChildren(
      tuned.length
        ? smallTable(
            [
              { label: "time", get: (t) => fmtClock(t.time) },
              { label: "member", get: (t) => t.member || "—" },
              { label: "step", get: (t) => fmtValue(t.step), num: true },
              { label: "interval s", get: (t) => fmtValue(t.interval_s), num: true },
              { label: "shared every", get: (t) => fmtValue(t.shared_every), num: true },
              { label: "params", get: (t) => fmtFields(t.params) },
              { label: "observed", get: (t) => fmtFields(t.observed) },
            ],
            tuned,
          )
        : el("div", "empty", "none in this run"),
    );
  }

  function renderDecisions() {
    const decisions = ui.doc.decisions;
    $("decisions-table").replaceChildren(
      decisions.length
        ? smallTable(
            [
              { label: "time", get: (d) => fmtClock(d.time) },
              { label: "request", get: (d) => fmtValue(d.request) },
              { label: "slots", get: (d) => fmtValue(d.slots), num: true },
              { label: "policy", get: (d) => fmtValue(d.policy) },
              { label: "free", get: (d) => fmtValue(d.free), num: true },
              { label: "running", get: (d) => (Array.isArray(d.jobs) ? d.jobs.length : "—"), num: true },
              {
                label: "decision",
                get: (d) =>
                  Array.isArray(d.preempt) && d.preempt.length ? `preempt ${d.preempt.join(", ")}` : `wait ${fmtValue(d.delay)} s`,
              },
              { label: "cost", get: (d) => fmtValue(d.cost), num: true },
            ],
            decisions,
          )
        : el("div", "empty", "none in this run"),
    );
  }

  // ------------------------------------------------------------------ drawing a document

  function render(doc) {
    ui.doc = doc;
    ui.received = Date.now();
    ui.byName = new Map(doc.members.map((m) => [m.name, m]));
    ui.lineage = new Map(doc.lineage.map((e) => [e.name, e]));
    for (const f of doc.families) colorOf(f.family);
    if (ui.focus && !ui.byName.has(ui.focus)) ui.focus = null;
    for (const name of ui.chosen) if (!ui.byName.has(name)) ui.chosen.delete(name);
    renderHeader();
    renderDamage();
    if (changed("families", doc.families)) renderFamilies();
    renderFilterOptions();
    renderTable();
    if (changed("lineage", doc.lineage)) renderLineage();
    if (changed("tuned", doc.tuned)) renderTuned();
    if (changed("decisions", doc.decisions)) renderDecisions();
    refreshDetails();
    document.body.dataset.tables = String(doc.generation); // the run's numbers are on the page
    if (!ui.observing) {
      // from the first document on: before it, the empty page has everything in view
      ui.observing = true;
      observer.observe($("timeline-plot"));
      observer.observe($("saves-plot"));
    }
    plotlyReady
      .then(() => {
        if (ui.doc !== doc) return null; // a newer document draws instead
        const drawn = [drawCurves(), drawTimeline(), drawSaves()];
        renderDetail();
        return Promise.all(drawn).then(() => {
          document.body.dataset.rendered = String(doc.generation);
        });
      })
      .catch((error) => showProblem(error.message));
  }

  function showProblem(text) {
    const banner = $("banner");
    banner.hidden = !text;
    banner.textContent = text || "";
  }

  async function poll() {
    try {
      const since = ui.doc ? `?since=${encodeURIComponent(ui.doc.generation)}` : "";
      const response = await fetch(`api/run${since}`, {
        cache: "no-store",
        credentials: "same-origin",
        signal: AbortSignal.timeout(ANSWER_MS),
      });
      if (response.status === 403) {
        throw new Error("the server refused this page (403): open the URL with the token that `resilient-flows dashboard` printed");
      }
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const body = await response.json();
      showProblem(null);
      setLive("on", "live");
      ui.connected = true;
      if (!body.unchanged) render(body);
    } catch (error) {
      const since = ui.connected === false ? ui.lostAt : new Date();
      ui.connected = false;
      ui.lostAt = since;
      setLive("off", "disconnected");
      let reason = error.message;
      if (error instanceof TypeError) reason = "the dashboard server does not answer";
      else if (error.name === "TimeoutError") reason = `the dashboard server did not answer within ${ANSWER_MS / 1000} s`;
      showProblem(`${reason} (since ${fmtClock(since.getTime() / 1000)}); retrying every ${POLL_MS / 1000} s…`);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  // ------------------------------------------------------------------ wiring

  function wire() {
    buildTableHead();
    $("members-table").tHead.addEventListener("click", (event) => {
      const th = event.target.closest("th");
      if (!th || !ui.doc) return;
      const key = th.dataset.key;
      ui.sort = { key, dir: ui.sort.key === key ? -ui.sort.dir : 1 };
      ui.page = 0;
      renderTable();
    });
    $("members-table").tBodies[0].addEventListener("click", (event) => {
      const tr = event.target.closest("tr");
      if (tr && tr.dataset.name !== undefined) toggleChosen(tr.dataset.name);
    });
    const refilter = (key, value) => {
      ui.filters[key] = value;
      ui.page = 0;
      if (ui.doc) renderTable();
    };
    $("filter-state").addEventListener("change", (e) => refilter("state", e.target.value));
    $("filter-family").addEventListener("change", (e) => refilter("family", e.target.value));
    $("filter-name").addEventListener("input", (e) => refilter("name", e.target.value));
    $("page-prev").addEventListener("click", () => {
      ui.page = Math.max(0, ui.page - 1);
      renderTable();
    });
    $("page-next").addEventListener("click", () => {
      ui.page += 1;
      renderTable();
    });
    $("clear-chosen").addEventListener("click", () => {
      ui.chosen.clear();
      ui.focus = null;
      renderTable();
      redrawMembers();
    });
    $("curve-family").addEventListener("change", (e) => {
      ui.curveFamily = e.target.value;
      if (ui.doc) drawCurves();
    });
    $("log-y").addEventListener("change", (e) => {
      ui.logY = e.target.checked;
      redrawMembers();
    });
  }

  wire();
  if (report) {
    setLive("static", "report");
    render(report.document);
  } else {
    setInterval(() => ui.doc && renderHeader(), 1000);
    poll();
  }
})();
