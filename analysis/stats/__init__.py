"""The statistics every report of ``analysis/`` decides and states its figures with.

- :mod:`analysis.stats.paired`: the paired t over per-seed effects and its TOST, the verdict rule
  (reproduced / contradicted / inconclusive), their exact power, the seeds a power needs, the
  smallest effect detected, the sd's chi-square interval; the paired t p-value, the t interval over
  seeds and Welch's test of the comparison tables.
- :mod:`analysis.stats.boundaries`: the group-sequential t boundaries (Lan-DeMets spending,
  simulated; the designs in use kept in ``t_boundaries.json`` beside it), the z boundaries they
  replaced, the sequential rule over simulated studies and its chance of a decision by each look.
- :mod:`analysis.stats.bootstrap`: the two-level bootstrap over seeds and problems (the ablation's
  intervals, the studies' secondary interval) and the paired percentile bootstrap.
- :mod:`analysis.stats.family`: several arms against one control, Bonferroni-split.

Pure numpy / scipy / pandas: no MLflow, no ``harness``. The names below are the public API; each
lives in one module.
"""

from analysis.stats.bootstrap import bootstrap_p, paired_bootstrap_ci, percentile_interval, two_level_bootstrap
from analysis.stats.family import comparison_levels, corrected_test, family_verdicts, sub_spec
from analysis.stats.paired import (
    CONTRADICTED,
    INCONCLUSIVE,
    MIN_SEEDS,
    POWER_TARGET,
    REPRODUCED,
    VERDICT_NAMES,
    decide,
    deciding_power,
    interval_level,
    min_detectable,
    paired_t_p,
    sd_interval,
    seeds_for_power,
    t_ci,
    t_interval,
    t_power,
    tost_power,
    welch_p,
)
from analysis.stats.boundaries import (
    BOUNDARIES,
    T_SEED,
    T_STUDIES,
    T_TABLE,
    decision_rates,
    derive_t_levels,
    design_key,
    look_sizes,
    nominal_levels,
    null_abs_t,
    sequential,
    write_t_table,
    z_nominal_levels,
)

__all__ = [
    "BOUNDARIES", "CONTRADICTED", "INCONCLUSIVE", "MIN_SEEDS", "POWER_TARGET", "REPRODUCED", "T_SEED", "T_STUDIES",
    "T_TABLE", "VERDICT_NAMES", "bootstrap_p", "comparison_levels", "corrected_test", "decide", "decision_rates",
    "deciding_power", "derive_t_levels", "design_key", "family_verdicts", "interval_level", "look_sizes", "min_detectable",
    "nominal_levels", "null_abs_t", "paired_bootstrap_ci", "paired_t_p", "percentile_interval", "sd_interval",
    "seeds_for_power", "sequential", "sub_spec", "t_ci", "t_interval", "t_power", "tost_power", "two_level_bootstrap",
    "welch_p", "write_t_table", "z_nominal_levels",
]
