"""The services layer: views and tasks call these; only `transitions` writes job state."""
