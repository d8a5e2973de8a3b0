// The rules the console applies, as the server sent them with the page (jobs/page_rules.py):
// how an instance is named, which job states are final, the terms of seed 004's quota
// formula, and the currency prices are in. No script keeps a copy of its own.
const rules = JSON.parse(document.getElementById("trainyard-rules").textContent);

// `[master]`, `[scheduler]`; `[worker-1]`, `[server-0]` for roles with several instances.
export function tagOf(role, index) {
  if (rules.tags.solo_roles.includes(role)) return role;
  return rules.tags.format.replace("{role}", role).replace("{index}", String(index));
}

export const isTerminal = (state) => rules.states.terminal.includes(state);
export const isWaiting = (state) => rules.states.waiting.includes(state);

// [{key, label, formula_name, unit}] for each resource the quota counts.
export const quotaResources = rules.quota.resources;
export const isCharged = (role) => !rules.quota.uncharged_roles.includes(role);

// What prices are in: {code: "USD", symbol: "$", prefix: "$"} (prefix "CHF " where the
// currency has no symbol of its own).
export const money = rules.money;
