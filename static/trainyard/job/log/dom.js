// The window in the DOM: items rendered in blocks of CHUNK, added at either end, dropped from
// either end, scrolled to. window.js decides what; this does it to the elements.
import { lastLine, olderWithSeparators, withSeparators } from "./attempts.js";
import { lineElement } from "./render.js";
import { CHUNK } from "./state.js";
import { indexAt, takeFromBottom, takeFromTop } from "./window.js";

function render(v, item) {
  item.el = lineElement(v, item);
  if (item.match) v.s.matchCount++;
  return item.el;
}

// New blocks of CHUNK items (the last one may be short).
function chunksOf(v, items, from) {
  const frag = document.createDocumentFragment();
  for (let i = from; i < items.length; ) {
    const chunk = document.createElement("div");
    chunk.className = "chunk";
    for (const end = Math.min(items.length, i + CHUNK); i < end; i++) chunk.appendChild(render(v, items[i]));
    frag.appendChild(chunk);
  }
  return frag;
}

export function appendItems(v, items) {
  if (!items.length) return;
  const { s, el } = v;
  items = withSeparators(items, lastLine(s.win));
  const last = el.log.lastElementChild;
  let i = 0;
  if (last) {
    const fill = document.createDocumentFragment();
    for (const room = CHUNK - last.childElementCount; i < items.length && i < room; i++) fill.appendChild(render(v, items[i]));
    last.appendChild(fill);
  }
  el.log.appendChild(chunksOf(v, items, i));
  s.win.push(...items);
}

export function prependItems(v, items) {
  if (!items.length) return;
  items = olderWithSeparators(items, v.s.win);
  v.el.log.prepend(chunksOf(v, items, 0));
  v.s.win = items.concat(v.s.win);
}

function removeItems(v, gone) {
  for (const it of gone) {
    const chunk = it.el.parentNode;
    it.el.remove();
    if (chunk && !chunk.firstChild) chunk.remove();
    if (it.match) v.s.matchCount--;
    it.el = null;
  }
}

export function dropFromTop(v, k) {
  if (k <= 0) return;
  removeItems(v, takeFromTop(v.s.win, k));
  v.s.moreBefore = true;
}

export function dropFromBottom(v, k) {
  if (k <= 0) return;
  removeItems(v, takeFromBottom(v.s.win, k));
  v.s.gap = true;
}

export function clearWindow(v) {
  v.el.log.replaceChildren();
  for (const it of v.s.win) it.el = null;
  v.s.win = [];
  v.s.matchCount = 0;
  v.s.stickTop = 0;
}

export function scrollToBottom(v) {
  const log = v.el.log;
  log.scrollTop = log.scrollHeight;
  v.s.stickTop = log.scrollTop;
}

// Where an element is in the log's scrolled content, in scrollTop's terms. (Not offsetTop:
// a line's offsetParent is its contained block, not the log.)
function yOf(v, el) {
  const log = v.el.log;
  return el.getBoundingClientRect().top - log.getBoundingClientRect().top - log.clientTop + log.scrollTop;
}

// The index of the first item whose element reaches below y; win.length if none does.
export function itemIndexAt(v, y) {
  return indexAt(v.s.win, y, (item) => yOf(v, item.el) + item.el.offsetHeight);
}

export function topVisibleCursor(v) {
  const { win, endItem } = v.s;
  if (!win.length) return null;
  const i = Math.min(itemIndexAt(v, v.el.log.scrollTop), win.length - 1);
  return win[i] === endItem ? null : Math.ceil(win[i].cursor);
}

// Scroll the log so the item is at its top or in its middle, and the page (as little as it
// takes) so that the item is on screen.
export function centre(v, item, how) {
  const el = item.el;
  if (!el) return;
  const log = v.el.log;
  const y = yOf(v, el);
  log.scrollTop = how === "top" ? y : y - (log.clientHeight - el.offsetHeight) / 2;
  el.scrollIntoView({ block: "nearest" });
}

export function setFocus(v, item) {
  const s = v.s;
  if (s.focusItem && s.focusItem.el) s.focusItem.el.classList.remove("focus");
  s.focusItem = item;
  if (item && item.el) item.el.classList.add("focus");
}

// Renders the item again (its matches changed); returns its new element.
export function rerender(v, item) {
  const el = lineElement(v, item);
  item.el.replaceWith(el);
  item.el = el;
}
