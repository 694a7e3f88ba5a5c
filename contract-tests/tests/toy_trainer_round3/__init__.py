"""FROZEN: registers the round-3 toy trainer (``training.py``) for the round-2 toy engine."""

import mizuoto


@mizuoto.hookimpl
def register_trainers(register):
    from toy_trainer_round3.training import ToyTrainer

    register(ToyTrainer)
