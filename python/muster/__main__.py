"""python -m muster --cmake-dir | --include-dir | --library-dir | --pkgconfig-dir | --version"""
import argparse
import sys

import muster


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m muster",
                                     description="Where the muster wheel keeps libmuster for C++ builds.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmake-dir", action="store_true", help="the folder of musterConfig.cmake (muster_DIR)")
    group.add_argument("--include-dir", action="store_true", help="the folder holding muster/muster.hpp")
    group.add_argument("--library-dir", action="store_true", help="the folder holding libmuster.so")
    group.add_argument("--pkgconfig-dir", action="store_true", help="the folder of muster.pc (PKG_CONFIG_PATH)")
    group.add_argument("--version", action="store_true", help="the installed muster's version")
    args = parser.parse_args(argv)
    try:
        if args.version:
            print(muster.__version__)
        elif args.cmake_dir:
            print(muster.get_cmake_dir())
        elif args.include_dir:
            print(muster.get_include())
        elif args.library_dir:
            print(muster.get_library_dir())
        else:
            print(muster.get_pkgconfig_dir())
    except FileNotFoundError as e:
        print(f"python -m muster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
