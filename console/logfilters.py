"""Filters of the console's own log (settings.LOGGING)."""

import logging


class NoClientErrorTracebacks(logging.Filter):
    """Django logs a refused request (403 for a PermissionDenied, 400, 404) with the exception's
    traceback: one line says it, a traceback for every 403 buries the server errors in web.log.
    Below 500 the line stays and the traceback goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
