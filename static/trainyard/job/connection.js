// The job page's one websocket (/ws/jobs/ID/): state, log, metric, gap and end frames, each
// handed to `onFrame`. It reconnects on its own: at once after the server dropped a client too
// slow to read, with a growing delay after any other loss, and it closes a link that has gone
// silent (the server speaks at least every ~5 s). `from()` says where to resume, so a
// reconnect brings no gap and no repeat. The close codes are the server's (rules.js).
import { closeCodes } from "../rules.js";

const STALE_SOCKET_MS = 20000;

export function openJobStream(jobId, { from, onFrame, onStatus, isEnded }) {
  let socket = null;
  let retry = 500;
  let lastFrameAt = 0;

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/?${from()}`);
    socket = ws;
    lastFrameAt = Date.now();
    ws.onopen = () => onStatus("live");
    ws.onmessage = (ev) => {
      lastFrameAt = Date.now();
      const msg = JSON.parse(ev.data);
      if (msg.type === "log") retry = 500;
      onFrame(msg);
    };
    ws.onclose = (ev) => {
      if (socket === ws) socket = null;
      if (isEnded()) return;
      // Logged out, or what opened the stream was revoked since (the reason says which).
      if (ev.code === closeCodes.unauthenticated) {
        onStatus(`${ev.reason || "logged out"}: log in again to see the log`);
      } else if (ev.code === closeCodes.not_found) onStatus("no such job");
      else if (ev.code === closeCodes.too_slow) {
        // The server dropped us for falling behind: pick up again from our cursor at once.
        onStatus("catching up…");
        setTimeout(connect, 0);
      } else {
        onStatus("reconnecting…");
        setTimeout(connect, retry);
        retry = Math.min(retry * 2, 10000);
      }
    };
  }

  // A link can die without a close frame.
  setInterval(() => {
    if (socket && !isEnded() && Date.now() - lastFrameAt > STALE_SOCKET_MS) socket.close();
  }, 5000);

  connect();
}
