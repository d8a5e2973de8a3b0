"""Running the whole product on one machine: our own Redis, the web server, the console's
Celery worker and N node agents. Used by `make run` and by the integration tests."""
