"""The lifecycle: the only writers of job and replica state (transitions), what follows from
an attempt's end (outcomes, restarts, time limits), the agents' reports, the work sent to
them (dispatch), and the events and schedule requests a change sends. It imports neither the
scheduler nor the read model ([tool.importlinter] in pyproject.toml)."""
