// Skein console: one run's view (#run/<task>): its events from its first, live, resumed after a
// break from the last one seen.
"use strict";
(() => {
const { $, readEvents, key } = Skein;

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


Skein.view("run", {
  nav: "runs",
  live: false,
  show: showRun,
  leave() {
    if (following) following.controller.abort();
    following = null;
  },
});
})();
