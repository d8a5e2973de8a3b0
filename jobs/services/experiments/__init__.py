"""Experiments (issue 48): hyperparameter searches whose trials are ordinary jobs.

- `space`: the request read and checked (space, objective, searcher, pruner, budget), Optuna's
  distributions of the space, and a trial's parameters applied to the job template.
- `study`: the Optuna study in its database (never in a process's memory), and the searcher
  and pruner an experiment names.
- `budget`: what the trials used (core- and GPU-hours from their jobs' attempts) and how many
  more may start.
- `reasons`: what a pruned, stopped or waiting trial says.
- `driver`: advance (tell Optuna what ended, ask and submit new trials) and judge (report a
  trial's new objective values, stop it early when the pruner says so).
- `control`: create, pause, resume, stop; with the driver the only writers of Experiment and
  Trial state. `access`: who sees which experiment. `sweep`: the console worker's timer.
"""
