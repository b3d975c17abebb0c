"""The stepping the trainer and the stacked runs share: K runs' steps as one (the rules'
:mod:`~creditaudit.methods.stacked`), epochs
of such steps (:mod:`~creditaudit.run.steps.epochs`) and a step captured once and replayed
as a CUDA graph (:mod:`~creditaudit.run.steps.capture`)."""
