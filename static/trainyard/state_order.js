// Is a job state older than one already shown? Events of one job are sent by several
// processes, and an HTTP answer may cross a websocket frame, so a client can hear `queued`
// after `running` of the same attempt. Each state carries its place in the job's life
// ([ended, attempt, step]: jobs/services/views/presenters.py state_order); one from before the
// state shown is dropped. A state without one (an older console) is always taken.
export function isOlderState(shown, next) {
  const a = shown && shown.state_order;
  const b = next && next.state_order;
  if (!Array.isArray(a) || !Array.isArray(b)) return false;
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (b[i] !== a[i]) return b[i] < a[i];
  }
  return false;
}
