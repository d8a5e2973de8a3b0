// Following and pausing, and what the view says about itself: the status line, the "new
// lines" button, notes, banners, the text of an empty log. These run every frame while lines
// stream in: they touch the DOM only when something changed.
import { formatCount } from "../../format.js";
import { isWaiting } from "../../rules.js";
import { setFocus } from "./dom.js";
import { isFiltered, nothingSelected } from "./filters.js";
import { requestFlush } from "./live.js";
import { pendingLines } from "./window.js";

export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

export function pause(v) {
  const s = v.s;
  if (!s.following) return;
  s.following = false;
  s.unseen = pendingLines(s.pending);
  showFollowState(v);
}

export function resume(v) {
  const s = v.s;
  if (s.busy) { s.viewGen++; s.busy = false; } // a page of older lines must not land after this
  s.following = true;
  s.unseen = 0;
  setFocus(v, null);
  showFollowState(v);
  requestFlush(v);
}

export function showFollowState(v) {
  const { s, el } = v;
  if (s.shownFollowing !== s.following) {
    s.shownFollowing = s.following;
    el.pause.textContent = s.following ? "Pause" : "Resume";
    el.pause.setAttribute("aria-pressed", s.following ? "false" : "true");
    el.pause.classList.toggle("paused", !s.following);
  }
  if (!s.following && !s.gap) s.unseen = pendingLines(s.pending);
  const hidden = s.following || (!s.gap && s.unseen === 0);
  if (el.newLines.hidden !== hidden) el.newLines.hidden = hidden;
  if (!hidden) {
    setText(el.newLines, s.unseen > 0 ? `↓ ${formatCount(s.unseen)} new line${s.unseen === 1 ? "" : "s"}` : "↓ Back to the end");
  }
  showStatus(v);
}

export function showStatus(v) {
  const s = v.s;
  setText(v.el.status, s.following || s.ended ? s.connection : `${s.connection} · paused`);
}

// What the log says while it has no line to show (CSS shows it on an empty log).
export function showEmpty(v) {
  const filter = v.s.filter;
  let text = "No lines yet.";
  if (nothingSelected(filter)) text = "Tick stdout or stderr to see lines.";
  else if (isFiltered(filter)) text = "No lines match these filters yet.";
  else if (isWaiting(v.s.job.state)) text = "The log starts when the job runs.";
  v.el.log.dataset.empty = text;
}

export function note(v, text, kind = "info") {
  const el = v.el.note;
  el.textContent = text;
  el.dataset.kind = kind;
  el.hidden = !text;
}

export function banner(v, text) {
  const p = document.createElement("p");
  p.className = "log-banner";
  p.textContent = text;
  v.el.notices.appendChild(p);
  while (v.el.notices.childElementCount > 3) v.el.notices.firstElementChild.remove();
}
