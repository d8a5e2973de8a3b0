"""Project wiring: settings, URLs, ASGI application and the Celery app. No logic lives here."""

from console.celery import app as celery_app

__all__ = ["celery_app"]
