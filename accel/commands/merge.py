"""`accel merge-weights`: merge a sharded FSDP checkpoint (DCP folder) into ``model.safetensors``.

One implementation, :func:`accel.utils.fsdp_utils.merge_fsdp_weights`; this is its command line, with
Accelerate's options. It runs in this process on the CPU and needs memory for the whole model.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_arguments", "merge_command", "merge_command_parser", "run"]

_DESCRIPTION = ("Merge the shards of an FSDP checkpoint saved with SHARDED_STATE_DICT (a torch.distributed.checkpoint "
                "folder) into one file, OUTPUT_PATH/model.safetensors. CPU only; needs RAM for the whole state dict.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel merge-weights`' options (Accelerate's)."""
    parser.description = _DESCRIPTION
    parser.add_argument("checkpoint_directory", type=str, help="folder with the sharded weights (e.g. .../pytorch_model_fsdp_0)")
    parser.add_argument("output_path", type=str, help="folder to write the merged weights into")
    parser.add_argument("--unsafe_serialization", action="store_true", default=False,
                        help="write pytorch_model.bin (pickle) instead of model.safetensors (not recommended)")
    parser.add_argument("--remove_checkpoint_dir", action="store_true", default=False,
                        help="delete the sharded folder after a successful merge")


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `merge-weights` parser (added to ``subparsers`` when given)."""
    parser = subparsers.add_parser("merge-weights", description=_DESCRIPTION) if subparsers is not None \
        else argparse.ArgumentParser("accel merge-weights", description=_DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=merge_command)
    return parser


def merge_command(args: argparse.Namespace) -> Any:
    """Accelerate's command function: merge; returns the file written."""
    from accel.utils.fsdp_utils import merge_fsdp_weights

    return merge_fsdp_weights(args.checkpoint_directory, args.output_path, not args.unsafe_serialization,
                              args.remove_checkpoint_dir)


def run(args: argparse.Namespace) -> int:
    """`accel merge-weights` through the `accel` entry point."""
    from accel.commands import UsageError

    try:
        written = merge_command(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"accel merge-weights: wrote {written}")
    return 0
