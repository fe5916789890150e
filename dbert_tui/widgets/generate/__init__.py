"""The Generate screen's parts (screens/generate.py composes them).

Each widget owns its own state; it tells the screen what happened with a message posted
upward, and the screen calls its methods downward.
"""
