"""Files: binary and JSON round trips, exact constants, and clear errors on bad files."""

import json
import math
import struct
import zlib

import pytest

from remat_ir import ir
from remat_ir.ir import arguments, pb
from remat_ir.ir.examples import mlp
from remat_ir.ir.serialization import MAGIC


@pytest.fixture(scope="module")
def graph():
    return mlp(layers=3, batch=8, width=16)


@pytest.mark.parametrize("suffix", [".rir", ".json"])
def test_round_trip(graph, tmp_path, suffix):
    path = ir.save(graph, tmp_path / f"g{suffix}")
    loaded = ir.load(path)
    assert loaded.proto == graph.proto
    assert len(loaded.schedules) == 2
    # The loaded graph answers the same questions.
    assert loaded.topological_order == graph.topological_order
    assert ir.simulate(loaded, loaded.schedules[0]).peak_bytes == \
        ir.simulate(graph, graph.schedules[0]).peak_bytes


def test_binary_and_json_describe_the_same_graph(graph, tmp_path):
    a = ir.load(ir.save(graph, tmp_path / "g.rir"))
    b = ir.load(ir.save(graph, tmp_path / "g.json"))
    assert a.proto == b.proto
    assert ir.dumps(a) == ir.dumps(b)


# Constants real models carry: causal-mask -inf, NaN, int64 extremes and beyond,
# dtypes, devices, memory formats, nested lists and tuples, empty lists.
SPECIAL_ARGS = [
    -math.inf, math.inf, math.nan, -0.0, 1e-300, 2**63 - 1, -(2**63), 2**64 + 5, -(2**70),
    True, False, None, "tanh", [], (), [1, [2, (3, None)]], (0.5, -math.inf),
    arguments.DTypeArg("bfloat16"), arguments.Device("cuda:1"),
    arguments.MemoryFormatArg("channels_last"), arguments.LayoutArg("strided"),
    1j, complex(-0.0, math.inf), complex(math.nan, -2.5), complex(-0.0, -0.0),
]


@pytest.mark.parametrize("suffix", [".rir", ".json"])
def test_special_arguments_round_trip_exactly(tmp_path, suffix):
    g = ir.Graph(name="constants")
    x = g.add_value("x", "float32", (2, 2), kind="user_input")
    g.add_input(x)
    y = g.add_value("y", "float32", (2, 2), kind="output")
    g.add_node("aten.masked_fill.Scalar", [x], [y], phase="forward",
               args=[ir.TensorRef(x)] + SPECIAL_ARGS, kwargs={"fill": -math.inf, "dims": [0, -1]})
    g.add_output(y, "user_output", "y")
    c = g.add_value("mask_const", "bool", (2,), kind="constant", constant=b"\x01\x00")
    z = g.add_value("z", "float32", (2, 2), kind="output")
    g.add_node("aten.where.self", [c, y], [z], phase="forward")
    g.add_output(z, "user_output", "z")
    loaded = ir.load(ir.save(g, tmp_path / f"c{suffix}"))
    node = loaded.node(0)
    decoded = [arguments.decode(a) for a in node.args]
    assert decoded[0] == ir.TensorRef(x)
    for original, back in zip(SPECIAL_ARGS, decoded[1:], strict=True):
        assert arguments.same(original, back), (original, back)
    assert math.copysign(1.0, decoded[1 + SPECIAL_ARGS.index(-0.0)]) == -1.0
    kwargs = {kw.name: arguments.decode(kw.value) for kw in node.kwargs}
    assert kwargs == {"fill": -math.inf, "dims": [0, -1]}
    assert loaded.value(c).constant.raw == b"\x01\x00"


def test_unsupported_argument_type_is_named():
    with pytest.raises(TypeError, match="cannot store an argument of type object"):
        arguments.encode(object())


def _write(tmp_path, data: bytes, name="bad.rir"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_truncated_file(graph, tmp_path):
    data = ir.dumps(graph)
    with pytest.raises(ir.FormatError, match=r"truncated: the header announces \d+ bytes of graph, the file has \d+"):
        ir.load(_write(tmp_path, data[:-7]))
    with pytest.raises(ir.FormatError, match="truncated: 10 bytes, shorter than the 20-byte header"):
        ir.load(_write(tmp_path, data[:10]))


def test_corrupt_file(graph, tmp_path):
    data = bytearray(ir.dumps(graph))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(ir.FormatError, match="corrupt: its checksum does not match"):
        ir.load(_write(tmp_path, bytes(data)))


def test_payload_that_does_not_decode(tmp_path):
    payload = b"\xff\xff\xff\xff"
    data = struct.pack("<4sHHQI", MAGIC, 1, 0, len(payload), zlib.crc32(payload)) + payload
    with pytest.raises(ir.FormatError, match="corrupt: the graph does not decode"):
        ir.load(_write(tmp_path, data))


def test_an_empty_payload_is_no_graph(graph, tmp_path):
    """Found by a review: a valid header over an empty payload decoded as an empty graph,
    which `validate` called sound and a solver planned (a 1-byte budget)."""
    major, minor = graph.proto.version.major, graph.proto.version.minor
    data = struct.pack("<4sHHQI", MAGIC, major, minor, 0, zlib.crc32(b""))
    with pytest.raises(ir.FormatError, match=rf"corrupt: its header says format {major}.{minor}, its graph "
                                             rf"states no version \(it is empty\)"):
        ir.load(_write(tmp_path, data))


def test_not_an_ir_file(tmp_path):
    with pytest.raises(ir.FormatError, match="not a remat IR file: it starts with b'PK"):
        ir.load(_write(tmp_path, b"PK\x03\x04" + bytes(40)))
    with pytest.raises(ir.FormatError, match="cannot read .*missing.rir: No such file"):
        ir.load(tmp_path / "missing.rir")


def test_newer_major_version_is_refused(graph, tmp_path):
    newer = pb.Graph()
    newer.CopyFrom(graph.proto)
    newer.version.major, newer.version.minor = 2, 0
    with pytest.raises(ir.FormatError, match=r"IR format 2\.0, newer than the 1\.x this remat-ir reads"):
        ir.load(_write(tmp_path, ir.dumps(newer)))
    raw = json.loads(ir.dumps_json(graph))
    raw["version"]["major"], raw["version"]["minor"] = 7, 0
    with pytest.raises(ir.FormatError, match=r"IR format 7\.0, newer"):
        ir.load(_write(tmp_path, json.dumps(raw).encode(), "newer.json"))


def test_newer_minor_version_with_unknown_fields_is_read(graph, tmp_path):
    raw = json.loads(ir.dumps_json(graph))
    raw["version"]["minor"] = ir.FORMAT_VERSION[1] + 1
    raw["a_field_from_the_future"] = {"x": 1}
    loaded = ir.load(_write(tmp_path, json.dumps(raw).encode(), "minor.json"))
    assert len(loaded.nodes) == len(graph.nodes)


def test_bad_json(tmp_path):
    with pytest.raises(ir.FormatError, match="not valid JSON: .* at line 1"):
        ir.load(_write(tmp_path, b'{"version": ', "bad.json"))
    with pytest.raises(ir.FormatError, match="no IR format version"):
        ir.load(_write(tmp_path, b'{"nodes": []}', "bad.json"))
    with pytest.raises(ir.FormatError, match="does not match the IR schema"):
        ir.load(_write(tmp_path, b'{"version": {"major": 1}, "nodes": [{"op": 5, "bogus": 1}]}', "bad.json"))


def test_load_validates_structure(graph, tmp_path):
    broken = pb.Graph()
    broken.CopyFrom(graph.proto)
    broken.nodes[0].inputs.append(999)
    with pytest.raises(ir.InvalidGraph, match="value id 999, which does not exist"):
        ir.load(_write(tmp_path, ir.dumps(broken)))
    assert len(ir.load(_write(tmp_path, ir.dumps(broken)), check=False).nodes) == len(graph.nodes)


def test_a_1_2_offload_gets_the_free_it_meant(tmp_path):
    """Before 1.3 an offload also released the device copy: on load a free follows it."""
    from builders import chain, schedule
    g, ids = chain(2)
    old = schedule([("compute", ids["f1"]), ("compute", ids["f2"]), ("offload", ids["a1"]),
                    ("prefetch", ids["a1"]), ("compute", ids["b2"]), ("free", ids["a1"]),
                    ("compute", ids["b1"]), ("free", ids["g1"])], 3)
    g.proto.schedules.append(old)
    g.proto.version.major, g.proto.version.minor = 1, 2
    loaded = ir.load(_write(tmp_path, ir.dumps(g.proto)))
    upgraded = loaded.proto.schedules[0]
    assert [s.WhichOneof("action") for s in upgraded.steps[:5]] == [
        "compute", "compute", "offload", "free", "prefetch"]
    assert upgraded.backward_start == 4
    assert ir.check(loaded, upgraded).peak_bytes == 3 * 1000
