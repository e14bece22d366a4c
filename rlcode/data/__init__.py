"""MBPP data: loading, splits by task id (see rlcode.data.mbpp). Light: no torch at import."""

from rlcode.data.mbpp import ENV_VAR, HUB_ID, SPLITS, MBPPDataError, MBPPTask, load_mbpp

__all__ = ["ENV_VAR", "HUB_ID", "SPLITS", "MBPPDataError", "MBPPTask", "load_mbpp"]
