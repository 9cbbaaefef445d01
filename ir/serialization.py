"""Reading and writing IR files: framed binary protobuf, or protobuf JSON.

Binary files (and the bytes piped to external solvers) carry a 20-byte header
in front of the serialized `Graph` (schemas/README.md):

    offset  size  field
    0       4     magic b"RMIR"
    4       2     format major version, little-endian
    6       2     format minor version
    8       8     payload length in bytes
    16      4     CRC-32 of the payload

Protobuf alone cannot tell a file cut at a message boundary from a complete
one, so the length and checksum are what make truncation and corruption
errors instead of silently smaller graphs. JSON files are the canonical
protobuf JSON mapping of `Graph` (its `version` field is checked first), for
people and tools that prefer text.

`load` validates the graph's structure before returning it.

Older files of the same major version are read and upgraded in memory to the
current format (`_upgrade`), so a reader never sees the older layout:

- 1.0 -> 1.1: graph inputs gained `user_input_position` (where the caller
  passes each user input) and `argument_name`. A 1.0 file gets positions from
  the naming convention the PyTorch frontend used then, user inputs named
  "input<N>" for the N-th flat argument, when every user input follows it;
  otherwise (a graph built by hand, like `examples/mlp.rir` with inputs "x" and
  "target") from the order of its user inputs among the graph inputs. Argument
  names stay empty (unknown).
- 1.1 -> 1.2: the provenance gained `cost_model` (with the per-step overhead the
  simulator adds); an older file has none, which means no overhead: nothing to fill.
- 1.2 -> 1.3: the provenance gained `host_link` and schedules `host_budget_bytes`.
  An offload no longer releases the device copy (a later free does, once the copy
  to host has completed), so each offload step of a stored schedule gets a free of
  the same value right after it: what the older file meant.
- 1.3 -> 1.4: the provenance gained `rng_replay_bytes`; an older file has none,
  which counts no memory for a replay's generator state, as before: nothing to fill.
- 1.4 -> 1.5: the provenance gained `allocation_granularity_bytes` and the host link
  `issue_s`; an older file has neither, which counts every storage at its exact bytes
  and no host time per transfer, as before: nothing to fill.
- 1.5 -> 1.6: the cost model gained `backend`; an older file has none, which means
  its costs were timed op by op (eager), as they were: nothing to fill.
- 1.6 -> 1.7: nodes gained `body` (fused nodes, `ir/fusion.py`); an older file has
  none: nothing to fill.
- 1.7 -> 1.8: the provenance gained `runtime_makes_gradient_seeds`; an older file has
  it false, which counts no memory for the output gradients, as before: nothing to fill.
- 1.8 -> 1.9: costs gained `host_s` and `device_s`, the cost model `two_timelines`; an
  older file has it false, one timeline of `time_s`, as before: nothing to fill.
- 1.9 -> 1.10: nodes gained `accumulates_gradient`; an older file has none marked,
  so a runtime runs every sum of a gradient's parts, as before: nothing to fill.
- 1.10 -> 1.11: nodes gained `autocast_cast_back`; an older file has none marked, so a
  runtime runs every cast back of an autocast cast's gradient, as before: nothing to fill.
- 1.11 -> 1.12: arguments gained `complex_value`; an older file has none: nothing to fill.
- 1.12 -> 1.13: the cost model gained `call_overhead_s`; an older file has it 0, which
  prices no runtime time per call, as before: nothing to fill.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from . import remat_ir_pb2 as pb
from .errors import FormatError, RematIRError
from .graph import FORMAT_VERSION, Graph
from .validation import validate

MAGIC = b"RMIR"
_HEADER = struct.Struct("<4sHHQI")


def _check_version(major: int, minor: int, where: str) -> None:
    if major > FORMAT_VERSION[0]:
        raise FormatError(f"{where} uses IR format {major}.{minor}, newer than the "
                          f"{FORMAT_VERSION[0]}.x this remat-ir reads; upgrade remat-ir")
    if major < 1:
        raise FormatError(f"{where} declares IR format {major}.{minor}; expected "
                          f"{FORMAT_VERSION[0]}.x (is it a remat IR file?)")


def dumps(graph: Graph | pb.Graph) -> bytes:
    """Framed binary encoding of a graph (header + serialized `Graph`)."""
    proto = graph.proto if isinstance(graph, Graph) else graph
    payload = proto.SerializeToString(deterministic=True)
    return _HEADER.pack(MAGIC, proto.version.major, proto.version.minor,
                        len(payload), zlib.crc32(payload)) + payload


def dumps_json(graph: Graph | pb.Graph) -> str:
    proto = graph.proto if isinstance(graph, Graph) else graph
    return json_format.MessageToJson(proto, indent=1, preserving_proto_field_name=True) + "\n"


def _parse_binary(data: bytes, where: str) -> pb.Graph:
    if len(data) < _HEADER.size:
        raise FormatError(f"{where} is truncated: {len(data)} bytes, shorter than the "
                          f"{_HEADER.size}-byte header")
    magic, major, minor, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"{where} is not a remat IR file: it starts with {data[:4]!r}, "
                          f"not {MAGIC!r} (binary) or '{{' (JSON)")
    _check_version(major, minor, where)
    payload = data[_HEADER.size:]
    if len(payload) < length:
        raise FormatError(f"{where} is truncated: the header announces {length} bytes of graph, "
                          f"the file has {len(payload)}")
    if len(payload) > length:
        raise FormatError(f"{where} is corrupt: {len(payload) - length} unexpected bytes after "
                          "the graph")
    if zlib.crc32(payload) != crc:
        raise FormatError(f"{where} is corrupt: its checksum does not match its contents")
    graph = pb.Graph()
    try:
        graph.ParseFromString(payload)
    except DecodeError as exc:
        raise FormatError(f"{where} is corrupt: the graph does not decode ({exc})") from None
    if (graph.version.major, graph.version.minor) != (major, minor):
        # The writer packs the header from the graph's own version: an empty payload (which
        # decodes as an empty graph, and validated as one: found by a review) states none.
        stated = (f"says {graph.version.major}.{graph.version.minor}" if graph.ByteSize()
                  else "states no version (it is empty)")
        raise FormatError(f"{where} is corrupt: its header says format {major}.{minor}, its graph {stated}")
    return graph


def _parse_json(text: str, where: str) -> pb.Graph:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno}") from None
    except RecursionError:
        raise _too_deep(where) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("version"), dict):
        raise FormatError(f"{where} has no IR format version (a top-level \"version\" object); "
                          "is it a remat IR file?")
    major, minor = raw["version"].get("major", 0), raw["version"].get("minor", 0)
    if not isinstance(major, int) or not isinstance(minor, int):
        raise FormatError(f"{where} has a malformed version {raw['version']!r}")
    _check_version(major, minor, where)
    graph = pb.Graph()
    try:
        # A newer minor version may add fields this reader does not know: skip them.
        json_format.ParseDict(raw, graph, ignore_unknown_fields=minor > FORMAT_VERSION[1])
    except json_format.ParseError as exc:
        raise FormatError(f"{where} does not match the IR schema: {exc}") from None
    except RecursionError:
        raise _too_deep(where) from None
    return graph


def _too_deep(where: str) -> FormatError:
    """Python's JSON reader recurses once per nested array or object, so a file nested
    thousands deep exhausts the stack; no IR file nests more than a few levels."""
    return FormatError(f"{where} is not a remat IR file: its JSON is nested deeper than "
                       "Python can read (an IR file nests a few levels)")


def _upgrade(proto: pb.Graph) -> pb.Graph:
    """Bring a graph of an older minor version of this major up to FORMAT_VERSION (see the
    module docstring for what each step fills in)."""
    if (proto.version.major, proto.version.minor) >= FORMAT_VERSION:
        return proto
    if proto.version.minor < 1:
        kinds = {v.id: v.kind for v in proto.values}
        user = [i for i in proto.inputs if kinds.get(i.value_id) == pb.USER_INPUT]
        numbers = [i.name.removeprefix("input") for i in user]
        by_name = (all(i.name.startswith("input") and n.isdigit() for i, n in zip(user, numbers))
                   and len(set(map(int, numbers))) == len(numbers))
        for index, (entry, number) in enumerate(zip(user, numbers)):
            entry.user_input_position = int(number) if by_name else index
    if proto.version.minor < 3:
        # Before 1.3 an offload released the device copy at once: it is now a free's job.
        for schedule in proto.schedules:
            steps = list(schedule.steps)
            if not any(s.HasField("offload") for s in steps):
                continue
            backward_start = schedule.backward_start
            del schedule.steps[:]
            for k, step in enumerate(steps):
                schedule.steps.append(step)
                if step.HasField("offload"):
                    schedule.steps.add(free=step.offload)
                    backward_start += k < schedule.backward_start
            schedule.backward_start = backward_start
    proto.version.major, proto.version.minor = FORMAT_VERSION
    return proto


def loads(data: bytes, *, where: str = "input", check: bool = True) -> Graph:
    """Graph from bytes in either encoding; `check` validates its structure."""
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"{where} is not valid UTF-8 JSON ({exc})") from None
        proto = _parse_json(text, where)
    else:
        proto = _parse_binary(data, where)
    proto = _upgrade(proto)
    return validate(proto) if check else Graph(proto)


def load(path: str | Path, *, check: bool = True) -> Graph:
    """Read an IR file (binary or JSON, told apart by content) and validate it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"cannot read {path}: {exc.strerror}") from None
    return loads(data, where=str(path), check=check)


def save(graph: Graph | pb.Graph, path: str | Path, *, format: str | None = None) -> Path:
    """Write a graph; JSON if `format="json"` or the name ends in .json, else binary."""
    path = Path(path)
    fmt = format or ("json" if path.suffix == ".json" else "binary")
    if fmt not in ("json", "binary"):
        raise ValueError(f"unknown IR file format {fmt!r}; use 'binary' or 'json'")
    data = dumps_json(graph).encode("utf-8") if fmt == "json" else dumps(graph)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise RematIRError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
