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


# --- one instance per node ---


def alone(i: int, cpu: int = 1, gpus: int = 0, mem: int = 1) -> Demand:
    return Demand(("worker", i), cpu, gpus, mem, alone=True)


def test_it_packs_small_instances_on_one_node_unless_they_go_one_per_node() -> None:
    rooms = [Room("a", 8, 0, 32), Room("b", 8, 0, 32)]
    packed = place([demand(0), demand(1)], rooms)
    assert packed is not None and len(set(packed.values())) == 1
    spread = place([alone(0), alone(1)], rooms)
    assert spread is not None and sorted(spread.values()) == ["a", "b"]


def test_instances_one_per_node_wait_when_fewer_nodes_have_room_than_instances() -> None:
    # Room for three on "a", for one on "b": enough in all, not one per node.
    rooms = [Room("a", 3, 0, 32), Room("b", 1, 0, 32), Room("c", 0, 0, 32)]
    assert place([demand(0), demand(1), demand(2)], rooms) is not None
    assert place([alone(0), alone(1), alone(2)], rooms) is None
    assert place([alone(0), alone(1)], rooms) is not None


def test_a_gang_one_per_node_never_fits_with_more_instances_than_nodes() -> None:
    from jobs.services.placement import gang_never_fits

    capacities = [Room("a", 64, 0, 256), Room("b", 64, 0, 256)]
    assert not gang_never_fits([alone(0), alone(1)], capacities)
    assert gang_never_fits([alone(0), alone(1), alone(2)], capacities)
    assert not gang_never_fits([demand(0), demand(1), demand(2)], capacities)


def test_where_an_instance_one_per_node_is_stuck_leaves_out_the_nodes_its_job_took() -> None:
    from jobs.services.placement import first_unplaceable

    rooms = [Room("a", 8, 0, 32), Room("b", 8, 0, 32)]
    stuck = first_unplaceable([alone(0), alone(1), alone(2)], rooms)
    assert stuck is not None
    instance, rooms_then = stuck
    assert instance.alone and rooms_then == []  # both nodes hold one already
    assert first_unplaceable([demand(0), demand(1), demand(2)], rooms) is None
