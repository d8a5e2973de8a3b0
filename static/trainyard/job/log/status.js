// What the view says about itself: following or paused, the status line, the "new lines"
// button, the search's count, notes, banners, the text of an empty log. Display only (the
// actions are live.js's and search.js's). These run every frame while lines stream in: they
// touch the DOM only when something changed.
import { formatCount } from "../../format.js";
import { isWaiting } from "../../rules.js";
import { isFiltered, nothingSelected } from "./filters.js";
import { matchIndex, pendingLines } from "./window.js";

export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
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

// "3 of 12 loaded", or what the search is doing (`message`).
export function showSearchStatus(v, message) {
  const { s } = v;
  const el = v.el.searchStatus;
  if (message !== undefined) setText(el, message);
  else if (!s.query) setText(el, "");
  else if (!s.matchCount) setText(el, "none loaded");
  else {
    const at = s.focusItem && s.focusItem.match && s.focusItem.el ? matchIndex(s.win, s.focusItem) : 0;
    setText(el, at ? `${at} of ${s.matchCount} loaded` : `${s.matchCount} loaded`);
  }
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
