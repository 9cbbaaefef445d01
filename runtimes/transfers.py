"""Offload and prefetch steps at run time: copies between device memory and host buffers.

The simulator's rules (docs/schedules.md) are what this follows:

- A value's whole storage is copied, and a prefetched value is rebuilt with the
  same sizes, strides and offset in a fresh storage of the same bytes: the memory
  model counts a prefetch as a fresh allocation of the value's storage, and a
  bytewise copy leaves every gradient unchanged.
- The device copy of an offloaded value stays where it is until the schedule frees
  it; the free waits for the copy (`wait`) before the last reference goes.
- Host buffers come from a pool that lives as long as the runtime: each is
  allocated on first use (pinned on CUDA) and reused by every later step, never
  allocated per step.

On CUDA copies run on one stream per direction, in schedule order, so that they
overlap compute and each other (a GPU has a copy engine each way):

- offload: the device-to-host stream waits for compute to reach the step (the value
  is written), copies into a host buffer and records an event. The schedule's free of
  the value makes compute wait for that event before the tensor's last reference
  goes, so the caching allocator hands its block to later kernels only after the
  copy has read it (no `record_stream`).
- prefetch: the device block is allocated on the compute stream; the host-to-device
  stream waits for compute to reach the step (earlier kernels may still use that
  block), copies and records an event; compute waits for it before the first step
  that reads, offloads or frees the value. Its host buffer goes back to the pool at
  once with that event, which the next offload into it waits for.

On CPU a copy is a synchronous memcpy: the device and the host are the same memory,
so offloading saves nothing there, but the code path and its exactness are tested.
"""

from __future__ import annotations

import torch


class HostCopy:
    """A value's copy in a host buffer, with what rebuilds the tensor, and the event of
    the latest copy in either direction that compute has not waited for."""

    __slots__ = ("buffer", "dtype", "size", "stride", "offset", "conj", "neg", "done")

    def __init__(self, buffer: torch.Tensor, tensor: torch.Tensor, done):
        self.buffer = buffer
        self.dtype, self.size, self.stride = tensor.dtype, tensor.size(), tensor.stride()
        self.offset = tensor.storage_offset()
        # A lazy conjugate or negative view (`z.conj()`, `torch._neg_view`) reads its storage
        # conjugated or negated: the bits are the tensor's, not its bytes', so the rebuilt
        # tensor gets them again (found by a review: an offloaded `fft(h).conj()` came back
        # unconjugated, a weight's gradient 24 off eager's).
        self.conj, self.neg = tensor.is_conj(), tensor.is_neg()
        self.done = done


class Transfers:
    """The copy streams and host buffer pool of one runtime on one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.outward = torch.cuda.Stream(device) if self.cuda else None   # device to host
        self.inward = torch.cuda.Stream(device) if self.cuda else None    # host to device
        #: bytes -> host buffers not in use, each with the event of the last copy reading it
        self.idle: dict[int, list[tuple[torch.Tensor, object]]] = {}
        self.allocated_bytes = 0     # host bytes the pool ever allocated

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """A host buffer to offload into; on CUDA the offload stream first waits for the
        prefetch that last read it."""
        idle = self.idle.get(nbytes)
        if idle:
            buffer, read = idle.pop()
            if read is not None:
                self.outward.wait_event(read)
            return buffer
        self.allocated_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda)

    def _copy(self, stream, destination: torch.Tensor, source: torch.Tensor):
        """Copy bytes; on CUDA on `stream` once compute has reached this point, returning
        the event that marks the end of the copy."""
        if not self.cuda:
            destination.copy_(source)
            return None
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            destination.copy_(source, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        return done

    def offload(self, tensor: torch.Tensor) -> HostCopy:
        """Start copying `tensor`'s storage into a host buffer."""
        storage = torch.empty(0, dtype=torch.uint8, device=self.device).set_(tensor.untyped_storage())
        buffer = self._buffer(storage.numel())
        return HostCopy(buffer, tensor, self._copy(self.outward, buffer, storage))

    def prefetch(self, copy: HostCopy) -> torch.Tensor:
        """A fresh device tensor that the copy is being written back into (wait before use)."""
        storage = torch.empty(copy.buffer.numel(), dtype=torch.uint8, device=self.device)
        copy.done = self._copy(self.inward, storage, copy.buffer)
        self.release(copy, read=copy.done)
        rebuilt = torch.empty(0, dtype=copy.dtype, device=self.device).set_(
            storage.untyped_storage(), copy.offset, copy.size, copy.stride)
        if copy.conj:
            torch._C._set_conj(rebuilt, True)
        if copy.neg:
            torch._C._set_neg(rebuilt, True)
        return rebuilt

    def wait(self, copy: HostCopy) -> None:
        """Compute waits for the copy's latest transfer (nothing to do on CPU, or twice)."""
        if copy.done is not None:
            torch.cuda.current_stream(self.device).wait_event(copy.done)
            copy.done = None

    def release(self, copy: HostCopy, read=None) -> None:
        """The host copy is no longer needed: its buffer goes back to the pool, with the
        event of the prefetch still reading it (None: only offloads, on the offload
        stream, ever wrote it, and the next one is queued behind them)."""
        if copy.buffer is not None:
            self.idle.setdefault(copy.buffer.numel(), []).append((copy.buffer, read))
            copy.buffer = None


def measure_link(device: torch.device, *, nbytes: int = 32 << 20, repeats: int = 5) -> dict:
    """The host link as the runtime uses it, timed on `device`: bandwidth (bytes per
    second, the slower direction) and latency (a 4 KiB copy), as `pb.HostLink` fields.
    On CUDA from pinned buffers, overlapped with compute; on CPU a memcpy on the compute
    timeline (what `Transfers` does there)."""
    import statistics
    import time

    cuda = device.type == "cuda"

    def seconds(destination, source) -> float:
        times = []
        for _ in range(repeats + 1):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                destination.copy_(source, non_blocking=True)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                began = time.perf_counter()
                destination.copy_(source)
                times.append(time.perf_counter() - began)
        return statistics.median(times[1:])

    def pair(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(n, dtype=torch.uint8, pin_memory=cuda),
                torch.empty(n, dtype=torch.uint8, device=device))

    host, on_device = pair(nbytes)
    big = max(seconds(on_device, host), seconds(host, on_device))
    small_host, small_device = pair(4096)
    latency = min(seconds(small_device, small_host), seconds(small_host, small_device))
    bandwidth = nbytes / max(big - latency, 1e-9)
    return {"bandwidth_bytes_per_s": bandwidth, "latency_s": latency, "overlapped": cuda,
            "source": "measured", "issue_s": issue_seconds(device)}


_LINKS: dict[str, dict] = {}


def host_link(device: torch.device) -> dict:
    """`measure_link(device)`, measured once per process and device: the link is the
    machine's, not the graph's, and each lowering measuring it again (a new shape's
    first call, every model of a session) spent 60 ms of copies for a figure that only
    moved with the machine's load. A copy of the fields, so callers may keep them."""
    key = str(torch.device(device))
    if key not in _LINKS:
        _LINKS[key] = measure_link(torch.device(device))
    return dict(_LINKS[key])


def issue_seconds(device: torch.device, *, round_trips: int = 50) -> float:
    """Host seconds per transfer that the runtime's own calls take (`Transfers.offload`,
    `prefetch`, `wait`, `release`) on 4 KiB values: on CUDA the copies run on their
    streams while the host moves on, so this is what a transfer costs a step whose
    kernels the host issues no faster than the GPU runs them (H100, the quick GPT-2:
    68 transfers made an 8.3 ms step 6 ms slower while they moved 1.6 ms of bytes)."""
    import time

    transfers = Transfers(device)
    value = torch.zeros(1024, device=device)

    def round_trip():
        copy = transfers.offload(value)
        transfers.wait(copy)
        back = transfers.prefetch(copy)
        transfers.wait(copy)
        return back

    round_trip()   # the host buffer, allocated once (pinned on CUDA)
    if transfers.cuda:
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(round_trips):
        round_trip()
    spent = time.perf_counter() - began
    if transfers.cuda:
        torch.cuda.synchronize(device)
    return spent / (2 * round_trips)
