"""MBPP evaluation: pass@k and the ``rlcode-eval`` command. Light: no torch at import."""

from rlcode.eval.passk import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
