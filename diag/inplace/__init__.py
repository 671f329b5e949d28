"""The main job in place: one launch of K ranks under the user's launcher (torchrun, srun, any env://
launcher) runs the whole plan on the job's own hosts (docs/inplace.md). ``python -m diag.inplace JOB.json``
is what diag's own lab and loopback launches start on every rank."""
