// The window's arithmetic: which items are in the DOM, where its edges are, what to drop when
// it grows past its bound. Pure: arrays of items in, numbers and removed items out (dom.js
// takes the removed items' elements away).
import { isSeparator } from "./attempts.js";

export function lastCursor(win) {
  return win.length ? win[win.length - 1].cursor : -1;
}

// The cursor of the first line in the window (a notice before it rounds up to it).
export function firstLineCursor(win) {
  return win.length ? Math.ceil(win[0].cursor) : null;
}

export function lastLineCursor(win, endItem) {
  for (let i = win.length - 1; i >= 0; i--) if (win[i] !== endItem) return Math.floor(win[i].cursor);
  return null;
}

// Takes the first k items out of win, and any separator left before its first line; returns
// what it took.
export function takeFromTop(win, k) {
  if (k <= 0) return [];
  const gone = win.splice(0, k);
  for (let i = 0; i < win.length && win[i].notice; ) {
    if (isSeparator(win[i])) gone.push(...win.splice(i, 1));
    else i++;
  }
  return gone;
}

// Takes the last k items out of win, and any separator left after its last line.
export function takeFromBottom(win, k) {
  if (k <= 0) return [];
  const gone = win.splice(win.length - k, k);
  for (let i = win.length - 1; i >= 0 && win[i].notice; i--) {
    if (isSeparator(win[i])) gone.push(...win.splice(i, 1));
  }
  return gone;
}

// The index of the first item whose element reaches below y (`bottomOf(item)`: where its
// element ends, in the same terms); win.length if none does. Items are in order on screen.
export function indexAt(win, y, bottomOf) {
  let lo = 0;
  let hi = win.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (bottomOf(win[mid]) <= y) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export function pendingLines(pending) {
  let n = 0;
  for (const it of pending) if (!it.notice) n++;
  return n;
}

// Whether a page read after the window's last line reached what the websocket brings next
// (`cursor`: what the websocket has brought so far).
export function reachesLive(page, pageSize, pending, endItem, cursor) {
  if (page.complete || page.lines.length < pageSize) return true;
  const first = pending.find((it) => it !== endItem);
  const need = first ? Math.ceil(first.cursor) - 1 : cursor;
  return need !== null && page.next >= need;
}

// Which match (from 1) in the window the item is; 0 if it is none.
export function matchIndex(win, item) {
  let n = 0;
  for (const it of win) {
    if (it.match) n++;
    if (it === item) return n;
  }
  return 0;
}

// The index in win of the next match after (dir 1) or before (dir -1) index i; -1 if none.
export function nextMatch(win, i, dir) {
  for (let j = i + dir; j >= 0 && j < win.length; j += dir) if (win[j].match) return j;
  return -1;
}
