"""Where the wheel's files come from; everything else about the package is in pyproject.toml.

`configs/` and `recipes/` sit beside `ptrun/` in the clone (as in torchtune); the wheel ships them inside the
package, as `ptrun/configs` and `ptrun/recipes`, where `ptrun.compose` looks first. pyproject.toml alone
cannot say this: its package discovery and a directory mapping for two more packages do not combine.
The wheel holds `ptrun` alone: `benchmarks/`, `tests/` and `scripts/` stay in the clone (tests/test_wheel.py).
"""

from setuptools import find_namespace_packages, setup

SHIPPED = {"ptrun.configs": "configs", "ptrun.recipes": "recipes"}

setup(
    packages=find_namespace_packages(include=["ptrun", "ptrun.*"]) + list(SHIPPED),
    package_dir=SHIPPED,
    package_data={"ptrun.configs": ["*.yaml", "*/*.yaml"], "ptrun.recipes": ["*.yaml"]},
)
