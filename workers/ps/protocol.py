"""The messages workers and servers exchange over torch.distributed point-to-point.

Every request is one float32 message that starts with a header; what follows depends on it.

    header    float32[10] viewed as float64[5] = [kind, sender rank, count, value, step]:
              float64 so that a step count and a learning rate both travel exactly, stored in
              float32 words so that a header and gradients can share one message. `count` says
              how many (slots, bytes, epochs), `value` carries a number (a mode's code, the
              learning rate), `step` says which (training step, epoch).
    MODE      value = mode code                 every worker, once: servers learn sync/async
                                                and catch workers started with different modes
    OPTIMIZER count = n bytes  -> uint8[n] JSON worker 0; answered with ACK
    INIT      count = n slots  -> int64[n, 2] (slot, elements) -> float32 values; answered with ACK
    PUSH      count = n slots, value = lr, step; gradients inline, or -> int64[n] slots -> float32
    PULL      count = n slots, step; [-> int64[n] slots]; answered with float32 values
    PUSHPULL  as PUSH; answered as PULL once the push is applied (one round trip, not two)
    EPOCH     step = epoch (1-based), count = epochs: a worker finished an epoch (servers log
              traffic)
    STOP                                        a worker is done with this server
    ACK       (server -> worker, header only)

n = ALL_SLOTS (-1) stands for "every slot you hold, in slot order": no slot list is sent and a
push's gradients ride in the same message, right after the header. That is what a training step
sends, so a step costs one message to each server and one back. Other requests send their slot
list and data as follow-up messages ("->"), whose sizes the header announces.

A server receives requests from any worker into a buffer big enough for a header plus all it
holds; gloo accepts a shorter message into a longer buffer. The sender's rank is in the header
because a receive from any source does not reliably tell it (Work.source_rank is deprecated).

Three tags keep the streams apart: requests on TAG_REQUEST, their follow-ups on TAG_DATA (from the
same worker, so a follow-up can never be mistaken for a request), replies on TAG_REPLY.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import torch

VALUE_DTYPE = torch.float32  # the wire and server dtype of parameters and gradients
HEADER_FIELDS = 5  # float64 fields
HEADER_WORDS = 2 * HEADER_FIELDS  # the float32 words they occupy
ALL_SLOTS = -1

TAG_REQUEST = 1
TAG_DATA = 2
TAG_REPLY = 3

MODES = ("dist_sync", "dist_device_sync", "dist_async")
SYNC_MODES = ("dist_sync", "dist_device_sync")


class Kind(enum.IntEnum):
    MODE = 1
    OPTIMIZER = 2
    INIT = 3
    PUSH = 4
    PULL = 5
    PUSHPULL = 6
    EPOCH = 7
    STOP = 8
    ACK = 9


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: int
    count: int  # how many: slots (ALL_SLOTS: every one held), bytes, epochs
    value: float  # a number: the mode's code, the learning rate
    step: int  # which: the training step, the epoch


def message(
    kind: Kind,
    sender: int,
    count: int = 0,
    value: float = 0.0,
    step: int = 0,
    inline: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """A header, followed by the concatenation of `inline` (flat float32 tensors) if given."""
    size = sum(t.numel() for t in inline) if inline else 0
    buffer = torch.empty(HEADER_WORDS + size, dtype=VALUE_DTYPE)
    fields = [float(kind), float(sender), float(count), float(value), float(step)]
    buffer[:HEADER_WORDS].view(torch.float64).copy_(torch.tensor(fields, dtype=torch.float64))
    if inline:
        torch.cat(inline, out=buffer[HEADER_WORDS:])
    return buffer


def empty_message(inline_capacity: int = 0) -> torch.Tensor:
    return torch.empty(HEADER_WORDS + inline_capacity, dtype=VALUE_DTYPE)


def parse_header(buffer: torch.Tensor) -> Header:
    kind, sender, count, value, step = buffer[:HEADER_WORDS].view(torch.float64).tolist()
    return Header(Kind(int(kind)), int(sender), int(count), value, int(step))


def inline_part(buffer: torch.Tensor, size: int) -> torch.Tensor:
    return buffer[HEADER_WORDS : HEADER_WORDS + size]


def mode_code(mode: str) -> int:
    return MODES.index(mode) + 1


def mode_name(code: int) -> str:
    return MODES[code - 1]


def json_tensor(obj: Any) -> torch.Tensor:
    data = json.dumps(obj, sort_keys=True).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_json(tensor: torch.Tensor) -> Any:
    return json.loads(bytes(tensor.tolist()).decode())


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
