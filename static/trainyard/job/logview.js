// The job page's log viewer: its parts (log/) wired to the page.
//
// The log arrives over the page's websocket (connection.js): the last TAIL lines, then live
// (log/live.js). What the page shows is a *window*: a run of consecutive lines that match the
// filters (log/filters.js), at most MAX_WINDOW of them in the DOM (log/window.js, log/dom.js).
// Older lines, other filters, search hits and the first error come from the HTTP API
// (log/paging.js, log/search.js). How a line shows is the server's to say (log/text.js).
//
// Every part is handed one object, `v`: the state (log/state.js), the page's elements, and what
// the server's rules give. Only the parts that render touch the DOM; the rest are plain
// functions that Node's test runner checks (tests/js/).
import { formatCount } from "../format.js";
import { logRules } from "../rules.js";
import { ensureTab, listenToFilters, syncOptions } from "./log/filterbar.js";
import { nothingSelected } from "./log/filters.js";
import { fetchNewer, fetchOlder } from "./log/paging.js";
import { pause, pushNotice, receive, requestFlush, resume } from "./log/live.js";
import { listenToSearch } from "./log/search.js";
import { createState, EDGE_PX, END, TAIL } from "./log/state.js";
import { banner, showEmpty, showFollowState, showStatus } from "./log/status.js";

export { TAIL };

function elements() {
  const $ = (id) => document.getElementById(id);
  return {
    log: $("log"),
    status: $("log-status"),
    tabs: $("log-tabs"),
    role: $("log-role"),
    node: $("log-node"),
    stdout: $("log-stdout"),
    stderr: $("log-stderr"),
    search: $("log-search"),
    searchStatus: $("search-status"),
    searchNext: $("search-next"),
    searchPrev: $("search-prev"),
    jumpError: $("jump-error"),
    pause: $("log-pause"),
    newLines: $("new-lines"),
    note: $("log-note"),
    notices: $("log-notices"),
    counts: $("log-counts"),
  };
}

// The person scrolls: up from the end pauses; near either edge of the window, more lines.
function listenToScrolling(v) {
  const { s } = v;
  const log = v.el.log;
  log.addEventListener(
    "scroll",
    () => {
      if (s.loading) return;
      const fromBottom = log.scrollHeight - log.scrollTop - log.clientHeight;
      if (s.following) {
        if (log.scrollTop >= s.stickTop - 2 || fromBottom <= 2) return;
        pause(v); // the person scrolled up to read
      }
      if (s.busy) return;
      if (log.scrollTop < EDGE_PX && s.moreBefore) fetchOlder(v);
      else if (fromBottom < EDGE_PX && s.gap) fetchNewer(v);
    },
    { passive: true },
  );
}

export function createLogView(jobId, initialJob) {
  const v = {
    jobId,
    s: createState(initialJob),
    el: elements(),
    foldTable: logRules.casefold,
    // Paging calls this once it has rebuilt the window: the live lines held meanwhile follow.
    rebuilt: (view) => requestFlush(view),
  };
  const s = v.s;

  listenToFilters(v);
  listenToSearch(v);
  listenToScrolling(v);
  v.el.pause.addEventListener("click", () => (s.following ? pause(v) : resume(v)));
  v.el.newLines.addEventListener("click", () => resume(v));

  function advance(next) {
    if (typeof next === "number" && (s.cursor === null || next > s.cursor)) s.cursor = next;
  }

  return {
    // Where the websocket starts: the tail at first, then after our cursor (no gap, no repeat).
    streamFrom: () => (s.cursor === null ? `tail=${TAIL}` : `after=${s.cursor}`),
    isEnded: () => s.ended,
    advance,
    jobChanged(state) {
      s.job = state;
      for (const r of state.replicas) ensureTab(v, r);
      syncOptions(v);
      showEmpty(v);
    },
    log(msg) {
      receive(v, msg);
      advance(msg.next);
    },
    gap(msg) {
      const lost = msg.next - msg.after;
      const text = `⚠ ${formatCount(lost)} line${lost === 1 ? "" : "s"} missing here: ${msg.reason}`;
      advance(msg.next);
      if (!nothingSelected(s.filter)) pushNotice(v, { notice: "gap", cursor: msg.after + 0.5, text });
      banner(v, text);
    },
    end(msg) {
      advance(msg.next);
      s.ended = true;
      s.connection = `log complete (${msg.reason})`;
      s.endItem = { notice: "end", cursor: END, text: `— end of log: ${msg.reason} —` };
      pushNotice(v, s.endItem);
      showStatus(v);
    },
    // How the websocket is doing, in words ("live", "reconnecting…"); the end's words stay.
    setConnection(text) {
      if (s.ended) return;
      s.connection = text;
      showStatus(v);
    },
    setNodeCounts(byNode, total) {
      s.nodeCounts = byNode || {};
      v.el.counts.dataset.total = total;
      syncOptions(v);
    },
    start() {
      showFollowState(v);
    },
  };
}
