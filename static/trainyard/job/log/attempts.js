// Attempts: a restarted job's log goes on with the next attempt's lines, and a separator row
// says where. Pure: items in, items out.

export function attemptOf(item) {
  return item.attempt || 0;
}

export function attemptLabel(item) {
  return `attempt ${attemptOf(item) + 1}`; // counted from 1: attempt 0 is the first run
}

// What a line's tag reads: `[worker-1] `, or `[worker-1 · attempt 2] ` after a restart.
export function tagText(item) {
  return attemptOf(item) > 0 ? `[${item.tag} · ${attemptLabel(item)}] ` : `[${item.tag}] `;
}

// A row before the first line of another attempt (ours alone: text, never the trainer's HTML).
export function attemptSeparator(line) {
  return { notice: "attempt", attempt: attemptOf(line), cursor: line.cursor - 0.5, text: `— ${attemptLabel(line)} —` };
}

export function isSeparator(item) {
  return item.notice === "attempt";
}

export function firstLine(items) {
  for (const it of items) if (!it.notice) return it;
  return null;
}

export function lastLine(items) {
  for (let i = items.length - 1; i >= 0; i--) if (!items[i].notice) return items[i];
  return null;
}

// `items` with a separator before each line whose attempt is not that of the line before it
// (`prev`: the line just before items[0], or null). Separators only ever sit between two
// lines of the window: window.js drops one left at either edge.
export function withSeparators(items, prev) {
  let out = null;
  for (let i = 0; i < items.length; i++) {
    const it = items[i];
    if (!it.notice) {
      if (prev && attemptOf(it) !== attemptOf(prev)) {
        if (!out) out = items.slice(0, i);
        out.push(attemptSeparator(it));
      }
      prev = it;
    }
    if (out) out.push(it);
  }
  return out || items;
}

// Older `items` to put before `win`: with their separators, and one between them and the
// window when the attempt changes there.
export function olderWithSeparators(items, win) {
  const out = withSeparators(items, null);
  const older = lastLine(out);
  const next = firstLine(win);
  if (older && next && attemptOf(older) !== attemptOf(next)) {
    if (out === items) return [...items, attemptSeparator(next)];
    out.push(attemptSeparator(next));
  }
  return out;
}
