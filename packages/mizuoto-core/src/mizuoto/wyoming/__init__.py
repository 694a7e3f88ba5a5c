"""``mizuoto wyoming``: Home Assistant's Wyoming protocol (``pip install
"mizuoto-core[wyoming]"``), serving the models, voices and limits of ``mizuoto serve``.

- :mod:`mizuoto.wyoming.info`: what ``describe`` answers (models, voices, languages);
- :mod:`mizuoto.wyoming.frames`: events read off a connection, checked against the
  protocol's shapes and bounded in size and time;
- :mod:`mizuoto.wyoming.sentences`: streamed text cut into sentences as they complete;
- :mod:`mizuoto.wyoming.handler`: one connection's events;
- :mod:`mizuoto.wyoming.server`: :class:`WyomingConfig`, :func:`run`, :func:`serve_in_thread`.

See docs/home-assistant.md.
"""
