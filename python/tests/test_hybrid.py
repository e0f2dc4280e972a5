"""ops_transformer.models.hybrid: the library model and its plain-torch twin on one state_dict give
the same logits, losses and gradients (fp32), and cached decode equals the full forward."""
import pytest
import torch
import torch.nn.functional as F

from conftest import need, rel_err
from ops_transformer.models.hybrid import HybridConfig, HybridLM

pytestmark = need("chunk_gated_delta_rule_bwd", "moe_ffn_backward", "causal_conv1d_bwd", "rms_norm_gated_bwd")

# 4 layers: GDN, GDN, GDN, attention; GVA (4 value heads on 2 key heads); T crosses a 64-chunk boundary.
TINY = HybridConfig(hidden_size=32, num_layers=4, num_attention_heads=2, head_dim=16, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4,
                    moe_intermediate_size=24, top_k=2)


def pair(seed=0):
    lib = HybridLM(TINY).init_weights(seed)
    twin = HybridLM(TINY, impl="torch")
    twin.load_state_dict(lib.state_dict())
    return lib, twin


def loss_of(model, ids):
    logits, aux = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)) + 0.01 * aux, logits


def test_one_state_dict():
    lib, twin = pair()
    assert list(lib.state_dict()) == list(twin.state_dict())
    assert all(a.shape == b.shape for a, b in zip(lib.state_dict().values(), twin.state_dict().values()))


def test_logits_and_gradients_match_twin():
    lib, twin = pair()
    ids = torch.randint(0, TINY.vocab_size, (2, 71), generator=torch.Generator().manual_seed(1))
    l_lib, lo_lib = loss_of(lib, ids)
    l_twin, lo_twin = loss_of(twin, ids)
    assert rel_err(lo_lib, lo_twin) < 1e-5
    assert abs(l_lib.item() - l_twin.item()) < 1e-5
    l_lib.backward()
    l_twin.backward()
    tp = dict(twin.named_parameters())
    for name, p in lib.named_parameters():
        assert p.grad is not None, name
        # The decay-gate gradients (A_log, dt_bias, in_proj_a) are ~1e-7..1e-4 and cancel: an
        # absolute floor of 1e-7 on the error norm; every other gradient is >= 1e-4 in norm.
        diff = (p.grad.double() - tp[name].grad.double()).norm().item()
        assert diff <= 1e-5 * tp[name].grad.double().norm().item() + 1e-7, name


def test_gradient_check_can_fail():
    """A wrong weight in the twin must show in the logits (the comparison is not vacuous)."""
    lib, twin = pair()
    with torch.no_grad():
        twin.layers[0].linear_attn.A_log.add_(0.1)
    ids = torch.randint(0, TINY.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    assert rel_err(lib(ids)[0], twin(ids)[0]) > 1e-4


@pytest.mark.parametrize("impl", ["ot", "torch"])
def test_cached_decode_equals_full_forward(impl):
    """Prefill 5 tokens into a cache (GDN state + conv state, KV cache, MoE inference path), then
    decode 1 token at a time: each step's logits equal the full forward's at that position."""
    lib, twin = pair(3)
    model = lib if impl == "ot" else twin
    ids = torch.randint(0, TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full, _ = model(ids)
        cache = model.new_cache()
        got = [model(ids[:, :5], cache=cache)[0]]
        for t in range(5, ids.shape[1]):
            got.append(model(ids[:, t:t + 1], cache=cache)[0])
    got = torch.cat(got, 1)
    assert rel_err(got, full) < 2e-5
    assert rel_err(got[:, -1], full[:, -1]) < 2e-5


def test_train_smoke(tmp_path):
    """python3 -m ops_transformer.train on a tiny config: both implementations, the report files, the
    losses equal, --generate on the cached path."""
    import json
    from ops_transformer import train
    rc = train.main(["--steps", "4", "--ref-steps", "4", "--check-ref", "--batch", "2", "--seq", "24", "--hidden", "32",
                     "--experts", "4", "--inter", "32", "--heads", "2", "--head-dim", "16", "--gdn-dim", "16",
                     "--generate", "6", "--out", str(tmp_path)])
    assert rc == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["max_loss_diff"] < 1e-4 and len(rep["losses"]["library"]) == 4
    assert rep["generate"]["twin_text_equal"] and len(rep["generate"]["text"]) > 0
    assert (tmp_path / "loss.png").stat().st_size > 0 and (tmp_path / "report.md").exists()


def test_kv_cache_appends_in_place_and_grows():
    """The attention KV cache writes each step's rows into buffers grown by doubling: the views
    equal the concatenation of every step's keys and values, across growths."""
    from ops_transformer.models.hybrid import _append_kv
    cache, ks, vs, past = {}, [], [], 0
    for T in (40, 30, 1, 1, 70):
        k, v = torch.randn(2, 3, T, 4), torch.randn(2, 3, T, 4)
        ks.append(k), vs.append(v)
        got_k, got_v = _append_kv(cache, k, v, past)
        past += T
        assert torch.equal(got_k, torch.cat(ks, 2)) and torch.equal(got_v, torch.cat(vs, 2))
        assert cache["k"].shape[2] == past
    assert cache["_kv"][0].shape[2] >= past
