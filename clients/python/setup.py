"""Build step of tollgate-client: generate the gRPC stubs from the repository's proto/.

Everything declarative is in pyproject.toml. This file only adds a ``build_py`` that runs
``grpc_tools.protoc`` on ``tollgate/v1/*.proto`` and writes ``tollgate/v1/*_pb2.py``,
``*_pb2.pyi`` and ``*_pb2_grpc.py`` into the build directory (or, for an editable install,
into ``src/``), and an ``sdist`` that carries the protos so a wheel can be built from it.

The proto root is, in order: ``$TOLLGATE_PROTO_ROOT``; ``proto/`` next to this file (inside an
sdist); ``../../proto`` relative to this file (the repository checkout, as in
``pip install ./clients/python`` from the repository root).
"""

import glob
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_GLOB = os.path.join("tollgate", "v1", "*.proto")


def proto_root():
    """The directory that holds tollgate/v1/*.proto."""
    candidates = []
    if os.environ.get("TOLLGATE_PROTO_ROOT"):
        candidates.append(os.environ["TOLLGATE_PROTO_ROOT"])
    candidates += [os.path.join(HERE, "proto"), os.path.join(HERE, "..", "..", "proto")]
    for candidate in candidates:
        if glob.glob(os.path.join(candidate, PROTO_GLOB)):
            return os.path.abspath(candidate)
    raise SystemExit(
        "tollgate-client: no tollgate/v1/*.proto under any of "
        + ", ".join(os.path.abspath(c) for c in candidates)
        + "; build from the repository (pip install ./clients/python) or set TOLLGATE_PROTO_ROOT"
    )


def well_known_protos():
    """grpc_tools' bundled google/protobuf/*.proto (timestamp.proto is imported)."""
    import grpc_tools

    path = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    if not os.path.isfile(os.path.join(path, "google", "protobuf", "timestamp.proto")):
        raise SystemExit(f"tollgate-client: grpc_tools has no google/protobuf/timestamp.proto under {path}")
    return path


def generate_stubs(out_dir):
    """Compile every tollgate/v1/*.proto into out_dir (as tollgate/v1/*_pb2*.py)."""
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise SystemExit(
            f"tollgate-client: building needs grpcio-tools ({e}); it is declared in "
            "pyproject.toml's [build-system] requires, so use pip's default build isolation or "
            "install grpcio-tools first when building with --no-build-isolation"
        )
    root = proto_root()
    protos = sorted(glob.glob(os.path.join(root, PROTO_GLOB)))
    os.makedirs(os.path.join(out_dir, "tollgate", "v1"), exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--proto_path={well_known_protos()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"tollgate-client: protoc failed (exit {code}) on {root}")
    generated = sorted(glob.glob(os.path.join(out_dir, "tollgate", "v1", "*_pb2*.py*")))
    print(f"tollgate-client: generated {len(generated)} stub files from {root}", file=sys.stderr)
    return generated


class BuildPyWithStubs(build_py):
    """build_py that also generates the gRPC stubs from the protos."""

    def run(self):
        if not getattr(self, "editable_mode", False):
            # In-tree builds reuse build/lib: drop what an earlier build left, so a removed
            # module or proto never lingers in the wheel.
            shutil.rmtree(os.path.join(self.build_lib, "tollgate"), ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            # Editable installs import from src/: generate there (ignored by .gitignore).
            generate_stubs(os.path.join(HERE, "src"))
        else:
            generate_stubs(self.build_lib)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            stubs = os.path.join(self.build_lib, "tollgate", "v1")
            outputs += sorted(glob.glob(os.path.join(stubs, "*_pb2*.py*")))
        return outputs


class SdistWithProtos(sdist):
    """sdist that carries the protos, so a wheel builds from it outside the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for proto in glob.glob(os.path.join(root, PROTO_GLOB)):
            target = os.path.join(base_dir, "proto", os.path.relpath(proto, root))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(proto, target)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})
