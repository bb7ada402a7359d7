"""Pre-registered studies: one YAML file per claim, one command runs what is missing and reports.

    python -m analysis.study studies/positive_control.yaml            # run missing jobs, then report
    python -m analysis.study --no-run studies/*.yaml                   # reports from the stores only
    python -m analysis.study --gpu studies/dapo_clip_higher.yaml       # the file's GPU arm set
    python -m analysis.study --t-table studies/*.yaml                  # the t boundaries of their designs

A study file (``studies/<name>.yaml``) is the pre-registration. Keys:

* ``name`` (= the file stem), ``claim`` (one sentence), ``source`` (paper, figure / table),
  ``setup`` (our setup in a few words), ``design`` (why this task, prompt, budget: the pilot's
  figures, written before the study ran);
* ``base``: overrides of ``conf/config.yaml`` shared by every arm; ``arms``: ``{arm: [overrides]}``;
  ``control`` and ``treatment``: the two arms compared (effect = treatment - control, paired by seed);
  or ``control`` and ``comparisons`` (several arms, each against the control at alpha / m: :mod:`analysis.stats.family`);
* ``seeds``, ``steps`` (``train.steps``), ``eval_size`` (``eval.size``, the first N problems of the
  task's fixed eval set);
* ``metric``: ``name`` (an MLflow metric) and ``summary``: ``final`` / ``auc`` (greedy eval accuracy
  from the per-problem verdicts each eval logs, :mod:`analysis.ablation`) or ``last_third`` (the mean
  of a per-step train metric over the last ceil(steps/3) steps); ``scale`` multiplies it for display
  (100: points);
* ``test``: ``kind: difference`` with ``sign`` (+1 / -1, the direction the claim predicts) or
  ``kind: equivalence`` with ``margin`` (in the metric's units, stated up front); ``alpha``;
  ``delta``: the effect size the power statement is about (difference tests);
* optional ``sequential: {first, add, max_seeds, boundary}``: run the first ``first`` seeds, look, and add
  ``add`` seeds per look up to ``max_seeds`` until the rule decides at the look's nominal alpha;
  ``boundary``: ``obrien_fleming`` / ``pocock`` (Lan-DeMets alpha spending) or ``bonferroni``
  (:mod:`analysis.stats.boundaries`); ``seeds`` then lists ``max_seeds`` seeds in the order they are added;
* ``launcher`` (``joblib``, ``slurm``, ``ray_local``: ``conf/hydra/launcher``) and ``jobs``;
* optional ``secondary``: metrics reported per arm but not tested; ``per_step``: metrics shown per step
  (mean over each arm's seeds) under the verdict, not tested; ``not_run``: why the study has
  no runs (shown in the index); ``notes``: text written after the runs, quoted in the report;
  ``pilots``: the earlier studies this one is the next version of (their rows stay in
  ``results/STUDIES.md``; the README's table keeps the current version and names them in a note);
* ``gpu``: the same keys (``base``, ``arms``, ``seeds``, ``steps``, ``eval_size``) for a GPU machine,
  run with ``--gpu`` into ``results/studies/<name>/gpu/``.

What the command does:

* **resume, reuse**: the study's store is ``results/studies/<name>/mlflow.db``; each arm's jobs are
  tagged ``sweep=<name>.<arm>``. A (arm, seed) with a FINISHED run there is not launched again; the
  others are launched as one Hydra multirun per arm (``python -m harness.run -m ... seed=<missing>``),
  which resumes an interrupted job from its checkpoint (``checkpoint.dir`` is per study, arm and
  seed; removed once the run is FINISHED unless ``--keep-checkpoints``).
* **refusal**: the first launch writes ``registration.json`` (everything above except ``design``,
  ``launcher``, ``jobs``, ``setup``; ``sequential`` included). Once the store holds a FINISHED run of
  the study, a file whose registered fields differ is refused (exit 2, naming the fields): a changed
  design is a new study with a new name. A study with no FINISHED run is a new registration and
  must have at least 3 seeds per arm (``sequential.first`` for a sequential one) and, for a train
  metric, a window of at least 2 steps (:func:`check_minimum`); the committed studies that ran
  below that are reported as below it.
* **verdict** (:mod:`analysis.stats.paired`): the seed is the unit. Each seed's paired effect is its mean
  over the eval problems (or the window's steps); the paired t interval over those per-seed effects
  (``seeds - 1`` df) decides: a difference is ``reproduced`` when its ``1 - alpha`` interval lies on
  the predicted side of 0, ``contradicted`` when it lies on the other side, else ``inconclusive``;
  an equivalence (TOST) is ``reproduced`` when its ``1 - 2 alpha`` interval lies inside
  ``(-margin, margin)``, ``contradicted`` when it lies entirely outside. Fewer than 2 paired seeds:
  ``inconclusive``. A sequential study applies the same rule at each look with the boundary's
  nominal alpha (the t statistic's boundaries, :func:`analysis.stats.nominal_levels`) and stops at
  the first decided look. The two-level bootstrap of :func:`analysis.stats.two_level_bootstrap`
  (seeds and problems / steps) is reported beside it, not tested. The rule changed twice
  (``studies/verdict_rules.json``: the paired t replaced the two-level bootstrap, then the t
  boundaries replaced the z boundaries); a study whose runs started before a change names the verdict
  (and, for the z boundaries, the interval) the earlier rule gave when it differs.
* **power** of the deciding test at the measured spread ``sd``, exact: the paired t-test's power for
  ``delta`` (noncentral t), the difference it detects with 80% power and the seeds 80% needs; for
  an equivalence, the TOST power at a true difference of 0 (integrated over the sample sd) and the
  seeds 80% needs; the chi-square 95% interval of ``sd`` and the seeds needed at its ends.
* writes ``results/studies/<name>.md`` (verdict, effect and interval, per-seed table, power, plot of
  every seed), ``results/studies/<name>/result.json``, and the index ``results/STUDIES.md``.

The package, by job (each module imports only those above it in this list):

* :mod:`~analysis.study.spec`: the study file checked, its registration, where its store lives;
* :mod:`~analysis.study.store`: what the store holds (the FINISHED runs, their metric values, where
  and when they ran);
* :mod:`~analysis.study.verdicts`: the per-seed effects, the rule at each look, the power;
* :mod:`~analysis.study.launch`: the missing jobs as Hydra multiruns, a sequential design's looks;
* :mod:`~analysis.study.figures`: the PNGs;
* :mod:`~analysis.study.render`: a study's report as text (``results/studies/<name>.md``);
* :mod:`~analysis.study.reporting`: one study from its store to its report and ``result.json``;
* :mod:`~analysis.study.overview`: ``results/STUDIES.md`` and the README's table;
* :mod:`~analysis.study.cli`: ``python -m analysis.study``.
"""

from analysis.study.cli import main
from analysis.study.figures import family_figure, plot, plot_family, plot_secondary
from analysis.study.launch import job_command, missing_jobs, run_missing, run_study
from analysis.study.overview import README_MARKS, index, update_readme
from analysis.study.render import effect_text, power_lines, test_text, verdict_text, write_report
from analysis.study.reporting import report
from analysis.study.spec import (
    RESULTS,
    RULE_CHANGES,
    StudyError,
    check_minimum,
    check_registration,
    load_study,
    registration,
    store_uri,
    study_dir,
    window_steps,
)
from analysis.study.store import load_records, metric_history, secondary_curves, seed_values
from analysis.study.verdicts import analyse, design_looks, paired_effects, power_analysis, t_table_designs, verdict

__all__ = [
    "README_MARKS", "RESULTS", "RULE_CHANGES", "StudyError", "analyse", "check_minimum", "check_registration",
    "design_looks", "effect_text", "family_figure", "index", "job_command", "load_records", "load_study", "main",
    "metric_history", "missing_jobs", "paired_effects", "plot", "plot_family", "plot_secondary", "power_analysis",
    "power_lines", "registration", "report", "run_missing", "run_study", "secondary_curves", "seed_values",
    "store_uri", "study_dir", "t_table_designs", "test_text", "update_readme", "verdict", "verdict_text",
    "window_steps", "write_report",
]
