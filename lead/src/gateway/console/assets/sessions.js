// Skein console: the tenant's sessions (#sessions) and one session (#session/<name>): its
// history after its summary, its checkpoints (the points a fork starts from), and its
// workspace's files, shown as text or downloaded. A download is fetched with the key (it travels
// in a header) and handed to the browser as a blob URL.
"use strict";
(() => {
const { $, api, button, cell, when, say, key, Refused } = Skein;

function seconds(total) {
  if (total == null) return "kept";
  if (total < 120) return `${total} s`;
  if (total < 7200) return `${Math.round(total / 60)} min`;
  if (total < 172800) return `${Math.round(total / 3600)} h`;
  return `${Math.round(total / 86400)} days`;
}

function bytes(size) {
  if (size < 1024) return `${size} B`;
  if (size < 1048576) return `${(size / 1024).toFixed(1)} KiB`;
  return `${(size / 1048576).toFixed(1)} MiB`;
}

function sessionLink(name) {
  const link = document.createElement("a");
  link.href = `#session/${encodeURIComponent(name)}`;
  link.textContent = name;
  return link;
}

async function showSessions() {
  const { sessions } = await api("/console/api/sessions");
  const rows = $("sessions-rows");
  rows.replaceChildren();
  for (const s of sessions) {
    const row = document.createElement("tr");
    row.dataset.session = s.session;
    cell(row, sessionLink(s.session));
    cell(row, s.turns);
    cell(row, s.messages);
    cell(row, when(s.last_activity_ms));
    cell(row, s.expires_in_secs == null ? "kept" : `expires in ${seconds(s.expires_in_secs)}`);
    cell(row, s.running_task ? `running ${s.running_task}` : "");
    rows.append(row);
  }
  $("sessions-table").hidden = sessions.length === 0;
  $("sessions-empty").hidden = sessions.length !== 0;
}

// The session shown, and the file read in it (kept when the live feed redraws the view).
let current = null;
let reading = null;

function paragraph(text, className) {
  const p = document.createElement("p");
  p.textContent = text;
  if (className) p.className = className;
  return p;
}

function messageItem(message) {
  const item = document.createElement("li");
  item.dataset.role = message.role;
  const role = document.createElement("span");
  role.className = "role";
  role.textContent = message.role + (message.tool_call_id ? ` (${message.tool_call_id})` : "");
  const text = document.createElement("div");
  text.className = "text";
  text.textContent = message.text;
  item.append(role, text);
  for (const call of message.tool_calls || []) {
    const line = document.createElement("div");
    line.className = "call";
    line.textContent = `→ ${call.name}(${call.arguments}) [${call.id}]`;
    text.append(line);
  }
  if (message.note) text.append(paragraph(`(${message.note})`, "note"));
  return item;
}

function showHistory(session) {
  const summary = $("session-summary");
  summary.hidden = !session.summary;
  if (session.summary) {
    $("session-summary-title").textContent = `Summary of ${session.summary.messages} earlier messages`;
    $("session-summary-text").textContent = session.summary.text;
    $("session-summary-note").textContent = session.summary.note ? `(${session.summary.note})` : "";
  }
  const left = session.earlier_left_out;
  $("session-history-note").hidden = !left;
  $("session-history-note").textContent = left ? `${left} earlier messages are not shown.` : "";
  const list = $("session-messages");
  list.replaceChildren(...session.messages.map(messageItem));
  $("session-history-empty").hidden = session.messages.length !== 0;
}

function showCheckpoints(session) {
  const rows = $("session-checkpoints");
  rows.replaceChildren();
  for (const c of session.checkpoints) {
    const row = document.createElement("tr");
    row.dataset.turn = c.turn;
    cell(row, c.turn);
    const task = document.createElement("a");
    task.href = `#run/${encodeURIComponent(c.task_id)}`;
    task.textContent = c.task_id;
    cell(row, task);
    cell(row, when(c.ended_at_ms));
    cell(row, c.model || "-");
    cell(row, c.steps);
    cell(row, c.calls);
    cell(row, c.tokens);
    cell(row, c.status).className = "status";
    cell(row, c.fork_points.join(", ")).className = "points";
    rows.append(row);
  }
  $("session-checkpoints-table").hidden = session.checkpoints.length === 0;
  $("session-checkpoints-empty").hidden = session.checkpoints.length !== 0;
}

function fileUrl(session, path, download) {
  const encoded = path.split("/").map(encodeURIComponent).join("/");
  return `/console/api/sessions/${encodeURIComponent(session)}/files/${encoded}${download ? "?download=1" : ""}`;
}

// A file's answer read with the key; a refusal as `Refused`, with the gateway's message.
async function fetchFile(session, path, download) {
  const response = await fetch(fileUrl(session, path, download), {
    headers: { Authorization: `Bearer ${key()}` },
  });
  if (!response.ok) {
    let message = response.statusText;
    try {
      message = (await response.json()).error.message;
    } catch (e) {
      // Not the gateway's JSON error: its status says enough.
    }
    throw new Refused(response.status, message);
  }
  return response;
}

function showReading() {
  $("session-file").hidden = !reading;
  if (!reading) return;
  $("session-file-title").textContent = reading.path;
  $("session-file-text").textContent = reading.text;
}

async function view(session, path) {
  try {
    const text = await (await fetchFile(session, path, false)).text();
    reading = { session, path, text };
    showReading();
    $("session-file-text").focus();
    say(`Showing ${path}.`);
  } catch (e) {
    say(e.status === 415 ? `${path} is not text: download it instead.` : `Could not read ${path}: ${e.message}`);
  }
}

async function download(session, path) {
  try {
    const blob = await (await fetchFile(session, path, true)).blob();
    const url = URL.createObjectURL(blob);
    const link = document.createElement("a");
    link.href = url;
    link.download = path.split("/").pop();
    link.hidden = true;
    document.body.append(link);
    link.click();
    link.remove();
    // The browser has taken the download once the click returns; the URL is freed a little later.
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    say(`Downloaded ${path}.`);
  } catch (e) {
    say(`Could not download ${path}: ${e.message}`);
  }
}

// Reads the files again and redraws them, keeping a keyboard user's place.
function showFiles(session) {
  return Skein.keepingPlace($("session-files"), () => drawFiles(session));
}

async function drawFiles(session) {
  const { files } = await api(`/console/api/sessions/${encodeURIComponent(session)}/files`);
  const rows = $("session-files");
  rows.replaceChildren();
  for (const file of files) {
    const row = document.createElement("tr");
    row.dataset.path = file.path;
    cell(row, file.path);
    cell(row, bytes(file.size));
    const actions = document.createElement("div");
    actions.className = "row-actions";
    actions.append(
      button("View", `View ${file.path}`, () => view(session, file.path), "view"),
      button("Download", `Download ${file.path}`, () => download(session, file.path), "download secondary"),
    );
    cell(row, actions);
    rows.append(row);
  }
  $("session-files-table").hidden = files.length === 0;
  $("session-files-empty").hidden = files.length !== 0;
}

async function showSession(name) {
  if (current !== name) {
    // Another session: nothing of the one shown before stays while this one is read.
    current = name;
    reading = null;
    for (const id of ["session-messages", "session-checkpoints", "session-files"]) $(id).replaceChildren();
    for (const id of ["session-summary", "session-forked", "session-file"]) $(id).hidden = true;
    $("session-facts").textContent = "";
  }
  $("session-title").textContent = `Session ${name}`;
  const session = await api(`/console/api/sessions/${encodeURIComponent(name)}`);
  const facts = [`${session.turns} turns`];
  if (session.running_task) facts.push(`a turn runs now (${session.running_task})`);
  $("session-facts").textContent = facts.join(" · ");
  const forked = $("session-forked");
  forked.hidden = !session.forked_from;
  if (session.forked_from) {
    forked.replaceChildren(
      "Forked from ",
      sessionLink(session.forked_from.session),
      ` at ${session.forked_from.at}.`,
    );
  }
  showHistory(session);
  showCheckpoints(session);
  await showFiles(name);
  showReading();
}

Skein.view("sessions", { show: showSessions });
Skein.view("session", {
  nav: "sessions",
  show: showSession,
  leave() {
    current = null;
    reading = null;
  },
});

document.addEventListener("DOMContentLoaded", () => {
  $("session-file-close").addEventListener("click", () => {
    const path = reading && reading.path;
    reading = null;
    showReading();
    const row = path && [...$("session-files").children].find((r) => r.dataset.path === path);
    if (row) row.querySelector("button.view").focus();
  });
});
})();
