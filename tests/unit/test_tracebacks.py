"""A failure's reason names the exception the trainer's last traceback ended with, read through
torch's "[rankN]: " prefix. The tracebacks are as torch 2.13 printed them under torchrun with
gloo (a rank raising after init_process_group), cut to the lines the agent keeps."""

from workers.tracebacks import (
    ended_with_error,
    known_abort,
    last_exception,
    own_error,
    usage_error,
)

ONE_FRAME = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/code/train.py", line 9, in <module>',
    "[rank1]:     main()",
    "[rank1]: ValueError: boom",
]

# A chained exception whose message runs over three lines, and a peer's collateral error and
# torchrun's own notes after it in the same stream.
CHAINED_MULTI_LINE = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/code/train.py", line 8, in main',
    "[rank1]:     load({})",
    '[rank1]:   File "/code/train.py", line 3, in load',
    '[rank1]:     return cfg["lr"]',
    "[rank1]:            ~~~^^^^^^",
    "[rank1]: KeyError: 'lr'",
    "",
    "[rank1]: The above exception was the direct cause of the following exception:",
    "",
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/code/train.py", line 12, in <module>',
    "[rank1]:     main()",
    '[rank1]:   File "/code/train.py", line 10, in main',
    '[rank1]:     raise ValueError("no learning rate in the config:\\n  got keys []") from e',
    "[rank1]: ValueError: no learning rate in the config:",
    "[rank1]:   got keys []",
    "[rank1]:   want lr",
    "W1126 16:41:54.916000 12960 torch/distributed/elastic/multiprocessing/api.py:1028] "
    "Sending process 12992 closing signal SIGTERM",
]


def test_it_reads_the_exception_under_the_rank_prefix() -> None:
    assert last_exception(ONE_FRAME) == "ValueError: boom"


def test_it_names_the_last_exception_of_a_chain_by_its_first_line() -> None:
    assert last_exception(CHAINED_MULTI_LINE) == "ValueError: no learning rate in the config:"


def test_it_finds_the_exception_when_the_kept_tail_begins_mid_traceback() -> None:
    """A deep stack (a DDP forward) is longer than the tail the agent keeps: its frames still
    mark a traceback."""
    frames = []
    for depth in range(12):
        frames += [
            f'[rank0]:   File "/venv/torch/nn/modules/module.py", line {1700 + depth}, in _call',
            "[rank0]:     return forward_call(*args, **kwargs)",
        ]
    shown = [
        *frames[-19:],
        "[rank0]: torch.distributed.DistBackendError: [0] store->get('0') got error: "
        "Connection reset by peer",
        "[rank0]: Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:672",
        "[rank0]: frame #0: c10::Error::Error(c10::SourceLocation) + 0x57",
    ]
    assert last_exception(shown) == (
        "torch.distributed.DistBackendError: [0] store->get('0') got error: "
        "Connection reset by peer"
    )


def test_it_names_an_exception_whatever_its_class_is_called() -> None:
    lines = ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', "Boom"]
    assert last_exception(lines) == "Boom"
    assert last_exception([*lines[:2], "KeyboardInterrupt"]) == "KeyboardInterrupt"


def test_it_reads_the_prefix_a_teeing_launcher_writes() -> None:
    lines = [line.replace("[rank1]: ", "[default1]:") for line in ONE_FRAME]
    assert last_exception(lines) == "ValueError: boom"


def test_without_a_traceback_there_is_no_exception() -> None:
    """A line that only looks like one is the trainer's own output."""
    assert last_exception(["epoch=1 loss: 0.5", "KeyError: 3"]) is None
    assert last_exception([]) is None


def test_an_abort_at_exit_from_a_running_thread_is_named_with_its_fix() -> None:
    """torch without destroy_process_group(): the script trained, then libstdc++ aborted."""
    lines = ["epoch 2 loss=0.01", "[rank0]: terminate called without an active exception"]
    reason = known_abort(lines)
    assert reason is not None
    assert "torch.distributed.destroy_process_group()" in reason
    assert known_abort(["terminate called after throwing an instance of 'c10::Error'"]) is None


ARGPARSE = [
    "usage: train.py [-h] [--epochs EPOCHS]",
    "train.py: error: unrecognized arguments: --steps 5",
]


def test_an_argparse_error_is_named_by_its_error_line() -> None:
    assert usage_error(ARGPARSE) == "train.py: error: unrecognized arguments: --steps 5"
    assert own_error(["[rank1]: " + line for line in ARGPARSE]) == (
        "train.py: error: unrecognized arguments: --steps 5"
    )
    # An error line without argparse's usage before it is not argparse's.
    assert usage_error(ARGPARSE[1:]) is None


def test_a_process_ended_with_an_error_only_when_its_stderr_ends_with_it() -> None:
    assert ended_with_error([*ONE_FRAME, ""]) == "ValueError: boom"
    survived = [*ONE_FRAME, *(f"step {i}" for i in range(10))]
    assert own_error(survived) == "ValueError: boom"
    assert ended_with_error(survived) is None
    assert ended_with_error(["epoch 1", *ARGPARSE]) == ARGPARSE[1]
