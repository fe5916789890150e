"""disk: the on-disk format, below everything that reads or writes a file.

layout (every file name, temp and swap folders, the output lock, atomic writes), schema (dbert.json's
fields and checks), trust (what counts as code or a pickle), jsonfile (JSON read with limits).

May import: the floor (errors, config, strategies, display, hardware) only.
"""
