"""The Jupyter kernels KV Lab starts to run lessons and labs (``make course``, ``kvlab labs run``) talk over ipc://
sockets instead of TCP ports: nothing listens on the network, and ipykernel has no unencrypted TCP to warn about."""

from __future__ import annotations

from jupyter_client.manager import KernelManager
from traitlets import default


class IPCKernelManager(KernelManager):
    """A kernel reached through Unix sockets beside its connection file (Jupyter's runtime folder)."""

    @default("transport")
    def _default_transport(self) -> str:
        return "ipc"


#: What papermill's ``kernel_manager_class`` takes.
MANAGER = f"{__name__}.IPCKernelManager"
