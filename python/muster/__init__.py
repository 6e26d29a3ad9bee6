"""muster, installed from its wheel: the launcher binaries are on PATH
(`muster`, `musterd`, `musterctl`); this package tells C++ builds where
libmuster, its headers and its CMake and pkg-config files are.

    cmake -Dmuster_DIR="$(python -m muster --cmake-dir)" ...   # find_package(muster)
    PKG_CONFIG_PATH="$(python -m muster --pkgconfig-dir)" pkg-config --cflags --libs muster
"""
from importlib import metadata as _metadata
from pathlib import Path as _Path

__all__ = ["get_cmake_dir", "get_include", "get_library_dir", "get_pkgconfig_dir", "__version__"]

_HERE = _Path(__file__).resolve().parent

try:
    __version__ = _metadata.version("muster-launcher")
except _metadata.PackageNotFoundError:  # imported from the source tree
    __version__ = "unknown"


def _existing(path: _Path) -> str:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this muster package was not installed from its wheel")
    return str(path)


def get_cmake_dir() -> str:
    """The folder holding musterConfig.cmake (for -Dmuster_DIR= or CMAKE_PREFIX_PATH)."""
    return _existing(_HERE / "lib" / "cmake" / "muster")


def get_include() -> str:
    """The folder holding muster/muster.hpp."""
    return _existing(_HERE / "include")


def get_library_dir() -> str:
    """The folder holding libmuster.so."""
    return _existing(_HERE / "lib")


def get_pkgconfig_dir() -> str:
    """The folder holding muster.pc (for PKG_CONFIG_PATH)."""
    return _existing(_HERE / "lib" / "pkgconfig")
