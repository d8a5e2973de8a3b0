"""The Optuna study of an experiment, in Optuna's database storage, and the searcher and pruner
the experiment names.

The searcher's state is Optuna's storage, never a process's memory: every call rebuilds the
study from the database (`load`), so a console worker restarted mid-search, or a second one,
carries on from exactly what was told so far. The storage is TRAINYARD_SEARCH_DATABASE_URL,
or beside the console's own database: for SQLite a sibling file, for PostgreSQL the same
database through SQLAlchemy's psycopg driver (Optuna's tables, prefixed by Optuna, beside
the console's).

A sampler is built per call with a seed that also counts the trials asked so far: one built
with the experiment's seed alone would draw its first random point again after every rebuild.
"""

import functools
from pathlib import Path
from typing import Any

import optuna
from django.conf import settings
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.study import StudyDirection
from sqlalchemy.engine import URL

from jobs.models import Experiment
from jobs.services.experiments import space

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Seconds a writer waits for SQLite's lock (the web and console worker share the file).
SQLITE_TIMEOUT_SECONDS = 30


def storage_url() -> str:
    configured: str = getattr(settings, "TRAINYARD_SEARCH_DATABASE_URL", "")
    if configured:
        return configured
    database = settings.DATABASES["default"]
    if "sqlite" in database["ENGINE"] and _in_memory(str(database["NAME"])):
        # A console database in memory (a test's) gets a search storage in memory: both go
        # with the process, and no file named after the memory database is left behind.
        return "sqlite://"
    if "sqlite" in database["ENGINE"]:
        path = Path(str(database["NAME"]))
        return f"sqlite:///{path.with_name(path.stem + '-search.sqlite3')}"
    if "postgresql" in database["ENGINE"]:
        return URL.create(
            "postgresql+psycopg",
            username=database.get("USER") or None,
            password=database.get("PASSWORD") or None,
            host=database.get("HOST") or None,
            port=int(database["PORT"]) if database.get("PORT") else None,
            database=database.get("NAME") or None,
        ).render_as_string(hide_password=False)
    raise ValueError(
        f"Set TRAINYARD_SEARCH_DATABASE_URL: no default storage for {database['ENGINE']}."
    )


def _in_memory(name: str) -> bool:
    return name == ":memory:" or "mode=memory" in name


@functools.cache
def _storage_for(url: str) -> optuna.storages.RDBStorage:
    # One engine (a pool of connections) per process and URL; what it stores is in the database.
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_SECONDS}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def storage() -> optuna.storages.RDBStorage:
    return _storage_for(storage_url())


def direction(experiment: Experiment) -> StudyDirection:
    if experiment.objective_goal == Experiment.Goal.MAXIMIZE:
        return StudyDirection.MAXIMIZE
    return StudyDirection.MINIMIZE


def sampler_for(experiment: Experiment, asked: int) -> BaseSampler:
    """The experiment's searcher, seeded for the `asked`-th trial (see the module's note)."""
    seed = None if experiment.seed is None else experiment.seed + asked
    if experiment.searcher == Experiment.Searcher.GRID:
        dimensions = space.dimensions_of(experiment.space)
        grid: dict[str, Any] = {d.key: d.grid() for d in dimensions}
        return GridSampler(grid, seed=experiment.seed)
    if experiment.searcher == Experiment.Searcher.RANDOM:
        return RandomSampler(seed=seed)
    return TPESampler(seed=seed)


def pruner_for(experiment: Experiment) -> BasePruner:
    options: dict[str, Any] = dict(experiment.pruner_options)
    if experiment.pruner == Experiment.Pruner.MEDIAN:
        return MedianPruner(**options)
    if experiment.pruner == Experiment.Pruner.SUCCESSIVE_HALVING:
        options.setdefault("reduction_factor", 3)
        return SuccessiveHalvingPruner(**options)
    if experiment.pruner == Experiment.Pruner.HYPERBAND:
        options.setdefault("reduction_factor", 3)
        return HyperbandPruner(**options)
    return NopPruner()


def create(experiment: Experiment) -> None:
    """Make the experiment's study (a second call finds it made)."""
    optuna.create_study(
        storage=storage(),
        study_name=experiment.study_name,
        direction=direction(experiment),
        load_if_exists=True,
    )


def load(experiment: Experiment, asked: int = 0) -> optuna.Study:
    """The study as its storage has it, with the experiment's searcher and pruner."""
    try:
        return optuna.load_study(
            study_name=experiment.study_name,
            storage=storage(),
            sampler=sampler_for(experiment, asked),
            pruner=pruner_for(experiment),
        )
    except KeyError:  # created with its row, but that call died before Optuna's: make it now
        create(experiment)
        return load(experiment, asked)


def trial_id(study: optuna.Study, number: int) -> int:
    """Optuna's id of the study's trial `number`."""
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
