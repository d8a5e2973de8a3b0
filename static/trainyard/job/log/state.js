// The log view's state: one plain object that every part of the viewer is handed, instead of
// variables shared by closures. Which part writes which field is said beside it.

export const TAIL = 2000; // lines asked for on connect, and when the view is rebuilt at the end
export const MAX_WINDOW = 5000; // line (and notice) elements in the DOM, at most
export const MAX_BUFFER = 5000; // live lines held back while paused; more could never all be shown
export const PAGE = 1000; // lines per HTTP page when scrolling or loading around a line
export const FRAME_LINES = 1000; // lines rendered per animation frame at most: a burst never janks
// Lines sit in blocks of CHUNK in the DOM, so adding or dropping a few relayouts one block
// rather than walking every line of the window.
export const CHUNK = 200;
export const EDGE_PX = 300; // this close to the top (bottom) of the window, fetch older (newer) lines
export const END = Number.MAX_SAFE_INTEGER; // sorts after every cursor

export const ALL = { tag: "", role: "", index: "", node: "", stdout: true, stderr: true };

export function createState(job) {
  return {
    job, // the job as the page last heard of it

    // What the websocket has brought (live.js, and the public calls in logview.js).
    cursor: null, // every line up to this cursor has come over the websocket (null: none yet)
    ended: false,
    endItem: null, // the "end of log" notice, once the log ended
    connection: "connecting…",

    // The window (window.js, dom.js): items in the DOM, ascending by cursor; item.el is its element.
    win: [],
    pending: [], // matching items not rendered yet, ascending (live.js)
    moreBefore: true, // older matching lines may exist before win[0]
    gap: false, // matching lines between the window's end and pending[0] are only on the server
    dropped: false, // pending overflowed: it holds the newest lines, up to the live end
    following: true,
    loading: false, // the window is being rebuilt over HTTP; pending waits for it (paging.js)
    busy: false, // an older or newer page is being fetched (paging.js)
    viewGen: 0, // bumped whenever the window is rebuilt: answers for an older one are dropped
    unseen: 0, // matching lines that arrived while paused and are not shown
    stickTop: 0, // the scrollTop we last set while following: less means the person scrolled up
    frameRequested: false,
    shownFollowing: null, // the follow state the controls show (status.js)

    filter: { ...ALL }, // filters.js
    query: "", // search.js
    matchCount: 0, // lines in the window with a match
    focusItem: null, // the search hit or error line marked in the window

    nodeCounts: {}, // lines per node, as GET .../logs/counts said (counts.js)
  };
}
