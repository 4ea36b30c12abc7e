"""The tiny Llama-shaped model profiled on this CPU: the same fixtures as tests/optime (one definition)."""

from ..optime.conftest import CLUSTER, DATA, MODEL, one_thread, profiled, tiny_layout  # noqa: F401
