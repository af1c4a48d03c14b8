"""Every package folder is listed in pyproject, so a non-editable install ships it."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for top, name in (("rljax", "rljax"), ("kernels", "rljax.kernels")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]))
    assert found == listed, f"missing: {sorted(found - listed)}; stale: {sorted(listed - found)}"
    assert not (ROOT / "kernels.py").exists()
