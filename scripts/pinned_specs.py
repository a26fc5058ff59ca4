"""Print each package name given, with the version specifier that PROJECT's installed metadata asks
for it where it names one (else the bare name): what the scratch-environment scripts install, at
the project's own pins, without installing the project's whole dependency list.

    python scripts/pinned_specs.py vllm numpy msgspec ...
"""

import importlib.metadata as m
import re
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # not installed yet in a fresh venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(project: str, names: list[str]) -> None:
    wanted = {norm(n): n for n in names}
    pinned = {}
    for line in m.requires(project) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # another platform, or an optional extra
        if norm(req.name) in wanted:
            pinned[norm(req.name)] = f"{req.name}{req.specifier}"
    for key, name in wanted.items():
        print(pinned.get(key, name))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
