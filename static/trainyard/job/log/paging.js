// Lines over HTTP (GET /api/v1/jobs/<id>/logs): the window rebuilt at the end or around a
// line, and older or newer pages as the person scrolls. Every answer is checked against the
// view's generation, so one that arrives after the window was rebuilt is dropped.
//
// It shows what it loaded and no more: the live lines held meanwhile are live.js's, which
// logview.js wires in as `v.rebuilt` (so this module does not import the one above it).
import { getLogs } from "./api.js";
import { appendItems, centre, clearWindow, dropFromBottom, dropFromTop, prependItems, scrollToBottom, setFocus } from "./dom.js";
import { nothingSelected } from "./filters.js";
import { END, MAX_WINDOW, PAGE, TAIL } from "./state.js";
import { note, showEmpty, showFollowState, showSearchStatus } from "./status.js";
import { firstLineCursor, lastLineCursor, pendingLines, reachesLive } from "./window.js";

function beginRebuild(v) {
  const s = v.s;
  s.viewGen++;
  s.loading = true;
  s.busy = false;
  s.pending = [];
  s.gap = s.dropped = false;
  setFocus(v, null);
  return s.viewGen;
}

function finishRebuild(v, gen) {
  if (gen !== v.s.viewGen) return;
  v.s.loading = false;
  showEmpty(v);
  if (v.el.note.dataset.kind === "error") note(v, "");
  showFollowState(v);
  showSearchStatus(v);
  v.rebuilt(v); // the live lines held while it loaded come next
}

function failed(v, what, err, gen, again) {
  note(v, `Could not load ${what}: ${err.message}. Trying again…`, "error");
  setTimeout(() => { if (gen === v.s.viewGen) again(); }, 2000);
}

function keepEnd(s) {
  if (s.ended && !s.pending.includes(s.endItem)) s.pending.push(s.endItem);
}

// The newest matching lines up to what the websocket has brought; live lines follow them.
export async function loadTail(v) {
  const s = v.s;
  const gen = beginRebuild(v);
  let page = { lines: [], more_before: false };
  try {
    if (!nothingSelected(s.filter)) page = await getLogs(v, { before: s.cursor === null ? END : s.cursor + 1, limit: TAIL });
  } catch (err) {
    return failed(v, "the log", err, gen, () => loadTail(v));
  }
  if (gen !== s.viewGen) return;
  clearWindow(v);
  appendItems(v, page.lines);
  s.moreBefore = !!page.more_before;
  keepEnd(s);
  if (s.following) scrollToBottom(v);
  finishRebuild(v, gen);
}

// The lines on both sides of cursor c, with the first line at or after c shown at the top
// of the view or in its middle. `hit`: the line the search or the error jump found, marked
// (with the server's hits, for a search); null for none.
export async function loadAround(v, c, how, hit) {
  const s = v.s;
  const gen = beginRebuild(v);
  let older;
  let newer;
  try {
    [older, newer] = await Promise.all([
      getLogs(v, { before: c, limit: PAGE }),
      getLogs(v, { after: Math.max(0, c - 1), limit: PAGE }),
    ]);
  } catch (err) {
    return failed(v, "the log", err, gen, () => loadAround(v, c, how, hit));
  }
  if (gen !== s.viewGen) return;
  const lines = older.lines.concat(newer.lines);
  if (hit && hit.hits) {
    const same = lines.find((l) => l.cursor === hit.cursor);
    if (same) Object.assign(same, { hits: hit.hits, hitsFor: s.query });
  }
  clearWindow(v);
  appendItems(v, lines);
  s.moreBefore = !!older.more_before;
  if (reachesLive(newer, PAGE, s.pending, s.endItem, s.cursor)) keepEnd(s);
  else s.gap = true;
  const target = s.win.find((it) => it.cursor >= c) || s.win[s.win.length - 1];
  if (target) {
    if (hit) setFocus(v, target);
    centre(v, target, how);
  }
  finishRebuild(v, gen);
}

export async function fetchOlder(v) {
  const s = v.s;
  const log = v.el.log;
  const first = firstLineCursor(s.win);
  if (first === null) { s.moreBefore = false; return; }
  s.busy = true;
  const gen = s.viewGen;
  try {
    const page = await getLogs(v, { before: first, limit: PAGE });
    if (gen !== s.viewGen) return;
    s.moreBefore = !!page.more_before;
    const lines = page.lines.filter((l) => l.cursor < first);
    if (!lines.length) return;
    // Keep what the person is reading where it is.
    const height = log.scrollHeight;
    const top = log.scrollTop;
    prependItems(v, lines);
    log.scrollTop = top + (log.scrollHeight - height);
    dropFromBottom(v, s.win.length - MAX_WINDOW);
    showFollowState(v);
    showSearchStatus(v);
  } catch (err) {
    note(v, `Could not load older lines: ${err.message}`);
  } finally {
    if (gen === s.viewGen) s.busy = false;
  }
}

export async function fetchNewer(v) {
  const s = v.s;
  const log = v.el.log;
  const last = lastLineCursor(s.win, s.endItem);
  if (last === null) return;
  s.busy = true;
  const gen = s.viewGen;
  try {
    const page = await getLogs(v, { after: last, limit: PAGE });
    if (gen !== s.viewGen) return;
    const bridged = reachesLive(page, PAGE, s.pending, s.endItem, s.cursor);
    const first = s.pending.find((it) => it !== s.endItem);
    const lines = page.lines.filter((l) => l.cursor > last && (!first || l.cursor < first.cursor));
    appendItems(v, lines);
    const height = log.scrollHeight;
    const top = log.scrollTop;
    dropFromTop(v, s.win.length - MAX_WINDOW);
    log.scrollTop = top - (height - log.scrollHeight);
    s.unseen = Math.max(pendingLines(s.pending), s.unseen - lines.length);
    if (bridged) {
      s.gap = s.dropped = false;
      keepEnd(s);
    }
    showFollowState(v);
    showSearchStatus(v);
  } catch (err) {
    note(v, `Could not load newer lines: ${err.message}`);
  } finally {
    if (gen === s.viewGen) s.busy = false;
  }
}
