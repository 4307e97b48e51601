// The status page: fetch /ui/state.json every REFRESH_MS and redraw. Everything shown is set
// with textContent (never parsed as HTML), so no model id, tenant or reason can inject markup.
"use strict";

const REFRESH_MS = 2000;
const PRIORITIES = ["high", "normal", "low"];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.append(cell instanceof Node ? cell : el("td", cell));
  for (const [k, v] of Object.entries(attrs || {})) tr.dataset[k] = v;
  return tr;
}

// A share of the runner's memory as a width; anything above zero stays visible.
function width(fraction) {
  const percent = 100 * Math.min(Math.max(fraction, 0), 1);
  return percent > 0 ? `max(2px, ${percent.toFixed(1)}%)` : "0";
}

function bar(fraction, kvFraction, title) {
  const outer = el("div", null, "bar");
  const fill = el("div", null, "fill");
  fill.style.width = width(fraction);
  outer.append(fill);
  if (kvFraction) {
    const kv = el("div", null, "kv");
    kv.style.width = width(kvFraction);
    outer.append(kv);
  }
  outer.title = title;
  const td = el("td");
  td.append(outer);
  return td;
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function fill(tbody, rows, empty) {
  tbody.replaceChildren(...rows);
  if (empty) document.getElementById(empty).hidden = rows.length > 0;
}

// One token budget: a bar of what its window has used, and what is left until it resets.
function budget(b) {
  const line = el("div", null, "budget");
  const known = b.used !== null;
  line.append(bar(known ? b.used / b.tokens : 0, 0, `${b.used ?? "?"} of ${b.tokens} used`)
    .firstChild);
  const left = known ? `${b.remaining} left` : "unknown (store unreachable)";
  line.append(` ${left} of ${b.budget}, resets in ${seconds(b.resetsInS)}`);
  Object.assign(line.dataset, { per: b.per, count: b.count, remaining: b.remaining ?? "" });
  return line;
}

function render(state) {
  const r = state.runner;
  document.getElementById("runner-id").textContent = r.id;
  const life = document.getElementById("life");
  life.textContent = r.life;
  life.className = `badge state-${r.life}`;
  document.getElementById("uptime").textContent = seconds(r.uptimeS);
  const m = r.memory;
  document.getElementById("memory-text").textContent =
    `${m.usedMB} / ${m.totalMB} MB used (${m.source})`;
  document.querySelector("#memory-bar .fill").style.width =
    width(m.totalMB ? m.usedMB / m.totalMB : 0);

  const total = m.totalMB || 1;
  fill(document.querySelector("#models tbody"), state.models.map((model) => {
    const weights = model.weightsMB ?? model.memoryMB;
    const kv = model.kvMB ?? 0;
    const detail = model.state === "failed"
      ? `exit ${model.exitCode ?? "?"}: ${model.error ?? ""}`
      : (model.kvUtilization !== null ? `KV ${Math.round(100 * model.kvUtilization)}% used` : "");
    return row([
      el("td", model.id), el("td", model.backend),
      el("td", model.state, `state-${model.state}`),
      el("td", `${model.memoryMB} MB`, "num"),
      bar(weights / total, kv / total, `weights ${weights} MB, KV and buffers ${kv} MB`),
      el("td", model.restarts, "num"), el("td", detail),
    ], { model: model.id, state: model.state });
  }));

  fill(document.querySelector("#loads tbody"), state.loads.map((load) => {
    const progress = el("progress");
    progress.max = 1;
    progress.value = load.progress;
    const cell = el("td");
    cell.append(progress, ` ${Math.round(100 * load.progress)}%`);
    return row([el("td", load.taskId.slice(0, 13) + "…"), el("td", load.modelId),
      el("td", load.status, `state-${load.status}`), cell, el("td", seconds(load.eta))],
      { model: load.modelId, status: load.status });
  }), "loads-empty");

  const q = state.queues;
  document.getElementById("queue-depth").textContent = `${q.depth} of ${q.maxDepth} waiting`;
  document.getElementById("queue-p95").textContent = `${q.p95WaitMs} ms`;
  const flying = Object.entries(q.inFlight).map(([model, n]) => `${model} ${n}`);
  document.getElementById("in-flight").textContent = flying.join(", ") || "none";
  fill(document.querySelector("#queues tbody"), q.byTenant.map((t) =>
    row([el("td", t.tenant), ...PRIORITIES.map((p) => el("td", t[p], "num"))],
      { tenant: t.tenant })));
  for (const p of PRIORITIES) document.getElementById(`q-${p}`).textContent = q.byPriority[p];

  fill(document.querySelector("#tenants tbody"), state.tenants.map((t) => {
    let flight = t.maxInFlight === null ? `${t.inFlight}` : `${t.inFlight} / ${t.maxInFlight}`;
    if (t.inFlightAllReplicas !== null) flight += ` (all replicas ${t.inFlightAllReplicas})`;
    const budgets = el("td");
    for (const b of t.budgets) budgets.append(budget(b));
    if (!t.budgets.length) budgets.textContent = "none";
    return row([el("td", t.tenant), el("td", `${t.priority.default} (max ${t.priority.max})`),
      el("td", t.models === null ? "all" : t.models.join(", ")),
      el("td", flight, "num in-flight"), el("td", t.queued, "num queued"), budgets],
      { tenant: t.tenant });
  }), "tenants-empty");

  document.getElementById("audit-source").textContent = `(${state.audit.source})`;
  fill(document.querySelector("#audit tbody"), state.audit.decisions.map((d) => {
    const when = d.time ? new Date(d.time * 1000).toLocaleTimeString() : "";
    const fields = Object.entries(d.params).map(([k, v]) => `${k}=${v}`).join(" ");
    const outcome = d.outcome === "approved" ? "approved" : `${d.outcome} (${d.reason})`;
    return row([el("td", when), el("td", d.operation), el("td", d.modelId ?? ""),
      el("td", fields), el("td", outcome, `outcome-${d.outcome}`),
      el("td", d.principals.join(", ")), el("td", d.keyIds.join(" "))],
      { operation: d.operation, outcome: d.outcome });
  }), "audit-empty");

  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  document.body.dataset.ready = "true";
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    const answer = await fetch("/ui/state.json", { cache: "no-store", credentials: "same-origin" });
    if (!answer.ok) throw new Error(`the runner answered ${answer.status}`);
    render(await answer.json());
    problem.hidden = true;
  } catch (error) {
    problem.textContent = `not updated: ${error.message}`;
    problem.hidden = false;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
