"""The environment a parameter-server process is started with: ranks, and clear errors."""

import pytest

from workers.examples import digits_ps
from workers.ps.config import DEFAULT_TIMEOUT_S, read_topology
from workers.ps.errors import ConfigError


def env(**overrides: str | None) -> dict[str, str]:
    base = {
        "DMLC_ROLE": "worker",
        "DMLC_PS_ROOT_URI": "10.0.0.5",
        "DMLC_PS_ROOT_PORT": "9091",
        "DMLC_NUM_SERVER": "2",
        "DMLC_NUM_WORKER": "3",
        "TRAINYARD_ROLE": "worker",
        "TRAINYARD_INDEX": "1",
    }
    for key, value in overrides.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def test_it_derives_ranks_scheduler_first_then_servers_then_workers() -> None:
    worker = read_topology(env())
    assert (worker.role, worker.index, worker.rank, worker.world_size) == ("worker", 1, 4, 6)
    assert worker.label == "worker-1"
    assert worker.server_ranks == [1, 2] and worker.worker_ranks == [3, 4, 5]
    assert [worker.label_of(r) for r in range(6)] == [
        "scheduler",
        "server-0",
        "server-1",
        "worker-0",
        "worker-1",
        "worker-2",
    ]
    server = read_topology(env(DMLC_ROLE="server", TRAINYARD_ROLE="server", TRAINYARD_INDEX="1"))
    assert server.rank == 2
    scheduler = read_topology(
        env(DMLC_ROLE="scheduler", TRAINYARD_ROLE="scheduler", TRAINYARD_INDEX=None)
    )
    assert (scheduler.rank, scheduler.label) == (0, "scheduler")
    assert worker.timeout_s == DEFAULT_TIMEOUT_S


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"DMLC_ROLE": None}, "DMLC_ROLE is not set"),
        ({"DMLC_ROLE": "master"}, "DMLC_ROLE='master' is not one of scheduler, server, worker"),
        ({"TRAINYARD_ROLE": "server"}, "disagrees with DMLC_ROLE"),
        ({"DMLC_PS_ROOT_URI": " "}, "DMLC_PS_ROOT_URI is not set"),
        ({"DMLC_PS_ROOT_PORT": None}, "DMLC_PS_ROOT_PORT is not set"),
        ({"DMLC_PS_ROOT_PORT": "http"}, "DMLC_PS_ROOT_PORT='http' is not a whole number"),
        ({"DMLC_PS_ROOT_PORT": "70000"}, "DMLC_PS_ROOT_PORT=70000 is not a TCP port"),
        ({"DMLC_NUM_SERVER": "two"}, "DMLC_NUM_SERVER='two' is not a whole number"),
        ({"DMLC_NUM_SERVER": "0"}, "needs at least 1 of its servers"),
        ({"DMLC_NUM_WORKER": None}, "DMLC_NUM_WORKER is not set"),
        ({"TRAINYARD_INDEX": None}, "TRAINYARD_INDEX is not set"),
        ({"TRAINYARD_INDEX": "3"}, "DMLC_NUM_WORKER=3 allows 0 to 2"),
        ({"TRAINYARD_INDEX": "-1"}, "out of range"),
        ({"TRAINYARD_PS_TIMEOUT": "soon"}, "TRAINYARD_PS_TIMEOUT='soon' is not a number"),
        ({"TRAINYARD_PS_TIMEOUT": "0"}, "must be a positive number"),
    ],
)
def test_it_names_the_bad_variable(overrides: dict[str, str | None], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        read_topology(env(**overrides))
    assert message in str(raised.value)


def test_a_scheduler_index_other_than_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match="the scheduler's index is 0"):
        read_topology(env(DMLC_ROLE="scheduler", TRAINYARD_ROLE="scheduler", TRAINYARD_INDEX="1"))


def test_the_timeouts_can_be_raised_per_job() -> None:
    topo = read_topology(env(TRAINYARD_PS_TIMEOUT="90", TRAINYARD_PS_JOIN_TIMEOUT="600"))
    assert (topo.timeout_s, topo.join_timeout_s) == (90.0, 600.0)


def test_a_process_without_the_ps_environment_gets_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("DMLC_ROLE", "TRAINYARD_ROLE", "TRAINYARD_INDEX"):
        monkeypatch.delenv(name, raising=False)
    assert digits_ps.main(["--epochs", "1"]) == 2
    assert "error: DMLC_ROLE is not set" in capsys.readouterr().err
