"""optim.AdamW and optim.clip_grad_norm_ against torch.optim.AdamW and torch's clip_grad_norm_ over
several steps (odd sizes, a parameter without a gradient, weight decay, clipping on and off),
state_dict interchange, bad inputs."""
import pytest
import torch

from conftest import need, rel_err
from ops_transformer import optim

pytestmark = need("adamw_step", "multi_tensor_l2_norm")


def params(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(33, 17), (5,), (1,), (40000,), (3, 2, 7)]  # (40000: more than one chunk)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


@pytest.mark.parametrize("wd,clip", [(0.0, None), (0.1, 1.0), (0.01, 100.0)])
def test_adamw_and_clip_match_torch(wd, clip):
    ours, theirs = params(0), params(0)
    o1 = optim.AdamW(ours, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    o2 = torch.optim.AdamW(theirs, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        for a, b in zip(ours, theirs):
            grad = torch.randn(a.shape, generator=g) * (3.0 if step % 2 else 0.1)
            a.grad, b.grad = grad.clone(), grad.clone()
        ours[1].grad = theirs[1].grad = None  # no gradient this step: untouched
        if clip is not None:
            n1 = optim.clip_grad_norm_(ours, clip)
            n2 = torch.nn.utils.clip_grad_norm_(theirs, clip)
            assert abs(float(n1) - float(n2)) <= 1e-5 * float(n2)
        o1.step()
        o2.step()
        for a, b in zip(ours, theirs):
            assert rel_err(a, b) < 1e-6
    assert not o1.state[ours[1]] and not o2.state[theirs[1]]  # never a gradient: no state
    for a, b in zip(ours, theirs):
        if a is ours[1]:
            continue
        for k in ("exp_avg", "exp_avg_sq"):
            assert rel_err(o1.state[a][k], o2.state[b][k]) < 1e-6
        assert float(o1.state[a]["step"]) == float(o2.state[b]["step"])


def test_state_dict_loads_into_torch_adamw():
    ps = params(2)
    o1 = optim.AdamW(ps, lr=1e-2)
    for p in ps:
        p.grad = torch.ones_like(p)
    o1.step()
    o2 = torch.optim.AdamW(ps, lr=1e-2)
    o2.load_state_dict(o1.state_dict())
    o1.step()
    o2.step()  # (both moved the same parameters: the second state equals the first's)
    assert float(o2.state[ps[0]]["step"]) == 2.0


def test_bad_inputs_name_the_argument():
    p = torch.nn.Parameter(torch.randn(4))
    with pytest.raises(ValueError):
        optim.AdamW([p], betas=(1.0, 0.9))
    with pytest.raises(RuntimeError, match="'grads'"):
        torch.ops.ops_transformer.adamw_step([p.data], [torch.randn(5)], [torch.zeros(4)], [torch.zeros(4)],
                                             1e-3, 0.9, 0.99, 1e-8, 0.0, 1)
    with pytest.raises(RuntimeError, match="'params'"):
        torch.ops.ops_transformer.adamw_step([torch.randn(4).double()], [torch.randn(4)], [torch.zeros(4)], [torch.zeros(4)],
                                             1e-3, 0.9, 0.99, 1e-8, 0.0, 1)
