"""Builds the package's native part with the project's CMake and installs it into the package.

The extension (libot_torch.so) and the libraries it links are CMake targets (python/CMakeLists.txt);
this script configures and builds them, then installs CMake's `python` component into the wheel's
package folder. OT_BUILD_DIR=<configured build folder> reuses an existing build (./test.sh passes
build/release); otherwise a Release build is made under setuptools' build_temp. The version is the
one in the top-level CMakeLists.txt."""
import os
import re
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERSION = re.search(r"project\(ops_transformer VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = Path(os.environ.get("OT_BUILD_DIR") or Path(self.get_finalized_command("build").build_temp) / "cmake")
        if not (build_dir / "CMakeCache.txt").is_file():
            generator = ["-G", "Ninja"] if subprocess.run(["ninja", "--version"], capture_output=True).returncode == 0 else []
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DOT_BUILD_PYTHON=ON", "-DOT_BUILD_TESTS=OFF", "-DOT_BUILD_TOOLS=OFF"])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "ot_torch", "-j", str(os.cpu_count() or 1)])
        subprocess.check_call(["cmake", "--install", str(build_dir), "--component", "python", "--prefix", str(Path(self.build_lib).resolve())])


class BinaryDistribution(Distribution):
    """The wheel holds compiled libraries: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(version=VERSION, cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
