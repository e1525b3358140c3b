"""A checkpoint written before the layer held its step loads into today's layer (a load hook maps
a step's keys to ``step.*``; a sequence mixer owns its parameters at its top level, as then, and
renames the ``step.*`` keys of the layout that held them) and computes what it computed then: ``tests/data/layers-v1/layers.pt``,
written by the code of e70159d (every registered variant then, and the cases whose parameters
sat elsewhere: Mamba-2's grouped B and C, a learnable score, the lecture notes' head form)."""

from pathlib import Path

import pytest
import torch

from attnlab import efficient
from attnlab.layers.migration import MIXER_LAYER_KEYS
from attnlab.layers.mixer import SequenceMixer

DATA = torch.load(Path(__file__).resolve().parent.parent / "data" / "layers-v1" / "layers.pt", weights_only=False)


@pytest.mark.parametrize("key", sorted(DATA))
def test_a_checkpoint_written_before_the_step_loads_and_computes_the_same(key):
    case = DATA[key]
    torch.manual_seed(0)  # the draws of the writing run: reformer draws its rotations at every call (no seed)
    layer = efficient.create(case["name"], embed_dim=16, num_heads=4, **case["options"]).double().eval()
    torch.randn(case["x"].shape, dtype=torch.float64)
    old_keys = set(case["state"])
    result = layer.load_state_dict(case["state"])  # strict: every old key found a place, every new one was filled
    assert not result.missing_keys and not result.unexpected_keys
    if efficient.capabilities(case["name"]).mixer:  # a sequence mixer owns its parameters at its top level, as then
        assert isinstance(layer, SequenceMixer) and set(layer.state_dict()) == old_keys
    else:  # a step's parameters are the held step's
        assert set(layer.state_dict()) == {k if k.startswith(("q_proj", "k_proj", "v_proj", "out_proj", "head_", "positional"))
                                           else f"step.{k}" for k in old_keys}
    with torch.no_grad():
        out = layer(case["x"]).output
    torch.testing.assert_close(out, case["output"], rtol=0, atol=1e-12)


def test_the_old_keys_are_the_steps_and_a_new_checkpoint_round_trips():
    old = DATA["linformer"]  # an attention step: its old top-level keys map to step.*
    assert "proj_k" in old["state"] and "step.proj_k" not in old["state"]
    layer = efficient.create("linformer", embed_dim=16, num_heads=4, **old["options"]).double()
    layer.load_state_dict(old["state"])
    assert torch.equal(layer.step.proj_k, old["state"]["proj_k"]) and "step.proj_k" in layer.state_dict()
    again = efficient.create("linformer", embed_dim=16, num_heads=4, **old["options"]).double()
    again.load_state_dict(layer.state_dict())  # the new keys load as they are
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), layer.state_dict().values()))
    with pytest.raises(RuntimeError, match="Unexpected key"):  # a key that is neither the layer's nor its step's is refused
        again.load_state_dict({**layer.state_dict(), "nonsense.weight": torch.zeros(1)})


def test_a_mixers_old_keys_are_its_own_and_the_step_keys_of_the_held_layout_load():
    old = DATA["gla"]  # a sequence mixer: its parameters at its top level, as in the first layout
    assert "gate_up.weight" in old["state"] and "step.gate_up.weight" not in old["state"]
    layer = efficient.create("gla", embed_dim=16, num_heads=4, **old["options"]).double()
    layer.load_state_dict(old["state"])
    assert torch.equal(layer.gate_up.weight, old["state"]["gate_up.weight"]) and not hasattr(layer, "step")
    # the layout when a layer held the mixer's parameters as its step: step.* keys, renamed by the load hook
    held = {k if k.startswith(MIXER_LAYER_KEYS) else f"step.{k}": v for k, v in layer.state_dict().items()}
    assert "step.gate_up.weight" in held and "gate_up.weight" not in held
    again = efficient.create("gla", embed_dim=16, num_heads=4, **old["options"]).double()
    result = again.load_state_dict(held)
    assert not result.missing_keys and not result.unexpected_keys
    assert again.state_dict().keys() == layer.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), layer.state_dict().values()))
    with pytest.raises(RuntimeError, match="Unexpected key"):  # a key that is neither the mixer's nor its old step's is refused
        again.load_state_dict({**layer.state_dict(), "nonsense.weight": torch.zeros(1)})
