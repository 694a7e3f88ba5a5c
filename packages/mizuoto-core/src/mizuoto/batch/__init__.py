"""Batch synthesis: many utterances from one input file, the model loaded once.

- :mod:`~mizuoto.batch.items`: ``read_lines`` (JSONL, CSV, TSV, plain text), ``build_order`` (a
  line's speech-service order) and ``build_request``;
- :mod:`~mizuoto.batch.run`: ``BatchJob``, ``run_batch`` (this process or ``workers``
  processes), ``speak_line`` (one line, the same in every backend), ``ModelLoader``;
- :mod:`~mizuoto.batch.ray`: ``ray_records`` and ``RaySettings``, the Ray Data backend
  (``mizuoto-core[ray]``).

See docs/batch.md.
"""

from mizuoto.batch.items import BatchLine, build_order, build_request, read_lines
from mizuoto.batch.run import BatchJob, BatchSummary, ModelLoader, run_batch, speak_line

__all__ = ["BatchJob", "BatchLine", "BatchSummary", "ModelLoader", "build_order", "build_request",
           "read_lines", "run_batch", "speak_line"]
