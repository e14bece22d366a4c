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
again. A component of a or delta can be small by cancellation, so their errors are bounded by the
vectors' largest components: to first order (tiny random layers, weights of std 0.02 on a residual
stream, do not amplify errors) each is within gamma(K) max|a_t| (max|delta_t|) of exact, and
M' = sum_t max|delta_t| max|a_t| is recorded too. So each computation is within
gamma(N) M + 2 gamma(K) M' of the exact gradient, and two within twice that: ``gradient_bound``.
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


def gradient_bound(terms: "TermMagnitudes", name: str, depth: int, relative: float = 0.0) -> torch.Tensor:
    """Two float32 computations of parameter ``name``'s gradient apart by at most this; ``relative``:
    a further relative error of every delta (e.g. from log-probs that differ by that much)."""
    return 2 * (gamma(terms.positions) * terms.sums[name] + (2 * gamma(depth) + relative) * terms.norm_sums[name])


class TermMagnitudes:
    """M = sum over token positions of |delta_t| |a_t| (float64) for each trained parameter of the
    model's Linear, Embedding and RMSNorm modules, recorded over one forward and backward."""

    def __init__(self, model) -> None:
        self.sums: dict[str, torch.Tensor] = {}  # M
        self.norm_sums: dict[str, torch.Tensor] = {}  # M'
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
                largest = delta.max(-1, keepdim=True).values  # [N, 1]
                if kind == "linear":
                    inputs = rows.double().abs()
                    self._add(weight, delta.T @ inputs, largest.T @ inputs.max(-1, keepdim=True).values)
                    if bias is not None:
                        self._add(self._names[id(bias)], delta.sum(0), largest.sum(0))
                elif kind == "embedding":
                    table = torch.zeros_like(module.weight, dtype=torch.float64)
                    self._add(weight, table.index_add(0, rows, delta),
                              table.index_add(0, rows, largest.expand_as(delta)))
                else:
                    flat = normalised.reshape(delta.shape)
                    self._add(weight, (delta * flat).sum(0), (largest * flat.max(-1, keepdim=True).values).sum(0))

            output.register_hook(backward)

        return forward

    def _add(self, name: str, value: torch.Tensor, normwise: torch.Tensor) -> None:
        self.sums[name] = self.sums[name] + value if name in self.sums else value
        normwise = normwise.expand_as(value)
        self.norm_sums[name] = self.norm_sums[name] + normwise if name in self.norm_sums else normwise

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
