"""A key/value cache among a training call's outputs (`frontends/cache_outputs.py`): built
as eager builds it, so the gradients are eager's bitwise, and left out of what the step
returns."""

from __future__ import annotations

import collections
import copy
import re
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

import remat_ir
from remat_ir.frontends import cache_outputs
from remat_ir.frontends.cache_outputs import dropping_caches, without_caches
from remat_ir.frontends.errors import LoweringError

from exactness import side_by_side

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

_NOTICE = r"call returns a key/value cache \(output\[{}\]\), as a call with use_cache=True"


def _gpt2():
    """GPT-2 as its config makes it: attention dropout 0.1, use_cache=True."""
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=16))


def _qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, attention_dropout=0.1))


def _t5():
    """T5's decoder keeps a config of its own (hunt70: a notice turned the cache off on the
    model's, the decoder's still asked for one)."""
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.1,
        decoder_start_token_id=0, pad_token_id=0))


@pytest.mark.parametrize("make, extra, place", [
    (_gpt2, {}, "'cache'"),
    (_gpt2, {"return_dict": False, "output_hidden_states": True}, "2"),
    (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=16, use_cache=False)),
     {"use_cache": True}, "'cache'"),
    (_qwen2, {}, "'cache'"),
    (_t5, {}, "'cache'"),
], ids=["gpt2", "gpt2-tuple", "gpt2-use_cache-argument", "qwen2", "t5"])
def test_a_model_building_a_cache_trains_bitwise_as_eager_which_builds_it(make, extra, place, capsys, monkeypatch):
    """Found by hunt70: `remat` set `use_cache=False` on the config (the model's cache,
    which torch.export cannot return, had been refused), and GPT-2's default config, with
    attention dropout, then attended to other layouts of the keys and values than eager,
    which builds the cache: gradients 7e-12 off, drifting over steps. The cache is built
    as eager builds it and left out of the outputs, said once; the user's config is left
    as it was."""
    torch.manual_seed(0)
    model = make()
    config = model.config.to_dict()
    ids = torch.randint(1, 64, (3, 8))
    batch = {"input_ids": ids, "labels": ids, **extra}
    made = []
    monkeypatch.setattr(cache_outputs, "_TOLD", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # said on stderr, not a warning (hunt75: an error under this filter)
        errors = side_by_side(model, lambda m: made.append(remat_ir.remat(m, batch, solver="recompute-all",
                                                                          cost_model="flops")) or made[0],
                              (), batch, lambda out: out[0], steps=3, tolerance=1e-30)
    assert errors == {}
    said = capsys.readouterr().err
    assert len(re.findall(_NOTICE.format(place), said)) == 1, said
    assert model.config.to_dict() == config
    out, theirs = made[0](**batch), copy.deepcopy(model)(**batch)
    # A model output leaves it out; a tuple holds None in its place, what follows where eager's is.
    assert len(out) == len(theirs) - (not isinstance(out, tuple))
    assert not any(isinstance(value, transformers.cache_utils.Cache) for value in pytree.tree_leaves(out))
    if isinstance(out, tuple):   # hunt75: `out[3]` read the attentions where eager's held the hidden states
        assert out[int(place)] is None
        assert [h.shape for h in out[3]] == [h.shape for h in theirs[3]]


def test_peft_prefix_tuning_which_returns_its_virtual_tokens_cache_trains_bitwise():
    """peft's prefix tuning hands its virtual tokens to the model as a cache, which the model
    returns with use_cache=False too: refused before, trained only through a wrapper
    returning the loss and logits. Now as the model is, padded or not."""
    peft = pytest.importorskip("peft")
    from transformers.utils import logging
    logging.set_verbosity_error()

    def make():
        torch.manual_seed(0)
        return peft.get_peft_model(
            transformers.LlamaForCausalLM(transformers.LlamaConfig(
                vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, use_cache=False)),
            peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    ids = torch.randint(0, 64, (2, 8))
    for mask in (torch.ones_like(ids), torch.tensor([[1] * 8, [1] * 5 + [0] * 3])):
        batch = {"input_ids": ids, "labels": ids, "attention_mask": mask, "use_cache": False}
        errors = side_by_side(make(), lambda m: remat_ir.remat(m, batch, solver="recompute-all",
                                                               cost_model="flops"),
                              (), batch, lambda out: out.loss, tolerance=1e-30)
        assert errors == {}


def test_a_cache_given_to_the_call_is_still_refused():
    """A cache among the inputs is not left out: its tensors would be taken for constants of
    the graph, and the next call's cache ignored."""
    torch.manual_seed(0)
    model = _gpt2()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        past = model(input_ids=ids[:, :4]).past_key_values
    with pytest.raises(LoweringError, match="DynamicCache"):
        remat_ir.remat(model, {"input_ids": ids[:, 4:], "labels": ids[:, 4:], "past_key_values": past},
                       cost_model="flops")


_Pair = collections.namedtuple("_Pair", "first second")


def _outputs(depth: int = 0):
    """Random output structures of tensors and caches, nested in the containers a model
    returns (dicts, tuples, lists, named tuples, model outputs)."""
    leaf = st.one_of(st.just("tensor"), st.just("cache"))
    if depth == 2:
        return leaf
    inner = st.deferred(lambda: _outputs(depth + 1))
    return st.one_of(
        leaf,
        st.lists(inner, max_size=3).map(tuple),
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
        st.tuples(inner, inner).map(lambda pair: _Pair(*pair)),
        st.tuples(inner, inner).map(lambda pair: ("output", pair)))


def _built(shape, counter):
    """The structure `shape` describes, with distinct tensors and fresh caches."""
    if shape == "tensor":
        counter[0] += 1
        return torch.full((1,), float(counter[0]))
    if shape == "cache":
        return DynamicCache()
    if isinstance(shape, _Pair):
        return _Pair(*(_built(item, counter) for item in shape))
    if isinstance(shape, tuple) and shape[:1] == ("output",):
        return CausalLMOutputWithPast(loss=_built(shape[1][0], counter), logits=_built(shape[1][1], counter))
    if isinstance(shape, dict):
        return {key: _built(item, counter) for key, item in shape.items()}
    return type(shape)(_built(item, counter) for item in shape)


def _without(value):
    """`value` with its caches left out of their model outputs and dicts and None in their
    place in tuples and lists (what `without_caches`'s spec rebuilds); raises LookupError
    where one sits where none can be left out."""
    if isinstance(value, DynamicCache):
        return None
    if isinstance(value, _Pair):
        if any(isinstance(item, DynamicCache) for item in value):
            raise LookupError
        return _Pair(*(_without(item) for item in value))
    if isinstance(value, CausalLMOutputWithPast):
        return type(value)(**{key: _without(item) for key, item in value.items()
                              if not isinstance(item, DynamicCache)})
    if isinstance(value, dict):
        return {key: _without(item) for key, item in value.items() if not isinstance(item, DynamicCache)}
    if isinstance(value, (tuple, list)):
        return type(value)(_without(item) for item in value)
    return value


@settings(max_examples=60, deadline=None)
@given(shape=_outputs())
def test_caches_anywhere_in_the_outputs_are_left_out_with_the_same_flat_tensors(shape):
    """Whatever the nesting, the structure without the caches takes the same flat tensors,
    with None at the positions it names, and rebuilds the outputs with each cache left out
    of its model output or dict and None in its place in a tuple or list; a cache where
    none can be left out (the output itself, a named tuple's field) is refused naming
    use_cache=False."""
    value = _built(shape, [0])
    try:
        expected = _without(value)
        refused = isinstance(value, DynamicCache)
    except LookupError:
        refused = True
    with dropping_caches((), {}) as classes:
        leaves, spec = pytree.tree_flatten(value)
        assert DynamicCache in classes
        if refused:
            with pytest.raises(LoweringError, match="use_cache=False"):
                without_caches(spec, classes)
            return
        rebuilt, places, holes = without_caches(spec, classes)
    assert DynamicCache not in pytree.SUPPORTED_NODES   # registered for the trace only
    assert len(places) == str(shape).count("cache")
    for position in holes:
        leaves.insert(position, None)
    again = pytree.tree_unflatten(leaves, rebuilt)
    assert pytree.tree_structure(again) == pytree.tree_structure(expected)
    assert all(a is b for a, b in zip(pytree.tree_leaves(again), pytree.tree_leaves(expected)))


def test_a_cache_class_the_user_registered_with_pytree_is_left_out_too_and_theirs_kept():
    """Found by hunt75: after transformers' `register_dynamic_cache_export_support()` the
    cache flattened to its tensors, which became outputs held through the step and were
    rebuilt from remat-ir's own placeholders: a crash inside transformers. It is left out
    as any cache, the user's registration put back after lowering."""
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()
    try:
        registered = pytree.SUPPORTED_NODES[DynamicCache]
        torch.manual_seed(0)
        model = _gpt2()
        eager = copy.deepcopy(model)
        ids = torch.randint(1, 64, (3, 8))
        batch = {"input_ids": ids, "labels": ids}
        scheduled = remat_ir.remat(model, batch, solver="recompute-all", cost_model="flops")
        for module in (eager, scheduled):   # (eager's output flattens to its cache's tensors too)
            torch.manual_seed(1)
            module(**batch).loss.backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))
        assert pytree.SUPPORTED_NODES[DynamicCache] is registered
        with torch.no_grad():
            assert pytree.tree_leaves(model(input_ids=ids).past_key_values)   # flattens to its tensors again
    finally:
        pytree._deregister_pytree_node(DynamicCache)


def test_a_cache_in_a_dataclass_output_is_refused_naming_use_cache():
    """Found by hunt75: a registered dataclass's context (its field names and its None
    fields') was taken for its children's keys, and a two-field `(loss, cache)` output
    lost a field: "not enough values to unpack" from AOTAutograd."""
    import dataclasses

    @dataclasses.dataclass
    class Out:
        loss: torch.Tensor
        cache: object

    torch.export.register_dataclass(Out, serialized_type_name="test_cache_outputs.Out")
    try:
        with dropping_caches((), {}) as classes:
            _, spec = pytree.tree_flatten(Out(torch.ones(1), DynamicCache()))
            with pytest.raises(LoweringError, match=r"returns a key/value cache at output\['cache'\]|inside a Out"):
                without_caches(spec, classes)
    finally:
        pytree._deregister_pytree_node(Out)
