"""The CLI reads the job and instance states from the console's API document, never from a
copy of its own: which states end a job (what `--wait` waits for) and how each is coloured."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Replica
from jobs.schemas import STATE_TONES
from trainyard_cli import render, states
from trainyard_cli.errors import CliError


@pytest.fixture
def document(alice: User) -> dict[str, Any]:
    client = Client(headers={"Authorization": f"Token {ApiToken.issue(alice)}"})
    answer: dict[str, Any] = client.get("/api/v1/openapi.json").json()
    return answer


def test_it_knows_every_state_the_console_has_and_which_end_a_job(
    document: dict[str, Any],
) -> None:
    vocabulary = states.from_openapi(document)
    assert vocabulary.job.ended == frozenset(Job.TERMINAL_STATES)
    assert vocabulary.replica.ended == frozenset(Replica.FINAL_STATES)
    assert set(vocabulary.job.tones) == set(Job.State.values)
    assert set(vocabulary.replica.tones) == set(Replica.State.values)
    assert "restarting" not in vocabulary.job.ended  # the state an old copy once missed


def test_every_state_has_a_colour_and_it_follows_what_the_console_says_it_means(
    document: dict[str, Any],
) -> None:
    assert set(STATE_TONES.values()) <= set(states.TONE_STYLES)
    vocabulary = states.from_openapi(document)
    for state in Job.State.values:
        assert render.state_text(state, vocabulary.job).style, state
    job_state = document["components"]["schemas"]["JobOut"]["properties"]["state"]
    job_state["x-tones"]["restarting"] = "bad"  # the console changes its mind: the CLI follows
    assert render.state_text("restarting", states.from_openapi(document).job).style == "red"


def test_a_console_whose_document_does_not_say_is_named_not_guessed(
    document: dict[str, Any],
) -> None:
    del document["components"]["schemas"]["JobOut"]["properties"]["state"]["x-ended"]
    with pytest.raises(CliError, match="which job states are final"):
        states.from_openapi(document)
