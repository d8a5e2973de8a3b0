"""The read model: what pages, the API and websocket clients are shown of jobs, nodes and
the queue. Read-only; the lifecycle reaches it only through what jobs.apps registers at start."""
