"""Ships the repository's site files and example workflows inside the package.

``site-configs/`` and ``workflows/`` stay at the top of the repository, where the tests and the docs
use them; a wheel has no top, so its build copies them to ``resilient_flows/_data/`` (where
``resilient_flows.shipped`` looks first). They are source files of the build too, so that an sdist
carries them and a wheel built from it has them. An editable install builds nothing here: the
package reads them in the checkout. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("site-configs", "workflows")


class BuildWithShipped(build_py):
    """``build_py``, plus the shipped directories copied into the package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for target, source in self._shipped().items():
            self.mkpath(str(Path(target).parent))
            self.copy_file(source, target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *self._shipped()]

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), **self._shipped()}

    def get_source_files(self) -> list[str]:
        return [*super().get_source_files(), *self._shipped().values()]

    def _shipped(self) -> dict[str, str]:
        """Where each shipped file goes in the build, from where it is in the repository."""
        target = Path(self.build_lib, "resilient_flows", "_data")
        return {
            str(target / path): str(path)
            for directory in SHIPPED
            for path in sorted(Path(directory).iterdir())
            if path.is_file() and not path.name.startswith(".")
        }


setup(cmdclass={"build_py": BuildWithShipped})
