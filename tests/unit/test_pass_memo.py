"""A scheduling pass's memo (jobs.services.scheduler.pass_memo): what it says again to jobs
alike, and when it forgets."""

from jobs.services.scheduler.pass_memo import PassMemo


def test_a_fate_is_said_again_to_jobs_alike_until_anything_changes() -> None:
    memo = PassMemo()
    judged: list[str] = []

    def judge(reason: str | None) -> str | None:
        judged.append(str(reason))
        return reason

    assert memo.fate("2 cores", lambda: judge("waiting: no room")) == "waiting: no room"
    assert memo.fate("2 cores", lambda: judge("never asked")) == "waiting: no room"
    assert judged == ["waiting: no room"]
    memo.changed(rooms=False)  # a new head of the queue: what jobs were told may not hold
    assert memo.fate("2 cores", lambda: judge("waiting behind the head")) == (
        "waiting behind the head"
    )
    # A placed job (None) tells the next job alike nothing.
    assert memo.fate("1 core", lambda: judge(None)) is None
    assert memo.fate("1 core", lambda: judge("waiting: no room")) == "waiting: no room"


def test_a_job_whose_judging_changed_the_pass_leaves_no_fate_for_the_next() -> None:
    memo = PassMemo()

    def preempting() -> str:
        memo.changed()  # it reserved room: the next job alike finds other rooms
        return "preempting job 7: starts once it has stopped"

    memo.fate("2 cores", preempting)
    assert memo.fate("2 cores", lambda: "waiting: no room") == "waiting: no room"


def test_what_depends_on_the_rooms_is_forgotten_only_when_they_change() -> None:
    memo = PassMemo()
    memo.reasons[("unplaced", "2 cores")] = "waiting: no room"
    memo.no_room.add(("2 cores", ()))
    memo.waits_for_room.add("waiting: no room")
    memo.changed(rooms=False)
    assert memo.reasons and memo.no_room
    memo.changed()
    assert not memo.reasons and not memo.no_room and not memo.shortfalls
    # The reasons that only say a job waits for room are known for the whole pass.
    assert memo.waits_for_room == {"waiting: no room"}
