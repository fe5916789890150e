"""serving: dbert serve.

serve (the HTTP app: its routes, the API key, the head check), request (a completions body read
by its deadline and size, decoded, checked field by field into a Plan), response (a choice's
text, the JSON answer, the server-sent events), api_error (the API's error shape), options
(Limits, MAX_HEAD, the start-up checks of the flags), connections (uvicorn's h11 protocol with
dbert's limits: the head deadline, the connection cap, malformed requests), logs (LogGuard:
escaped, rate-limited logs), server (uvicorn's server: signals, the graceful drain, run),
serve_queue (the request queue: one worker thread owns the model, jobs wait in a bounded queue,
agreeing jobs share a sampler call).

May import: the floor, disk, text, maths, sampling, storage.
"""
