// Skein console, its core: reads the gateway's /console/api with the key the person signs in
// with (kept in this tab's session storage only), shows the view the address names (`#name` or
// `#name/argument`), and reads it again when the live feed says something changed. Views are
// registered with `Skein.view(name, {...})`: this file's runs list, approvals and workers, and
// those of the scripts loaded after it (run.js, sessions.js, dead-letters.js). No request leaves
// the gateway.
"use strict";

// Script errors, kept for whoever checks the page.
window.consoleErrors = [];
window.addEventListener("error", (e) => window.consoleErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.consoleErrors.push(String(e.reason)));

const KEY_ITEM = "skein-console-key";
const $ = (id) => document.getElementById(id);

// The registered views by name: `show(argument)` draws it (argument: what follows `name/` in the
// address), `leave()` (optional) stops what it follows, `nav` names the navigation link it lies
// under, `live: false` keeps the live feed from reading it again.
const views = new Map();
const Skein = {
  view(name, spec) {
    views.set(name, { nav: name, live: true, ...spec });
  },
};
window.Skein = Skein;

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

// A button with its text and an accessible name; `act` runs on click.
function button(text, label, act, className) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label);
  if (className) b.className = className;
  if (act) b.addEventListener("click", act);
  return b;
}

// What names a control across redraws: its accessible name, its id, or a link's text.
function placeOf(element) {
  return element.getAttribute("aria-label") || element.id || (element.tagName === "A" ? element.textContent : "");
}

// Redraws `container` with `draw()` keeping a keyboard user's place: the focus goes back to the
// control of the same name, and what was typed in a named field stays, so a redraw the live feed
// asks for neither loses the focus nor a reason half written.
async function keepingPlace(container, draw) {
  const focused = document.activeElement;
  const place = focused && container.contains(focused) ? placeOf(focused) : "";
  const typed = new Map();
  for (const field of container.querySelectorAll("input[aria-label]")) {
    if (field.value) typed.set(field.getAttribute("aria-label"), field.value);
  }
  await draw();
  for (const field of container.querySelectorAll("input[aria-label]")) {
    const value = typed.get(field.getAttribute("aria-label"));
    if (value && !field.value) field.value = value;
  }
  if (!place || document.body.contains(focused)) return;
  const again = [...container.querySelectorAll("a, button, input, select")].find((e) => placeOf(e) === place);
  if (again) again.focus();
}

// POSTs `body` as JSON (or sends `method`), saying what came of it.
async function act(path, body, done, method = "POST") {
  try {
    const answer = await api(path, {
      method,
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (done) say(typeof done === "function" ? done(answer) : done);
    return answer;
  } catch (e) {
    say(`Not done: ${e.message}`);
    return null;
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


function showApprovals() {
  return keepingPlace($("approvals-rows"), drawApprovals);
}

async function drawApprovals() {
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
  const { workers, backlog } = await api("/console/api/workers");
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
  const queues = $("backlog-rows");
  queues.replaceChildren();
  for (const queue of backlog) {
    const row = document.createElement("tr");
    row.dataset.consumer = queue.consumer;
    cell(row, queue.pool);
    cell(row, queue.consumer);
    cell(row, queue.error ? "unknown" : queue.pending);
    cell(row, queue.error ? queue.error : queue.ack_pending);
    queues.append(row);
  }
  $("backlog-table").hidden = backlog.length === 0;
}

// The runs list, filtered and paged by the server (`before`: the oldest start shown).
async function showRuns(older) {
  const query = new URLSearchParams();
  for (const [name, id] of [["status", "filter-status"], ["agent", "filter-agent"], ["session", "filter-session"]]) {
    if ($(id).value.trim()) query.set(name, $(id).value.trim());
  }
  const rows = $("runs-rows");
  if (older && rows.lastElementChild) query.set("before", rows.lastElementChild.dataset.started);
  else if ($("filter-before").value) query.set("before", String(new Date($("filter-before").value).getTime()));
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

// The view the address names, and its argument.
function view() {
  const named = location.hash.replace("#", "");
  const slash = named.indexOf("/");
  const name = slash < 0 ? named : named.slice(0, slash);
  const argument = slash < 0 ? null : decodeURIComponent(named.slice(slash + 1));
  return views.has(name) ? [name, argument] : ["runs", null];
}

let shown = null;

async function show() {
  const [current, argument] = view();
  const nav = views.get(current).nav;
  for (const [name, spec] of views) {
    $(name).hidden = name !== current;
    const link = $(`nav-${name}`);
    if (!link) continue;
    if (name === nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
    if (name !== current && shown === name && spec.leave) spec.leave();
  }
  shown = current;
  try {
    await views.get(current).show(argument);
  } catch (e) {
    if (e instanceof Refused && e.status === 401) return signOut(e.message);
    say(`Could not read the ${current}: ${e.message}`);
  }
}

let again = null;
function showSoon() {
  if (!views.get(view()[0]).live || again) return;
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
  for (const [name, spec] of views) {
    if (spec.leave) spec.leave();
    $(name).hidden = true;
  }
  shown = null;
  $("new-run-agent").replaceChildren();
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

// The agents a run may be started with, once per sign-in.
async function listAgents() {
  const select = $("new-run-agent");
  if (select.options.length) return;
  const { data } = await api("/v1/models");
  for (const model of data) {
    const option = document.createElement("option");
    option.textContent = model.id;
    select.append(option);
  }
}

// Starts a run as the signed-in principal; it shows in the list as soon as its turn starts.
async function startRun(event) {
  event.preventDefault();
  const started = await act(
    "/console/api/runs",
    { agent: $("new-run-agent").value, input: $("new-run-input").value, session: $("new-run-session").value.trim() || null },
    (run) => `Started run ${run.task_id} in session ${run.session}.`,
  );
  if (started) $("new-run-input").value = "";
}

Skein.view("runs", {
  show: async () => {
    await keepingPlace($("runs-rows"), () => showRuns(false));
    await listAgents();
  },
});
Skein.view("approvals", { show: showApprovals });
Skein.view("workers", { show: showWorkers });
Object.assign(Skein, { $, api, act, button, cell, when, say, readEvents, keepingPlace, Refused, show, key });

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", signIn);
  $("runs-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    show();
  });
  $("runs-older").addEventListener("click", () => showRuns(true));
  $("new-run-form").addEventListener("submit", startRun);
  $("sign-out").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", show);
  if (key()) whoAmI().then(signedIn, (e) => signOut(e.message));
  else signOut("");
});
