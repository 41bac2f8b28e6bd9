// The pystatefun admin console: plain JS, no build step, no dependencies.
// Reads GET /plan once, GET /status every POLL_MS (rates are deltas between two polls), and
// GET /state/... and /addresses/.../timeline for the address lookup. Text goes into the page
// with textContent only. With a token set on the server, a request answered 401 asks for the
// token once; it is kept in sessionStorage and sent as "Authorization: Bearer".
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const TOKEN_KEY = "pystatefun-admin-token";
let previous = null; // {at, status}

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

class Unauthorized extends Error {}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token-form").hidden = false;
    throw new Unauthorized("the admin server wants a token");
  }
  return response;
}

async function apiJson(path) {
  const response = await api(path);
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (await response.text()));
  return response.json();
}

function showError(error) {
  const box = $("error");
  if (error) { box.textContent = String(error.message || error); box.hidden = false; }
  else box.hidden = true;
}

function fmt(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "-";
  if (typeof value !== "number") return String(value);
  return value.toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 1 : digits });
}

function bytes(n) {
  if (typeof n !== "number") return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return fmt(n, 1) + " " + units[i];
}

function fill(tableId, rows, empty) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    const cols = $(tableId).tHead ? $(tableId).tHead.rows[0].cells.length : 2;
    body.append(el("tr", {}, el("td", { colspan: cols, class: "muted" }, empty)));
    return;
  }
  for (const row of rows) {
    body.append(el("tr", {}, ...row.map((cell, i) => el("td", i ? { class: "num" } : {}, cell))));
  }
}

// -- the job graph ---------------------------------------------------------------------------

const COLUMN = { source: 0, router: 1, keyby: 2, dispatcher: 3, timers: 4, sink: 4 };

function column(node) {
  if (node.id in COLUMN) return COLUMN[node.id];
  return COLUMN[node.kind] !== undefined ? COLUMN[node.kind] : 2;
}

function drawGraph(plan) {
  const W = 190, H = 18, GAP_X = 60, GAP_Y = 22, PAD = 12;
  const columns = [];
  for (const node of plan.nodes) {
    const c = column(node);
    (columns[c] = columns[c] || []).push(node);
  }
  const place = {};
  let height = 0;
  columns.forEach((nodes, c) => {
    let y = PAD;
    for (const node of nodes || []) {
      const h = H * node.label.length + 10;
      place[node.id] = { x: PAD + c * (W + GAP_X), y, h };
      y += h + GAP_Y;
    }
    height = Math.max(height, y);
  });
  const width = PAD * 2 + columns.length * (W + GAP_X) - GAP_X;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "job graph", id: "graph-svg" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#7a8294" }));
  defs.append(marker);
  root.append(defs);
  for (const edge of plan.edges) {
    const a = place[edge.from], b = place[edge.to];
    if (!a || !b) continue;
    const feedback = edge.label === "feedback";
    let d;
    if (b.x > a.x) {
      const x1 = a.x + W, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2;
      d = `M ${x1} ${y1} C ${x1 + GAP_X / 2} ${y1}, ${x2 - GAP_X / 2} ${y2}, ${x2} ${y2}`;
    } else { // back edges (feedback) arc below
      const x1 = a.x + W / 2, y1 = a.y + a.h, x2 = b.x + W / 2, y2 = b.y + b.h;
      const low = Math.max(y1, y2) + GAP_Y;
      d = `M ${x1} ${y1} C ${x1} ${low}, ${x2} ${low}, ${x2} ${y2}`;
    }
    const path = svg("path", { d, class: feedback ? "edge feedback" : "edge",
      "marker-end": "url(#arrow)" });
    root.append(path);
  }
  for (const node of plan.nodes) {
    const p = place[node.id];
    const g = svg("g", { class: "node " + node.kind, "data-id": node.id });
    g.append(svg("rect", { x: p.x, y: p.y, width: W, height: p.h, rx: 5 }));
    node.label.forEach((line, i) => {
      const text = svg("text", { x: p.x + 8, y: p.y + 17 + i * H });
      text.textContent = line;
      g.append(text);
    });
    root.append(g);
  }
  $("graph").replaceChildren(root);
  $("routes").replaceChildren(...plan.functions.map((f) => el("li", {}, f)));
}

// -- live figures ----------------------------------------------------------------------------

function rate(now, before, seconds) {
  if (before === undefined || before === null || seconds <= 0) return null;
  return Math.max(0, (now - before) / seconds);
}

function render(status, at) {
  const seconds = previous ? (at - previous.at) / 1000 : 0;
  const before = previous ? previous.status : {};
  const rows = [];
  const invocationRate = rate(status.invocations, before.invocations, seconds);
  rows.push(["invocations/s", fmt(invocationRate)]);
  for (const key of ["invocations", "messages_in_flight", "remote_messages_in_flight",
    "delayed_messages", "dead_letters", "parallelism"]) {
    if (typeof status[key] === "number") rows.push([key.replaceAll("_", " "), fmt(status[key], 0)]);
  }
  const cp = status.checkpoints;
  if (cp) {
    rows.push(["checkpoints completed", fmt(cp.completed, 0)]);
    rows.push(["last checkpoint", cp.last ? `${fmt(cp.last_duration_ms)} ms` : "none yet"]);
    rows.push(["longest stall", `${fmt(cp.max_stall_ms, 3)} ms`]);
  } else rows.push(["checkpoints", "off"]);
  fill("job", rows, "");
  $("job").tBodies[0].rows[0].id = "invocation-rate";
  renderWorker(status.worker);

  const functions = status.functions || null;
  if (functions) {
    const was = before.functions || {};
    fill("functions", Object.entries(functions).sort().map(([name, f]) => {
      const p = was[name] || {};
      return [name, fmt(rate(f.invocations, p.invocations, seconds)),
        fmt(rate(f.messages_in, p.messages_in, seconds)),
        fmt(rate(f.messages_out, p.messages_out, seconds)),
        fmt(f.failures, 0), fmt(f.mailbox, 0)];
    }), "no function invoked yet");
  } else fill("functions", [], "per function figures are not reported by this runtime");

  const io = [];
  for (const [id, i] of Object.entries(status.ingresses || {})) {
    const p = (before.ingresses || {})[id] || {};
    io.push([id, "ingress", fmt(rate(i.records, p.records, seconds)), fmt(i.records, 0),
      i.blocked_seconds === undefined ? "-" : fmt(i.blocked_seconds, 2) + " s"]);
  }
  for (const [id, e] of Object.entries(status.egresses || {})) {
    const p = (before.egresses || {})[id] || {};
    io.push([id, "egress", fmt(rate(e.records, p.records, seconds)), fmt(e.records, 0), "-"]);
  }
  fill("io", io, status.ingresses ? "none" : "not reported by this runtime");

  fill("endpoints", Object.entries(status.endpoints || {}).map(([name, e]) => [
    name, fmt(e.calls, 0), fmt(e.errors, 0), fmt(e.retries, 0),
    e.latency_p99_ms === undefined ? "-" : fmt(e.latency_p99_ms, 1) + " ms"]),
  status.endpoints ? "no remote endpoint" : "not reported by this runtime");

  const history = status.checkpoint_history || [];
  fill("checkpoints", history.slice(-10).reverse().map((c) => [
    fmt(c.id, 0), c.completed_at ? new Date(c.completed_at * (c.completed_at < 1e12 ? 1000 : 1))
      .toLocaleTimeString() : "-", fmt(c.duration_ms) + " ms", bytes(c.bytes)]),
  cp ? (status.checkpoint_history ? "none yet" : "history not reported by this runtime")
    : "checkpoints are off");

  const dead = status.dead_letters;
  const box = $("dead-letters");
  if (typeof dead === "number") box.replaceChildren(el("p", {}, `${fmt(dead, 0)} dead letter(s)`));
  else if (dead && typeof dead === "object") {
    box.replaceChildren(el("pre", {}, JSON.stringify(dead, null, 2)));
  } else box.replaceChildren(el("p", { class: "muted" }, "not reported"));
  $("updated").textContent = "updated " + new Date(at).toLocaleTimeString();
}

// "0-3,7" for [0, 1, 2, 3, 7]
function ranges(numbers) {
  const parts = [];
  for (let i = 0; i < numbers.length; i++) {
    let j = i;
    while (j + 1 < numbers.length && numbers[j + 1] === numbers[j] + 1) j++;
    parts.push(i === j ? String(numbers[i]) : `${numbers[i]}-${numbers[j]}`);
    i = j;
  }
  return parts.join(",") || "none";
}

// A worker of a clustered job: its id and what it owns now (GET /status's "worker").
function renderWorker(worker) {
  $("worker-section").hidden = !worker;
  if (!worker) return;
  fill("worker", [
    ["worker", worker.id],
    ["job", worker.job],
    ["assignment", worker.rebalancing ? "rebalancing" : `generation ${worker.generation}`],
    ["partitions", ranges(worker.partitions)],
    ["key groups", `${ranges(worker.key_groups)} (${worker.key_groups.length} of ${worker.max_parallelism})`],
    ["input partitions", worker.input_partitions.map(([t, p]) => `${t}:${p}`).join(", ") || "none"],
    ["admin", worker.admin_url],
  ], "");
}

// 421: another worker owns the address's key group; name it (and link its console).
async function otherOwner(response) {
  const answer = await response.json();
  const text = `key group ${answer.key_group} is owned by worker ${answer.owner}`;
  if (!answer.admin_url) return el("p", { class: "muted" }, text);
  return el("p", { class: "muted" }, text + ": ",
    el("a", { href: answer.admin_url + "/", id: "owner-link" }, answer.admin_url));
}

async function poll() {
  try {
    const status = await apiJson("/status");
    const at = Date.now();
    render(status, at);
    previous = { at, status };
    showError(null);
    await refreshTimeline();
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

async function loadPlan() {
  try { drawGraph(await apiJson("/plan")); } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

// -- address lookup --------------------------------------------------------------------------

function addressPath(text) {
  const parts = text.trim().split("/");
  if (parts.length < 3 || parts.some((p) => !p)) return null;
  const id = parts.pop(), type = parts.pop(), ns = parts.join("/");
  return [ns, type, id].map(encodeURIComponent).join("/");
}

function describe(value) {
  if (!value) return "(deleted)";
  const shown = value.value !== undefined ? value.value : value.preview;
  const text = shown === undefined ? "(no value)" : JSON.stringify(shown);
  return `${text} : ${value.typename}`;
}

async function lookup(event) {
  event.preventDefault();
  const text = $("address").value;
  const path = addressPath(text);
  if (!path) { showError(new Error("an address is namespace/type/id, got " + text)); return; }
  showError(null);
  const state = $("state"), timeline = $("timeline");
  try {
    const response = await api("/state/" + path);
    if (response.status === 404) {
      state.replaceChildren(el("p", { class: "muted" }, `no state for ${text}`));
    } else if (response.status === 421) {
      state.replaceChildren(await otherOwner(response));
      timeline.replaceChildren();
      shownAddress = null;
      return;
    } else if (!response.ok) {
      state.replaceChildren(el("p", { class: "error" }, await response.text()));
    } else {
      const found = await response.json();
      const table = el("table", { id: "state-values" },
        el("thead", {}, el("tr", {}, el("th", {}, "state"), el("th", {}, "value"),
          el("th", {}, "type"), el("th", {}, "expires"))));
      const body = el("tbody");
      for (const [name, v] of Object.entries(found.values)) {
        body.append(el("tr", {}, el("td", {}, name),
          el("td", {}, el("code", {}, JSON.stringify(v.value))),
          el("td", {}, `${v.typename} (${v.encoding})`),
          el("td", {}, v.expires_at_ms ? new Date(v.expires_at_ms).toLocaleString() +
            (v.expired ? " (expired)" : "") : "-")));
      }
      table.append(body);
      state.replaceChildren(el("h3", {}, `state of ${found.address} (key group ${found.key_group})`), table);
    }
    shownAddress = path;
    await showTimeline(path);
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

// The address whose timeline is shown: asked again at every poll (the runtime records an
// address from its first lookup on, so the timeline fills as it is invoked).
let shownAddress = null;

async function refreshTimeline() {
  if (!shownAddress) return;
  try { await showTimeline(shownAddress); } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

async function showTimeline(path) {
  const timeline = $("timeline");
  const answer = await api(`/addresses/${path}/timeline`);
  if (path !== shownAddress) return;  // another address was looked up meanwhile
  if (!answer.ok) {
    timeline.replaceChildren(el("p", { class: "muted" }, await answer.text()));
    return;
  }
  const data = await answer.json();
  const items = data.invocations.slice().reverse().map((inv) => {
    const lines = [];
    for (const m of inv.messages_in) lines.push(`in from ${m.caller || "an ingress"}: ${describe(m)} (${m.size} B)`);
    for (const s of inv.state) lines.push(`state ${s.name} = ${describe(s.value)}`);
    for (const m of inv.messages_out) lines.push(`out to ${m.target}: ${describe(m)}`);
    for (const d of inv.delayed) lines.push(d.target ? `delayed ${d.delay_ms} ms to ${d.target}` : `cancelled ${d.cancellation_token}`);
    for (const e of inv.egress) lines.push(`egress ${e.egress}: ${e.records} record(s), ${e.bytes} B`);
    const head = `${new Date(inv.at_ms).toLocaleTimeString()} - ${fmt(inv.duration_ms, 3)} ms`;
    return el("div", { class: "invocation" }, el("strong", {}, head),
      inv.error ? el("div", { class: "failed" }, inv.error) : "",
      el("pre", {}, lines.join("\n")));
  });
  const since = data.every_invocation ? "" :
    `, recorded since ${new Date(data.recorded_since_ms).toLocaleTimeString()}`;
  timeline.replaceChildren(el("h3", {}, `last ${data.invocations.length} invocation(s), newest first (${data.keep} kept${since})`),
    ...(items.length ? items : [el("p", { class: "muted" }, "no invocation recorded yet")]));
}

function useToken(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  $("token-form").hidden = true;
  loadPlan();
  poll();
}

document.addEventListener("DOMContentLoaded", () => {
  $("lookup").addEventListener("submit", lookup);
  $("token-form").addEventListener("submit", useToken);
  loadPlan();
  poll();
  setInterval(poll, POLL_MS);
});
