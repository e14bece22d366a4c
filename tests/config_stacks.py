"""Every shipped config (configs/ and the studies' benchmarks/configs/) with the configs it is applied on
top of, as `rlcode fit --config A --config B`.

An overlay names only what it changes, so it is checked on its stack: the configs its first line says it
goes after (``rlcode.cli.overlays``), bases first. Every other config stands alone.
"""

from pathlib import Path

from rlcode.cli.overlays import overlay_bases

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*(REPO / "configs").rglob("*.yaml"), *(REPO / "benchmarks" / "configs").rglob("*.yaml")])


def config_stack(config: Path) -> list[Path]:
    """The files to pass for ``config``, bases first."""
    return [*(REPO / name for name in overlay_bases(config)), config]


def config_id(config: Path) -> str:
    return str(config.relative_to(REPO))
