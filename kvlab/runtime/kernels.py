"""How KV Lab runs a notebook headless (``make course``, ``kvlab labs run``, grids, tests): papermill with a Jupyter
kernel reached over ipc:// sockets and read with jupyter_client's *blocking* client.

- ipc://: nothing listens on the network, and ipykernel has no unencrypted TCP to warn about.
- The blocking client: papermill's default (``AsyncKernelManager``) reads the kernel's replies with an asyncio client
  that waits for a cell's reply with no timeout. A missed wake-up on its edge-triggered ZeroMQ socket then waits
  forever: CI hung twice in lesson 01 on the second model (15 min, then its limit), and we caught one locally: py-spy
  showed the kernel idle and papermill still waiting for the reply to a cell that had finished. A
  blocking client polls its sockets with ``zmq_poll``, which reads the socket's real state — the client nbval and
  the course build use, neither of which ever hung.

Papermill's own command line gets the same with ``--engine kvlab`` (``Engine``, registered in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from traitlets import default


class IPCKernelManager(KernelManager):
    """A kernel reached through Unix sockets beside its connection file (Jupyter's runtime folder); its client is
    jupyter_client's blocking one (``KernelManager.client_class``)."""

    @default("transport")
    def _default_transport(self) -> str:
        return "ipc"


#: What papermill's ``kernel_manager_class`` takes.
MANAGER = f"{__name__}.IPCKernelManager"


def execute(notebook: str | Path, output: str | Path, parameters: dict[str, Any] | None = None,
            cwd: str | Path | None = None, **options: Any) -> Any:  # noqa: ANN401 - papermill's NotebookNode
    """Run ``notebook`` top to bottom into ``output`` (written even when a cell fails, which raises papermill's
    ``PapermillExecutionError``), in ``cwd`` (the notebook's folder by default), with papermill's other ``options``."""
    import papermill as pm

    notebook = Path(notebook)
    return pm.execute_notebook(str(notebook), str(output), parameters=parameters or {}, cwd=str(cwd or notebook.parent),
                               kernel_name=options.pop("kernel_name", "python3"), progress_bar=False,
                               kernel_manager_class=MANAGER, **options)


class Engine:
    """Papermill's nbclient engine with KV Lab's kernel (``papermill --engine kvlab …``): ipc:// and a blocking client.
    It hands every call to papermill's own engine; not a subclass, because papermill loads its engines while
    ``papermill.engines`` is still being imported."""

    @staticmethod
    def _nbclient() -> Any:  # noqa: ANN401 - papermill's engine class
        from papermill.engines import NBClientEngine

        return NBClientEngine

    @classmethod
    def execute_notebook(cls, nb: Any, kernel_name: str, **kwargs: Any) -> Any:  # noqa: ANN401 - papermill's NotebookNode
        return cls._nbclient().execute_notebook(nb, kernel_name, **({"kernel_manager_class": MANAGER} | kwargs))

    @classmethod
    def nb_kernel_name(cls, nb: Any, name: str | None = None) -> str:  # noqa: ANN401
        return cls._nbclient().nb_kernel_name(nb, name)

    @classmethod
    def nb_language(cls, nb: Any, language: str | None = None) -> str:  # noqa: ANN401
        return cls._nbclient().nb_language(nb, language)
