"""Generated gRPC stubs of the ``tollgate.v1`` proto package.

The ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` modules next to this file are generated
from the repository's ``proto/tollgate/v1/*.proto`` when the package is built (see
``setup.py``); they are not kept in the source tree. Prefer the typed wrapper in
:mod:`tollgate` to these raw stubs.
"""
