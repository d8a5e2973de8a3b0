// Which lines the view shows: the instance tab, role, node and streams chosen. Pure: the
// filter bar (filterbar.js) reads the controls into a filter, these answer questions about it.

// The filter the controls say: an instance tab (`tab`: {tag, role, index}, or null for "all")
// overrides the role select.
export function filterOf({ tab, role, node, stdout, stderr }) {
  const one = tab && tab.tag ? tab : null;
  return {
    tag: one ? one.tag : "",
    role: one ? one.role : role,
    index: one ? one.index : "",
    node,
    stdout,
    stderr,
  };
}

export function sameFilter(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// The filter as the log API's query parameters.
export function filterParams(filter) {
  const p = {};
  if (filter.role) p.role = filter.role;
  if (filter.index !== "") p.index = filter.index;
  if (filter.node) p.node = filter.node;
  if (filter.stdout !== filter.stderr) p.stream = filter.stdout ? "stdout" : "stderr";
  return p;
}

// Whether a live line is one the view shows (`line.tag` already set).
export function lineMatches(filter, line) {
  if (line.stream === "stderr" ? !filter.stderr : !filter.stdout) return false;
  if (filter.tag && line.tag !== filter.tag) return false;
  if (filter.role && line.role !== filter.role) return false;
  if (filter.node && line.node !== filter.node) return false;
  return true;
}

export function nothingSelected(filter) {
  return !filter.stdout && !filter.stderr;
}

export function isFiltered(filter) {
  return Object.keys(filterParams(filter)).length > 0;
}

// A tab is offered only when it can show something under the role and node chosen.
export function tabOffered(replica, role, node) {
  return !replica || !((role && replica.role !== role) || (node && replica.node !== node));
}
