"""The model zoo stage: the torch modules the tool builds and the callables it calls. Takes a
workload's definition (`topoprof.workload`) and gives a module, an example batch and a loss:
the presets (`preset_modules`, with `llama`), the synthetic model `validate` trains
(`synthetic_lm`), a user's `--model` callable (`user_callable`), and activation checkpointing
applied to a module's blocks (`checkpoint_wrap`). Both the meta-device trace and the rank
workers build from here. May import: the base and `topoprof.workload`."""
