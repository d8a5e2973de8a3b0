// The rules the console applies, as the server sent them with the page (jobs/page_rules.py):
// how an instance is named, which job states are final, the currency prices are in, and the
// job stream's close codes. No script keeps a copy of its own.
const rules = JSON.parse(document.getElementById("trainyard-rules").textContent);

// `[master]`, `[scheduler]`; `[worker-1]`, `[server-0]` for roles with several instances.
export function tagOf(role, index) {
  if (rules.tags.solo_roles.includes(role)) return role;
  return rules.tags.format.replace("{role}", role).replace("{index}", String(index));
}

export const isTerminal = (state) => rules.states.terminal.includes(state);
export const isWaiting = (state) => rules.states.waiting.includes(state);

// What prices are in: {code: "USD", symbol: "$", prefix: "$"} (prefix "CHF " where the
// currency has no symbol of its own).
export const money = rules.money;

// The IANA zone the console shows times in (TRAINYARD_TIME_ZONE); null: the reader's own.
export const timeZone = rules.time_zone;
// How the log viewer compares text (jobs/logshape.py): {casefold: {char: folding}} for the
// characters whose case folding is not their lowercase.
export const logRules = rules.log;
// {unauthenticated, not_found, too_slow}: why the job stream closed (jobs/consumers.py).
export const closeCodes = rules.close_codes;
