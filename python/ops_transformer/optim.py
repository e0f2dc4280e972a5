"""Optimizer steps on the library: one call a step over every parameter (torch.optim's per-tensor
loop runs ~10 element-wise ops per tensor, dispatch rather than memory for a model of many small
tensors).

    opt = optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    total = optim.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()

AdamW is torch.optim.AdamW (decoupled weight decay, bias corrections; no amsgrad, maximize or
capturable) with the state names of torch's ('step', 'exp_avg', 'exp_avg_sq'), so state_dicts load
either way. Parameters, gradients and state fp32 on the CPU. clip_grad_norm_ is
torch.nn.utils.clip_grad_norm_ (L2 norm, in place) with the norm from one multi_tensor_l2_norm call."""
import torch

from ._lib import fast_op

__all__ = ["AdamW", "clip_grad_norm_"]

_ADAMW = fast_op("adamw_step")
_L2 = fast_op("multi_tensor_l2_norm")


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        if _ADAMW is None:
            raise NotImplementedError("optim.AdamW: adamw_step is not built into this library")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"optim.AdamW: invalid lr {lr}, betas {betas}, eps {eps} or weight_decay {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # parameters grouped by their step count (all equal but after a partial load)
            by_step = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("optim.AdamW: sparse gradients are not supported")
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["step"] += 1
                by_step.setdefault(int(st["step"].item()), []).append((p, st))
            b1, b2 = group["betas"]
            for step, items in by_step.items():
                _ADAMW([p for p, _ in items], [p.grad for p, _ in items], [s["exp_avg"] for _, s in items],
                       [s["exp_avg_sq"] for _, s in items], group["lr"], b1, b2, group["eps"], group["weight_decay"], step)
        return loss


def clip_grad_norm_(parameters, max_norm):
    """Scales the gradients in place so their total L2 norm is at most max_norm (torch's rule:
    factor max_norm / (norm + 1e-6), clamped to 1); returns the norm before clipping."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = _L2(grads)
    factor = float(max_norm) / (total + 1e-6)
    if factor < 1.0:
        torch._foreach_mul_(grads, factor)
    return torch.tensor(total)
