"""Where Optuna keeps an experiment's search (jobs/services/experiments/study.py): the setting,
else beside the console's database (a sibling SQLite file; on PostgreSQL the same database
through SQLAlchemy's psycopg driver)."""

from typing import Any

from sqlalchemy.engine import make_url

from jobs.services.experiments import study


def test_the_setting_wins(settings: Any) -> None:
    settings.TRAINYARD_SEARCH_DATABASE_URL = "postgresql+psycopg://u@db/search"
    assert study.storage_url() == "postgresql+psycopg://u@db/search"


def test_beside_a_sqlite_database_it_is_a_sibling_file(settings: Any) -> None:
    settings.TRAINYARD_SEARCH_DATABASE_URL = ""
    settings.DATABASES = {
        "default": {"ENGINE": "console.sqlite_backend", "NAME": "/srv/ty/trainyard.sqlite3"}
    }
    assert study.storage_url() == "sqlite:////srv/ty/trainyard-search.sqlite3"


def test_on_postgresql_it_is_the_same_database_through_psycopg(settings: Any) -> None:
    settings.TRAINYARD_SEARCH_DATABASE_URL = ""
    settings.DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "trainyard",
            "USER": "ty",
            "PASSWORD": "p@ss word",
            "HOST": "db.example",
            "PORT": 5433,
        }
    }
    url = make_url(study.storage_url())
    assert (url.drivername, url.username, url.password) == ("postgresql+psycopg", "ty", "p@ss word")
    assert (url.host, url.port, url.database) == ("db.example", 5433, "trainyard")
