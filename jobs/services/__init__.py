"""The services layer: views and tasks call these; only `lifecycle` writes job state."""
