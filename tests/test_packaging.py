"""Every package folder is listed in pyproject, so a non-editable install ships it
(configs/ too, as rljax.configs)."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    tops = (("rljax", "rljax"), ("kernels", "rljax.kernels"), ("configs", "rljax.configs"))
    for top, name in tops:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]))
    assert found == listed, f"missing: {sorted(found - listed)}; stale: {sorted(listed - found)}"
    assert not (ROOT / "kernels.py").exists()


def test_package_dir_maps_every_top_level_folder_shipped_under_rljax():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {
        "rljax": "rljax",
        "rljax.kernels": "kernels",
        "rljax.configs": "configs",
    }
    # The recipes are reachable from an install, not only from a checkout.
    from rljax.configs import arith_tiny

    assert pathlib.Path(arith_tiny.__file__).parent == ROOT / "configs"
