// Finding lines: the search box (matches in the window marked here, the next one beyond it
// found by the server) and the jump to the first error. What counts as a match is the
// server's rule (text.js).
import { getLogs } from "./api.js";
import { centre, itemIndexAt, rerender, setFocus } from "./dom.js";
import { isFiltered } from "./filters.js";
import { pause } from "./live.js";
import { loadAround } from "./paging.js";
import { rangesOf } from "./render.js";
import { note, showSearchStatus } from "./status.js";
import { firstLineCursor, lastLineCursor, nextMatch } from "./window.js";

export function setQuery(v, query) {
  const s = v.s;
  s.query = query;
  s.matchCount = 0;
  for (const it of s.win) {
    if (it.notice) continue;
    if (it.match || rangesOf(v, it).length) rerender(v, it);
    if (it.match) s.matchCount++;
  }
  if (s.focusItem && !s.focusItem.match) setFocus(v, null);
  showSearchStatus(v);
}

export async function searchStep(v, dir) {
  const { s, el } = v;
  if (!s.query) return el.search.focus();
  pause(v);
  // Start from the current match, else from the edge of what is on screen.
  let i = s.focusItem && s.focusItem.el ? s.win.indexOf(s.focusItem) : -1;
  if (i < 0) i = dir > 0 ? itemIndexAt(v, el.log.scrollTop) - 1 : itemIndexAt(v, el.log.scrollTop + el.log.clientHeight);
  const j = nextMatch(s.win, i, dir);
  if (j >= 0) {
    setFocus(v, s.win[j]);
    centre(v, s.win[j], "centre");
    return showSearchStatus(v);
  }
  // Not in the window: ask the server for the next match beyond it.
  const gen = s.viewGen;
  showSearchStatus(v, "searching…");
  try {
    let hit = null;
    if (dir > 0) {
      const last = lastLineCursor(s.win, s.endItem);
      const page = await getLogs(v, { q: s.query, after: last === null ? 0 : last, limit: 1 });
      hit = page.lines[0];
    } else if (s.moreBefore && firstLineCursor(s.win) !== null) {
      const page = await getLogs(v, { q: s.query, before: firstLineCursor(s.win), limit: 1 });
      hit = page.lines[page.lines.length - 1];
    }
    if (gen !== s.viewGen) return;
    if (!hit) return showSearchStatus(v, dir > 0 ? "no more below" : "no more above");
    await loadAround(v, hit.cursor, "centre", hit);
  } catch (err) {
    showSearchStatus(v, `search failed: ${err.message}`);
  }
}

export async function jumpToError(v) {
  const s = v.s;
  pause(v);
  note(v, "");
  let page;
  try {
    page = await getLogs(v, { errors: 1, limit: 1, after: 0 });
  } catch (err) {
    return note(v, `Could not look for errors: ${err.message}`);
  }
  const hit = page.lines[0];
  if (!hit) return note(v, isFiltered(s.filter) ? "No error lines match these filters." : "No error lines in this log.");
  const here = s.win.find((it) => it.cursor === hit.cursor);
  if (here) {
    setFocus(v, here);
    centre(v, here, "centre");
  } else await loadAround(v, hit.cursor, "centre", hit);
}

export function listenToSearch(v) {
  const { el } = v;
  let timer = 0;
  el.search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => setQuery(v, el.search.value), 150);
  });
  el.search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    clearTimeout(timer);
    if (el.search.value !== v.s.query) setQuery(v, el.search.value);
    searchStep(v, ev.shiftKey ? -1 : 1);
  });
  el.searchNext.addEventListener("click", () => searchStep(v, 1));
  el.searchPrev.addEventListener("click", () => searchStep(v, -1));
  el.jumpError.addEventListener("click", () => jumpToError(v));
}
