"""Build hooks: the protobuf modules from the .proto files in sdk/_proto, and the compiled hot
loops (statefun/_hotloops.c).

The generated ``*_pb2.py`` files are build products, never committed. They are written
next to their .proto files so that both a wheel and an editable install see them.

The hot loops are optional: without a C compiler (or Python's headers) the build says so and
goes on, and the runtime runs the same loops as Python (statefun/_compiled.py).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PROTO_DIR = Path(__file__).parent / "sdk" / "_proto"


def generate_protos() -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system)

    for proto in sorted(PROTO_DIR.glob("*.proto")):
        target = proto.with_name(proto.stem + "_pb2.py")
        if target.exists() and target.stat().st_mtime >= proto.stat().st_mtime:
            continue
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={PROTO_DIR}",
            f"--pyi_out={PROTO_DIR}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        generate_protos()
        super().run()


HOT_LOOPS = Extension(
    "statefun._hotloops",
    sources=["statefun/_hotloops.c"],
    optional=True,  # a failed compile is a warning; the Python loops stand in
    extra_compile_args=["-O2"],
)

setup(cmdclass={"build_py": BuildPyWithProtos}, ext_modules=[HOT_LOOPS])
