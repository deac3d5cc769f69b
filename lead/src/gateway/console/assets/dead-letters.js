// Skein console: the tenant's dead letters (#dead-letters), the messages set aside after being
// refused or failing every attempt. Any key of the tenant reads them; a key with the `operate`
// role replays one (its work runs again and the letter goes) or removes it (asked twice).
"use strict";
(() => {
const { $, api, act, button, cell, say } = Skein;

// Letters whose body is shown, by number, with what was read of it (kept across redraws).
const opened = new Map();
// The letter whose removal waits for a second press.
let confirming = null;

function size(letter) {
  const text = letter.size < 1024 ? `${letter.size} B` : `${(letter.size / 1024).toFixed(1)} KiB`;
  return letter.truncated ? `${text} (cut)` : text;
}

function body(detail) {
  if ("payload" in detail) return JSON.stringify(detail.payload, null, 2);
  return detail.preview + (detail.preview_cut ? "\n(cut: the body is longer)" : "");
}

async function toggle(letter) {
  if (opened.has(letter.seq)) {
    opened.delete(letter.seq);
  } else {
    try {
      opened.set(letter.seq, body(await api(`/console/api/dead-letters/${letter.seq}`)));
    } catch (e) {
      say(`Could not read letter ${letter.seq}: ${e.message}`);
      return;
    }
  }
  await showLetters();
}

async function replay(letter) {
  const answer = await act(
    `/console/api/dead-letters/${letter.seq}/replay`,
    undefined,
    `Replayed letter ${letter.seq}${letter.task_id ? ` (task ${letter.task_id})` : ""}: it runs again.`,
  );
  if (answer) opened.delete(letter.seq);
  await showLetters();
}

async function remove(letter) {
  if (confirming !== letter.seq) {
    confirming = letter.seq;
    await showLetters();
    const confirm = document.querySelector(`#dead-letters-rows tr[data-seq='${letter.seq}'] button.remove`);
    if (confirm) confirm.focus();
    say(`Press "Confirm removal" to remove letter ${letter.seq} for good.`);
    return;
  }
  confirming = null;
  const answer = await act(`/console/api/dead-letters/${letter.seq}`, undefined, `Removed letter ${letter.seq}.`, "DELETE");
  if (answer) opened.delete(letter.seq);
  await showLetters();
}

function actions(letter, mayOperate) {
  const name = `letter ${letter.seq}${letter.task_id ? ` (task ${letter.task_id})` : ""}`;
  const show = button(opened.has(letter.seq) ? "Hide" : "Show", `Show the body of ${name}`, () => toggle(letter), "show secondary");
  show.setAttribute("aria-expanded", String(opened.has(letter.seq)));
  const again = button("Replay", `Replay ${name}`, () => replay(letter), "replay");
  const removing = confirming === letter.seq;
  const gone = button(removing ? "Confirm removal" : "Remove", `${removing ? "Confirm removal of" : "Remove"} ${name}`, () => remove(letter), "remove deny");
  if (!mayOperate) {
    for (const b of [again, gone]) {
      b.disabled = true;
      b.title = "this key may not replay or remove dead letters (it lacks the operate role)";
    }
  } else if (letter.truncated) {
    again.disabled = true;
    again.title = "this letter holds only the head of its message: it cannot be replayed";
  }
  const box = document.createElement("div");
  box.className = "row-actions";
  box.append(show, again, gone);
  return box;
}

// Reads the letters again and redraws them, keeping a keyboard user's place.
function showLetters() {
  return Skein.keepingPlace($("dead-letters-rows"), drawLetters);
}

async function drawLetters() {
  const { letters, may_operate: mayOperate } = await api("/console/api/dead-letters");
  const rows = $("dead-letters-rows");
  rows.replaceChildren();
  const present = new Set(letters.map((l) => l.seq));
  for (const seq of opened.keys()) if (!present.has(seq)) opened.delete(seq);
  if (!present.has(confirming)) confirming = null;
  for (const letter of letters) {
    const row = document.createElement("tr");
    row.dataset.seq = letter.seq;
    if (letter.task_id) row.dataset.task = letter.task_id;
    cell(row, letter.seq);
    cell(row, letter.original_subject);
    cell(row, letter.task_id || "");
    cell(row, letter.reason).className = "reason";
    cell(row, letter.attempts);
    cell(row, size(letter));
    cell(row, actions(letter, mayOperate));
    rows.append(row);
    if (opened.has(letter.seq)) {
      const detail = document.createElement("tr");
      detail.className = "letter-body";
      detail.dataset.body = letter.seq;
      const pre = document.createElement("pre");
      pre.textContent = opened.get(letter.seq);
      const td = cell(detail, pre);
      td.colSpan = 7;
      rows.append(detail);
    }
  }
  $("dead-letters-table").hidden = letters.length === 0;
  $("dead-letters-empty").hidden = letters.length !== 0;
  $("dead-letters-operate").hidden = mayOperate;
}

Skein.view("dead-letters", {
  show: showLetters,
  leave() {
    confirming = null;
  },
});
})();
