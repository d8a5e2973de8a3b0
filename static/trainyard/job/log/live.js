// Live lines from the websocket, and following them: those that match the filters wait in
// `pending` and are rendered once per animation frame, at most FRAME_LINES a frame. While the
// view is paused they stay there, bounded by MAX_BUFFER: past it the oldest are dropped, and
// fetched over HTTP if the person scrolls down to them.
import { tagOf } from "../../rules.js";
import { appendItems, clearWindow, dropFromTop, scrollToBottom, setFocus } from "./dom.js";
import { lineMatches } from "./filters.js";
import { loadTail } from "./paging.js";
import { FRAME_LINES, MAX_BUFFER, MAX_WINDOW } from "./state.js";
import { showFollowState, showSearchStatus } from "./status.js";
import { lastCursor, pendingLines } from "./window.js";

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

export function requestFlush(v) {
  if (v.s.frameRequested) return;
  v.s.frameRequested = true;
  requestAnimationFrame(() => flush(v));
}

function flush(v) {
  const s = v.s;
  s.frameRequested = false;
  if (s.loading) return;
  if (!s.following) return showFollowState(v);
  if (s.gap) {
    // The lines between the window and the buffer are only on the server. If the buffer ran
    // over it holds the newest lines, so start from those; otherwise fetch the newest.
    if (!s.dropped) return loadTail(v);
    clearWindow(v);
    s.moreBefore = true;
    s.gap = s.dropped = false;
  }
  const last = lastCursor(s.win);
  let items = s.pending;
  s.pending = [];
  if (items.length > FRAME_LINES) {
    s.pending = items.slice(FRAME_LINES); // the rest next frame
    items = items.slice(0, FRAME_LINES);
    requestFlush(v);
  }
  if (items.length && items[0].cursor <= last) items = items.filter((it) => it.cursor > last);
  dropFromTop(v, s.win.length + items.length - MAX_WINDOW);
  appendItems(v, items);
  scrollToBottom(v);
  showFollowState(v);
  showSearchStatus(v);
}

function take(s, line) {
  if (s.cursor !== null && line.cursor <= s.cursor) return; // replayed after a reconnect
  s.pending.push(line);
  if (!s.following) s.unseen++;
}

function keepBufferBounded(s) {
  const over = s.pending.length - MAX_BUFFER;
  if (over <= 0) return;
  s.pending.splice(0, over);
  s.gap = s.dropped = true; // what was dropped can be fetched over HTTP
}

// A "log" frame carries either `lines` (one object per line) or `batches` (lines of one
// instance and stream: line k of a batch has cursor first + k, and shows as `shown[k]` when
// the server says so).
export function receive(v, msg) {
  const s = v.s;
  for (const line of msg.lines || []) {
    line.tag = tagOf(line.role, line.index);
    if (lineMatches(s.filter, line)) take(s, line);
  }
  for (const b of msg.batches || []) {
    const tag = tagOf(b.role, b.index);
    if (!lineMatches(s.filter, { role: b.role, node: b.node, stream: b.stream, tag })) continue;
    const shown = b.shown || {};
    for (let k = 0; k < b.lines.length; k++) {
      const line = { cursor: b.first + k, role: b.role, index: b.index, attempt: b.attempt || 0, node: b.node, stream: b.stream, ts: b.ts, text: b.lines[k], tag };
      if (shown[k]) line.shown = shown[k];
      take(s, line);
    }
  }
  keepBufferBounded(s);
  requestFlush(v);
}

// A notice row (a gap, the end) among the live lines.
export function pushNotice(v, item) {
  v.s.pending.push(item);
  keepBufferBounded(v.s);
  requestFlush(v);
}
