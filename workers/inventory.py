"""What this host has: CPU cores, memory, and GPUs (count and model) through NVML.

A host without an NVIDIA driver has no GPUs, and says so; it never reports a guess.
"""

import logging
import os
import socket
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    cpus: int
    memory_gb: int
    gpus: int
    gpu_model: str


def detect_gpus() -> tuple[int, str]:
    """(count, model of GPU 0) from NVML; (0, "") when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return 0, ""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver on this host: a CPU node
        log.info("no GPUs: NVML unavailable (%s)", exc)
        return 0, ""
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            return 0, ""
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return count, name.decode() if isinstance(name, bytes) else str(name)
    finally:
        pynvml.nvmlShutdown()


def detect() -> Inventory:
    gpus, model = detect_gpus()
    return Inventory(
        cpus=os.cpu_count() or 1,
        memory_gb=max(1, int(psutil.virtual_memory().total / 2**30)),
        gpus=gpus,
        gpu_model=model,
    )


def gpu_usage(ids: list[int]) -> list[tuple[float, float]]:
    """(utilisation %, memory used in MB) of each of these GPUs; [] where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no module, no driver: no GPU figures, never made-up ones
        return []
    try:
        usage = []
        for gpu in ids:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            usage.append((float(rates.gpu), float(memory.used) / 2**20))
        return usage
    except pynvml.NVMLError as exc:
        log.warning("reading GPU usage failed: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def interfaces() -> dict[str, list[str]]:
    """Each network interface of this host (of this network namespace) and its IPv4/IPv6
    addresses."""
    found: dict[str, list[str]] = {}
    for name, addresses in psutil.net_if_addrs().items():
        found[name] = [
            a.address.split("%")[0]  # an IPv6 link-local address carries its scope
            for a in addresses
            if a.family in (socket.AF_INET, socket.AF_INET6)
        ]
    return found


def interface_of(address: str) -> str | None:
    """The interface that holds `address` here, if one does (127.0.0.1: the loopback)."""
    for name, addresses in sorted(interfaces().items()):
        if address in addresses:
            return name
    return None
