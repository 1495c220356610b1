"""topoprof: GPU topology and interconnect profiler for multi-GPU PyTorch training.

The packages are the stages of the data flow, each importing only from the ones before it
(tests/test_layering.py holds this):

  probes/     the hardware and the rank processes (nvidia-smi, NVML, host, torch.distributed)
  topology/   the node's wiring and the nominal bandwidth of every link
  measure/    rank processes and what they measure: collectives, fits, logs
  model/      step time per strategy from what was measured (or given), and its validation
  report/     JSON, Markdown, text and charts for people
  scan/       the main job: every stage in turn, into one report
  commands/   the CLI: options -> call -> render
"""

__version__ = "0.1.0"
