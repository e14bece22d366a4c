"""How far two float32 computations of the same gradients may lie apart: bounds derived from float32
rounding, the reduction lengths and the magnitudes of the terms summed (for tests that cannot run
in float64; ``exact_float64`` is the first choice).

A sum of n terms computed in float32, in any order, is within gamma(n) * sum |terms| of the exact
sum (gamma(n) = n u / (1 - n u), u = 2^-24: Higham, Accuracy and Stability of Numerical Algorithms,
3.1). A parameter's gradient is a sum over the N token positions of a pass of terms |delta_t| |a_t|
(delta: the gradient at the module's output; a: the input for a Linear weight, 1 for a bias or an
embedding row, the normalised input for a norm's weight); ``TermMagnitudes`` records
M = sum_t |delta_t| |a_t| per parameter. The terms themselves carry the rounding of the reductions
before them: forward to a, at most K sequential reductions; backward from the loss to delta, as many
again; to first order (tiny random layers, weights of std 0.02 on a residual stream, do not
amplify relative errors) a and delta are each within gamma(K) of exact. So each computation is
within (gamma(N) + 2 gamma(K)) M of the exact gradient, and two within twice that: ``gradient_bound``.
K per decoder layer: the norm (mean over H), the q projection (H), the attention scores (head size
<= H), softmax and the weighted values (2 L over L positions), o_proj (H), the second norm (H), the
gate/up projections (H) and down (I): 5 H + I + 2 L; then the head (H) and its log-sum-exp over the
vocabulary (V): ``reduction_depth``. A log-prob z_i - logsumexp(z) is within 2 gamma(K) (|z_i| + |lse|)
per computation: ``logp_bound``.
"""

from __future__ import annotations

import torch

U32 = 2.0 ** -24


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def reduction_depth(config, length: int) -> int:
    """K for a decoder of ``config`` over ``length`` positions (see the module docstring)."""
    hidden = config.hidden_size
    return config.num_hidden_layers * (5 * hidden + config.intermediate_size + 2 * length) + hidden + config.vocab_size


def logp_bound(z: torch.Tensor, depth: int) -> float:
    """Two float32 computations of log softmax(z) apart by at most this (z: logits / temperature)."""
    z = z.double()
    return 2 * 2 * gamma(depth) * float(z.abs().max() + torch.logsumexp(z, -1).abs().max())


def gradient_bound(magnitude: torch.Tensor, positions: int, depth: int) -> torch.Tensor:
    """Two float32 computations of a gradient with term magnitudes ``magnitude`` apart by at most this."""
    return 2 * (gamma(positions) + 2 * gamma(depth)) * magnitude


class TermMagnitudes:
    """M = sum over token positions of |delta_t| |a_t| (float64) for each trained parameter of the
    model's Linear, Embedding and RMSNorm modules, recorded over one forward and backward."""

    def __init__(self, model) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.positions = 0
        self._names = {id(p): name for name, p in model.named_parameters()}  # tied weights: one name
        self._handles = []
        for module in model.modules():
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                kind = self._kind(module)
                if kind is not None:
                    self._handles.append(module.register_forward_hook(self._hook(kind)))

    @staticmethod
    def _kind(module) -> str | None:
        if isinstance(module, torch.nn.Linear):
            return "linear"
        if isinstance(module, torch.nn.Embedding):
            return "embedding"
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            return "norm"
        return None

    def _hook(self, kind: str):
        def forward(module, inputs, output):
            if not output.requires_grad:
                return
            weight, bias = self._names[id(module.weight)], getattr(module, "bias", None)
            x = inputs[0].detach()
            rows = x.reshape(-1, x.size(-1)) if kind != "embedding" else x.reshape(-1)
            self.positions = max(self.positions, rows.size(0))
            if kind == "norm":
                normalised = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True)
                                                       + module.variance_epsilon)).abs()

            def backward(grad):
                delta = grad.detach().double().abs().reshape(-1, grad.size(-1))  # [N, out]
                if kind == "linear":
                    self._add(weight, delta.T @ rows.double().abs())
                    if bias is not None:
                        self._add(self._names[id(bias)], delta.sum(0))
                elif kind == "embedding":
                    self._add(weight, torch.zeros_like(module.weight, dtype=torch.float64).index_add_(0, rows, delta))
                else:
                    self._add(weight, (delta * normalised.reshape(delta.shape)).sum(0))

            output.register_hook(backward)

        return forward

    def _add(self, name: str, value: torch.Tensor) -> None:
        self.sums[name] = self.sums[name] + value if name in self.sums else value

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
