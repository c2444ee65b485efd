"""Package discovery for the top-level layout.

`tasks/`, `simulators/` and `configs/` live at the repository root (the design card's layout) but
install as `mmrl.tasks`, `mmrl.simulators` and `mmrl.configs`, so `mmrl train task=...` finds them
from any working directory. Everything else is declared in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = {"mmrl.tasks": "tasks", "mmrl.simulators": "simulators", "mmrl.configs": "configs"}


def _packages() -> list[str]:
    packages = find_packages(include=["mmrl", "mmrl.*"])
    for name, folder in MAPPED.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(folder)]
    return packages


setup(packages=_packages(), package_dir={"mmrl": "mmrl", **MAPPED})
