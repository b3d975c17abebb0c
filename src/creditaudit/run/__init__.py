"""One run: plan it (resolved components, data identity, code identity, run id, folder),
train it, checkpoint and resume it, and record it.

- :mod:`~creditaudit.run.plan`: the run plan, built once (:func:`~creditaudit.run.plan.plan_run`)
  and checked at the door (:mod:`~creditaudit.run.door`: a guest's conformance checks;
  :mod:`~creditaudit.run.run_code`: the run's guests and the record's code block);
- :mod:`~creditaudit.run.setup`, :mod:`~creditaudit.run.trainer` (``train``),
  :mod:`~creditaudit.run.evaluation`, :mod:`~creditaudit.run.resume`,
  :mod:`~creditaudit.run.record_keeping`: building, training and resuming;
- :mod:`~creditaudit.run.folder`, :mod:`~creditaudit.run.unresumable`,
  :mod:`~creditaudit.run.results`: the run's folder and result;
- :mod:`~creditaudit.run.recorder`, :mod:`~creditaudit.run.recorder_config`,
  :mod:`~creditaudit.run.recorder_inputs`, :mod:`~creditaudit.run.recorder_finish`: the
  record a run writes, from the command line or from the user's own loop;
- :mod:`~creditaudit.run.stacked`: several runs of one recipe trained as one stack
  (:mod:`~creditaudit.run.stack_groups`: which runs can);
- :mod:`creditaudit.run.steps`: the stepping both trainers use — stacked steps, epochs of
  them, and steps captured once and replayed (CUDA graphs).
"""
