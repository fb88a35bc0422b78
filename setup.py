"""Build the native extension ``hetgmp._native`` with CMake (pybind11 + OpenMP).

The extension is required: if CMake or the compiler fails, installation fails loudly
rather than producing a package that silently lacks its hot loops.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import pybind11

        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("HETGMP_BUILD_TYPE", "Release")
        cmake_args = [
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DHETGMP_OUTPUT_DIR={out.parent}",
            f"-DHETGMP_OUTPUT_NAME={out.name}",
        ]
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", str(ROOT), *cmake_args], cwd=build_dir, check=True)
        subprocess.run(
            ["cmake", "--build", ".", "--config", cfg, "-j", jobs], cwd=build_dir, check=True
        )


setup(ext_modules=[CMakeExtension("hetgmp._native")], cmdclass={"build_ext": CMakeBuild})
