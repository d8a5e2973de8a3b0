from jobs.services.placement import Demand, Room, never_fits, place


def demand(i: int, cpu: int = 1, gpus: int = 0, mem: int = 1) -> Demand:
    return Demand(("worker", i), cpu, gpus, mem)


def test_it_places_every_instance_when_all_fit() -> None:
    rooms = [Room("a", 2, 0, 8), Room("b", 2, 0, 8)]
    got = place([demand(0, 2), demand(1, 2)], rooms)
    assert got is not None and sorted(got.values()) == ["a", "b"]


def test_it_places_nothing_when_one_instance_does_not_fit() -> None:
    rooms = [Room("a", 2, 0, 8), Room("b", 1, 0, 8)]
    assert place([demand(0, 2), demand(1, 2)], rooms) is None
    # The rooms passed in are not consumed by a failed attempt.
    assert rooms[0].cpu == 2


def test_it_packs_tightly_so_a_big_request_still_fits_later() -> None:
    rooms = [Room("big", 8, 2, 64), Room("small", 2, 0, 8)]
    got = place([demand(0, cpu=2)], rooms)
    assert got == {("worker", 0): "small"}


def test_it_sends_gpu_instances_to_nodes_with_free_gpus() -> None:
    rooms = [Room("cpu-only", 32, 0, 256), Room("gpu", 16, 2, 128)]
    got = place([demand(0, cpu=12, gpus=2, mem=120)], rooms)
    assert got == {("worker", 0): "gpu"}


def test_it_reports_a_demand_no_node_can_ever_hold() -> None:
    capacities = [Room("a", 8, 0, 32)]
    assert never_fits([demand(0, 2), demand(1, cpu=2, gpus=2)], capacities) == demand(1, 2, 2)
    assert never_fits([demand(0, 2)], capacities) is None


def test_it_knows_when_a_gang_could_never_run_at_once() -> None:
    from jobs.services.placement import gang_never_fits

    capacities = [Room("a", 4, 0, 16), Room("b", 4, 0, 16)]
    assert not gang_never_fits([demand(i, 2) for i in range(4)], capacities)
    assert gang_never_fits([demand(i, 2) for i in range(5)], capacities)
    assert gang_never_fits([demand(0, 3), demand(1, 3), demand(2, 2)], capacities)
