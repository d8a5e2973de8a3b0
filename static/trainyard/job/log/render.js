// One item's element. Built with createElement / createTextNode only: whatever a trainer
// prints (HTML, escape sequences) stays text, and the server has already said how it shows.
import { formatLocalTime } from "../../format.js";
import { tagText } from "./attempts.js";
import { findRanges, pieces, plainOf, segmentsOf } from "./text.js";

// The item's shown text, worked out once.
export function plainOfItem(item) {
  if (item.plain === undefined) item.plain = plainOf(segmentsOf(item));
  return item.plain;
}

// Where the query matches the item: the server's own hits when it found this line for this
// query, else the same rule here.
export function rangesOf(v, item) {
  if (!v.s.query || item.notice) return [];
  if (item.hitsFor === v.s.query && item.hits) return item.hits;
  return findRanges(v.s.query, plainOfItem(item), v.foldTable);
}

export function lineElement(v, item) {
  const div = document.createElement("div");
  if (item.notice) {
    div.className = `notice notice-${item.notice}`;
    div.textContent = item.text;
    return div;
  }
  div.className = item.stream === "stderr" ? "line stderr" : "line";
  div.dataset.tag = item.tag;
  div.dataset.cursor = item.cursor;
  div.dataset.node = item.node;
  div.dataset.stream = item.stream;
  div.title = `${item.node} · ${item.stream} · ${formatLocalTime(new Date(item.ts * 1000))} · #${item.cursor}`;
  const tag = document.createElement("span");
  tag.className = "tag";
  tag.textContent = tagText(item);
  div.appendChild(tag);
  const ranges = rangesOf(v, item);
  item.match = ranges.length > 0;
  if (item.match) div.classList.add("has-match");
  if (item === v.s.focusItem) div.classList.add("focus");
  for (const piece of pieces(segmentsOf(item), ranges)) {
    let node = document.createTextNode(piece.text);
    if (piece.marked) {
      const mark = document.createElement("mark");
      mark.className = "match";
      mark.appendChild(node);
      node = mark;
    }
    if (piece.cls) {
      const span = document.createElement("span");
      span.className = piece.cls;
      span.appendChild(node);
      node = span;
    }
    div.appendChild(node);
  }
  return div;
}
