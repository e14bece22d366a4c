"""A local code sandbox for running untrusted model-written Python thousands of times per RL step.

    from rlcode.sandbox import SandboxPool, Program, wait
    with SandboxPool() as pool:
        result = pool.submit(Program("def f(x): return x + 1", probes=("f(1)",))).result()
        result.status, result.probe_lines   # Status.OK, ['{"i":0,"v":2}']
"""

from .isolation import IsolationReport, IsolationUnavailable, detect_isolation
from .pool import SandboxPool, wait
from .result import ExecResult, ExecutionInfo, Program, Status

__all__ = ["ExecResult", "ExecutionInfo", "IsolationReport", "IsolationUnavailable", "Program",
           "SandboxPool", "Status", "detect_isolation", "wait"]
