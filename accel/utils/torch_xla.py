"""Installing torch_xla on Google Colab (``accelerate.utils.torch_xla``)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

__all__ = ["install_xla"]


def install_xla(upgrade: bool = False) -> None:
    """Install the torch_xla wheel matching the installed torch on a Google Colab TPU runtime (``upgrade``: torch first).

    Anywhere else this is an error: the Colab wheel index is the only one this helper knows.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if "google.colab" not in str(shell):
        raise RuntimeError("install_xla only works inside a Google Colab notebook; elsewhere install torch_xla "
                           "with pip (pip install torch_xla) for the installed torch version")
    if upgrade:
        subprocess.run([sys.executable, "-m", "pip", "install", "-U", "torch"], check=True)
    torch_release = version("torch").rsplit(".", 1)[0]
    wheel = (f"https://storage.googleapis.com/tpu-pytorch/wheels/colab/torch_xla-{torch_release}-cp37-cp37m-linux_x86_64.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", wheel], check=True)
