"""The runtime's pieces that need no processes: liveness, error text, messages, updates."""

import torch

from workers.ps import protocol
from workers.ps.kvstore import merge_devices
from workers.ps.liveness import HeartbeatMonitor, first_line, tick_seconds
from workers.ps.optim import OptimizerSpec, Updater, sgd


def test_a_process_is_lost_only_after_its_counter_stood_still_for_the_timeout() -> None:
    monitor = HeartbeatMonitor([1, 2], timeout_s=20, now=0.0)
    monitor.observe(1, 1, now=0.5)
    monitor.observe(2, 1, now=0.5)
    monitor.observe(1, 2, now=15.0)  # rank 1 keeps beating, rank 2 stops after its first beat
    assert monitor.stale(now=20.0) == []
    assert monitor.stale(now=21.0) == [(2, 20.5)]
    monitor.forget(2)  # finished cleanly: no longer watched
    assert monitor.stale(now=30.0) == []
    assert monitor.stale(now=36.0) == [(1, 21.0)]


def test_the_tick_is_a_tenth_of_the_timeout_within_bounds() -> None:
    assert tick_seconds(20) == 1.0
    assert tick_seconds(5) == 0.5
    assert tick_seconds(0.2) == 0.1


def test_gloo_errors_are_cut_down_to_what_happened() -> None:
    exc = RuntimeError(
        "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [127.0.0.1]:14493. This is typically caused by a remote worker crashing. GLHF!"
    )
    assert first_line(exc) == "Connection closed by peer [127.0.0.1]:14493"


def test_headers_carry_step_counts_and_learning_rates_exactly() -> None:
    lr = 0.1 * 0.5 * (1 + 0.3)  # not representable in float32
    header = protocol.parse_header(
        protocol.message(protocol.Kind.PUSH, 4, protocol.ALL_SLOTS, lr, 2**40 + 1)
    )
    assert header == protocol.Header(protocol.Kind.PUSH, 4, -1, lr, 2**40 + 1)
    grads = [torch.arange(3.0), torch.ones(2)]
    inline = protocol.message(protocol.Kind.PUSHPULL, 3, protocol.ALL_SLOTS, lr, 1, inline=grads)
    assert protocol.inline_part(inline, 5).tolist() == [0.0, 1.0, 2.0, 1.0, 1.0]
    assert protocol.parse_header(inline).kind == protocol.Kind.PUSHPULL
    spec = sgd(lr=0.05, momentum=0.9, nesterov=True)
    assert OptimizerSpec.from_json(protocol.tensor_json(protocol.json_tensor(spec.to_json()))) == (
        spec
    )


def test_the_servers_update_is_torch_sgd_on_the_averaged_gradient() -> None:
    torch.manual_seed(0)
    start = torch.randn(6)
    grads = [torch.randn(6) for _ in range(3)]
    reference = start.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9, nesterov=True)
    updater = Updater(sgd(lr=0.1, momentum=0.9, nesterov=True))
    value = start.clone()
    updater.add(7, value)
    for grad in grads:
        reference.grad = grad
        optimizer.step()
        updater.step([(7, grad)], lr=0.1)
    assert torch.equal(value.detach(), reference.detach())


def test_a_workers_devices_are_averaged_the_same_way_in_both_sync_modes_on_cpu() -> None:
    devices = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 6.0]])]
    on_host = merge_devices(devices, on_device=False)  # dist_sync
    on_device = merge_devices(devices, on_device=True)  # dist_device_sync
    assert on_host.tolist() == on_device.tolist() == [2.0, 4.0]
    assert on_host.dtype == torch.float32 and on_host.device.type == "cpu"
