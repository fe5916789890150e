"""serving: dbert serve.

serve (the HTTP app: routes, limits, streaming), serve_queue (the request queue: one worker thread owns the
model, jobs wait in a bounded queue, agreeing jobs share a sampler call).

May import: the floor, disk, text, maths, sampling, storage.
"""
