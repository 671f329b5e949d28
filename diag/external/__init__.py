"""Programs as arms of diag's interleaved trials (``diag trial``): a patched library build, an environment
variable or a kernel setting A/B-tested with the same rounds, seeded order, CPU samples, bootstrap verdicts
and budget stop as diag's own arms (diag/trial.py), on every host of the lab or of the in-place job.

``adapters`` (pure): what a program prints -> timed rows. ``arm``: one block of a command arm on one rank
(the trial's hook). ``run``: the ``diag trial`` driver (a plan of one trial step at every N, run on the one
job: diag.runplan). The records are the trial's own blocks, so report and diagnose read them as any trial;
what they say of a program (its backend, its comparisons' rule, the link arm) is defined with the trial's
spec (diag.trialspec), which the report imports instead of this package.
"""

from diag.trialspec import ARM_RULE, COMMAND_BACKEND, LINK_ARM

__all__ = ["ARM_RULE", "COMMAND_BACKEND", "LINK_ARM"]
