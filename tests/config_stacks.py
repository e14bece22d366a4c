"""Every config in configs/ with the configs it is applied on top of, as `rlcode fit --config A --config B`.

An overlay names only what it changes, so it is checked on its stack: the listed bases, and
``quickstart.yaml`` for a hardware profile under configs/hw/. Every other config stands alone.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
OVERLAYS = {"tiny_test.yaml": ["quickstart.yaml"],  # overlay -> the configs it is applied on top of
            "tiny_grpo.yaml": ["quickstart.yaml", "tiny_test.yaml"],
            "learn_mbpp_cpu_lora.yaml": ["learn_mbpp_cpu.yaml"],
            "learn_mbpp_cpu_tests.yaml": ["learn_mbpp_cpu.yaml"],
            "learn_mbpp_cpu_binary.yaml": ["learn_mbpp_cpu.yaml", "learn_mbpp_cpu_tests.yaml"],
            "learn_mbpp_cpu_ds.yaml": ["learn_mbpp_cpu.yaml", "learn_mbpp_cpu_tests.yaml"],
            "learn_mbpp_cpu_wide.yaml": ["learn_mbpp_cpu.yaml", "learn_mbpp_cpu_tests.yaml"],
            "learn_mbpp_cpu_wide_g4.yaml": ["learn_mbpp_cpu.yaml", "learn_mbpp_cpu_tests.yaml",
                                            "learn_mbpp_cpu_wide.yaml"],
            "learn_mbpp_cpu_wide_long.yaml": ["learn_mbpp_cpu.yaml", "learn_mbpp_cpu_tests.yaml",
                                              "learn_mbpp_cpu_wide.yaml"]}
HW_OVERLAY_DIR = REPO / "configs" / "hw"


def config_stack(config: Path) -> list[Path]:
    """The files to pass for ``config``, bases first."""
    if config.parent == HW_OVERLAY_DIR:
        return [REPO / "configs" / "quickstart.yaml", config]
    return [*(REPO / "configs" / name for name in OVERLAYS.get(config.name, [])), config]


def config_id(config: Path) -> str:
    return str(config.relative_to(REPO / "configs"))
