// The job page's log viewer.
//
// The log arrives over the page's websocket (connection.js): the last TAIL lines, then live.
// What the page shows is a *window*: a run of consecutive lines that match the filters, at
// most MAX_WINDOW of them in the DOM (in blocks of CHUNK). Live lines wait in `pending` and are
// rendered once per animation frame, at most FRAME_LINES a frame. While the view is paused
// they stay there, bounded by MAX_BUFFER: past it the oldest are dropped, and fetched over HTTP
// if the person scrolls down to them. Older lines, other filters, search hits and the first
// error come from the HTTP API.
//
// Lines are built with createElement / createTextNode only: whatever a trainer prints (HTML,
// escape sequences) stays text.
import { isWaiting, tagOf as tagOfInstance } from "../rules.js";
import { parseText } from "./ansi.js";

export const TAIL = 2000; // lines asked for on connect, and when the view is rebuilt at the end
const MAX_WINDOW = 5000; // line (and notice) elements in the DOM, at most
const MAX_BUFFER = 5000; // live lines held back while paused; more could never all be shown
const PAGE = 1000; // lines per HTTP page when scrolling or loading around a line
const FRAME_LINES = 1000; // lines rendered per animation frame at most: a burst never janks
// Lines sit in blocks of CHUNK in the DOM, so adding or dropping a few relayouts one block
// rather than walking every line of the window.
const CHUNK = 200;
const EDGE_PX = 300; // this close to the top (bottom) of the window, fetch older (newer) lines
const END = Number.MAX_SAFE_INTEGER; // sorts after every cursor

export function createLogView(jobId, initialJob) {
  const $ = (id) => document.getElementById(id);
  const logEl = $("log");
  const statusEl = $("log-status");
  const tabsEl = $("log-tabs");
  const roleEl = $("log-role");
  const nodeEl = $("log-node");
  const stdoutEl = $("log-stdout");
  const stderrEl = $("log-stderr");
  const searchEl = $("log-search");
  const searchStatusEl = $("search-status");
  const pauseEl = $("log-pause");
  const newLinesEl = $("new-lines");
  const noteEl = $("log-note");
  const noticesEl = $("log-notices");
  const countsEl = $("log-counts");
  const number = new Intl.NumberFormat("en-US");

  let job = initialJob;

  // --- what the websocket has brought ---------------------------------------------------------
  let cursor = null; // every line up to this cursor has come over the websocket (null: none yet)
  let ended = false;
  let endItem = null;
  let connection = "connecting…";

  // --- the view -----------------------------------------------------------------------------
  let win = []; // items in the DOM, ascending by cursor; item.el is its element
  let pending = []; // matching items not rendered yet, ascending
  let moreBefore = true; // older matching lines may exist before win[0]
  let gap = false; // matching lines between the window's end and pending[0] are only on the server
  let dropped = false; // pending overflowed: it holds the newest lines, up to the live end
  let following = true;
  let loading = false; // the window is being rebuilt over HTTP; pending waits for it
  let busy = false; // an older or newer page is being fetched
  let viewGen = 0; // bumped whenever the window is rebuilt: answers for an older one are dropped
  let unseen = 0; // matching lines that arrived while paused and are not shown
  let stickTop = 0; // the scrollTop we last set while following: less means the person scrolled up
  let frameRequested = false;
  let filter = { tag: "", role: "", index: "", node: "", stdout: true, stderr: true };
  let query = "";
  let queryLower = "";
  let queryRe = null;
  let matchCount = 0;
  let focusItem = null;

  const tagOf = (line) => tagOfInstance(line.role, line.index);

  // --- filters: instance tabs, role, node, stream -------------------------------------------
  function ensureTab(r) {
    if (tabsEl.querySelector(`[data-tag="${CSS.escape(r.tag)}"]`)) return;
    const b = document.createElement("button");
    b.type = "button";
    b.className = "tab";
    b.setAttribute("role", "tab");
    b.dataset.tag = r.tag;
    b.dataset.role = r.role;
    b.dataset.index = r.index;
    b.textContent = `[${r.tag}]`;
    tabsEl.appendChild(b);
  }

  function setOptions(select, values, label) {
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\n") === values.join("\n")) return;
    const current = select.value;
    select.replaceChildren(new Option(label, ""));
    for (const v of values) select.appendChild(new Option(v, v));
    select.value = values.includes(current) ? current : "";
  }

  function syncOptions() {
    const roles = [...new Set(job.replicas.map((r) => r.role))];
    const nodes = new Set(job.replicas.map((r) => r.node).filter(Boolean));
    for (const n of Object.keys(nodeCounts)) nodes.add(n);
    setOptions(roleEl, roles, "all roles");
    setOptions(nodeEl, [...nodes].sort(), "all nodes");
    renderNodeCounts();
    // A choice that is no longer offered (say, a node the job left) falls back to "all".
    if (JSON.stringify(readFilter()) !== JSON.stringify(filter)) filterChanged();
  }

  // A tab is offered only when it can show something under the role and node chosen.
  function syncTabs() {
    const byTag = new Map(job.replicas.map((r) => [r.tag, r]));
    for (const b of tabsEl.querySelectorAll(".tab")) {
      const r = byTag.get(b.dataset.tag);
      b.hidden = !!r && ((roleEl.value && r.role !== roleEl.value) || (nodeEl.value && r.node !== nodeEl.value));
      if (b.hidden && b.classList.contains("active")) selectTab(tabsEl.querySelector('.tab[data-tag=""]'));
    }
  }

  function selectTab(b) {
    tabsEl.querySelectorAll(".tab").forEach((t) => {
      t.classList.toggle("active", t === b);
      t.setAttribute("aria-selected", t === b ? "true" : "false");
    });
  }

  function readFilter() {
    const active = tabsEl.querySelector(".tab.active");
    return {
      tag: active ? active.dataset.tag : "",
      role: active && active.dataset.tag ? active.dataset.role : roleEl.value,
      index: active && active.dataset.tag ? active.dataset.index : "",
      node: nodeEl.value,
      stdout: stdoutEl.checked,
      stderr: stderrEl.checked,
    };
  }

  function filterParams() {
    const p = {};
    if (filter.role) p.role = filter.role;
    if (filter.index !== "") p.index = filter.index;
    if (filter.node) p.node = filter.node;
    if (filter.stdout !== filter.stderr) p.stream = filter.stdout ? "stdout" : "stderr";
    return p;
  }

  function matches(line) {
    if (line.stream === "stderr" ? !filter.stderr : !filter.stdout) return false;
    if (filter.tag && line.tag !== filter.tag) return false;
    if (filter.role && line.role !== filter.role) return false;
    if (filter.node && line.node !== filter.node) return false;
    return true;
  }

  function nothingSelected() {
    return !filter.stdout && !filter.stderr;
  }

  function filterChanged() {
    syncTabs();
    const next = readFilter();
    if (JSON.stringify(next) === JSON.stringify(filter)) return;
    filter = next;
    // Following: show the newest matching lines. Paused: stay where the person was reading.
    const top = following ? null : topVisibleCursor();
    if (top === null) loadTail();
    else loadAround(top, "top", false);
  }

  tabsEl.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.tab");
    if (!b) return;
    selectTab(b);
    filterChanged();
  });
  for (const el of [roleEl, nodeEl, stdoutEl, stderrEl]) el.addEventListener("change", filterChanged);

  function prepare(line) {
    line.tag = tagOf(line);
    return line;
  }

  function ensureParsed(item) {
    if (item.segments) return;
    item.segments = parseText(item.text);
    item.plain = item.segments.map((s) => s.text).join("");
  }

  function hasMatch(item) {
    if (!queryRe || item.notice) return false;
    ensureParsed(item);
    return item.plain.toLowerCase().includes(queryLower);
  }

  function matchRanges(plain) {
    const ranges = [];
    for (const m of plain.matchAll(queryRe)) ranges.push([m.index, m.index + m[0].length]);
    return ranges;
  }

  function lineElement(item) {
    const div = document.createElement("div");
    if (item.notice) {
      div.className = `notice notice-${item.notice}`;
      div.textContent = item.text;
      return div;
    }
    ensureParsed(item);
    div.className = item.stream === "stderr" ? "line stderr" : "line";
    div.dataset.tag = item.tag;
    div.dataset.cursor = item.cursor;
    div.dataset.node = item.node;
    div.dataset.stream = item.stream;
    div.title = `${item.node} · ${item.stream} · ${new Date(item.ts * 1000).toISOString()} · #${item.cursor}`;
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = attemptOf(item) > 0 ? `[${item.tag} · ${attemptLabel(item)}] ` : `[${item.tag}] `;
    div.appendChild(tag);
    const ranges = queryRe ? matchRanges(item.plain) : [];
    item.match = ranges.length > 0;
    if (item.match) div.classList.add("has-match");
    if (item === focusItem) div.classList.add("focus");
    let offset = 0;
    let r = 0;
    for (const seg of item.segments) {
      const end = offset + seg.text.length;
      let at = offset;
      while (at < end) {
        while (r < ranges.length && ranges[r][1] <= at) r++;
        let stop = end;
        let marked = false;
        if (r < ranges.length && ranges[r][0] <= at) { marked = true; stop = Math.min(end, ranges[r][1]); }
        else if (r < ranges.length && ranges[r][0] < end) stop = ranges[r][0];
        let node = document.createTextNode(seg.text.slice(at - offset, stop - offset));
        if (marked) {
          const mark = document.createElement("mark");
          mark.className = "match";
          mark.appendChild(node);
          node = mark;
        }
        if (seg.cls) {
          const span = document.createElement("span");
          span.className = seg.cls;
          span.appendChild(node);
          node = span;
        }
        div.appendChild(node);
        at = stop;
      }
      offset = end;
    }
    return div;
  }

  // --- attempts: a restarted job's log goes on with the next attempt's lines ----------------
  function attemptOf(item) {
    return item.attempt || 0;
  }

  function attemptLabel(item) {
    return `attempt ${attemptOf(item) + 1}`; // counted from 1: attempt 0 is the first run
  }

  // A row before the first line of another attempt (ours alone: text, never the trainer's HTML).
  function attemptSeparator(line) {
    return { notice: "attempt", attempt: attemptOf(line), cursor: line.cursor - 0.5, text: `— ${attemptLabel(line)} —` };
  }

  function isSeparator(item) {
    return item.notice === "attempt";
  }

  function firstLine(items) {
    for (const it of items) if (!it.notice) return it;
    return null;
  }

  function lastLine(items) {
    for (let i = items.length - 1; i >= 0; i--) if (!items[i].notice) return items[i];
    return null;
  }

  // `items` with a separator before each line whose attempt is not that of the line before it
  // (`prev`: the line just before items[0], or null). Separators only ever sit between two
  // lines of the window: the drops below take away one left at either edge.
  function withSeparators(items, prev) {
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

  // --- the window in the DOM ----------------------------------------------------------------
  function lastCursor() {
    return win.length ? win[win.length - 1].cursor : -1;
  }

  function firstLineCursor() {
    return win.length ? Math.ceil(win[0].cursor) : null;
  }

  function lastLineCursor() {
    for (let i = win.length - 1; i >= 0; i--) if (win[i] !== endItem) return Math.floor(win[i].cursor);
    return null;
  }

  function render(item) {
    item.el = lineElement(item);
    if (item.match) matchCount++;
    return item.el;
  }

  // New blocks of CHUNK items (the last one may be short).
  function chunksOf(items, from) {
    const frag = document.createDocumentFragment();
    for (let i = from; i < items.length; ) {
      const chunk = document.createElement("div");
      chunk.className = "chunk";
      for (const end = Math.min(items.length, i + CHUNK); i < end; i++) chunk.appendChild(render(items[i]));
      frag.appendChild(chunk);
    }
    return frag;
  }

  function appendItems(items) {
    if (!items.length) return;
    items = withSeparators(items, lastLine(win));
    const last = logEl.lastElementChild;
    let i = 0;
    if (last) {
      const fill = document.createDocumentFragment();
      for (const room = CHUNK - last.childElementCount; i < items.length && i < room; i++) fill.appendChild(render(items[i]));
      last.appendChild(fill);
    }
    logEl.appendChild(chunksOf(items, i));
    win.push(...items);
  }

  function prependItems(items) {
    if (!items.length) return;
    items = withSeparators(items, null);
    const older = lastLine(items);
    const next = firstLine(win);
    if (older && next && attemptOf(older) !== attemptOf(next)) items.push(attemptSeparator(next));
    logEl.prepend(chunksOf(items, 0));
    win = items.concat(win);
  }

  function removeItems(gone) {
    for (const it of gone) {
      const chunk = it.el.parentNode;
      it.el.remove();
      if (chunk && !chunk.firstChild) chunk.remove();
      if (it.match) matchCount--;
      it.el = null;
    }
  }

  function dropFromTop(k) {
    if (k <= 0) return;
    removeItems(win.splice(0, k));
    // A separator stays only between two lines: none before the first line left.
    for (let i = 0; i < win.length && win[i].notice; ) {
      if (isSeparator(win[i])) removeItems(win.splice(i, 1));
      else i++;
    }
    moreBefore = true;
  }

  function dropFromBottom(k) {
    if (k <= 0) return;
    removeItems(win.splice(win.length - k, k));
    for (let i = win.length - 1; i >= 0 && win[i].notice; i--) {
      if (isSeparator(win[i])) removeItems(win.splice(i, 1));
    }
    gap = true;
  }

  function clearWindow() {
    logEl.replaceChildren();
    for (const it of win) it.el = null;
    win = [];
    matchCount = 0;
    stickTop = 0;
  }

  function scrollToBottom() {
    logEl.scrollTop = logEl.scrollHeight;
    stickTop = logEl.scrollTop;
  }

  // Where an element is in the log's scrolled content, in scrollTop's terms. (Not offsetTop:
  // a line's offsetParent is its contained block, not the log.)
  function yOf(el) {
    return el.getBoundingClientRect().top - logEl.getBoundingClientRect().top - logEl.clientTop + logEl.scrollTop;
  }

  // The index of the first item whose element reaches below y; win.length if none does.
  function indexAt(y) {
    let lo = 0;
    let hi = win.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const el = win[mid].el;
      if (yOf(el) + el.offsetHeight <= y) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  function topVisibleIndex() {
    return win.length ? Math.min(indexAt(logEl.scrollTop), win.length - 1) : -1;
  }

  function topVisibleCursor() {
    const i = topVisibleIndex();
    return i < 0 || win[i] === endItem ? null : Math.ceil(win[i].cursor);
  }

  // Scroll the log so the item is at its top or in its middle, and the page (as little as it
  // takes) so that the item is on screen.
  function centre(item, how) {
    const el = item.el;
    if (!el) return;
    const y = yOf(el);
    logEl.scrollTop = how === "top" ? y : y - (logEl.clientHeight - el.offsetHeight) / 2;
    el.scrollIntoView({ block: "nearest" });
  }

  function setFocus(item) {
    if (focusItem && focusItem.el) focusItem.el.classList.remove("focus");
    focusItem = item;
    if (item && item.el) item.el.classList.add("focus");
  }

  // --- live lines: once per animation frame -------------------------------------------------
  function requestFlush() {
    if (frameRequested) return;
    frameRequested = true;
    requestAnimationFrame(flush);
  }

  function flush() {
    frameRequested = false;
    if (loading) return;
    if (!following) return showFollowState();
    if (gap) {
      // The lines between the window and the buffer are only on the server. If the buffer ran
      // over it holds the newest lines, so start from those; otherwise fetch the newest.
      if (!dropped) return loadTail();
      clearWindow();
      moreBefore = true;
      gap = dropped = false;
    }
    const last = lastCursor();
    let items = pending;
    pending = [];
    if (items.length > FRAME_LINES) {
      pending = items.slice(FRAME_LINES); // the rest next frame
      items = items.slice(0, FRAME_LINES);
      requestFlush();
    }
    if (items.length && items[0].cursor <= last) items = items.filter((it) => it.cursor > last);
    dropFromTop(win.length + items.length - MAX_WINDOW);
    appendItems(items);
    scrollToBottom();
    showFollowState();
    showSearchStatus();
  }

  function pendingLines() {
    let n = 0;
    for (const it of pending) if (!it.notice) n++;
    return n;
  }

  function take(line) {
    if (cursor !== null && line.cursor <= cursor) return; // replayed after a reconnect
    pending.push(line);
    if (!following) unseen++;
  }

  // A "log" frame carries either `lines` (one object per line) or `batches` (lines of one
  // instance and stream: line k of a batch has cursor first + k).
  function receive(msg) {
    for (const line of msg.lines || []) if (matches(prepare(line))) take(line);
    for (const b of msg.batches || []) {
      const tag = tagOf(b);
      if (!matches({ role: b.role, node: b.node, stream: b.stream, tag })) continue;
      for (let k = 0; k < b.lines.length; k++) {
        take({ cursor: b.first + k, role: b.role, index: b.index, attempt: b.attempt || 0, node: b.node, stream: b.stream, ts: b.ts, text: b.lines[k], tag });
      }
    }
    keepBufferBounded();
    requestFlush();
  }

  function keepBufferBounded() {
    const over = pending.length - MAX_BUFFER;
    if (over <= 0) return;
    pending.splice(0, over);
    gap = dropped = true; // what was dropped can be fetched over HTTP
  }

  function pushNotice(item) {
    pending.push(item);
    keepBufferBounded();
    requestFlush();
  }

  // --- follow and pause ---------------------------------------------------------------------
  function pause() {
    if (!following) return;
    following = false;
    unseen = pendingLines();
    showFollowState();
  }

  function resume() {
    if (busy) { viewGen++; busy = false; } // a page of older lines must not land after this
    following = true;
    unseen = 0;
    setFocus(null);
    showFollowState();
    requestFlush();
  }

  // These run every frame while lines stream in: they touch the DOM only when something changed.
  let shownFollowing = null;

  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  function showFollowState() {
    if (shownFollowing !== following) {
      shownFollowing = following;
      pauseEl.textContent = following ? "Pause" : "Resume";
      pauseEl.setAttribute("aria-pressed", following ? "false" : "true");
      pauseEl.classList.toggle("paused", !following);
    }
    if (!following && !gap) unseen = pendingLines();
    const hidden = following || (!gap && unseen === 0);
    if (newLinesEl.hidden !== hidden) newLinesEl.hidden = hidden;
    if (!hidden) setText(newLinesEl, unseen > 0 ? `↓ ${number.format(unseen)} new line${unseen === 1 ? "" : "s"}` : "↓ Back to the end");
    showStatus();
  }

  pauseEl.addEventListener("click", () => (following ? pause() : resume()));
  newLinesEl.addEventListener("click", resume);

  logEl.addEventListener(
    "scroll",
    () => {
      if (loading) return;
      const fromBottom = logEl.scrollHeight - logEl.scrollTop - logEl.clientHeight;
      if (following) {
        if (logEl.scrollTop >= stickTop - 2 || fromBottom <= 2) return;
        pause(); // the person scrolled up to read
      }
      if (busy) return;
      if (logEl.scrollTop < EDGE_PX && moreBefore) fetchOlder();
      else if (fromBottom < EDGE_PX && gap) fetchNewer();
    },
    { passive: true },
  );

  // --- HTTP ---------------------------------------------------------------------------------
  async function getLogs(params) {
    const q = new URLSearchParams({ ...filterParams(), ...params });
    const r = await fetch(`/api/v1/jobs/${jobId}/logs?${q}`, { credentials: "same-origin" });
    if (!r.ok) throw new Error(`the server answered ${r.status}`);
    const page = await r.json();
    page.lines.forEach(prepare);
    return page;
  }

  function beginRebuild() {
    viewGen++;
    loading = true;
    busy = false;
    pending = [];
    gap = dropped = false;
    setFocus(null);
    return viewGen;
  }

  // Whether a page read after the window's last line reached what the websocket brings next.
  function reachesLive(page) {
    if (page.complete || page.lines.length < PAGE) return true;
    const first = pending.find((it) => it !== endItem);
    const need = first ? Math.ceil(first.cursor) - 1 : cursor;
    return need !== null && page.next >= need;
  }

  function finishRebuild(gen) {
    if (gen !== viewGen) return;
    loading = false;
    showEmpty();
    if (noteEl.dataset.kind === "error") note("");
    showFollowState();
    showSearchStatus();
    requestFlush();
  }

  function failed(what, err, gen, again) {
    note(`Could not load ${what}: ${err.message}. Trying again…`, "error");
    setTimeout(() => { if (gen === viewGen) again(); }, 2000);
  }

  // The newest matching lines up to what the websocket has brought; live lines follow them.
  async function loadTail() {
    const gen = beginRebuild();
    let page = { lines: [], more_before: false };
    try {
      if (!nothingSelected()) page = await getLogs({ before: cursor === null ? END : cursor + 1, limit: TAIL });
    } catch (err) {
      return failed("the log", err, gen, loadTail);
    }
    if (gen !== viewGen) return;
    clearWindow();
    appendItems(page.lines);
    moreBefore = !!page.more_before;
    if (ended && !pending.includes(endItem)) pending.push(endItem);
    if (following) scrollToBottom();
    finishRebuild(gen);
  }

  // The lines on both sides of cursor c, with the first line at or after c shown at the top
  // of the view or in its middle (and marked, for a search hit or an error).
  async function loadAround(c, how, mark) {
    const gen = beginRebuild();
    let older;
    let newer;
    try {
      [older, newer] = await Promise.all([
        getLogs({ before: c, limit: PAGE }),
        getLogs({ after: Math.max(0, c - 1), limit: PAGE }),
      ]);
    } catch (err) {
      return failed("the log", err, gen, () => loadAround(c, how, mark));
    }
    if (gen !== viewGen) return;
    clearWindow();
    appendItems(older.lines.concat(newer.lines));
    moreBefore = !!older.more_before;
    if (reachesLive(newer)) {
      if (ended && !pending.includes(endItem)) pending.push(endItem);
    } else gap = true;
    const target = win.find((it) => it.cursor >= c) || win[win.length - 1];
    if (target) {
      if (mark) setFocus(target);
      centre(target, how);
    }
    finishRebuild(gen);
  }

  async function fetchOlder() {
    const first = firstLineCursor();
    if (first === null) { moreBefore = false; return; }
    busy = true;
    const gen = viewGen;
    try {
      const page = await getLogs({ before: first, limit: PAGE });
      if (gen !== viewGen) return;
      moreBefore = !!page.more_before;
      const lines = page.lines.filter((l) => l.cursor < first);
      if (!lines.length) return;
      // Keep what the person is reading where it is.
      const height = logEl.scrollHeight;
      const top = logEl.scrollTop;
      prependItems(lines);
      logEl.scrollTop = top + (logEl.scrollHeight - height);
      dropFromBottom(win.length - MAX_WINDOW);
      showFollowState();
      showSearchStatus();
    } catch (err) {
      note(`Could not load older lines: ${err.message}`);
    } finally {
      if (gen === viewGen) busy = false;
    }
  }

  async function fetchNewer() {
    const last = lastLineCursor();
    if (last === null) return;
    busy = true;
    const gen = viewGen;
    try {
      const page = await getLogs({ after: last, limit: PAGE });
      if (gen !== viewGen) return;
      const bridged = reachesLive(page);
      const first = pending.find((it) => it !== endItem);
      const lines = page.lines.filter((l) => l.cursor > last && (!first || l.cursor < first.cursor));
      appendItems(lines);
      const height = logEl.scrollHeight;
      const top = logEl.scrollTop;
      dropFromTop(win.length - MAX_WINDOW);
      logEl.scrollTop = top - (height - logEl.scrollHeight);
      unseen = Math.max(pendingLines(), unseen - lines.length);
      if (bridged) {
        gap = dropped = false;
        if (ended && !pending.includes(endItem)) pending.push(endItem);
      }
      showFollowState();
      showSearchStatus();
    } catch (err) {
      note(`Could not load newer lines: ${err.message}`);
    } finally {
      if (gen === viewGen) busy = false;
    }
  }

  // --- search -------------------------------------------------------------------------------
  function setQuery(q) {
    query = q;
    queryLower = q.toLowerCase();
    queryRe = q ? new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gi") : null;
    matchCount = 0;
    for (const it of win) {
      if (it.notice) continue;
      if (it.match || hasMatch(it)) {
        const el = lineElement(it);
        it.el.replaceWith(el);
        it.el = el;
      }
      if (it.match) matchCount++;
    }
    if (focusItem && !focusItem.match) setFocus(null);
    showSearchStatus();
  }

  function showSearchStatus(message) {
    if (message !== undefined) setText(searchStatusEl, message);
    else if (!query) setText(searchStatusEl, "");
    else if (!matchCount) setText(searchStatusEl, "none loaded");
    else {
      const at = focusItem && focusItem.match && focusItem.el ? matchIndex(focusItem) : 0;
      setText(searchStatusEl, at ? `${at} of ${matchCount} loaded` : `${matchCount} loaded`);
    }
  }

  function matchIndex(item) {
    let n = 0;
    for (const it of win) {
      if (it.match) n++;
      if (it === item) return n;
    }
    return 0;
  }

  async function searchStep(dir) {
    if (!query) return searchEl.focus();
    pause();
    // Start from the current match, else from the edge of what is on screen.
    let i = focusItem && focusItem.el ? win.indexOf(focusItem) : -1;
    if (i < 0) i = dir > 0 ? indexAt(logEl.scrollTop) - 1 : indexAt(logEl.scrollTop + logEl.clientHeight);
    for (let j = i + dir; j >= 0 && j < win.length; j += dir) {
      if (win[j].match) {
        setFocus(win[j]);
        centre(win[j], "centre");
        return showSearchStatus();
      }
    }
    // Not in the window: ask the server for the next match beyond it.
    const gen = viewGen;
    showSearchStatus("searching…");
    try {
      let hit = null;
      if (dir > 0) {
        const last = lastLineCursor();
        const page = await getLogs({ q: query, after: last === null ? 0 : last, limit: 1 });
        hit = page.lines[0];
      } else if (moreBefore && firstLineCursor() !== null) {
        const page = await getLogs({ q: query, before: firstLineCursor(), limit: 1 });
        hit = page.lines[page.lines.length - 1];
      }
      if (gen !== viewGen) return;
      if (!hit) return showSearchStatus(dir > 0 ? "no more below" : "no more above");
      await loadAround(hit.cursor, "centre", true);
    } catch (err) {
      showSearchStatus(`search failed: ${err.message}`);
    }
  }

  let searchTimer = 0;
  searchEl.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => setQuery(searchEl.value), 150);
  });
  searchEl.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    clearTimeout(searchTimer);
    if (searchEl.value !== query) setQuery(searchEl.value);
    searchStep(ev.shiftKey ? -1 : 1);
  });
  $("search-next").addEventListener("click", () => searchStep(1));
  $("search-prev").addEventListener("click", () => searchStep(-1));

  // --- jump to the first error --------------------------------------------------------------
  async function jumpToError() {
    pause();
    note("");
    let page;
    try {
      page = await getLogs({ errors: 1, limit: 1, after: 0 });
    } catch (err) {
      return note(`Could not look for errors: ${err.message}`);
    }
    const hit = page.lines[0];
    if (!hit) {
      const filtered = Object.keys(filterParams()).length > 0;
      return note(filtered ? "No error lines match these filters." : "No error lines in this log.");
    }
    const here = win.find((it) => it.cursor === hit.cursor);
    if (here) {
      setFocus(here);
      centre(here, "centre");
    } else await loadAround(hit.cursor, "centre", true);
  }
  $("jump-error").addEventListener("click", jumpToError);

  // --- status and notices -------------------------------------------------------------------
  function showStatus() {
    setText(statusEl, following || ended ? connection : `${connection} · paused`);
  }

  // What the log says while it has no line to show (CSS shows it on an empty log).
  function showEmpty() {
    let text = "No lines yet.";
    if (nothingSelected()) text = "Tick stdout or stderr to see lines.";
    else if (Object.keys(filterParams()).length) text = "No lines match these filters yet.";
    else if (isWaiting(job.state)) text = "The log starts when the job runs.";
    logEl.dataset.empty = text;
  }

  function note(text, kind = "info") {
    noteEl.textContent = text;
    noteEl.dataset.kind = kind;
    noteEl.hidden = !text;
  }

  function banner(text) {
    const p = document.createElement("p");
    p.className = "log-banner";
    p.textContent = text;
    noticesEl.appendChild(p);
    while (noticesEl.childElementCount > 3) noticesEl.firstElementChild.remove();
  }

  // --- line counts per node (GET .../logs/counts) ----------------------------------------------
  let nodeCounts = {};

  function renderNodeCounts() {
    const nodes = Object.keys(nodeCounts).sort();
    const parts = [];
    for (const n of nodes) {
      const span = document.createElement("span");
      span.className = "count";
      span.dataset.node = n;
      const b = document.createElement("strong");
      b.textContent = n;
      span.append(b, ` ${number.format(nodeCounts[n])}`);
      parts.push(span);
    }
    if (countsEl.dataset.total !== undefined) {
      const total = document.createElement("span");
      total.className = "count total";
      total.textContent = `${number.format(Number(countsEl.dataset.total))} lines in all`;
      parts.push(total);
    }
    countsEl.replaceChildren(...parts);
    for (const o of nodeEl.options) {
      if (o.value) o.textContent = nodeCounts[o.value] !== undefined ? `${o.value} (${number.format(nodeCounts[o.value])})` : o.value;
    }
  }

  // --- what the page's other parts call -----------------------------------------------------
  function advance(next) {
    if (typeof next === "number" && (cursor === null || next > cursor)) cursor = next;
  }

  return {
    // Where the websocket starts: the tail at first, then after our cursor (no gap, no repeat).
    streamFrom: () => (cursor === null ? `tail=${TAIL}` : `after=${cursor}`),
    isEnded: () => ended,
    advance,
    jobChanged(state) {
      job = state;
      for (const r of state.replicas) ensureTab(r);
      syncOptions();
      showEmpty();
    },
    log(msg) {
      receive(msg);
      advance(msg.next);
    },
    gap(msg) {
      const lost = msg.next - msg.after;
      const text = `⚠ ${number.format(lost)} line${lost === 1 ? "" : "s"} missing here: ${msg.reason}`;
      advance(msg.next);
      if (!nothingSelected()) pushNotice({ notice: "gap", cursor: msg.after + 0.5, text });
      banner(text);
    },
    end(msg) {
      advance(msg.next);
      ended = true;
      connection = `log complete (${msg.reason})`;
      endItem = { notice: "end", cursor: END, text: `— end of log: ${msg.reason} —` };
      pushNotice(endItem);
      showStatus();
    },
    // How the websocket is doing, in words ("live", "reconnecting…"); the end's words stay.
    setConnection(text) {
      if (ended) return;
      connection = text;
      showStatus();
    },
    setNodeCounts(byNode, total) {
      nodeCounts = byNode || {};
      countsEl.dataset.total = total;
      syncOptions();
    },
    start() {
      showFollowState();
    },
  };
}
