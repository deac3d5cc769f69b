// Skein console: reads the gateway's /console/api with the key the person signs in with (kept in
// this tab's session storage only), shows the view the address names (#runs, #run/<task>,
// #approvals, #workers), and reads it again when the live feed says something changed; a run's
// view follows its events as they come. No request leaves the gateway.
"use strict";

// Script errors, kept for whoever checks the page.
window.consoleErrors = [];
window.addEventListener("error", (e) => window.consoleErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.consoleErrors.push(String(e.reason)));

const KEY_ITEM = "skein-console-key";
const VIEWS = ["runs", "run", "approvals", "workers"];
const $ = (id) => document.getElementById(id);

let live = null;

function key() {
  return sessionStorage.getItem(KEY_ITEM);
}

function say(text) {
  $("status").textContent = text;
}

class Refused extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...(options.headers || {}), Authorization: `Bearer ${key()}` },
  });
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText;
    throw new Refused(response.status, message);
  }
  return body;
}

function cell(row, content) {
  const td = document.createElement("td");
  if (content instanceof Node) td.append(content);
  else td.textContent = content == null ? "" : String(content);
  row.append(td);
  return td;
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

async function showApprovals() {
  const { calls, may_answer: mayAnswer } = await api("/console/api/approvals");
  const rows = $("approvals-rows");
  rows.replaceChildren();
  for (const call of calls) {
    const row = document.createElement("tr");
    row.dataset.task = call.task_id;
    row.dataset.call = call.call_id;
    cell(row, call.task_id);
    cell(row, call.agent);
    cell(row, call.tool);
    const args = document.createElement("pre");
    args.textContent = JSON.stringify(call.arguments, null, 2);
    cell(row, args);
    cell(row, call.rule);
    cell(row, when(call.requested_at_ms));
    const answer = document.createElement("div");
    answer.className = "answer";
    const reason = document.createElement("input");
    reason.type = "text";
    reason.placeholder = "reason (optional)";
    reason.setAttribute("aria-label", `Reason for ${call.tool} in task ${call.task_id}`);
    reason.className = "reason";
    const approve = document.createElement("button");
    approve.type = "button";
    approve.textContent = "Approve";
    approve.className = "approve";
    approve.setAttribute("aria-label", `Approve ${call.tool} in task ${call.task_id}`);
    const deny = document.createElement("button");
    deny.type = "button";
    deny.textContent = "Deny";
    deny.className = "deny";
    deny.setAttribute("aria-label", `Deny ${call.tool} in task ${call.task_id}`);
    for (const [button, verdict] of [[approve, true], [deny, false]]) {
      button.disabled = !mayAnswer;
      if (!mayAnswer) button.title = "this key may not answer calls (it lacks the approve role)";
      button.addEventListener("click", () => decide(call, verdict, reason.value));
    }
    answer.append(reason, approve, deny);
    cell(row, answer);
    rows.append(row);
  }
  $("approvals-table").hidden = calls.length === 0;
  $("approvals-empty").hidden = calls.length !== 0;
}

async function decide(call, approve, reason) {
  try {
    await api(`/console/api/approvals/${encodeURIComponent(call.task_id)}/answer`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ approve, reason, call_id: call.call_id, source: call.source }),
    });
    say(`${approve ? "Approved" : "Denied"} ${call.tool} in task ${call.task_id}.`);
  } catch (e) {
    say(`Not answered: ${e.message}`);
  }
  await show();
}

async function showWorkers() {
  const { workers } = await api("/console/api/workers");
  const rows = $("workers-rows");
  rows.replaceChildren();
  for (const worker of workers) {
    const row = document.createElement("tr");
    row.dataset.worker = worker.worker_id;
    cell(row, worker.worker_id);
    cell(row, worker.pool);
    cell(row, worker.tools.join(", "));
    cell(row, (worker.agent_types || (worker.runs_subagents ? ["any"] : [])).join(", "));
    cell(row, worker.capacity);
    cell(row, when(worker.heartbeat_ms));
    rows.append(row);
  }
  $("workers-table").hidden = workers.length === 0;
  $("workers-empty").hidden = workers.length !== 0;
}

// The runs list, filtered and paged by the server (`before`: the oldest start shown).
async function showRuns(older) {
  const query = new URLSearchParams();
  for (const [name, id] of [["status", "filter-status"], ["agent", "filter-agent"], ["session", "filter-session"]]) {
    if ($(id).value.trim()) query.set(name, $(id).value.trim());
  }
  const rows = $("runs-rows");
  if (older && rows.lastElementChild) query.set("before", rows.lastElementChild.dataset.started);
  const { runs } = await api(`/console/api/runs?${query}`);
  if (!older) rows.replaceChildren();
  for (const run of runs) {
    const row = document.createElement("tr");
    row.dataset.task = run.task_id;
    row.dataset.started = run.started_at_ms;
    const link = document.createElement("a");
    link.href = `#run/${encodeURIComponent(run.task_id)}`;
    link.textContent = run.task_id;
    cell(row, link);
    cell(row, run.agent);
    cell(row, run.session);
    cell(row, when(run.started_at_ms));
    cell(row, run.status).className = "status";
    cell(row, run.events);
    rows.append(row);
  }
  $("runs-table").hidden = rows.children.length === 0;
  $("runs-empty").hidden = rows.children.length !== 0;
  $("runs-older").hidden = runs.length < 50;
}

// A line of the run's timeline for one event; a model's text joins the line before it.
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
    case "final":
      return `${e.result.status}: ${e.result.answer || (e.result.failure && e.result.failure.message) || ""}`;
    default:
      return JSON.stringify(e);
  }
}

// Reads an SSE response to its end, passing each event's id (a number, or null) and data.
async function readEvents(response, each) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const blocks = buffer.split("\n\n");
    buffer = blocks.pop();
    for (const block of blocks) {
      const lines = block.split("\n");
      const id = lines.find((l) => l.startsWith("id:"));
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (data) each(id ? Number(id.slice(3).trim()) : null, data);
    }
  }
}

let following = null;

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

// A run's events, from its first, live; after a break, from the last one seen.
async function showRun(task) {
  if (following && following.task === task) return;
  if (following) following.controller.abort();
  const controller = new AbortController();
  following = { task, controller };
  $("run-title").textContent = `Run ${task}`;
  $("run-state").textContent = "Following its events…";
  const list = $("run-events");
  list.replaceChildren();
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
        addEvent(list, JSON.parse(data));
      });
      if (list.lastElementChild && list.lastElementChild.dataset.kind === "final") return;
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, 30000);
  }
}

function view() {
  const named = decodeURIComponent(location.hash.replace("#", ""));
  if (named.startsWith("run/")) return ["run", named.slice(4)];
  return [VIEWS.includes(named) && named !== "run" ? named : "runs", null];
}

async function show() {
  const [current, task] = view();
  for (const name of VIEWS) {
    $(name).hidden = name !== current;
    const link = $(`nav-${name}`);
    if (!link) continue;
    if (name === current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (current !== "run" && following) {
    following.controller.abort();
    following = null;
  }
  try {
    if (current === "runs") await showRuns(false);
    else if (current === "run") await showRun(task);
    else if (current === "approvals") await showApprovals();
    else await showWorkers();
  } catch (e) {
    if (e instanceof Refused && e.status === 401) return signOut(e.message);
    say(`Could not read the ${current}: ${e.message}`);
  }
}

let again = null;
function showSoon() {
  if (view()[0] === "run" || again) return;
  // At most one read a second, whatever the feed says: a busy tenant stays within its key's
  // limit, and a steady feed still gets its reads.
  again = setTimeout(() => {
    again = null;
    show();
  }, 1000);
}

// The live feed: a note per change of the tenant's tasks, read as SSE over fetch (so the key
// travels in a header), reconnecting after a pause when it breaks.
async function follow() {
  const controller = new AbortController();
  live = controller;
  let pause = 1000;
  while (live === controller) {
    try {
      const response = await fetch("/console/api/live", {
        headers: { Authorization: `Bearer ${key()}` },
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(response.statusText);
      pause = 1000;
      await readEvents(response, () => showSoon());
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, 30000);
  }
}

// The key's principal and tenant, as the gateway proves them.
async function whoAmI() {
  const { principal, tenant } = await api("/console/api/approvals");
  return `${principal} · ${tenant}`;
}

function signedIn(who) {
  $("sign-in").hidden = true;
  $("views").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = who;
  follow();
  show();
}

function signOut(why) {
  sessionStorage.removeItem(KEY_ITEM);
  if (live) live.abort();
  live = null;
  if (following) following.controller.abort();
  following = null;
  for (const name of VIEWS) $(name).hidden = true;
  $("views").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = why || "";
  $("key").focus();
}

async function signIn(event) {
  event.preventDefault();
  sessionStorage.setItem(KEY_ITEM, $("key").value.trim());
  $("key").value = "";
  try {
    signedIn(await whoAmI());
  } catch (e) {
    signOut(e instanceof Refused && e.status === 401 ? "That key is not known." : e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", signIn);
  $("runs-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    show();
  });
  $("runs-older").addEventListener("click", () => showRuns(true));
  $("sign-out").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", show);
  if (key()) whoAmI().then(signedIn, (e) => signOut(e.message));
  else signOut("");
});
