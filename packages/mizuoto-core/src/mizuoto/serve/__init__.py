"""``mizuoto serve``: an OpenAI-compatible speech server (``pip install "mizuoto-core[serve]"``).

- :mod:`mizuoto.serve.app`: :class:`ServeConfig`, :func:`create_app`, :func:`run`,
  :func:`serve_in_thread`;
- :mod:`mizuoto.serve.routes`: the HTTP API;
- :mod:`mizuoto.serve.worker`: one thread per model, fed by a bounded queue, running the
  :mod:`mizuoto.serve.jobs` requests hand it;
- :mod:`mizuoto.serve.pool`: which models stay loaded, and when a request may pin one;
- :mod:`mizuoto.audio_encoding` (core): every format of :mod:`mizuoto.audio_formats`, whole or
  streamed;
- :mod:`mizuoto.serve.voices`: named voices on disk;
- :mod:`mizuoto.serve.errors` and :mod:`mizuoto.serve.metrics`.

See docs/serve.md.
"""

from mizuoto.serve.app import ServeConfig, create_app, model_names, run, serve_in_thread

__all__ = ["ServeConfig", "create_app", "model_names", "run", "serve_in_thread"]
