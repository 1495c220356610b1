"""topoprof: GPU topology and interconnect profiler for multi-GPU PyTorch training.

The packages are the stages of the data flow, each importing only from the ones before it
(tests/test_layering.py holds this):

  specs/      what the CLI side and the rank side agree on: collective specs, FSDP2 modes, the profile schema
  workload/   what is trained: layouts, presets, the synthetic model's spec, checkpointing modes
  zoo/        the torch modules and callables built from them
  trace/      one forward and backward on the meta device, op by op
  probes/     the hardware readers (hardware/), then, above topology, the rank processes (ranks/) and
              the device profile (device_profile/); the repository's top-level probes/, installed here
  topology/   the node's wiring and the nominal bandwidth of every link
  measure/    rank processes and what they measure: collectives, fits, logs
  model/      step time per strategy from what was measured (or given), and its validation
  report/     JSON, Markdown, text and charts for people
  scan/       the main job: every stage in turn, into one report
  commands/   the CLI: options -> call -> render
"""

__version__ = "0.1.0"
