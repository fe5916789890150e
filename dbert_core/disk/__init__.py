"""disk: the on-disk format, below everything that reads or writes a file.

layout (every file name, and the quick checks of a checkpoint folder), temp_folders (the temp and
swap folders dbert writes in, and recovery after a crash), lock (the output lock), atomic (a text
file written whole or not at all), output (an output path checked, a run's folders made before any
work), modes (the umask's file modes), tree (a folder tree walked without links, within limits),
schema (dbert.json's fields and checks), trust (what counts as code or a pickle), jsonfile (JSON
read with limits).

May import: the floor (errors, config, strategies, display, hardware) only.
"""
