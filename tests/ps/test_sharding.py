"""Which server holds what: balanced by size, deterministic, big keys split across servers."""

import pytest

from workers.ps.sharding import Sharder

# The digits MLP's parameters, in model order: 64->128->64->10 weights and biases.
DIGITS = [
    ("0.weight", 8192),
    ("0.bias", 128),
    ("2.weight", 8192),
    ("2.bias", 64),
    ("4.weight", 640),
    ("4.bias", 10),
]


def loads(plan: dict, servers: int) -> list[int]:
    held = [0] * servers
    for slices in plan.values():
        for s in slices:
            held[s.server] += s.size
    return held


def test_it_puts_the_two_big_weights_on_different_servers() -> None:
    plan = Sharder(2).assign(DIGITS)
    assert plan["0.weight"][0].server != plan["2.weight"][0].server
    assert loads(plan, 2) == [8832, 8394]


def test_it_keeps_every_server_within_one_key_of_the_mean() -> None:
    sizes = [(f"k{i}", n) for i, n in enumerate([900, 850, 700, 640, 300, 299, 128, 64, 10, 5])]
    for servers in (2, 3, 4):
        held = loads(Sharder(servers).assign(sizes), servers)
        mean = sum(n for _, n in sizes) / servers
        assert max(held) - mean <= max(n for _, n in sizes)
        assert sum(held) == sum(n for _, n in sizes)


def test_it_places_largest_first_on_the_least_loaded_server() -> None:
    plan = Sharder(3).assign([("a", 10), ("b", 40), ("c", 30), ("d", 20), ("e", 5)])
    # b->0, c->1, d->2, then a->2 (20 is the least), then e->1 (1 and 2 tie at 30: lower wins)
    assert {k: v[0].server for k, v in plan.items()} == {"b": 0, "c": 1, "d": 2, "a": 2, "e": 1}


def test_it_splits_a_key_over_the_bound_into_near_equal_slices_on_every_server() -> None:
    plan = Sharder(3, big_array_bound=4).assign([("big", 10), ("small", 2)])
    big = plan["big"]
    assert [s.size for s in big] == [4, 3, 3]
    assert [(s.start, s.stop) for s in big] == [(0, 4), (4, 7), (7, 10)]
    assert sorted(s.server for s in big) == [0, 1, 2]
    # The small key goes to a server that got one of the shorter slices.
    assert plan["small"][0].server in {s.server for s in big if s.size == 3}


def test_a_single_server_holds_even_big_keys_whole() -> None:
    plan = Sharder(1, big_array_bound=4).assign([("big", 10)])
    assert [(s.server, s.start, s.stop) for s in plan["big"]] == [(0, 0, 10)]


def test_it_is_deterministic_and_numbers_slots_in_the_given_key_order() -> None:
    first = Sharder(2, big_array_bound=5000).assign(DIGITS)
    second = Sharder(2, big_array_bound=5000).assign(DIGITS)
    assert first == second
    slots = [s.slot for key, _ in DIGITS for s in first[key]]
    assert slots == list(range(len(slots)))


def test_later_inits_keep_balancing_on_top_of_earlier_ones() -> None:
    sharder = Sharder(2)
    sharder.assign([("a", 100)])
    plan = sharder.assign([("b", 60), ("c", 50)])
    assert plan["b"][0].server == 1 and plan["c"][0].server == 1
    assert sharder.loads == [100, 110]
    assert plan["b"][0].slot == 1 and plan["c"][0].slot == 2


def test_it_refuses_duplicate_keys_and_negative_sizes() -> None:
    with pytest.raises(ValueError, match="twice"):
        Sharder(2).assign([("a", 1), ("a", 2)])
    with pytest.raises(ValueError, match="negative"):
        Sharder(2).assign([("a", -1)])
