"""What ``make setup`` prints at the end: the versions that matter and the sandbox's isolation level.

Three lines instead of pip's install log: enough to see the right torch build (CPU or CUDA) went in
and how strongly model code will be contained on this machine.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import torch

from rlcode.sandbox.isolation import IsolationUnavailable, detect_isolation


def main() -> None:
    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} (not installed)"

    device = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available() else "CPU build" \
        if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, no GPU visible"
    print(f"installed: rlcode {version('rlcode')}, torch {torch.__version__} ({device}), "
          + ", ".join(installed(n) for n in ("lightning", "transformers", "peft", "bitsandbytes", "vllm", "wandb")))
    try:
        report = detect_isolation()
        weaker = " (weaker than bwrap: see `rlcode-eval --doctor`)" if report.weaker_than_bwrap else ""
        print(f"sandbox isolation: {report.level}{weaker}")
    except IsolationUnavailable as error:
        print(f"sandbox isolation: unavailable ({error})")


if __name__ == "__main__":
    main()
