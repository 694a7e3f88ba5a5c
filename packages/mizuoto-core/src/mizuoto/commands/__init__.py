"""The commands of ``mizuoto``, one module each: a module's ``COMMANDS`` (a tuple of click
commands) are added to the group in :mod:`mizuoto.cli`, so that adding a command is adding one
module here. :mod:`mizuoto.commands.toolkit` holds what they share (public: a plugin's
``register_commands`` may use it too)."""
