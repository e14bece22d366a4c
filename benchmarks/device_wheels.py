"""The wheels a lent GPU machine needs for ``gpu_check.py``, downloaded here, sized against the lease.

The lent machine (one H100 or H200, no network) has torch, transformers, lightning, peft and the rest of
``device_image.txt``, and receives at most 64 MiB per call: the working tree plus whatever it carries.
This script downloads, at the versions in ``requirements-lock.txt``, exactly the packages the GPU check
imports that the image lacks (``CARRIED``), for the device's Python and platform, into an ignored
folder; prints each wheel and the total; and fails when the total with the working tree is over the
lease's limit. A package without a wheel is built into one here when the build is pure Python.

    python benchmarks/device_wheels.py                       # .device-wheels/, for the device (cp312)
    python benchmarks/device_wheels.py --python-version 3.11 --dest DIR   # the device-stack test's set

``CARRIED`` is the list the device-stack test (tests/test_gpu_check_device_stack.py) proves sufficient:
it installs the image's versions, these wheels and nothing else, and runs the check's dry run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-lock.txt"
IMAGE = Path(__file__).with_name("device_image.txt")
LEASE_BYTES = 64 * 2**20  # the most one call carries, the working tree included
# What the check imports beyond the image, with what those import in turn (the image has the rest):
# TRL for the peer figure (datasets, which imports dill and multiprocess), bitsandbytes for 4-bit QLoRA,
# TextArena for the SPIRAL step (it imports nltk and websockets), jsonargparse for the platform line's
# profile. Left out because nothing the check runs imports them: nltk's defusedxml, jsonargparse's
# docstring-parser and typeshed-client (its signatures extra), TextArena's openai and chess.
CARRIED = ["trl", "datasets", "dill", "multiprocess", "bitsandbytes", "textarena", "nltk", "websockets",
           "jsonargparse"]
# The device-stack venv runs on this machine's Python 3.11, beside its torch 2.13 CPU wheel: the image's
# numpy 2.5 needs Python 3.12, so the lock's numpy stands in for it there.
STACK_VERSIONS = {"numpy": None}
# The device: Python 3.12 on x86-64 Linux (glibc 2.17+ wheels, newest tag first).
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path = LOCK) -> dict[str, str]:
    """``name -> version`` of every package pinned in the lock (markers ignored: one version each)."""
    versions = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            versions[normalize(match.group(1))] = match.group(2)
    return versions


def lock_requirements(lock: Path = LOCK) -> dict[str, set[str]]:
    """``package -> the packages it requires``, read from the lock's ``# via`` comments (Linux only)."""
    from packaging.markers import Marker

    requires: dict[str, set[str]] = {}
    current = None
    for line in lock.read_text().splitlines():
        pinned = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==[^\s;]+(?:\s*;\s*(.*))?$", line)
        if pinned:
            marker = pinned.group(2)
            linux = marker is None or Marker(marker).evaluate({"sys_platform": "linux", "platform_system": "Linux"})
            current = normalize(pinned.group(1)) if linux else None
            continue
        via = re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if via and current and via.group(1) != "via":
            requires.setdefault(normalize(via.group(1)), set()).add(current)
    return requires


def device_stack_requirements(torch_version: str, lock: Path = LOCK, image: Path = IMAGE) -> list[str]:
    """What the device-stack venv installs: torch, and every package on the image that rlcode or a carried
    package needs, at the image's version where one was read there, else the lock's (``STACK_VERSIONS``
    where that version cannot install beside the torch this machine has)."""
    requires, versions, present = lock_requirements(lock), locked_versions(lock), image_packages(image)
    needed, todo = set(), ["rlcode", *map(normalize, CARRIED)]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(requires.get(name, ()))
    pins = [f"torch=={torch_version}"]
    for name in sorted(needed & set(present)):
        version = (STACK_VERSIONS[name] if name in STACK_VERSIONS else present[name]) or versions.get(name)
        pins.append(f"{name}=={version}" if version else name)
    return pins


def image_packages(image: Path = IMAGE) -> dict[str, str | None]:
    """``name -> version`` (None where no one read it) of what the device image holds."""
    packages = {}
    for line in image.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[normalize(name)] = version or None
    return packages


def carried_pins(lock: Path = LOCK, image: Path = IMAGE) -> dict[str, str]:
    """``name -> version`` to carry; an error when one is missing from the lock or already on the image."""
    versions, present = locked_versions(lock), image_packages(image)
    unpinned = [name for name in CARRIED if normalize(name) not in versions]
    if unpinned:
        raise SystemExit(f"not in {lock.name}: {', '.join(unpinned)}; add them to pyproject.toml and run `make lock`")
    on_image = [name for name in CARRIED if normalize(name) in present]
    if on_image:
        raise SystemExit(f"already on the device image ({image.name}), carrying them would shadow it: {', '.join(on_image)}")
    return {normalize(name): versions[normalize(name)] for name in CARRIED}


def download(pins: dict[str, str], dest: Path, python_version: str) -> list[Path]:
    """One wheel per pin into ``dest`` (emptied first: two versions of a package stop the install there)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    tags = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
    for name, version in pins.items():
        fetched = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                       "--implementation", "cp", *tags, "-d", str(dest), f"{name}=={version}")
        if fetched.returncode != 0:
            _build_pure_wheel(name, version, dest)
    wheels = sorted(dest.glob("*.whl"))
    names = {normalize(wheel.name.split("-")[0]) for wheel in wheels}
    if names != set(pins) or len(wheels) != len(pins):
        raise SystemExit(f"expected one wheel for each of {sorted(pins)}, got {[wheel.name for wheel in wheels]}")
    return wheels


def _build_pure_wheel(name: str, version: str, dest: Path) -> None:
    """No wheel on the index: build one from the sdist, which must come out pure Python (py3-none-any)."""
    with tempfile.TemporaryDirectory() as scratch:
        built = _pip("wheel", "--no-deps", "-w", scratch, f"{name}=={version}")
        wheels = list(Path(scratch).glob("*.whl"))
        if built.returncode != 0 or len(wheels) != 1 or not wheels[0].name.endswith("-none-any.whl"):
            raise SystemExit(f"no wheel of {name}=={version} for the device, and no pure-Python build of it:\n"
                             f"{built.stdout[-1500:]}{built.stderr[-1500:]}")
        shutil.move(str(wheels[0]), dest / wheels[0].name)


def _pip(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *arguments, "-q", "--disable-pip-version-check"],
                          capture_output=True, text=True)


def working_tree_bytes(root: Path = ROOT) -> int:
    """What travels besides the carried folder: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    paths = (root / name.decode() for name in listed if name)
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=ROOT / ".device-wheels", help="emptied, then filled")
    parser.add_argument("--python-version", default="3.12", help="the device's Python (default 3.12)")
    parser.add_argument("--stack-requirements", metavar="TORCH_VERSION",
                        help="print the device-stack venv's requirements (with this torch) and download nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stack_requirements:
        print(" ".join(device_stack_requirements(args.stack_requirements)))
        return 0
    pins = carried_pins()
    print(f"downloading {len(pins)} wheels for Python {args.python_version} into {args.dest} ...", flush=True)
    wheels = download(pins, args.dest, args.python_version)
    manifest = {"python_version": args.python_version, "wheels": {}}
    for wheel in wheels:
        size = wheel.stat().st_size
        manifest["wheels"][wheel.name] = {"bytes": size, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
        print(f"  {size / 2**20:6.2f} MiB  {wheel.name}")
    carried = sum(entry["bytes"] for entry in manifest["wheels"].values())
    tree = working_tree_bytes()
    manifest.update(wheel_bytes=carried, working_tree_bytes=tree)
    (args.dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wheels {carried / 2**20:.2f} MiB + working tree {tree / 2**20:.2f} MiB = "
          f"{(carried + tree) / 2**20:.2f} MiB of the lease's {LEASE_BYTES / 2**20:.0f} MiB per call")
    if carried + tree > LEASE_BYTES:
        print("over the limit: carry less (or move large untracked files out of the working tree)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
