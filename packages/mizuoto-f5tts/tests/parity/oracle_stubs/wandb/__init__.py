"""Stand-in for `wandb` so upstream f5-tts imports offline (its trainer imports it at load).

Only what upstream touches at import or with ``logger=None`` exists; anything else fails loudly.
"""


class _Api:
    api_key = None


api = _Api()


def init(*args, **kwargs):
    raise RuntimeError("wandb stand-in: logging to wandb is not available in the parity env")


def log(*args, **kwargs):
    raise RuntimeError("wandb stand-in: logging to wandb is not available in the parity env")
