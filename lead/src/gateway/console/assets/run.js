// Skein console: one run's view (#run/<task>). Its events stream from the first, live, resumed
// after a break from the last one seen; from them the page draws the model and tool calls (the
// worker that ran each, how long it took, how often it was delivered), the plan as a graph of
// steps and the events themselves. What the events do not hold — the tree of runs, the status,
// tokens and cost, the trace link, the fork points, what the key may do — comes from
// /console/api/runs/<task>, read again when the run's shape changes. The actions (cancel, pause,
// resume, steer, fork, replay; answering a waiting call) are offered by the key's roles.
"use strict";
(() => {
const { $, api, act, button, cell, when, say, readEvents, key } = Skein;

// Kinds of event after which the run's summary is read again.
const RESHAPING = new Set(["turn_started", "run_ended", "final", "plan_step_started", "plan_step_finished", "approval_requested", "approval_resolved", "paused", "resumed"]);

let following = null;

// A line of the events list for one event; a model's text joins the line before it.
function summary(event) {
  const e = event.event;
  switch (e.type) {
    case "turn_started":
      return `${e.agent} on session ${e.session}${e.trace_id ? ` · trace ${e.trace_id}` : ""}`;
    case "model_delta":
    case "reasoning_delta":
      return e.text;
    case "tool_started":
      return `${e.tool}(${typeof e.arguments === "string" ? e.arguments : JSON.stringify(e.arguments)})`;
    case "tool_finished":
      return `${e.tool} ${e.ok ? "ok" : "failed"} on ${e.worker_id}: ${e.preview}`;
    case "approval_requested":
      return `${e.tool} waits for a person (${e.rule})`;
    case "approval_resolved":
      return `${e.tool}: ${e.verdict}${e.by ? ` by ${e.by}` : ""}${e.reason ? ` — ${e.reason}` : ""}`;
    case "steered":
      return e.text;
    case "final":
      return `${e.result.status}: ${e.result.answer || (e.result.failure && e.result.failure.message) || ""}`;
    default:
      return JSON.stringify(e);
  }
}

function addEvent(list, event) {
  const last = list.lastElementChild;
  const kind = event.event.type;
  if (kind === "model_delta" && last && last.dataset.kind === kind && last.dataset.source === event.source) {
    last.querySelector(".text").textContent += event.event.text;
    return;
  }
  const item = document.createElement("li");
  item.dataset.kind = kind;
  item.dataset.source = event.source;
  for (const [name, text] of [["at", new Date(event.at_ms).toLocaleTimeString()], ["source", event.source], ["kind", kind], ["text", summary(event)]]) {
    const span = document.createElement("span");
    span.className = name;
    span.textContent = text;
    item.append(span);
  }
  list.append(item);
  if (kind === "final") $("run-state").textContent = `Ended ${event.event.result.status}.`;
}

function took(ms) {
  return ms == null ? "" : ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

// The calls table: a row per model call (a run of its text) and per tool or subagent call, kept
// up to date as their ends arrive.
function addCall(state, event) {
  const e = event.event;
  const rows = $("run-call-rows");
  const key = `${event.source} ${e.call_id}`;
  if (e.type === "model_delta") {
    const open = state.model.get(event.source);
    if (open) {
      open.dataset.until = event.at_ms;
      open.querySelector(".took").textContent = took(event.at_ms - Number(open.dataset.from));
      return;
    }
    const row = document.createElement("tr");
    row.dataset.kind = "model";
    row.dataset.from = event.at_ms;
    cell(row, event.source);
    cell(row, "model");
    cell(row, "");
    cell(row, "").className = "took";
    cell(row, "");
    cell(row, "");
    rows.append(row);
    state.model.set(event.source, row);
    return;
  }
  if (e.type === "tool_started") {
    state.model.delete(event.source);
    const row = document.createElement("tr");
    row.dataset.kind = "tool";
    row.dataset.call = e.call_id;
    row.dataset.from = event.at_ms;
    cell(row, event.source);
    const args = typeof e.arguments === "string" ? e.arguments : JSON.stringify(e.arguments);
    cell(row, `${e.tool}(${args.length > 120 ? `${args.slice(0, 120)}…` : args})`);
    cell(row, "").className = "worker";
    cell(row, "…").className = "took";
    cell(row, "").className = "attempts";
    cell(row, e.permission && e.permission !== "allowed" ? `${e.permission} (${e.rule})` : "running").className = "outcome";
    rows.append(row);
    state.calls.set(key, row);
  } else if (e.type === "approval_requested" || e.type === "approval_resolved") {
    const row = state.calls.get(key);
    if (row) row.querySelector(".outcome").textContent = e.type === "approval_requested" ? "waits for a person" : `${e.verdict}${e.by ? ` by ${e.by}` : ""}`;
  } else if (e.type === "tool_finished") {
    const row = state.calls.get(key);
    if (!row) return;
    row.querySelector(".worker").textContent = e.worker_id;
    row.querySelector(".took").textContent = took(e.duration_ms || event.at_ms - Number(row.dataset.from));
    const attempts = e.attempts || 1;
    row.querySelector(".attempts").textContent = attempts > 1 ? `${attempts} (${attempts - 1} retried)` : "1";
    row.querySelector(".outcome").textContent = e.ok ? "ok" : `failed: ${e.preview}`;
  }
}

// The plan as a graph: its steps in columns by depth (a step stands right of the steps it
// waits for), each with its state and what it waits for.
function drawPlan(plan) {
  const steps = plan.plan || [];
  $("run-plan").hidden = steps.length === 0;
  const graph = $("run-plan-graph");
  graph.replaceChildren();
  const depth = new Map();
  const depthOf = (step, seen = new Set()) => {
    if (depth.has(step.id)) return depth.get(step.id);
    if (seen.has(step.id)) return 0;
    seen.add(step.id);
    const before = (step.after || []).map((id) => steps.find((s) => s.id === id)).filter(Boolean);
    const d = before.length ? 1 + Math.max(...before.map((s) => depthOf(s, seen))) : 0;
    depth.set(step.id, d);
    return d;
  };
  const columns = [];
  for (const step of steps) (columns[depthOf(step)] ||= []).push(step);
  for (const column of columns) {
    const list = document.createElement("ol");
    list.className = "plan-column";
    for (const step of column || []) {
      const item = document.createElement("li");
      item.className = `step ${step.status}`;
      item.dataset.step = step.id;
      const title = document.createElement("strong");
      title.textContent = `${step.id}. ${step.step}`;
      const facts = document.createElement("span");
      facts.textContent = [step.status, step.agent && `by ${step.agent}`, step.worker_id && `on ${step.worker_id}`, step.duration_ms != null && took(step.duration_ms), step.after && step.after.length && `after ${step.after.join(", ")}`].filter(Boolean).join(" · ");
      item.append(title, facts);
      list.append(item);
    }
    graph.append(list);
  }
}

function fact(list, name, value) {
  if (value == null || value === "") return;
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  if (value instanceof Node) dd.append(value);
  else dd.textContent = String(value);
  list.append(dt, dd);
}

function link(text, href) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function drawTree(run) {
  const item = document.createElement("li");
  const text = [run.agent || "lead", run.status, run.instance && `on ${run.instance}`, run.tokens != null && `${run.tokens} tokens`, run.ended_at_ms && took(run.ended_at_ms - run.started_at_ms)].filter(Boolean).join(" · ");
  item.textContent = `${run.source}: ${text}`;
  item.dataset.source = run.source;
  if (run.children && run.children.length) {
    const children = document.createElement("ul");
    for (const child of run.children) children.append(drawTree(child));
    item.append(children);
  }
  return item;
}

// Offers each action to the keys whose role allows it, and only while it means something.
function offer(run) {
  const ended = !["running", "waiting"].includes(run.status);
  const rules = [
    ["run-cancel", run.may.operate, !ended, "operate"],
    ["run-pause", run.may.operate, !ended, "operate"],
    ["run-resume", run.may.operate, !ended, "operate"],
    ["run-steer", run.may.submit, !ended, "submit"],
    ["run-fork", run.may.submit, Boolean(run.turn), "submit"],
    ["run-replay", run.may.submit, Boolean(run.turn), "submit"],
  ];
  for (const [id, allowed, now, role] of rules) {
    $(id).disabled = !allowed || !now;
    $(id).title = !allowed ? `this key lacks the ${role} role` : now ? "" : ended ? "the run has ended" : "the run has no record yet (it has not ended)";
  }
  $("run-steer-text").disabled = $("run-steer").disabled;
  $("run-fork-at").disabled = $("run-fork").disabled;
  if (run.turn && !$("run-fork-at").value) $("run-fork-at").placeholder = `${run.turn.turn} or ${run.turn.turn}.S`;
}

async function drawWaiting(task) {
  const { calls, may_answer: mayAnswer } = await api("/console/api/approvals");
  const mine = calls.filter((c) => c.task_id === task);
  $("run-waiting").hidden = mine.length === 0;
  const list = $("run-waiting-calls");
  list.replaceChildren();
  for (const call of mine) {
    const item = document.createElement("li");
    item.dataset.call = call.call_id;
    const what = document.createElement("span");
    what.textContent = `${call.tool} ${JSON.stringify(call.arguments)} (${call.rule}) `;
    const reason = document.createElement("input");
    reason.type = "text";
    reason.placeholder = "reason (optional)";
    reason.setAttribute("aria-label", `Reason for ${call.tool}`);
    item.append(what, reason);
    for (const [text, approve, cls] of [["Approve", true, "approve"], ["Deny", false, "deny"]]) {
      const b = button(text, `${text} ${call.tool} in this run`, async () => {
        await act(`/console/api/approvals/${encodeURIComponent(task)}/answer`, { approve, reason: reason.value, call_id: call.call_id, source: call.source }, `${approve ? "Approved" : "Denied"} ${call.tool}.`);
        refresh(task);
      }, cls);
      b.disabled = !mayAnswer;
      if (!mayAnswer) b.title = "this key lacks the approve role";
      item.append(b);
    }
    list.append(item);
  }
}

// Reads the run's summary and draws what it holds.
async function drawSummary(task) {
  const run = await api(`/console/api/runs/${encodeURIComponent(task)}`);
  if (!following || following.task !== task) return;
  following.summary = run;
  const facts = $("run-facts");
  facts.replaceChildren();
  fact(facts, "Agent", run.agent);
  fact(facts, "Session", link(run.session, `#session/${encodeURIComponent(run.session)}`));
  fact(facts, "Status", run.status);
  fact(facts, "Started", when(run.started_at_ms));
  const result = run.final;
  if (result) {
    const u = result.usage || {};
    fact(facts, "Tokens", `${(u.prompt_tokens || 0) + (u.completion_tokens || 0)} (${u.prompt_tokens || 0} in, ${u.completion_tokens || 0} out)`);
    if (result.spent) fact(facts, "Cost", `$${Number(result.spent.cost_usd || 0).toFixed(4)}`);
    fact(facts, "Model calls", result.iterations);
  }
  if (run.turn) fact(facts, "Turn in session", `${run.turn.turn} (${run.turn.steps} steps, ${run.turn.calls} calls)`);
  if (run.trace_url) {
    const trace = link(`trace ${run.trace_id}`, run.trace_url);
    trace.rel = "noreferrer";
    trace.target = "_blank";
    fact(facts, "Trace", trace);
  } else if (run.trace_id) {
    fact(facts, "Trace", run.trace_id);
  }
  const tree = $("run-tree");
  tree.replaceChildren();
  if (run.tree) tree.append(drawTree(run.tree));
  offer(run);
  await drawWaiting(task);
}

// Reads the summary again at most once a second while events reshape the run.
function refresh(task) {
  if (!following || following.task !== task || following.again) return;
  following.again = setTimeout(() => {
    if (!following || following.task !== task) return;
    following.again = null;
    drawSummary(task).catch((e) => say(`Could not read run ${task}: ${e.message}`));
  }, 1000);
}

// A run's events, from its first, live; after a break, from the last one seen.
async function showRun(task) {
  if (following && following.task === task) return;
  leave();
  const controller = new AbortController();
  following = { task, controller, again: null };
  $("run-title").textContent = `Run ${task}`;
  $("run-state").textContent = "Following its events…";
  const list = $("run-events");
  list.replaceChildren();
  $("run-call-rows").replaceChildren();
  $("run-plan").hidden = true;
  $("run-steer-text").value = "";
  $("run-fork-at").value = "";
  const calls = { model: new Map(), calls: new Map() };
  drawSummary(task).catch((e) => say(`Could not read run ${task}: ${e.message}`));
  let last = 0;
  let pause = 1000;
  while (following && following.controller === controller) {
    try {
      const headers = { Authorization: `Bearer ${key()}` };
      if (last) headers["Last-Event-ID"] = String(last);
      const response = await fetch(`/console/api/runs/${encodeURIComponent(task)}/events`, { headers, signal: controller.signal });
      if (!response.ok) throw new Error(response.statusText);
      await readEvents(response, (id, data) => {
        if (id) last = id;
        const event = JSON.parse(data);
        addEvent(list, event);
        addCall(calls, event);
        if (event.event.type === "plan_updated") drawPlan(event.event.plan);
        if (RESHAPING.has(event.event.type)) refresh(task);
      });
      if (list.lastElementChild && list.lastElementChild.dataset.kind === "final") return;
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, 30000);
  }
}

function leave() {
  if (!following) return;
  following.controller.abort();
  clearTimeout(following.again);
  following = null;
}

function current() {
  return following && following.task;
}

const path = (action) => `/console/api/runs/${encodeURIComponent(current())}/${action}`;

document.addEventListener("DOMContentLoaded", () => {
  $("run-cancel").addEventListener("click", () => act(path("cancel"), {}, "Cancel requested."));
  $("run-pause").addEventListener("click", () => act(path("pause"), {}, "Pause requested: the turn parks at its next step."));
  $("run-resume").addEventListener("click", () => act(path("resume"), {}, "Resume requested."));
  $("run-steer").addEventListener("click", async () => {
    if (await act(path("steer"), { text: $("run-steer-text").value }, "Steer message sent: it joins before the next model call.")) $("run-steer-text").value = "";
  });
  $("run-fork").addEventListener("click", () => {
    const at = $("run-fork-at").value.trim();
    act(path("fork"), at ? { at } : {}, (forked) => `Forked at ${forked.at} into session ${forked.session} (files as they were ${forked.files}).`);
  });
  $("run-replay").addEventListener("click", async () => {
    const replay = await act(path("replay"), {}, (r) => `Replaying as run ${r.task_id} in session ${r.session}; calls that match the record are answered from it.`);
    if (replay) location.hash = `#run/${encodeURIComponent(replay.task_id)}`;
  });
});

Skein.view("run", { nav: "runs", live: false, show: showRun, leave });
})();
