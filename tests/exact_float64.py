"""Models that run wholly in float64, for equality tests that hold to rounding and not to a tuned margin.

Two float64 computations that differ only in the order of their additions (a shared prefix against
the plain pass, micro-batch splits, ranks) agree to a few units of float64 rounding: each value is
a sum of at most n ~ 10^3 rounded terms in these tiny models (the longest: a weight gradient over
every token position of a batch, or a chain of 2 layers' projections, attention and the 300-word
head), so the two differ by at most about 2 n u |terms| with u = 2^-53 = 1.1e-16, i.e. 2e-13 of
the terms' magnitude. ``FLOAT64_TOLERANCE`` allows 1e-12 of each result's own scale (a factor 5
for cancellation; measured: at most 1.4e-14). A real defect (a wrong position, a cache row read
by the wrong row, a normaliser off by a factor) moves values by 1e-3 of their scale or more.
"""

from __future__ import annotations

import types

import torch

FLOAT64_TOLERANCE = 1e-12


def _llama_rms_norm(self, hidden_states):  # Llama, Qwen2, Mistral, ...: weight * normalised
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _gemma_rms_norm(self, hidden_states):  # Gemma: (1 + weight) * normalised
    return self._norm(hidden_states) * (1.0 + self.weight)


def in_float64(model):
    """``model`` in float64 throughout, returned.

    transformers' RMSNorms compute in float32 whatever the model's dtype (they are there to upcast
    half precision), which would round every float64 activation to float32 at each norm; here they
    run the same formula in the model's own dtype (a norm of another form is refused).
    """
    model.to(torch.float64)
    for module in model.modules():
        if not type(module).__name__.endswith("RMSNorm"):
            continue
        if hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_llama_rms_norm, module)
        elif hasattr(module, "_norm") and hasattr(module, "eps"):
            module.forward = types.MethodType(_gemma_rms_norm, module)
        else:
            raise TypeError(f"{type(module).__name__}: no float64 form of this norm here")
    return model


def assert_float64_equal(a: torch.Tensor, b: torch.Tensor, name: str = "") -> None:
    """float64 tensors equal to ``FLOAT64_TOLERANCE`` of their scale (see the module docstring)."""
    assert a.dtype == b.dtype == torch.float64, f"{name}: {a.dtype} and {b.dtype}, expected float64"
    scale = max(float(b.abs().max()), float(a.abs().max()))
    difference = float((a - b).abs().max())
    assert difference <= FLOAT64_TOLERANCE * scale, f"{name}: max |difference| {difference:.3g} at scale {scale:.3g}"
