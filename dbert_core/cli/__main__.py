"""`python -m dbert_core.cli`: the `dbert` command (torchrun -m dbert_core.cli train ... too)."""

from . import main

main()
