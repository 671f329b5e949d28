"""Programs as arms of diag's interleaved trials (``diag trial``): a patched library build, an environment
variable or a kernel setting A/B-tested with the same rounds, seeded order, CPU samples, bootstrap verdicts
and budget stop as diag's own arms (diag/trial.py), on every host of the lab or of the in-place job.

``adapters`` (pure): what a program prints -> timed rows. ``arm``: one block of a command arm on one rank
(the trial's hook). ``run``: the ``diag trial`` driver (run directory, one launch per world size, captures
and their analysis). The records are the trial's own blocks, so report and diagnose read them as any trial.
"""

# What the records say of a program's trial (read by diag.report.arms, which imports nothing else from here).
COMMAND_BACKEND = "command"      # TrialArm.backend of a program's arm; its records' backend ("command:<arm>")
ARM_RULE = "arm_difference"      # the rule of each arm's comparison with the trial's baseline
LINK_ARM = "link"                # diag's raw-TCP reference arm beside the programs (--link)

__all__ = ["ARM_RULE", "COMMAND_BACKEND", "LINK_ARM"]
