"""Analysis layer over harness results: trade-off tables, figures, claims, roofline model,
projections and capacity (analytic and measured). ``harness.report`` puts them together; the
notebook ``notebooks/tradeoffs.ipynb`` shows them interactively.

Modules (one job each):

* ``rows``     NA-safe values of results rows, backend family, measured layer steps, scenario
* ``tables``   per-backend and side-by-side tables (ratio, winner, bytes per tier, amplification)
* ``figures``  matplotlib figures (heatmaps, latency vs top-k, amplification, stages, hit rate)
* ``claims``   verdicts on the seed article's claims
* ``model``    uniform-random page bound, per-stage roofline, hardware projections
* ``capacity`` requests per HBM budget and decode throughput, projected from decode rows
* ``capacity_measured`` the ``scenario=capacity`` rows: tokens/s vs context, max batch,
  crossover, verdict on the published direction, the projection beside them
* ``capacity_figures``  tokens/s and max batch vs context per design and tp_size
"""
from .model import (Ceilings, expected_amplification_uniform, expected_pages_uniform, load_hardware,
                    model_preset, predict, project)
from .tables import (AxisRoles, apply_filter, axis_roles, derive, per_backend_table, to_markdown,
                     tradeoff_table, tradeoff_tables)
from .claims import Claim, check_claims, claims_frame
from .capacity import capacity_table, kv_bytes_per_request
from .capacity_measured import CapacityView, DirectionClaim, analyse_capacity

__all__ = [
    "Ceilings", "expected_amplification_uniform", "expected_pages_uniform", "load_hardware",
    "model_preset", "predict", "project", "AxisRoles", "apply_filter", "axis_roles", "derive",
    "per_backend_table", "to_markdown", "tradeoff_table", "tradeoff_tables", "Claim", "check_claims", "claims_frame",
    "capacity_table", "kv_bytes_per_request", "CapacityView", "DirectionClaim", "analyse_capacity",
]
