"""The `laya-grpc` entry points; the only layer that wires the services together."""
from .main import main

__all__ = ["main"]
