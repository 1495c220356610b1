"""The main job stage, `topoprof scan`: takes what was asked and gives one report, running the
stages before it in turn: the wiring, one launch of every rank measurement, the copies, the
predictions, the verdict and the advice. A stage that fails is a status in the report; only rank
work that fails part-way fails the scan.

  options  what was asked, checked before anything runs, and the sweeps it chooses
  ranks    all rank work in one launch, with progress
  pipeline from start to report

`options` is the scan's request, as `topoprof.model.inputs.request` is the model command's.
"""
