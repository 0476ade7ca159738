"""Moving a model's weights to host memory while it sleeps, and back (the ``hf`` engine's sleep on a GPU).

Each parameter and buffer gets one host buffer, allocated on the first sleep and reused by every later one, in
page-locked (pinned) memory when CUDA is available, so both copies run asynchronously (``non_blocking``) and at the
bus's speed; a pageable copy blocks the host and runs at a fraction of it. While asleep the module's tensors *are*
the host buffers (``tensor.data`` points there), so the module stays usable on the host and a weight update during
sleep lands in them; ``restore`` copies them into fresh device memory. Tied tensors (an lm_head sharing the
embedding) are one parameter and are moved once.
"""

from __future__ import annotations

import torch
from torch import nn


def _tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer of ``module``, tied ones once."""
    return [*module.named_parameters(), *module.named_buffers()]


class HostOffload:
    """Offloads ``module``'s tensors to reused host buffers (``offload``) and brings them back (``restore``)."""

    def __init__(self, module: nn.Module, pin: bool | None = None):
        self.module = module
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.host: dict[str, torch.Tensor] = {}  # one buffer per tensor name, allocated once
        self.device: torch.device | None = None  # where the tensors lived before ``offload``; None while awake

    def offload(self) -> None:
        """Copy every tensor into its host buffer and let the module point there (frees the device memory once
        the caller empties the allocator's cache). A no-op while already offloaded."""
        if self.device is not None:
            return
        tensors = _tensors(self.module)
        if not tensors:
            return
        self.device = tensors[0][1].device
        for name, t in tensors:
            buf = self.host.get(name)
            if buf is None:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
                self.host[name] = buf
            buf.copy_(t.data, non_blocking=self.pin)
        _synchronize(self.device)  # the host buffers are complete before the device memory goes
        for name, t in tensors:
            t.data = self.host[name]

    def restore(self) -> None:
        """Copy the host buffers into fresh memory on the original device (the buffers stay for the next
        ``offload``). A no-op while not offloaded."""
        if self.device is None:
            return
        device = self.device
        for name, t in _tensors(self.module):
            buf = self.host[name]
            fresh = torch.empty(buf.shape, dtype=buf.dtype, device=device)
            fresh.copy_(buf, non_blocking=self.pin)
            t.data = fresh
        _synchronize(device)
        self.device = None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
