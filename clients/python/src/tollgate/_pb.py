"""The generated stubs, imported in one place with a clear error when they are missing."""

try:
    from .v1 import authority_pb2, authority_pb2_grpc, receipt_pb2, supervisor_pb2, supervisor_pb2_grpc
except ImportError as e:  # pragma: no cover - only in a source tree that was never built
    raise ImportError(
        "tollgate: the generated gRPC stubs (tollgate/v1/*_pb2.py) are missing; they are made "
        "when the package is built: `pip install ./clients/python` from the repository root "
        f"({e})"
    ) from e

__all__ = [
    "authority_pb2",
    "authority_pb2_grpc",
    "receipt_pb2",
    "supervisor_pb2",
    "supervisor_pb2_grpc",
]
