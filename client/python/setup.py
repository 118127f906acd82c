"""Builds the package, generating raftlock/v1/locks_pb2.py and
locks_pb2_grpc.py from the repository's proto/raftlock/v1/locks.proto first.

The generated modules are not checked in: they are made from the .proto
on every build, with the grpcio-tools pinned in pyproject.toml, so they
cannot drift from it. Building therefore needs the repository checkout
(``pip install ./client/python`` from its root, or
``pip install --no-build-isolation`` with grpcio-tools installed).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
PROTO = os.path.join("raftlock", "v1", "locks.proto")
OUT = os.path.join(HERE, "src")


def generate():
    """Runs protoc (from grpcio-tools) on locks.proto into src/raftlock/v1."""
    source = os.path.join(PROTO_ROOT, PROTO)
    generated = os.path.join(OUT, "raftlock", "v1", "locks_pb2.py")
    if not os.path.exists(source) and os.path.exists(generated):
        return  # an sdist: generated when it was made
    if not os.path.exists(source):
        sys.exit(
            f"raftlock: {source} not found: build this package from the raftlock "
            "repository (pip install ./client/python)"
        )
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        PROTO,
    ]
    if protoc.main(args) != 0:
        sys.exit(f"raftlock: protoc failed on {source}")


class BuildPy(build_py):
    def run(self):
        generate()
        super().run()


class Sdist(sdist):
    def run(self):
        generate()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
