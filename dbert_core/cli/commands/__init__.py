"""The `dbert` commands, one module each: train, sample, eval, checkpoints (the group list, fetch,
import, remove), tui, bench, serve. Each holds its command's function with its options and help;
dbert_core/cli/__init__.py registers them on the app."""
