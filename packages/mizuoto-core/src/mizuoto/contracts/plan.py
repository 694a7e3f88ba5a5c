"""A request as an engine resolved it, before it runs: :meth:`Engine.plan`'s answer.

A front end plans a request as soon as it knows the model (a bad setting, a voice of another
model, a capability the model lacks are refused then, before the request waits for its turn),
and hands the plan to ``synthesize`` / ``stream`` / ``edit``, which run it without checking
again. The seed is resolved here, once: drawn when the request left it unset
(``seed_drawn``), so a front end knows it before the first byte and ``applied`` reports it
truthfully."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mizuoto.contracts.requests import EditRequest, SynthesisRequest


@attrs.frozen
class RequestPlan:
    """``request`` checked by the engine ``engine`` for the weights ``fingerprint``:
    ``params`` parsed from ``request.params`` (over the model's defaults, ``model_defaults``
    the ones it took), ``seed`` the one the request runs with, ``notices`` what validation
    changed in it."""

    request: SynthesisRequest | EditRequest
    params: Any
    seed: int
    seed_drawn: bool
    engine: str
    fingerprint: str
    notices: tuple[str, ...] = ()
    model_defaults: Mapping[str, Any] = attrs.field(factory=dict)
